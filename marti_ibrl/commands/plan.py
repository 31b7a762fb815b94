"""``marti-ibrl plan``: the dry run of a recipe's flags on an allocation (:func:`marti_ibrl.cluster.plan.make_plan`), printed;
exit 2 when the job does not fit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from marti_ibrl.cluster.memory import MAX_GPU_MEMORY_GIB
from marti_ibrl.cluster.plan import make_plan
from marti_ibrl.cluster.plan_format import format_plan
from marti_ibrl.cluster.sizing import MODEL_TABLE, PlanError
from marti_ibrl.commands.argtypes import float_range, int_range
from marti_ibrl.config import Config, ConfigError, load_config


def add_plan_parser(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="dry run: GPUs and memory per component for a recipe's flags (no GPU, no Ray)",
        description="Flags as for train (--config FILE.yaml, --section.key VALUE, --roleN.key VALUE), plus the "
        "allocation below. Exit 2 when the job does not fit.",
        allow_abbrev=False,
    )
    plan.add_argument(
        "--nodes", type=int_range(1), default=None, help="nodes of the allocation (default: as many as needed)"
    )
    plan.add_argument("--gpus-per-node", type=int_range(1), default=8, help="default: 8")
    plan.add_argument(
        "--gpu-memory",
        type=float_range(0, MAX_GPU_MEMORY_GIB, lo_open=True),
        default=80.0,
        help=f"GiB per GPU (default: 80; at most {MAX_GPU_MEMORY_GIB:g})",
    )
    plan.add_argument(
        "--model-config",
        default=None,
        help=f"model size when a checkpoint path does not exist here: {' | '.join(MODEL_TABLE)} | PATH/config.json",
    )
    plan.add_argument("--strict", action="store_true", help="checkpoints, data files and variables must exist")
    plan.add_argument(
        "--fit",
        action="store_true",
        help="propose the layouts that fit the allocation (colocation, ranks, engines, TP, ZeRO, micro-batch), best "
        "first, each as the flags to add; when none does, the smallest allocation that would (marti_ibrl/cluster/layouts.py)",
    )
    plan.set_defaults(func=main, dotted_flags=True)


def main(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        print(f"marti-ibrl plan: error: {message}", file=sys.stderr)
        return 2

    flags = list(args.flags)
    try:
        cfg, assumed = parse_flags(flags, args.strict)
        config_file = flags[flags.index("--config") + 1] if "--config" in flags else None
        p = make_plan(
            cfg,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            gpu_memory_gib=args.gpu_memory,
            model_config=args.model_config,
            config_file=config_file,
            assumed=assumed,
        )
    except (ConfigError, PlanError) as e:
        return fail(str(e))
    if args.fit:
        return fit(p, args, config_file)
    print(format_plan(p))
    if p.problems:
        return fail("does not fit: " + "; ".join(p.problems) + " (--fit proposes layouts that fit)")
    return 0


def fit(p, args: argparse.Namespace, config_file: str | None) -> int:
    """``--fit``: the layouts of :func:`marti_ibrl.cluster.layouts.propose` for this allocation, or the smallest one that has
    some; exit 2 when nothing fits."""
    from marti_ibrl.cluster.layouts import format_layouts, propose, smallest_fit

    alloc = dict(nodes=p.nodes, gpus_per_node=p.gpus_per_node, gpu_memory_gib=p.gpu_memory / 2**30)
    kw = dict(model_config=args.model_config, config_file=config_file)
    layouts = propose(p.cfg, **alloc, **kw)
    if layouts:
        print(format_layouts(layouts, **alloc))
        return 0
    bigger = smallest_fit(p.cfg, **alloc, **kw)
    where = f"{p.nodes} × {p.gpus_per_node} GPUs of {alloc['gpu_memory_gib']:g} GiB"
    if bigger is None:
        print(f"marti-ibrl plan: error: no layout fits {where}, nor 4 times as many nodes or 80 GiB GPUs",
              file=sys.stderr)  # fmt: skip
        return 2
    change, layout = bigger
    flags = " ".join(layout.flags) or "(the recipe as it is)"
    print(
        f"marti-ibrl plan: error: no layout fits {where}; the smallest change that fits: {change}, with"
        + f"\n  {layout.summary}\n  add: {flags}",
        file=sys.stderr,
    )
    return 2


def parse_flags(flags: list[str], strict: bool) -> tuple[Config, list[str]]:
    """``load_config(flags)`` exactly as ``train``; without ``strict``, missing paths and variables are assumed."""
    if "--config" in flags:
        i = flags.index("--config")
        if i + 1 < len(flags) and not Path(flags[i + 1]).is_file():
            raise ConfigError(f"--config: no such file {flags[i + 1]}")
    if strict:
        return load_config(flags), []
    missing: list[str] = []
    return load_config(flags, assumed=missing), missing
