"""Rollout batching: 64 DoND dialogues with a tiny model, batched per turn vs one dialogue at a time.

Both runs use the same two HF-generate engines (one per role, Ray actors) and the same runner; the
only difference is how many dialogues are live at once. Throughput = generated tokens / second.
The last line is ``batched/sequential throughput ratio: X.XX`` (goal >= 8x).

    .venv/bin/python benchmarks/rollout_batching.py [--dialogues 64] [--max-rounds 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import ray
from transformers import AutoTokenizer

from marti_ibrl.envs.dond import DondEnv, generate_scenarios
from marti_ibrl.rewards import env_reward
from marti_ibrl.rollout.engines import HFGenerateEngineActor
from marti_ibrl.rollout.runner import DialogueRunner, Policy
from marti_ibrl.tiny import build_tiny_dond_model


def tokens(trajectories) -> int:
    return sum(len(t.token_ids) for traj in trajectories for t in traj.turns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dialogues", type=int, default=64)
    ap.add_argument("--max-rounds", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_dond_model(tmp)
        ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="ERROR")
        env = DondEnv(max_rounds=args.max_rounds, prompt_style="compact")
        tok = AutoTokenizer.from_pretrained(model)
        policies = {
            r: Policy("current", [HFGenerateEngineActor.remote(model=model, seed=i)], tok)
            for i, r in enumerate(env.roles)
        }
        runner = DialogueRunner(
            env,
            {r: env_reward(env) for r in env.roles},
            {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": args.max_new_tokens},
            max_len=2048,
        )
        scenarios = [(s.uid, s) for s in generate_scenarios(args.dialogues, 7)]
        runner.run(scenarios[:2], 1, policies)  # warm-up both engines

        t0 = time.perf_counter()
        batched = runner.run(scenarios, 1, policies)
        t_batched = time.perf_counter() - t0
        t0 = time.perf_counter()
        sequential = [traj for sc in scenarios for traj in runner.run([sc], 1, policies)]
        t_seq = time.perf_counter() - t0
        ray.shutdown()

    tp_b, tp_s = tokens(batched) / t_batched, tokens(sequential) / t_seq
    print(
        f"dialogues: {len(batched)}  turns batched/sequential: {sum(len(t.turns) for t in batched)}"
        f"/{sum(len(t.turns) for t in sequential)}"
    )
    print(f"batched:    {t_batched:7.2f} s  {tp_b:9.1f} tok/s")
    print(f"sequential: {t_seq:7.2f} s  {tp_s:9.1f} tok/s")
    print(f"batched/sequential throughput ratio: {tp_b / tp_s:.2f}")


if __name__ == "__main__":
    main()
