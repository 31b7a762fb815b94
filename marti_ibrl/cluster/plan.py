"""``marti-ibrl plan``: a recipe's GPU placement and per-GPU memory, with no GPU, no Ray and no torch.

``marti-ibrl plan --config X.yaml [train flags...] [--nodes 4 --gpus-per-node 8 --gpu-memory 80]`` parses the flags
exactly as ``train`` does (:func:`marti_ibrl.config.load_config`), lists every component ``train`` would start
(:func:`marti_ibrl.cluster.placement.placement`, the same function that sizes ``train``'s Ray start-up), estimates each one's
memory per GPU, and exits 2 with one message when the job does not fit the allocation (GPU count or memory).

Without ``--strict``, paths and environment variables that only exist on the cluster (checkpoints, ``env.data``,
``judge.api_key_env``) are assumed present and listed; the model sizes then come from ``--model-config`` or from
the built-in table (:data:`MODEL_TABLE`) matched by name. With ``--strict`` (the Slurm recipes' preflight), every
check of ``train`` applies.

Memory model, per GPU (GiB = 2^30 bytes; P parameters, W ranks of the role, w = 2 bytes for bf16/fp16, 4 for fp32):

* actor rank: weights P·w, gradients P·w, Adam states P·12 (fp32 master copy + m + v; P·8 for fp32: m + v), the
  usual DeepSpeed split, partitioned over the W ranks by ZeRO stage (1: Adam states; 2: + gradients; 3: + weights,
  plus two gathered tensors of the largest layer/embedding in flight); activations: the larger of the update pass
  and the log-prob pass (below); plus :data:`PROCESS_OVERHEAD` (CUDA context, NCCL buffers, allocator slack);
* reference rank: weights P·w (÷W under ZeRO-3, which OpenRLHF also uses for the reference), log-prob activations,
  overhead;
* rollout engine (vLLM, bf16): ``gpu_memory_utilization`` × GPU memory on each of its TP GPUs — weights P·2 / TP,
  :data:`VLLM_RUNTIME` (profiled activations, CUDA graphs), and the rest as KV cache. Its KV use at the recipe's
  batch (:attr:`Usage.kv_use`): the dialogues it serves per iteration × one ``rollout.max_len``-token sequence each
  (an upper bound) ÷ its KV cache.

Colocated (``--train.colocate role|all``, :func:`~marti_ibrl.cluster.placement.phases`), a GPU holds several components and
its memory depends on the phase (:func:`phase_usages`): in *generation* each engine its whole budget above and each
actor (with its reference) only its resident parts — bf16 weights (and adapter), the reference's weights, process
overheads — since OpenRLHF's ``--ds.enable_sleep`` offloads optimizer states, gradients and fp32 master weights
(not the bf16 weights); in *training* each sleeping engine :data:`VLLM_ASLEEP` and each training actor its whole
estimate above, the others their resident parts. ``all`` runs the roles' log-prob passes and updates at once when
that fits the GPU, else one role after the other.

Activations are a rough, stated model: T = ``rollout.max_len`` tokens per sample (samples are padded, not packed),
a layer keeps about 8h + 3I values per token for backward (h hidden size, I MLP width; with gradient
checkpointing only its h-wide input stays, plus one layer being recomputed), and the logits cost V × 10 bytes per
token in the update (bf16 logits, their fp32 copy, its gradient; + V × 8 with an entropy bonus) and V × 6 bytes in
the log-prob pass. Update: ``train.micro_batch_size`` samples; log-prob pass: ``rollout.micro_batch_size`` samples.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from marti_ibrl.cluster.placement import (
    ACTOR,
    ENGINES,
    FROZEN_ENGINES,
    POOL_ENGINES,
    REFERENCE,
    SHARED,
    Component,
    Phase,
    colocated,
    phases,
    placement,
    pool_served_by,
    reference_on_actor_gpus,
    trained_roles,
)
from marti_ibrl.config import Config, ConfigError, load_config

GiB = 1024**3
PROCESS_OVERHEAD = 1 * GiB
"""Per DeepSpeed process: CUDA context, NCCL buffers, allocator fragmentation (assumption)."""
VLLM_RUNTIME = 2 * GiB
"""Per vLLM GPU, inside its gpu_memory_utilization budget: profiled activation peak and CUDA graphs (assumption)."""
VLLM_ASLEEP = 1 * GiB
"""Per vLLM GPU while its engine sleeps (level 1: weights to CPU, KV cache freed): CUDA context, CUDA graphs
(assumption)."""
RESIDENT = ("weights", "adapter", "reference weights", "overhead")
"""What a DeepSpeed rank keeps on its GPU while colocated engines generate (``--ds.enable_sleep`` offloads the rest)."""

# Model sizes used when a checkpoint's config.json is not at hand (plan on a laptop). ASSUMPTIONS: the text
# configs published for Qwen3.5-4B / Qwen3.5-9B (hybrid: 3 Gated DeltaNet layers per full-attention layer, gated
# attention, 248,320-token vocabulary; 4B ties its embeddings, 9B does not), as we could not download the real
# files here. Only the language model counts: OpenRLHF loads checkpoints with AutoModelForCausalLM, which maps
# qwen3_5 to the text-only Qwen3_5ForCausalLM (no vision tower, no MTP head). vLLM may also load the vision tower
# (a few hundred MB); it is not counted.
_QWEN35 = {
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
}
MODEL_TABLE: dict[str, dict] = {
    "qwen3.5-4b": {**_QWEN35, "hidden_size": 2560, "intermediate_size": 9216, "tie_word_embeddings": True},
    "qwen3.5-9b": {**_QWEN35, "hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False},
}


class PlanError(Exception):
    """The job does not fit, or cannot be sized; the message says why (exit code 2)."""


# -- model sizes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """What the memory estimate needs to know about a checkpoint."""

    source: str
    """Where the numbers come from (a config.json, or the built-in table: an assumption)."""
    params: int
    vocab: int
    hidden: int
    layers: int
    intermediate: int
    largest_tensor: int
    """Parameters of the largest unit ZeRO-3 gathers at once (a layer, the embedding or the LM head)."""
    kv_bytes_per_token: int
    """vLLM KV cache per token (bf16) over the full-attention layers, all KV heads."""
    kv_heads: int
    state_bytes_per_sequence: int
    """Fixed recurrent + convolution state per sequence of the linear-attention layers (0 for plain attention)."""
    linears: tuple[tuple[str, int, int, int], ...] = ()
    """The decoder's linear layers as (module name, in features, out features, how many): what LoRA adapts."""


def _hybrid_layer_types(text: dict) -> list[str]:
    layers = text["num_hidden_layers"]
    if text.get("layer_types"):
        return list(text["layer_types"])
    if "linear_num_value_heads" in text:  # Qwen3.5 / Qwen3-Next: every full_attention_interval-th layer is full
        every = text.get("full_attention_interval", 4)
        return ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    return ["full_attention"] * layers


def model_spec(config: dict, source: str) -> ModelSpec:
    """Parameter count, KV bytes and state size of a dense decoder from its HF ``config.json`` (a multimodal
    checkpoint's ``text_config``). Counts embeddings, LM head (unless tied), per layer: attention (Q incl. the
    output gate of gated attention, GQA K/V, O, biases, Q/K norms) or Gated DeltaNet (projections, depthwise
    convolution, decay and gate parameters, norm), the gated MLP and two norms; and the final norm."""
    text = config.get("text_config") or config
    try:
        model_type = str(text.get("model_type") or config.get("model_type") or "")
        if any(k in text for k in ("num_experts", "num_local_experts", "n_routed_experts")):
            raise PlanError(f"{source}: mixture-of-experts models are not sized by plan (dense decoders only)")
        h, n_layers, vocab = text["hidden_size"], text["num_hidden_layers"], text["vocab_size"]
        inter, heads = text["intermediate_size"], text["num_attention_heads"]
        kv_heads = text.get("num_key_value_heads") or heads
        head_dim = text.get("head_dim") or h // heads
    except KeyError as e:
        raise PlanError(f"{source}: no {e.args[0]!r}: not a decoder config plan can size") from None
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    qwen3 = model_type.startswith("qwen3")
    gated = text.get("attn_output_gate", model_type.startswith(("qwen3_5", "qwen3_next")))
    q_out, kv_out, o_in = heads * head_dim * (2 if gated else 1), kv_heads * head_dim, heads * head_dim
    attention = h * q_out + 2 * h * kv_out + o_in * h + (2 * head_dim if qwen3 else 0)
    if model_type == "qwen2":  # Qwen2: biases on q, k, v
        attention += q_out + 2 * kv_out
    elif text.get("attention_bias"):
        attention += q_out + 2 * kv_out + h
    mlp = 3 * h * inter + ((2 * inter + h) if text.get("mlp_bias") else 0)
    kinds = _hybrid_layer_types(text)
    n_full = kinds.count("full_attention")
    linear, state = 0, 0
    if n_full < n_layers:
        k_heads, v_heads = text["linear_num_key_heads"], text["linear_num_value_heads"]
        k_dim, v_dim = text["linear_key_head_dim"], text["linear_value_head_dim"]
        kernel = text.get("linear_conv_kernel_dim", 4)
        key, value = k_heads * k_dim, v_heads * v_dim
        conv = 2 * key + value
        # in_proj_qkv, in_proj_z, in_proj_b/a, conv1d (depthwise), dt_bias + A_log, gated norm, out_proj
        linear = h * conv + h * value + 2 * h * v_heads + conv * kernel + 2 * v_heads + v_dim + value * h
        ssm_bytes = 4 if text.get("mamba_ssm_dtype", "float32") == "float32" else 2
        state = (n_layers - n_full) * (v_heads * k_dim * v_dim * ssm_bytes + conv * (kernel - 1) * 2)
    per_layer_norms = 2 * h
    params = n_full * attention + (n_layers - n_full) * linear + n_layers * (mlp + per_layer_norms)
    params += vocab * h * (1 if tied else 2) + h
    largest = max(vocab * h, max(attention, linear) + mlp + per_layer_norms)
    n_lin = n_layers - n_full
    linears = (
        ("q_proj", h, q_out, n_full),
        ("k_proj", h, kv_out, n_full),
        ("v_proj", h, kv_out, n_full),
        ("o_proj", o_in, h, n_full),
        ("gate_proj", h, inter, n_layers),
        ("up_proj", h, inter, n_layers),
        ("down_proj", inter, h, n_layers),
    )
    if n_lin:  # Gated DeltaNet projections (transformers' Qwen3.5 names)
        linears += (
            ("in_proj_qkv", h, conv, n_lin),
            ("in_proj_z", h, value, n_lin),
            ("in_proj_b", h, v_heads, n_lin),
            ("in_proj_a", h, v_heads, n_lin),
            ("out_proj", value, h, n_lin),
        )
    return ModelSpec(
        source=source,
        params=params,
        vocab=vocab,
        hidden=h,
        layers=n_layers,
        intermediate=inter,
        largest_tensor=largest,
        kv_bytes_per_token=n_full * 2 * kv_out * 2,
        kv_heads=kv_heads,
        state_bytes_per_sequence=state,
        linears=linears,
    )


def lora_params(m: ModelSpec, rank: int, target_modules: list[str]) -> int:
    """Parameters of a rank-r LoRA adapter: r·(in + out) per adapted linear layer (``all-linear``: every one of
    :attr:`ModelSpec.linears`, the output head excluded, as peft does)."""
    every = list(target_modules) == ["all-linear"]
    return sum(rank * (i + o) * n for name, i, o, n in m.linears if every or name in target_modules)


def _table_key(text: str) -> str | None:
    """The MODEL_TABLE entry named in ``text`` (``Qwen3.5-9B``, ``qwen3_5-4b-sft``, ...), if exactly one."""
    norm = re.sub(r"[_\s]", ".", text.lower())
    found = {k for k in MODEL_TABLE if re.search(re.escape(k) + r"(?![0-9])", norm)}
    return found.pop() if len(found) == 1 else None


def _config_json(file: Path, source: str) -> dict:
    """A config.json's object, or a PlanError naming ``source`` (not JSON, not an object)."""
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PlanError(f"{source}: not a JSON config ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(config, dict):
        raise PlanError(f"{source}: not a config.json (a JSON {type(config).__name__}, not an object)")
    return config


def resolve_model(path: str, model_config: str | None, config_file: str | None) -> ModelSpec:
    """A checkpoint's size: its config.json when it exists; else ``--model-config`` (a MODEL_TABLE key or a
    config.json); else the table entry named in the checkpoint path, or in the recipe's file name."""
    own = Path(path) / "config.json"
    if own.is_file():
        return model_spec(_config_json(own, str(own)), str(own))
    if model_config:
        if model_config.lower() in MODEL_TABLE:
            key = model_config.lower()
            return model_spec(MODEL_TABLE[key], f"--model-config {key} (built-in table, assumed)")
        file = Path(model_config)
        file = file / "config.json" if file.is_dir() else file
        if not file.is_file():
            known = " | ".join(MODEL_TABLE)
            raise PlanError(f"--model-config: expected {known} or a config.json, got {model_config!r}")
        return model_spec(_config_json(file, f"--model-config {file}"), str(file))
    for name, where in ((path, "checkpoint name"), (Path(config_file or "").name, "recipe name")):
        key = _table_key(name)
        if key:
            return model_spec(MODEL_TABLE[key], f"{key} (built-in table, assumed; from the {where})")
    raise PlanError(
        f"cannot size {path}: no config.json there and no known model in its name; "
        f"pass --model-config {' | '.join(MODEL_TABLE)} | PATH/config.json"
    )


# -- memory ---------------------------------------------------------------------------------------------------


@dataclass
class Usage:
    """One component's memory per GPU: named parts (bytes) and what its GPUs hold in total."""

    component: Component
    model: ModelSpec | None
    parts: dict[str, int] = field(default_factory=dict)
    sequences: int | None = None
    """Engines: how many ``rollout.max_len``-token sequences the KV budget holds."""
    kv_use: float | None = None
    """Current-policy engines: the share of the KV cache an iteration's dialogues fill (module docstring)."""
    note: str = ""

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def _activations(cfg: Config, m: ModelSpec, role, update: bool) -> int:
    """Rough activation bytes per GPU of the update pass (``update``) or of a log-prob pass (module docstring)."""
    act = 4 if cfg.ds.param_dtype == "fp32" else 2
    per_token_layer = act * (8 * m.hidden + 3 * m.intermediate)
    tokens = cfg.rollout.max_len
    if not update:
        return cfg.rollout.micro_batch_size * tokens * (per_token_layer + 6 * m.vocab)
    if cfg.ds.gradient_checkpointing:
        layers = m.layers * act * m.hidden + per_token_layer
    else:
        layers = m.layers * per_token_layer
    logits = m.vocab * (10 + (8 if role.entropy_coef > 0 else 0))
    return cfg.train.micro_batch_size * tokens * (layers + logits)


def usage(cfg: Config, c: Component, m: ModelSpec, gpu_memory: int) -> Usage:
    """Memory per GPU of component ``c`` (the module docstring's model)."""
    role = next(r for r in cfg.roles if r.name == c.role)
    u = Usage(c, m)
    if c.kind in (ACTOR, REFERENCE):
        w = 4 if cfg.ds.param_dtype == "fp32" else 2
        stage, ranks = cfg.ds.zero_stage, c.count
        u.parts["weights"] = m.params * w // (ranks if stage == 3 else 1)
        trained = m.params  # a LoRA role trains its adapter only: gradients and Adam states of the adapter
        if role.lora_rank > 0:
            trained = lora_params(m, role.lora_rank, role.target_modules)
            u.parts["adapter"] = trained * w // (ranks if stage == 3 else 1)
            u.note = "LoRA: gradients and Adam states of the adapter only; π_ref = the base with the adapter off"
        if c.kind == ACTOR:
            u.parts["gradients"] = trained * w // (ranks if stage >= 2 else 1)
            u.parts["Adam states"] = trained * (8 if w == 4 else 12) // (ranks if stage >= 1 else 1)
        if stage == 3:
            u.parts["ZeRO-3 gathers"] = 2 * m.largest_tensor * w
        update = _activations(cfg, m, role, update=True) if c.kind == ACTOR else 0
        logprobs = _activations(cfg, m, role, update=False)
        if c.kind == REFERENCE and reference_on_actor_gpus(cfg, role):
            u.parts, u.note = {}, "on the actor's GPUs (counted there)"
            return u
        if c.kind == ACTOR and reference_on_actor_gpus(cfg, role):
            # the reference's process shares these GPUs; its log-prob pass runs beside the actor's, not the update
            u.parts["reference weights"] = m.params * w // (ranks if stage == 3 else 1)
            if stage == 3:
                u.parts["reference gathers"] = 2 * m.largest_tensor * w
            u.parts["activations"] = max(update, 2 * logprobs)
            u.parts["overhead"] = 2 * PROCESS_OVERHEAD
            return u
        u.parts["activations"] = max(update, logprobs)
        u.parts["overhead"] = PROCESS_OVERHEAD
        return u
    tp = c.gpus_each
    budget = int(role.gpu_memory_utilization * gpu_memory)
    u.parts["weights"] = m.params * 2 // tp
    if role.lora_rank > 0 and not role.frozen:  # vLLM's GPU slots for max_loras adapters of max_lora_rank
        from marti_ibrl.lora import vllm_max_lora_rank

        u.parts["adapters"] = 2 * lora_params(m, vllm_max_lora_rank(role.lora_rank), role.target_modules) * 2 // tp
    u.parts["runtime"] = VLLM_RUNTIME
    u.parts["KV cache"] = budget - u.parts["weights"] - u.parts.get("adapters", 0) - VLLM_RUNTIME
    per_sequence = cfg.rollout.max_len * m.kv_bytes_per_token // min(tp, m.kv_heads) + m.state_bytes_per_sequence // tp
    u.sequences = max(0, u.parts["KV cache"]) // per_sequence
    u.note = f"KV for ~{u.sequences} sequences of {cfg.rollout.max_len} tokens"
    if c.kind != FROZEN_ENGINES:
        dialogues = cfg.rollout.dialogues
        u.note += f" (an iteration: {dialogues} dialogues, ~{math.ceil(dialogues / c.count)} per engine)"
    if c.kind == ENGINES and u.parts["KV cache"] > 0:  # every dialogue has one sequence on its role's engines
        served = len(trained_roles(cfg)) if cfg.rollout.share_engines else 1
        u.kv_use = dialogues * served / c.count * per_sequence / u.parts["KV cache"]
        u.note += f"; KV use at this batch {100 * u.kv_use:.1f}%"
    return u


@dataclass
class PhaseUsage:
    """Memory per GPU of one colocated GPU group (a role's GPUs, or the shared ones) in one :class:`Phase`."""

    phase: Phase
    group: str
    parts: dict[str, int] = field(default_factory=dict)
    """Per component on the group's GPUs (``agent1 engines``, ``agent1 actor``: with its reference), bytes."""

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def phase_usages(cfg: Config, usages: list[Usage], together: bool = True) -> list[PhaseUsage]:
    """Per colocated GPU group and phase, what each component on a GPU holds (module docstring); [] when not
    colocated. Engines: awake their budget, asleep :data:`VLLM_ASLEEP` per GPU; an actor (with its colocated
    reference): its whole estimate when its role trains in the phase, else its :data:`RESIDENT` parts."""
    out = []
    groups = list(dict.fromkeys(u.component.group for u in usages if u.component.group))
    for phase in phases(cfg, together):
        if phase.name == "sync":  # below generation: the engines' weights without their KV cache
            continue
        for group in groups:
            pu = PhaseUsage(phase, group)
            for u in usages:
                c = u.component
                if c.group != group or c.kind == REFERENCE:  # a colocated reference is counted in its actor
                    continue
                if c.kind == ENGINES:
                    pu.parts[f"{c.role} engines"] = u.total if phase.engines_awake else VLLM_ASLEEP
                elif c.role in phase.training:
                    pu.parts[f"{c.role} actor"] = u.total
                else:
                    pu.parts[f"{c.role} actor (resident)"] = sum(v for k, v in u.parts.items() if k in RESIDENT)
            out.append(pu)
    return out


# -- the plan ---------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    cfg: Config
    components: list[Component]
    usages: list[Usage]
    nodes: int
    gpus_per_node: int
    gpu_memory: int
    models: dict[str, ModelSpec]
    assumed: list[str]
    """Paths / variables not checked here (plan without --strict)."""
    problems: list[str]

    lora: list = field(default_factory=list)
    """:class:`LoRASummary` per LoRA role."""
    phases: list[PhaseUsage] = field(default_factory=list)
    """Colocated (``--train.colocate role|all``): memory per GPU of each GPU group in each phase."""
    updates_together: bool | None = None
    """Colocated: the roles' log-prob passes and updates run at once (``role``: always, their GPUs are apart;
    ``all``: when that fits the GPU), else one role after the other."""
    together_bytes: int = 0
    """``all`` with the updates one after the other: what both at once would need per GPU."""

    @property
    def total_gpus(self) -> int:
        return sum(c.gpus for c in self.components)


def make_plan(
    cfg: Config,
    *,
    nodes: int | None = None,
    gpus_per_node: int = 8,
    gpu_memory_gib: float = 80.0,
    model_config: str | None = None,
    config_file: str | None = None,
    assumed: list[str] | None = None,
) -> Plan:
    """Placement, memory per GPU and the reasons the job does not fit (``problems``, empty when it fits)."""
    components = placement(cfg)
    total = sum(c.gpus for c in components)
    gpu_memory = int(gpu_memory_gib * GiB)
    problems = []
    if nodes is None:
        nodes = max(1, math.ceil(total / gpus_per_node))
    if total > nodes * gpus_per_node:
        problems.append(
            f"the job needs {total} GPUs, the allocation has {nodes} × {gpus_per_node} = {nodes * gpus_per_node}"
        )
    gpu_device = cfg.train.device != "cpu"
    models = {}
    for c in components:
        if c.model not in models:
            models[c.model] = resolve_model(c.model, model_config, config_file)
    usages, hint = [], False
    for c in components:
        u = usage(cfg, c, models[c.model], gpu_memory) if gpu_device else Usage(c, models[c.model])
        usages.append(u)
        if not gpu_device:
            continue
        where = f"{c.role} {c.kind}"
        if c.kind in (ACTOR, REFERENCE) and u.total > gpu_memory:
            problems.append(f"{where} needs {_gib(u.total)} GiB per GPU > {_gib(gpu_memory)} GiB ({_parts(u)})")
            hint = True
        elif c.kind not in (ACTOR, REFERENCE):
            role = next(r for r in cfg.roles if r.name == c.role)
            flag = f"--role{cfg.roles.index(role) + 1}"
            if not 0 < role.gpu_memory_utilization <= 1:
                problems.append(f"{flag}.gpu_memory_utilization must be in (0, 1], got {role.gpu_memory_utilization}")
            elif not u.sequences:
                problems.append(
                    f"{where}: {role.gpu_memory_utilization} × {_gib(gpu_memory)} GiB leaves no KV cache for one "
                    f"{cfg.rollout.max_len}-token sequence after the weights ({_gib(u.parts['weights'])} GiB per GPU) "
                    f"and the runtime ({_gib(VLLM_RUNTIME)} GiB); raise {flag}.gpu_memory_utilization or "
                    f"{flag}.tensor_parallel_size"
                )
            if c.gpus_each > gpus_per_node:
                problems.append(
                    f"{where}: tensor parallel size {c.gpus_each} exceeds the {gpus_per_node} GPUs of a node"
                )
    if hint:
        problems.append(
            "for the DeepSpeed ranks try --ds.zero_stage 3, --ds.gradient_checkpointing true, more ranks "
            "(--roleN.num_gpus_per_node) or smaller --train.micro_batch_size / --rollout.micro_batch_size"
        )
    plan = Plan(cfg, components, usages, nodes, gpus_per_node, gpu_memory, models, list(assumed or []), problems)
    if gpu_device and colocated(cfg):
        _plan_phases(plan)
    plan.problems = list(dict.fromkeys(problems))  # a role's engines and pool engines share its settings
    plan.lora = lora_summary(cfg, models)
    return plan


def _plan_phases(p: Plan) -> None:
    """Colocated: each phase's memory per GPU; ``all`` updates the roles at once when that fits, else in turn."""
    cfg, limit = p.cfg, p.gpu_memory
    p.phases, p.updates_together = phase_usages(cfg, p.usages, together=True), True
    training = [pu for pu in p.phases if pu.phase.training]
    if cfg.train.colocate == "all" and len(trained_roles(cfg)) > 1 and max(pu.total for pu in training) > limit:
        p.together_bytes = max(pu.total for pu in training)
        p.phases, p.updates_together = phase_usages(cfg, p.usages, together=False), False
    for pu in p.phases:
        if pu.total <= limit:
            continue
        where = f"{pu.phase.name} on {_group_gpus(pu.group)}"
        how = (
            "lower --roleN.gpu_memory_utilization, or --ds.zero_stage 3 to split the weights that stay"
            if pu.phase.engines_awake
            else "try --ds.zero_stage 3, --ds.gradient_checkpointing true or smaller micro-batches"
        )
        p.problems.append(f"{where} needs {_gib(pu.total)} GiB per GPU > {_gib(limit)} GiB ({_parts(pu)}); {how}")


@dataclass
class LoRASummary:
    """A LoRA role against the same role on full weights (``lora_rank 0``): its adapter and what it saves."""

    role: str
    rank: int
    params: int
    snapshot_bytes: int
    """One pool snapshot (``pool.dtype``): the adapter, vs ``full_snapshot_bytes`` for the whole model."""
    full_snapshot_bytes: int
    gpus_saved: int
    """Devices the role's full-weight stack (same flags, ``lora_rank 0``) would take more: its reference ranks and
    pool engines (``reference_gpus`` + ``pool_gpus``)."""
    reference_gpus: int = 0
    pool_gpus: int = 0


def lora_summary(cfg: Config, models: dict[str, ModelSpec]) -> list[LoRASummary]:
    import copy

    out = []
    for i, role in enumerate(cfg.roles):
        if role.frozen or role.lora_rank == 0:
            continue
        full = copy.deepcopy(cfg)
        full.roles[i].lora_rank = 0
        if full.pool.num_engines == 0:
            full.pool.num_engines = None
        gpus = {c.kind: c.gpus for c in placement(full) if c.role == role.name}
        saved = sum(gpus.values()) - sum(c.gpus for c in placement(cfg) if c.role == role.name)
        m = models[role.pretrain]
        n = lora_params(m, role.lora_rank, role.target_modules)
        w = 4 if cfg.pool.dtype == "fp32" else 2
        ref, pool = gpus.get(REFERENCE, 0), gpus.get(POOL_ENGINES, 0)
        out.append(LoRASummary(role.name, role.lora_rank, n, n * w, m.params * w, saved, ref, pool))
    return out


def _gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}"
    return f"{n} B"


def _group_gpus(group: str, count: int | None = None) -> str:
    """``the shared GPUs`` / ``agent1's 4 GPUs``: a colocated GPU group in a message."""
    n = f"{count} " if count is not None else ""
    if count == 1:
        return "the 1 shared GPU" if group == SHARED else f"{group}'s 1 GPU"
    return f"the {n}shared GPUs" if group == SHARED else f"{group}'s {n}GPUs"


def _parts(u: Usage | PhaseUsage) -> str:
    return " + ".join(f"{k} {_gib(v)}" for k, v in u.parts.items())


def format_plan(p: Plan) -> str:
    cfg = p.cfg
    gpu = cfg.train.device != "cpu"
    trained = [r.name for r in cfg.roles if not r.frozen]
    lines = [
        f"env {cfg.env.name}: roles {', '.join(r.name for r in cfg.roles)} (trained: {', '.join(trained)}); "
        f"ZeRO-{cfg.ds.zero_stage} {cfg.ds.param_dtype}"
        + (", gradient checkpointing" if cfg.ds.gradient_checkpointing else "")
        + f"; {cfg.rollout.batch_size} scenarios × {cfg.rollout.n_samples_per_prompt} samples per iteration, "
        f"max_len {cfg.rollout.max_len}",
        "",
        "models:",
    ]
    for path, m in p.models.items():
        state = f" + {_size(m.state_bytes_per_sequence)} state/sequence" if m.state_bytes_per_sequence else ""
        lines.append(
            f"  {path}: {_count(m.params)} params, vocab {m.vocab}, KV {_size(m.kv_bytes_per_token)}/token"
            f"{state}  [{m.source}]"
        )
    lines += [
        "",
        f"{'role':<10} {'component':<14} {'processes':<12} {'GPUs':>4}  per-GPU memory, GiB"
        + (f" (of {_gib(p.gpu_memory)})" if gpu else ""),
    ]
    for u in p.usages:
        c = u.component
        procs = (
            f"{c.count} × TP{c.gpus_each}"
            if c.kind not in (ACTOR, REFERENCE)
            else f"{c.count} rank{'s' * (c.count != 1)}"
        )
        mem = f"{_gib(u.total)} = {_parts(u)}" if gpu and u.parts else "-"
        if u.note:
            mem += f"; {u.note}"
        if c.shared and c.kind != REFERENCE:  # a reference's note says so already
            mem += f"; on {_group_gpus(c.group)} (colocated)"
        lines.append(f"{c.role:<10} {c.kind:<14} {procs:<12} {c.gpus:>4}  {mem}")
    for x in p.lora:
        lines.append(
            f"{x.role}: LoRA r={x.rank}, {_count(x.params)} adapter params; a pool snapshot {_size(x.snapshot_bytes)} "
            f"vs {_gib(x.full_snapshot_bytes)} GiB full ({cfg.pool.size} per pool); no reference model, no pool "
            f"engines: {x.gpus_saved} GPU{'s' * (x.gpus_saved != 1)} fewer than full weights with these flags "
            f"(reference {x.reference_gpus}, pool engines {x.pool_gpus})"
        )
    lines += _format_colocated(p)
    if cfg.rollout.share_engines:
        first, *others = [r for r in cfg.roles if not r.frozen]
        saved = sum(r.num_engines * r.tensor_parallel_size for r in others)
        lines.append(
            f"engines: {first.name}'s {first.num_engines} × TP{first.tensor_parallel_size} serve the adapters of "
            f"{', '.join(r.name for r in [first, *others])} (--rollout.share_engines): {saved} GPUs fewer"
        )
    alloc = p.nodes * p.gpus_per_node
    idle = f", {alloc - p.total_gpus} idle" if alloc > p.total_gpus else ""
    nodes = f"{p.nodes} node{'s' * (p.nodes != 1)}"
    lines += ["", f"total: {p.total_gpus} GPUs; allocation {nodes} × {p.gpus_per_node} GPUs = {alloc}{idle}"]
    if not gpu:
        lines.append("train.device cpu: the slots are CPU processes (logical devices); no GPU memory estimate")
    if p.assumed:
        lines.append(
            "not checked here (assumed present where train runs; --strict checks them): " + ", ".join(p.assumed)
        )
    lines.append("fits" if not p.problems else "DOES NOT FIT")
    return "\n".join(lines)


def _format_colocated(p: Plan) -> list[str]:
    """The colocated layout's lines: who shares which GPUs, each phase's memory, the update order, the pools."""
    cfg = p.cfg
    lines = []
    if colocated(cfg):
        groups = list(dict.fromkeys(c.group for c in p.components if c.group and c.kind != REFERENCE))
        for g in groups:
            members = [c for c in p.components if c.group == g]
            gpus = sum(c.gpus for c in members)
            lines.append(
                f"colocated (--train.colocate {cfg.train.colocate}): {', '.join(f'{c.role} {c.kind}' for c in members)} "
                f"on {_group_gpus(g, gpus)}; engines sleep while DeepSpeed trains"
            )
        for pu in p.phases:
            lines.append(f"  {pu.phase.name + ' (' + pu.group + ')':<28} {_gib(pu.total)} GiB per GPU = {_parts(pu)}")
        n = len(trained_roles(cfg))
        if p.updates_together is not None and cfg.train.colocate == "all" and n > 1:
            lines.append(
                f"  updates: {'both' if n == 2 else f'all {n}'} roles at once (they fit together)"
                if p.updates_together
                else f"  updates: one role after the other ({'both' if n == 2 else 'all'} at once would need "
                f"{_gib(p.together_bytes)} GiB per "
                f"GPU > {_gib(p.gpu_memory)})"
            )
        if cfg.train.device == "cpu":
            lines.append("  train.device cpu: no sleep mode (vLLM-CPU, HF engines): the processes only share slots")
    for role in trained_roles(cfg):
        served = pool_served_by(cfg, role)
        if served and (colocated(cfg) or role.lora_rank > 0):
            lines.append(f"pool: {role.name}'s snapshots are served by {served}")
    return lines


# -- parsing as train does ------------------------------------------------------------------------------------


def parse_flags(flags: list[str], strict: bool) -> tuple[Config, list[str]]:
    """``load_config(flags)`` exactly as ``train``; without ``strict``, missing paths and variables are assumed."""
    if "--config" in flags:
        i = flags.index("--config")
        if i + 1 < len(flags) and not Path(flags[i + 1]).is_file():
            raise ConfigError(f"--config: no such file {flags[i + 1]}")
    if strict:
        return load_config(flags), []
    missing: list[str] = []
    return load_config(flags, assumed=missing), missing


# -- the command ----------------------------------------------------------------------------------------------
