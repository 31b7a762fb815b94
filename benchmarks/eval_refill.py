"""Evaluation throughput: dialogues played in lock-step chunks vs a refilled pool of live dialogues.

``marti-ibrl eval`` plays ``--batch`` dialogues at once. Lock-step (``flush_every=1``): a chunk of ``--batch``
dialogues runs until its longest dialogue ends, the batches shrinking as the short ones finish, then the next chunk
starts. Refill (the default, ``DialogueRunner.run(max_live=...)``): a finished dialogue is replaced by a waiting one
at the next turn, so the engines' batches stay full. Same checkpoint, engines, scenarios and counterpart; the two
modes alternate (twice each). Needs a checkpoint that plays the protocol (dialogue lengths must vary for refill to
matter), e.g. the mini Table 2 SFT init. The last line is ``refill/lock-step throughput ratio: X.XX``.

    .venv/bin/python benchmarks/eval_refill.py --model runs/mini_table2/sft [--scenarios 128 --batch 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from marti_ibrl.backend.cluster import start_ray
from marti_ibrl.backend.stack import FrozenEngines
from marti_ibrl.envs.dond import DondEnv, generate_scenarios
from marti_ibrl.eval.episodes import Named
from marti_ibrl.eval.evaluator import Evaluator


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF checkpoint that plays the DoND protocol")
    ap.add_argument("--counterpart", default="heldout:hardliner")
    ap.add_argument("--scenarios", type=int, default=128, help="scenarios (x 2 seats) per measurement")
    ap.add_argument("--batch", type=int, default=64, help="dialogues in play at once")
    ap.add_argument("--num-engines", type=int, default=2)
    ap.add_argument("--max-rounds", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--show-complement", action="store_true")
    args = ap.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        print(f"eval_refill: error: {args.model} is not an HF checkpoint (no config.json)", file=sys.stderr)
        return 2

    env = DondEnv(
        max_rounds=args.max_rounds, prompt_style="compact", bot_speech="markers", show_complement=args.show_complement
    )
    scenarios = [(s.uid, s) for s in generate_scenarios(args.scenarios, 4242)]
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": args.max_new_tokens}
    start_ray(args.num_engines, "cpu", log_to_driver=False)
    engines = FrozenEngines("cpu", args.num_engines, seed=0, max_len=512)
    ev = Evaluator(env, scenarios, sampling, max_len=512, engines=engines, chunk=args.batch)
    policy, counterpart = Named("policy", f"checkpoint:{args.model}"), Named("counterpart", args.counterpart)
    rates: dict[str, list[float]] = {"lock-step": [], "refill": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ev.run_pair(policy, counterpart, Path(tmp) / "warmup.jsonl", progress=False)  # engines up, warm
            for k, mode in enumerate(["lock-step", "refill"] * 2):
                ev.flush_every = 1 if mode == "lock-step" else 1 + 2 * args.scenarios // args.batch  # one runner call
                t0 = time.perf_counter()
                episodes = ev.run_pair(policy, counterpart, Path(tmp) / f"{k}.jsonl", progress=False)
                seconds = time.perf_counter() - t0
                rates[mode].append(len(episodes) / seconds)
                turns = sum(len(e["transcript"]) for e in episodes) / len(episodes)
                print(
                    f"{mode:9s}: {len(episodes)} episodes in {seconds:6.1f}s = {rates[mode][-1]:5.1f}/s "
                    f"(mean {turns:.1f} turns, agreement {sum(e['agreed'] for e in episodes) / len(episodes):.2f})"
                )
    finally:
        ev.close()
    best = {mode: max(r) for mode, r in rates.items()}
    print(f"refill/lock-step throughput ratio: {best['refill'] / best['lock-step']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
