"""IB-RL from Python: a config made the way `marti-ibrl train` makes it, a run, and what it learned.

    .venv/bin/python examples/python_api.py --model recipes/dond/tiny-sft --out runs/python-api [--iterations 2]

docs/python-api.md explains each step; tests/package/test_examples.py runs this file.
"""

from __future__ import annotations

import argparse
import sys

from marti_ibrl.config import ConfigError, load_config
from marti_ibrl.eval.report import learning_summary
from marti_ibrl.trainer import IBRLTrainer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the checkpoint both roles start from")
    p.add_argument("--out", required=True, help="the run directory (a new one)")
    p.add_argument("--iterations", type=int, default=2)
    args = p.parse_args(argv)

    # 1. The config: the same flags as the command line, YAML first, every value validated (ConfigError names it).
    try:
        cfg = load_config(
            [
                *("--config", "recipes/dond/tiny-cpu.yaml", "--ckpt.path", args.out),
                *("--role1.pretrain", args.model, "--role2.pretrain", args.model),
                *("--train.iterations", str(args.iterations), "--rollout.batch_size", "4"),
            ]
        )
    except ConfigError as e:
        print(f"python_api: {e}", file=sys.stderr)
        return 2
    print(f"roles {[r.name for r in cfg.roles]}, lr {[r.lr for r in cfg.roles]}, seed {cfg.train.seed}")

    # 2. The run: the constructor starts Ray and every role's processes; fit() runs Algorithm 1; close() stops them.
    trainer = IBRLTrainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()

    # 3. What it learned: one metrics dict per iteration (the iteration table's and tensorboard's keys).
    for m in history:
        rewards = ", ".join(f"{r} {m[f'{r}/reward']:.2f}" for r in trainer.roles)
        print(f"iteration {int(m['iteration'])}: agreement {m['rollout/agreement']:.2f}, reward {rewards}")
    print(learning_summary(history))
    return 0


if __name__ == "__main__":
    sys.exit(main())
