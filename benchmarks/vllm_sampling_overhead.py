"""The vLLM engine's CPU per generated token: the protocol's requests vs vLLM's default requests, one run.

The question (issue 38: on 2 cores the asynchronous iteration is bounded by the generation core's CPU): how much CPU
does an engine (vLLM's ``AsyncLLM`` as OpenRLHF's ``RolloutRayActor`` runs it, and its engine-core process) spend
per generated token when the requests ask only for what the engine protocol returns (token ids and their log-probs,
once, when the request ends: :func:`marti_ibrl.rollout.engines._sampling_params`), against vLLM's defaults (every
token detokenized, a cumulative ``RequestOutput`` built and streamed at every engine step)?

``--batch`` prompts (default 16, rollout-like: 100-250 tokens) and ``--new-tokens`` (default 64) per call, sampled and
seeded alike in both variants; ``--repeats`` calls each (default 8), alternating which variant goes first, the first
pair dropped (warm-up). CPU = user + system seconds of this process and its children (the engine core), over the
generated tokens. The engine runs in this process (``AsyncLLMEngine`` with the trainer's CPU engine arguments:
:func:`marti_ibrl.rollout.engines._on_cpu`, eager as CPU engines run; ``--compiled``: vLLM's compiled graph), not under
Ray, so nothing else is counted. Both variants must return the same tokens and log-probs (checked: the run fails
otherwise). Last line::

    protocol/default engine CPU per token: X.XX

    .venv/bin/python benchmarks/vllm_sampling_overhead.py [--model PATH] [--batch 16] [--repeats 8] [--compiled]

The model defaults to the tiny model the CPU cluster recipe trains (the demo's, head_dim 32, built here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import uuid


def _cpu_seconds() -> float:
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # (a child that has just ended)
            total += sum(child.cpu_times()[:2])
    return total


async def _measure(
    model: str, batch: int, new_tokens: int, repeats: int, compiled: bool
) -> dict[str, list[tuple[float, int]]]:
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from marti_ibrl.rollout.engines import _completion, _on_cpu, _sampling_params

    kwargs = dict(model=model, dtype="float32", max_model_len=1024, seed=0, enforce_eager=not compiled)
    _on_cpu(kwargs, kv_sequences=batch)
    llm = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**kwargs))
    prompts = [[3 + (i * 7 + j) % 90 for j in range(100 + 10 * i)] for i in range(batch)]
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": new_tokens, "seed": 1234}

    def params(variant: str, i: int):
        ours = _sampling_params(sampling, i)
        if variant == "protocol":
            return ours
        return SamplingParams(  # vLLM's defaults for everything the protocol leaves out
            temperature=ours.temperature, top_p=ours.top_p, max_tokens=ours.max_tokens, logprobs=0, seed=ours.seed
        )

    async def one(prompt, p):
        final = None
        async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt), p, request_id=uuid.uuid4().hex):
            final = out
        return _completion(final.outputs[0])

    rows: dict[str, list[tuple[float, int]]] = {"protocol": [], "default": []}
    first: dict[str, list[dict]] = {}
    for r in range(repeats):
        for variant in ("default", "protocol") if r % 2 == 0 else ("protocol", "default"):
            c0 = _cpu_seconds()
            outs = await asyncio.gather(*(one(p, params(variant, i)) for i, p in enumerate(prompts)))
            spent = _cpu_seconds() - c0
            first.setdefault(variant, outs)
            if r > 0:
                rows[variant].append((spent, sum(len(o["token_ids"]) for o in outs)))
    if first["protocol"] != first["default"]:
        raise SystemExit("the two variants returned different tokens or log-probs")
    llm.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="an HF checkpoint vLLM serves (default: the demo's tiny model, built here)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--compiled", action="store_true", help="vLLM's compiled graph (CPU engines run eagerly)")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats must be at least 2 (the first pair is a warm-up)")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from marti_ibrl.sft import DEMO_TINY_MODEL, VLLM_TINY_HEADS
            from marti_ibrl.tiny import build_tiny_dond_model

            model = build_tiny_dond_model(f"{tmp}/tiny", **{**DEMO_TINY_MODEL, **VLLM_TINY_HEADS})
        rows = asyncio.run(_measure(model, args.batch, args.new_tokens, args.repeats, args.compiled))
    per_token = {}
    for variant, runs in rows.items():
        per_token[variant] = statistics.mean(cpu / tokens for cpu, tokens in runs)
        tokens = statistics.mean(t for _, t in runs)
        print(f"{variant:>8}: {1e3 * per_token[variant]:.3f} ms CPU per token ({tokens:.0f} tokens per call)")
    print(f"protocol/default engine CPU per token: {per_token['protocol'] / per_token['default']:.2f}")


if __name__ == "__main__":
    main()
