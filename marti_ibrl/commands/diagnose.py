"""``marti-ibrl diagnose RUN``: checkpoint diagnostics of a training run (:mod:`marti_ibrl.eval.diagnose`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from marti_ibrl.commands.argtypes import MAX_SCENARIOS, int_range
from marti_ibrl.eval import diagnose as diagnostics
from marti_ibrl.eval.diagnose import checked_checkpoints, diagnose, run_config


def add_diagnose_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "diagnose",
        help="checkpoint diagnostics of a run: semantic-similarity heatmap, in-system vs fixed success",
        description=diagnostics.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir")
    p.add_argument("--role", required=True, help="the role whose checkpoints are diagnosed")
    p.add_argument("-n", "--num-scenarios", type=int_range(1, MAX_SCENARIOS), default=50)
    p.add_argument("--fixed", default=None, help="fixed counterpart SPEC (default: the other role's step-0 checkpoint)")
    p.add_argument("--scenario-seed", type=int, default=20261)
    p.add_argument(
        "--embedder", default=None, help="sentence-transformers model dir (default: bundled all-MiniLM-L6-v2)"
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_diagnose)
    return p


def cmd_diagnose(args) -> int:
    run_dir = Path(args.run_dir)
    try:
        run_config(run_dir)
        from marti_ibrl.backend.cluster import start_ray
        from marti_ibrl.backend.stack import FrozenEngines
        from marti_ibrl.cluster.device import resolve_device

        device = resolve_device(args.device, "--device")
        checked_checkpoints(run_dir, args.role)  # before Ray: a missing or truncated checkpoint is one line now
        start_ray(3, device, log_to_driver=False)  # at most: the checkpoint, the fixed and the in-system counterpart
        cfg = run_config(run_dir)
        engines = FrozenEngines(device, 1, args.seed, cfg.rollout.max_len, gpu_memory_utilization=0.3)
        result = diagnose(
            run_dir, args.role, args.num_scenarios, args.fixed, args.scenario_seed, args.embedder, engines
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"marti-ibrl diagnose: error: {e}", file=sys.stderr)
        return 2
    for p in result["points"]:
        print(f"step {p['checkpoint']}: agreement vs fixed {p['fixed']:.2f}, in-system {p['in_system']}")
    print(f"wrote {run_dir / 'diagnostics' / (args.role + '.json')} and figures in {run_dir / 'figures'}")
    from marti_ibrl.eval.report import refresh_report

    if line := refresh_report(run_dir, f"diagnostics of {args.role}"):
        print(line)
    return 0
