"""LoRA roles (``--roleN.lora_rank > 0``): a role trains only a low-rank adapter on its frozen base checkpoint.

What a LoRA role changes, and where (the rest of IB-RL is the same trainer):

* **Training**: OpenRLHF's own LoRA (``--ds.lora.*`` of its parser: its ``Actor`` wraps the base with peft's
  ``get_peft_model``, DeepSpeed's optimizer holds only the trainable adapter parameters), set per role by
  :func:`marti_ibrl.backend.args.role_args`. θ_i is the adapter; the base weights never change.
* **The KL reference π_ref of Eq. 5 is the base with the adapter off.** OpenRLHF itself starts a second model for it
  (``ReferenceModelActor`` loading the same base checkpoint: the memory and devices of another copy of the base);
  here the role's own actor computes it with peft's ``disable_adapter()`` (``RolePolicyActorBase.forward_base``), so a
  LoRA role has no reference group at all. Since the adapter starts at B = 0, π_θ = π_ref at iteration 0 exactly as
  for a full-weight role, and the KL is to the same initial policy.
* **Weight sync** moves the adapter only: the actor's rank 0 writes it in peft format (MBs) and each of the role's
  engines loads it as a new adapter (vLLM: a ``LoRARequest`` with a fresh id; the HF engine: peft ``load_adapter``),
  then drops the previous one (:class:`AdapterRef`).
* **Opponent pools** hold adapters: ``pool/ROLE/vNNNNNN/`` (``adapter_config.json`` + ``adapter_model.safetensors``)
  with the manifest's sha256 (of the weights file) and bytes (of the directory). A historical opponent is served by
  the role's *current* engines with that snapshot's adapter per request, so a LoRA role has no pool engines.
* **Export**: ``ROLE/hf`` holds the final adapter (OpenRLHF saves only the adapter of a peft model);
  ``marti-ibrl export-merged`` writes the base with the adapter merged in, an ordinary HF checkpoint
  (:func:`export_merged`); ``marti-ibrl eval`` and ``telesales eval`` take an adapter directory as a policy and
  merge it once into ``OUT/merged/`` (:func:`servable_checkpoint`).

Pure helpers only here (no Ray, no DeepSpeed); peft and safetensors are imported lazily.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from marti_ibrl.checkpoints import ADAPTER_CONFIG  # noqa: F401 (re-exported: lora.ADAPTER_CONFIG)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
MERGED_RECORD = "merged_from.json"
"""What :func:`servable_checkpoint` writes beside a merged checkpoint: the adapter and base it was made from."""
ALL_LINEAR = "all-linear"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's ``max_lora_rank`` accepts (vllm/config/lora.py ``MaxLoRARanks``)."""
ROLE_ID_STRIDE = 1_000_000
"""Adapter ids (vLLM's ``lora_int_id``, unique per engine): role slot × stride + a per-kind offset."""
POOL_ID_OFFSET = ROLE_ID_STRIDE // 2


def peft_target_modules(target_modules: list[str]) -> str | list[str]:
    """``--roleN.target_modules`` as peft takes it: ``["all-linear"]`` is peft's string shorthand (every linear layer
    but the output head), anything else a list of module names (``q_proj``, ``v_proj``, ...)."""
    return ALL_LINEAR if list(target_modules) == [ALL_LINEAR] else list(target_modules)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM's ``max_lora_rank`` accepts that holds ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")


@dataclass(frozen=True)
class AdapterRef:
    """One adapter an engine serves per request: ``name`` (unique across a run's adapters), ``id`` (vLLM's
    ``lora_int_id``: a new one for every new set of weights, since vLLM caches adapters by id) and ``path`` (its peft
    directory, on storage every engine of the role can read, like the pool snapshots)."""

    name: str
    id: int
    path: str

    def as_dict(self) -> dict:
        return {"name": self.name, "id": self.id, "path": self.path}


def current_adapter(role: str, slot: int, version: int, path: str) -> AdapterRef:
    """The adapter of the role's current policy after its ``version``-th update (0: the initial adapter, B = 0);
    named by the update count, so a resumed run serves the same names."""
    return AdapterRef(f"{role}/current/v{version}", slot * ROLE_ID_STRIDE + 1 + version, path)


def pool_adapter(role: str, slot: int, version: int, path: str) -> AdapterRef:
    """The adapter of the role's pool snapshot ``version`` (π_θi^(<k) of Eq. 6)."""
    return AdapterRef(f"{role}/pool/v{version}", slot * ROLE_ID_STRIDE + POOL_ID_OFFSET + version, path)


def is_lora_param(name: str) -> bool:
    """A peft LoRA parameter (``...lora_A...``/``...lora_B...``), as opposed to a frozen base weight."""
    return ".lora_A." in name or ".lora_B." in name or ".lora_embedding_" in name


def base_param_name(peft_name: str) -> str:
    """The HF name of a base weight inside a peft model: ``base_model.model.X.base_layer.weight`` -> ``X.weight``."""
    name = peft_name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


def write_adapter(directory: str | os.PathLike, state_dict: dict, peft_config, base_model: str | None = None) -> dict:
    """Write an adapter in peft's format (what ``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load):
    ``adapter_config.json`` and ``adapter_model.safetensors`` holding ``state_dict`` (peft's saved names, from
    ``get_peft_model_state_dict``). Written to ``DIR.tmp`` and renamed, so a half-written adapter never has the final
    name. Returns {sha256 (of the weights file), bytes (of the directory)}."""
    from safetensors.torch import save_file

    final = Path(directory)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = peft_config
    if base_model is not None:
        import copy

        config = copy.copy(peft_config)
        config.base_model_name_or_path = base_model
    config.save_pretrained(str(tmp))
    save_file({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, str(tmp / ADAPTER_WEIGHTS))
    info = adapter_info(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return info


def adapter_info(directory: str | os.PathLike) -> dict:
    """{sha256 of ``adapter_model.safetensors``, bytes of every file in the directory}: a pool manifest's entry."""
    d = Path(directory)
    h = hashlib.sha256()
    with open(d / ADAPTER_WEIGHTS, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return {"sha256": h.hexdigest(), "bytes": sum(p.stat().st_size for p in d.iterdir() if p.is_file())}


def adapter_tensors(directory: str | os.PathLike) -> dict:
    """The adapter's tensors as saved (peft names)."""
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / ADAPTER_WEIGHTS))


def export_merged(base: str, adapter: str, out: str, dtype: str = "fp32") -> Path:
    """``base`` with the peft ``adapter`` merged into its weights (W + (α/r)·B·A), saved as an ordinary HF checkpoint
    with the base's tokenizer: for evaluation or serving anywhere that knows nothing of LoRA."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    to = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    out_dir = Path(out)
    merged.to(to).save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(base).save_pretrained(str(out_dir))
    return out_dir


def is_adapter(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a peft adapter directory (a LoRA role's ``ROLE/hf``, a pool snapshot)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(adapter: str | os.PathLike, base: str | None = None) -> str:
    """The base checkpoint of ``adapter``: ``base`` if given, else the one its ``adapter_config.json`` names (the
    role's ``--roleN.pretrain``); ValueError naming the adapter when it is no adapter or the base is no directory."""
    import json

    config = Path(adapter) / ADAPTER_CONFIG
    if not config.is_file():
        raise ValueError(f"{adapter}: no {ADAPTER_CONFIG} (not a peft adapter)")
    given = base is not None
    base = base or json.loads(config.read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        named = "given" if given else f"named by its {ADAPTER_CONFIG}"
        raise ValueError(f"{adapter}: base checkpoint {base!r} ({named}) is not a directory")
    return str(base)


def servable_checkpoint(path: str | os.PathLike, cache_dir: str | os.PathLike) -> str:
    """``path`` itself when it is an ordinary checkpoint; for a peft adapter, the checkpoint that any engine serves:
    its base with it merged in (:func:`export_merged`, fp32), written once under ``cache_dir`` and reused while
    :data:`MERGED_RECORD` says it was made from the same adapter weights (sha256) and base."""
    import json

    if not is_adapter(path):
        return str(path)
    base = adapter_base(path)
    made_from = {"adapter": str(Path(path).resolve()), "sha256": adapter_info(path)["sha256"], "base": base}
    out = Path(cache_dir) / f"{Path(path).resolve().parent.name}-{Path(path).name}-{made_from['sha256'][:12]}"
    record = out / MERGED_RECORD
    if record.is_file() and json.loads(record.read_text()) == made_from:
        return str(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    export_merged(base, str(path), str(tmp))
    (tmp / MERGED_RECORD).write_text(json.dumps(made_from, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return str(out)
