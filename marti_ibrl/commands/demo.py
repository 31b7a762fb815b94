"""``marti-ibrl demo``: the embedded CPU default (:mod:`marti_ibrl.demo`)."""

from __future__ import annotations

import argparse

from marti_ibrl.commands.argtypes import int_range
from marti_ibrl.commands.train import with_schema_flags


def cmd_demo(args: argparse.Namespace) -> int:
    from marti_ibrl.demo import main as demo_main

    return demo_main(args)


def add_demo_parser(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="the embedded CPU default: tiny model, SFT warm start, IB-RL on DoND",
        description="The embedded CPU default; every train flag (--section.key VALUE, --roleN.key VALUE, listed "
        "below) overrides the recipe, e.g. marti-ibrl demo --role1.lr 5e-4 --train.seed 1.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    with_schema_flags(demo)
    demo.add_argument("--config", default="recipes/dond/tiny-cpu.yaml", help="IB-RL recipe (YAML)")
    demo.add_argument("--out", default="runs/demo", help="output directory")
    demo.add_argument("--iterations", type=int_range(1), default=None, help="IB-RL iterations (default: the recipe's)")
    demo.add_argument(
        "--model",
        default="tiny",
        help="tiny (built locally, seconds) or a `marti-ibrl model list` name, e.g. smollm2-135m-instruct "
        "(with --config recipes/dond/smollm2-cpu.yaml: `make demo MODEL=smollm2`)",
    )
    sft = demo.add_mutually_exclusive_group()
    sft.add_argument(
        "--sft",
        default=None,
        metavar="DIR",
        help="start IB-RL from this SFT warm start (made by --make-sft with the same recipe) instead of training one",
    )
    sft.add_argument(
        "--make-sft",
        default=None,
        metavar="DIR",
        help="only build the model and its SFT warm start into DIR, with demo_sft.json saying how (then use --sft DIR)",
    )
    demo.set_defaults(func=cmd_demo, dotted_flags=True)
