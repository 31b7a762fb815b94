"""``marti-ibrl``: train | plan | eval | diagnose | report | dond sample / check-data | patch | demo | telesales profiles | sft |
model list / get | play | annotate.

``main(argv)`` parses; ``train`` hands a validated :class:`~marti_ibrl.config.Config` to
:func:`marti_ibrl.trainer.train`. The environments' own subcommands (``dond``, ``telesales``, ``sft``) are added by
their registry specs (:mod:`marti_ibrl.envs.registry`; handlers in :mod:`marti_ibrl.commands`). Heavy imports
(torch, Ray, OpenRLHF) happen only in the command that needs them, so ``--help`` and config errors are instant.
"""

from __future__ import annotations

import argparse
import sys

from marti_ibrl.config import ConfigError, load_config


def _cmd_train(args: argparse.Namespace) -> int:
    def fail(e: ConfigError) -> int:
        print(f"marti-ibrl train: error: {e}", file=sys.stderr)
        return 2

    try:
        cfg = load_config(args.flags)
        from marti_ibrl.device import check_device_dtype, resolve_device

        # before the trainer's imports (Ray, DeepSpeed) print anything
        check_device_dtype(cfg.ds.param_dtype, resolve_device(cfg.train.device))
    except ConfigError as e:
        return fail(e)
    from marti_ibrl.backend.nodes import NodeLostError
    from marti_ibrl.trainer import TrainingStopped, train

    try:
        train(cfg)  # the trainer's own checks (prompts that fit --rollout.max_len) come before Ray starts
    except ConfigError as e:
        return fail(e)
    except NodeLostError as e:  # the cluster lost a node: resumable from the last commit (the message says how)
        print(f"marti-ibrl train: error: {e}", file=sys.stderr)
        return 3
    except TrainingStopped as e:  # NaN/inf rewards, steps or weights past their limits; the last commit is intact
        print(f"marti-ibrl train: error: {e}", file=sys.stderr)
        return 4
    return 0


def _cmd_patch(args: argparse.Namespace) -> int:
    from marti_ibrl.patching import PatchError
    from marti_ibrl.patching import main as patch_main

    try:
        if args.action == "export":
            from marti_ibrl.patch_export import main as export_main

            return export_main(args.check, args.against, args.out)
        return patch_main(args.action, args.root)
    except PatchError as e:
        print(f"marti-ibrl patch: error: {e}", file=sys.stderr)
        return 2


def _cmd_demo(args: argparse.Namespace) -> int:
    from marti_ibrl.demo import main as demo_main

    return demo_main(args)


def _cmd_report(args: argparse.Namespace) -> int:
    from marti_ibrl.eval.report import write_report

    try:
        path = write_report(args.run_dir, args.eval, args.reference)
    except (FileNotFoundError, ValueError) as e:
        print(f"marti-ibrl report: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def _cmd_export_merged(args: argparse.Namespace) -> int:
    from marti_ibrl.lora import adapter_base, export_merged

    try:
        base = adapter_base(args.adapter, args.base)
    except ValueError as e:
        print(f"marti-ibrl export-merged: error: {e}", file=sys.stderr)
        return 2
    out = export_merged(base, args.adapter, args.out, args.dtype)
    print(f"wrote {out} ({base} + {args.adapter}, merged)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marti-ibrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="IB-RL training (Ray + DeepSpeed)",
        description="Flags: --config FILE.yaml, --section.key VALUE (see marti_ibrl/config.py), --roleN.key VALUE.",
    )
    train.set_defaults(func=_cmd_train)

    from marti_ibrl.envs import registry

    for spec in registry.specs():  # each environment's own subcommands (marti_ibrl/commands/)
        if spec.commands is not None:
            spec.commands(sub)

    patch = sub.add_parser("patch", help="apply / check / revert our OpenRLHF patches; export: git am them upstream")
    patch.add_argument("action", choices=["apply", "check", "revert", "export"])
    patch.add_argument("--root", help="directory holding the openrlhf package (default: the installed one)")
    patch.add_argument("--check", action="store_true", help="export: also run OpenRLHF's suite on the series")
    patch.add_argument("--against", help="export: your OpenRLHF git checkout (default: the pristine wheel)")
    patch.add_argument("--out", help="export: keep the git repository here (a new or empty directory)")
    patch.set_defaults(func=_cmd_patch)

    demo = sub.add_parser("demo", help="the embedded CPU default: tiny model, SFT warm start, IB-RL on DoND")
    demo.add_argument("--config", default="recipes/dond/tiny-cpu.yaml", help="IB-RL recipe (YAML)")
    demo.add_argument("--out", default="runs/demo", help="output directory")
    demo.add_argument("--iterations", type=int, default=None, help="IB-RL iterations (default: the recipe's)")
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
    demo.set_defaults(func=_cmd_demo)

    from marti_ibrl.plan import add_plan_parser

    add_plan_parser(sub)

    from marti_ibrl.eval.command import add_eval_parser

    add_eval_parser(sub)

    from marti_ibrl.eval.diagnose import add_diagnose_parser

    add_diagnose_parser(sub)

    report = sub.add_parser("report", help="RUN_DIR/report.md: training curves, eval tables, GEE statistics")
    report.add_argument("run_dir", help="a training run directory (or any directory holding eval/)")
    report.add_argument("--eval", default=None, help="eval directory (default: RUN_DIR/eval)")
    report.add_argument("--reference", default=None, help="reference policy of the GEE comparisons (default: first)")
    report.set_defaults(func=_cmd_report)

    from marti_ibrl.models import add_model_parser

    add_model_parser(sub)

    merged = sub.add_parser(
        "export-merged",
        help="a LoRA role's adapter merged into its base: an ordinary HF checkpoint",
        description="ADAPTER: a peft directory (RUN/ROLE/hf, RUN/pool/ROLE/vNNNNNN); the base defaults to the one its "
        "adapter_config.json names (the role's --roleN.pretrain).",
    )
    merged.add_argument("adapter")
    merged.add_argument("out")
    merged.add_argument("--base", default=None, help="base checkpoint (default: the adapter's base_model_name_or_path)")
    merged.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    merged.set_defaults(func=_cmd_export_merged)

    from marti_ibrl.people.command import add_people_parsers

    add_people_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from marti_ibrl import quiet

    quiet.install()  # the start-up notices nobody can act on (pynvml, Ray's tip, DeepSpeed's CPU line)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in ("train", "plan"):
        args.flags = rest  # dotted flags are the config's business (marti_ibrl.config.load_config)
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
