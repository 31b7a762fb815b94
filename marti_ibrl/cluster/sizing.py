"""Model sizes for ``marti-ibrl plan`` (:mod:`marti_ibrl.cluster.plan`): what the memory estimate needs to know about
a checkpoint (:class:`ModelSpec`), read from its ``config.json`` or, where the checkpoint is not at hand (a plan on a
laptop), from the built-in table :data:`MODEL_TABLE` (a data table: published configs, stated as assumptions)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


class PlanError(Exception):
    """The job does not fit, or cannot be sized; the message says why (exit code 2)."""


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
