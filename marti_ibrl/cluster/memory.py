"""Memory per GPU of every process and of every colocated phase, for ``marti-ibrl plan`` (:mod:`.plan`) and the
colocated runtime (:func:`updates_fit_together`).

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

import math
from dataclasses import dataclass, field

from marti_ibrl.cluster.placement import (
    ACTOR,
    ENGINES,
    FROZEN_ENGINES,
    REFERENCE,
    SHARED,
    Component,
    Phase,
    phases,
    reference_on_actor_gpus,
    trained_roles,
)
from marti_ibrl.cluster.sizing import ModelSpec, lora_params
from marti_ibrl.config import Config

GiB = 1024**3
MAX_GPU_MEMORY_GIB = 16384.0
"""The largest GPU memory a plan takes, in GiB (16 TiB: far above any device; a larger number is a typo)."""
LORA_RANK = 16
"""The adapter rank a plan proposes for LoRA roles (``plan --fit``'s layouts, the memory hint): the rank the
repository's LoRA tests and learning path train."""
PROCESS_OVERHEAD = 1 * GiB
"""Per DeepSpeed process: CUDA context, NCCL buffers, allocator fragmentation (assumption)."""
VLLM_RUNTIME = 2 * GiB
"""Per vLLM GPU, inside its gpu_memory_utilization budget: profiled activation peak and CUDA graphs (assumption)."""
VLLM_ASLEEP = 1 * GiB
"""Per vLLM GPU while its engine sleeps (level 1: weights to CPU, KV cache freed): CUDA context, CUDA graphs
(assumption)."""
RESIDENT = ("weights", "adapter", "reference weights", "overhead")
"""What a DeepSpeed rank keeps on its GPU while colocated engines generate (``--ds.enable_sleep`` offloads the rest)."""


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


def updates_fit_together(cfg: Config, usages: list[Usage], gpu_memory: int) -> tuple[bool, int]:
    """Colocated: whether the roles' log-prob passes and updates run at once (``role``: always, their GPUs are apart;
    ``all``: when that fits ``gpu_memory`` bytes per GPU), and the bytes per GPU at once needs in training."""
    peak = max((pu.total for pu in phase_usages(cfg, usages, together=True) if pu.phase.training), default=0)
    return not (cfg.train.colocate == "all" and len(trained_roles(cfg)) > 1 and peak > gpu_memory), peak


def gib(n: int) -> str:
    """Bytes as GiB, one decimal."""
    return f"{n / GiB:.1f}"


def parts_text(u: Usage | PhaseUsage) -> str:
    """A usage's parts in GiB: ``weights 1.2 + overhead 1.0``."""
    return " + ".join(f"{k} {gib(v)}" for k, v in u.parts.items())


def group_gpus(group: str, count: int | None = None) -> str:
    """``the shared GPUs`` / ``agent1's 4 GPUs``: a colocated GPU group in a message."""
    n = f"{count} " if count is not None else ""
    if count == 1:
        return "the 1 shared GPU" if group == SHARED else f"{group}'s 1 GPU"
    return f"the {n}shared GPUs" if group == SHARED else f"{group}'s {n}GPUs"
