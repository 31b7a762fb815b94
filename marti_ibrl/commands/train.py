"""``marti-ibrl train``: IB-RL training (Ray + DeepSpeed) of the validated config of its flags
(:func:`marti_ibrl.config.load_config`); exit 2 for a config error, 3 for a lost node or a local Ray that did not
start (``--ray.start_timeout``), 4 for a stopped run (the last commit intact in each)."""

from __future__ import annotations

import argparse
import sys

from marti_ibrl.config import ConfigError, load_config


def cmd_train(args: argparse.Namespace) -> int:
    def fail(e: ConfigError) -> int:
        print(f"marti-ibrl train: error: {e}", file=sys.stderr)
        return 2

    try:
        cfg = load_config(args.flags)
        from marti_ibrl.cluster.device import check_device_dtype, resolve_device

        # before the trainer's imports (Ray, DeepSpeed) print anything
        check_device_dtype(cfg.ds.param_dtype, resolve_device(cfg.train.device))
    except ConfigError as e:
        return fail(e)
    from marti_ibrl.backend.cluster import RayStartTimeout
    from marti_ibrl.cluster.nodes import NodeLostError
    from marti_ibrl.envs.custom import UserCodeError
    from marti_ibrl.outputs import disk_full
    from marti_ibrl.trainer import TrainingStopped, train

    try:
        history = train(cfg)  # the trainer's own checks (prompts that fit --rollout.max_len) come before Ray starts
    except ConfigError as e:
        return fail(e)
    except UserCodeError as e:  # an environment of your own broke its contract mid-run: the last commit is intact
        print(f"marti-ibrl train: error: {e}; nothing of this iteration was committed", file=sys.stderr)
        return 2
    except (NodeLostError, RayStartTimeout) as e:  # the cluster lost a node, or Ray hung starting: resumable
        print(f"marti-ibrl train: error: {e}", file=sys.stderr)
        return 3
    except TrainingStopped as e:  # NaN/inf rewards, steps or weights past their limits; the last commit is intact
        print(f"marti-ibrl train: error: {e}", file=sys.stderr)
        return 4
    except Exception as e:  # (last) a full disk under a checkpoint, an export or the commit: one line, never Ray's 60
        if (full := disk_full(e, cfg.ckpt.path)) is None:
            raise
        print(
            f"marti-ibrl train: error: {full}; the last commit is intact (a save that did not finish is never "
            "committed): make room and resume with the same flags and --ckpt.load_enable true",
            file=sys.stderr,
        )
        return 4
    from marti_ibrl.eval.report import finished_lines

    for line in finished_lines(cfg, history):
        print(f"[train] {line}", flush=True)
    return 0


def add_train_parser(sub) -> None:
    train = sub.add_parser(
        "train",
        help="IB-RL training (Ray + DeepSpeed)",
        description="Flags: --config FILE.yaml, --section.key VALUE, --roleN.key VALUE (every one below).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    with_schema_flags(train)
    train.set_defaults(func=cmd_train, dotted_flags=True)


def with_schema_flags(parser: argparse.ArgumentParser) -> None:
    """``--help`` of ``parser`` ends with every schema flag (:func:`marti_ibrl.config.flags_help.flags_help`), made
    when help is asked for (not at every start-up)."""
    plain = parser.format_help

    def format_help() -> str:
        from marti_ibrl.config.flags_help import flags_help

        return plain() + "\n" + flags_help()

    parser.format_help = format_help
