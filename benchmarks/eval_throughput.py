"""Evaluation throughput: what the mini Table 2 evaluation gained from the engine's attention, prefilling new
dialogues and streaming pairs.

Three measurements, each alternating its two modes twice on the same checkpoint, engines and scenarios:

0. **Engine, one turn of cached dialogues** (in-process ``HFGenerateEngine``, ``--cached`` dialogues after
   ``--turns`` turns): transformers' SDPA, which copies every grouped K/V head per query head whenever there is a
   padding mask (so the whole KV cache, each layer, each decoded token), vs the engine's ``sdpa_gqa``, which hands
   the grouped heads to the kernel as they are. Same samples either way.
1. **Engine, one mixed batch** (in-process ``HFGenerateEngine``): ``--cached`` dialogues extending their prefix cache
   plus ``--fresh`` new ones (a whole system prompt). Without the prefill the batch computes the longest uncached
   suffix (a whole prompt) for every row; with it (``HFGenerateEngine._prefill_new_sessions``) the new rows are
   cached on their own first and the batch computes only the short suffixes. Same samples either way.
2. **Evaluation** (Ray engines, as ``marti-ibrl eval``): one policy against the held-out bots and itself, played pair
   by pair with 128 dialogues at once (the old benchmark setting) vs one stream of all pairs
   (``Evaluator.run_pairs``) with 1024 at once (the mini Table 2 setting now).

The last lines are ``sdpa_gqa/sdpa engine turn speed-up: X.XX``, ``prefill/no-prefill batch speed-up: X.XX`` and
``stream/per-pair throughput ratio: X.XX``.

    .venv/bin/python benchmarks/eval_throughput.py --model runs/mini_table2/sft [--scenarios 100]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from marti_ibrl.envs.dond import DondEnv, generate_scenarios
from marti_ibrl.envs.dond.heldout import HELDOUT_BOTS
from marti_ibrl.eval.episodes import SELF, Named
from marti_ibrl.eval.evaluator import Evaluator


def _played_engine(model: str, env: DondEnv, n: int, turns: int, max_new_tokens: int):
    """An in-process engine with ``n`` dialogues that played ``turns`` turns (each seat's prefix cached)."""
    from marti_ibrl.rollout.engines import HFGenerateEngine
    from marti_ibrl.rollout.render import RoleView

    engine = HFGenerateEngine(model, seed=0)
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": max_new_tokens, "seed": 1}
    views = [RoleView(engine.tokenizer, env.system_prompt(s, "agent1")) for s in generate_scenarios(n, 9)]
    ids = [f"d{i}" for i in range(n)]
    for _ in range(turns):
        outs = engine.generate_batch([v.generation_prompt() for v in views], sampling, ids)
        for view, out in zip(views, outs):
            view.add_own(out["token_ids"], out["logprobs"], finished=out["finish_reason"] == "stop")
            view.add_counterpart("<try> item0=1 item1=1 item2=0 <try>")
    return engine, views, ids, sampling


def _alternate(engine, modes: dict, prompts, sampling, ids) -> dict[str, float]:
    """Best seconds of one ``generate_batch`` per mode, alternating the modes twice from the same caches.

    ``modes``: name -> a function that sets the engine up for that mode."""
    start = dict(engine.sessions)
    times: dict[str, list[float]] = {m: [] for m in modes}
    for mode in list(modes) * 2:
        modes[mode]()
        engine.sessions.clear()
        engine.sessions.update(start)
        before = engine.stats["computed_tokens"]
        t0 = time.perf_counter()
        engine.generate_batch(prompts, sampling, ids)
        times[mode].append(time.perf_counter() - t0)
        print(
            f"engine {mode:10s}: {times[mode][-1]:6.2f}s, {engine.stats['computed_tokens'] - before} prompt positions"
        )
    return {m: min(t) for m, t in times.items()}


def engine_prefill(model: str, env: DondEnv, cached: int, fresh: int, max_new_tokens: int) -> float:
    """Seconds of one mixed batch without / with the prefill of new dialogues; returns the speed-up."""
    from marti_ibrl.rollout.render import RoleView

    engine, views, ids, sampling = _played_engine(model, env, cached, 1, max_new_tokens)
    views += [RoleView(engine.tokenizer, env.system_prompt(s, "agent1")) for s in generate_scenarios(fresh, 10)]
    ids += [f"new{i}" for i in range(fresh)]
    prefill = engine._prefill_new_sessions

    def use(fn):
        return lambda: setattr(engine, "_prefill_new_sessions", fn)

    best = _alternate(
        engine,
        {"no prefill": use(lambda *_: None), "prefill": use(prefill)},
        [v.generation_prompt() for v in views],
        sampling,
        ids,
    )
    return best["no prefill"] / best["prefill"]


def engine_attention(model: str, env: DondEnv, n: int, turns: int, max_new_tokens: int) -> float:
    """Seconds of one turn of ``n`` cached dialogues with transformers' SDPA (K/V heads copied per query head under
    the padding mask) and with the engine's ``sdpa_gqa``; returns the speed-up."""
    engine, views, ids, sampling = _played_engine(model, env, n, turns, max_new_tokens)

    def use(attn: str):
        return lambda: engine.model.set_attn_implementation(attn)

    best = _alternate(
        engine,
        {"sdpa": use("sdpa"), "sdpa_gqa": use("sdpa_gqa")},
        [v.generation_prompt() for v in views],
        sampling,
        ids,
    )
    return best["sdpa"] / best["sdpa_gqa"]


def eval_stream(model: str, env: DondEnv, n: int, max_new_tokens: int) -> float:
    """Episodes/s of the per-pair and the streamed evaluation of one policy; returns their ratio."""
    from marti_ibrl.backend.cluster import start_ray
    from marti_ibrl.backend.stack import FrozenEngines

    scenarios = [(s.uid, s) for s in generate_scenarios(n, 4242)]
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": max_new_tokens}
    start_ray(2, "cpu", log_to_driver=False)
    ev = Evaluator(env, scenarios, sampling, max_len=512, engines=FrozenEngines("cpu", 2, seed=0, max_len=512))
    policy = Named("policy", f"checkpoint:{model}")
    counterparts = [Named(b, f"heldout:{b}") for b in HELDOUT_BOTS] + [Named("self", SELF)]
    rates: dict[str, list[float]] = {"per pair": [], "stream": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ev.run_pair(policy, counterparts[0], Path(tmp) / "warmup.jsonl", progress=False)  # engines up, warm
            for k, mode in enumerate(["per pair", "stream"] * 2):
                files = [(c, Path(tmp) / f"{k}-{c.name}.jsonl") for c in counterparts]
                t0 = time.perf_counter()
                if mode == "per pair":
                    ev.chunk = 128
                    played = [ev.run_pair(policy, c, f, progress=False) for c, f in files]
                else:
                    ev.chunk = 1024
                    played = ev.run_pairs(policy, files, progress=False)
                seconds = time.perf_counter() - t0
                episodes = sum(len(p) for p in played)
                rates[mode].append(episodes / seconds)
                print(f"eval {mode:8s}: {episodes} episodes in {seconds:6.1f}s = {rates[mode][-1]:5.1f}/s")
    finally:
        ev.close()
    return max(rates["stream"]) / max(rates["per pair"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF checkpoint that plays the DoND protocol (mini Table 2 SFT)")
    ap.add_argument("--scenarios", type=int, default=100, help="scenarios (x 2 seats) per pair in the evaluation")
    ap.add_argument("--cached", type=int, default=256, help="dialogues with a prefix cache in the engine batch")
    ap.add_argument("--fresh", type=int, default=16, help="new dialogues in the engine batch")
    ap.add_argument("--turns", type=int, default=4, help="turns the dialogues played before the attention timing")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        print(f"eval_throughput: error: {args.model} is not an HF checkpoint (no config.json)", file=sys.stderr)
        return 2
    env = DondEnv(max_rounds=5, prompt_style="compact", bot_speech="markers", show_complement=True)
    attention = engine_attention(args.model, env, args.cached, args.turns, args.max_new_tokens)
    speedup = engine_prefill(args.model, env, args.cached, args.fresh, args.max_new_tokens)
    ratio = eval_stream(args.model, env, args.scenarios, args.max_new_tokens)
    print(f"sdpa_gqa/sdpa engine turn speed-up: {attention:.2f}")
    print(f"prefill/no-prefill batch speed-up: {speedup:.2f}")
    print(f"stream/per-pair throughput ratio: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
