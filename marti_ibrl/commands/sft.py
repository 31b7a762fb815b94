"""``marti-ibrl sft``: a warm start for any environment with scripted players (:mod:`marti_ibrl.sft.make`).

    marti-ibrl sft --env split_coins:SplitCoins --pretrain MODEL --out runs/split-sft --dialogues 2000
    marti-ibrl sft --env dond --env.prompt_style compact --env.max_rounds 5 --pretrain MODEL --out runs/dond-sft

``--env.KEY VALUE`` flags set the environment as ``train`` does (its dialogues are rendered as the RL rollout will
show them, so give the same ones). ``OUT`` is the checkpoint (HF model and tokenizer), with ``sft_data.jsonl``,
``sft.log`` and ``sft_record.json`` (how it was made, the valid self-played turns before and after); train from it
with ``--roleN.pretrain OUT``. Bad input is one line and exit 2 before any training (records longer than
``--max-len`` included: OpenRLHF would drop or cut them silently); a failed training exits 1, and so does a warm start
whose valid self-played turns are under ``--min-valid`` (it learned nothing usable; the checkpoint is kept).

The old form ``marti-ibrl sft --role sales|customer --transcripts FILE`` is ``marti-ibrl telesales sft`` (TeleSales'
SFT on call transcripts) and still works, after one line saying so.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from marti_ibrl.commands.argtypes import float_range, int_range

PROG = "marti-ibrl sft"
DEFAULTS = {"epochs": 1, "lr": 1e-4, "batch_size": 16, "micro_batch_size": 8, "max_len": 1024}
"""Any environment's SFT hyperparameters by default: a pretrained LM learning a format (SmolLM2's rate)."""
TINY_DEFAULTS = {**DEFAULTS, "lr": 7e-3, "micro_batch_size": 16}
"""The defaults for a tiny model from scratch (:func:`marti_ibrl.sft.presets.is_tiny`: ``model tiny``'s, the demo's):
the demo's SFT rate, 70 times the pretrained one."""


def defaults_for(pretrain: str) -> dict:
    """:data:`TINY_DEFAULTS` for a tiny model, else :data:`DEFAULTS`."""
    from marti_ibrl.sft.presets import is_tiny

    return dict(TINY_DEFAULTS if is_tiny(pretrain) else DEFAULTS)


TELESALES = {"epochs": 1, "lr": 1e-5, "batch_size": 16, "micro_batch_size": 1, "max_len": 4096}
"""The old form's defaults (``marti-ibrl telesales sft``'s)."""


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def cmd_sft(args: argparse.Namespace) -> int:
    flags = list(getattr(args, "flags", []))
    if args.transcripts or args.role:  # the old form: TeleSales' SFT on call transcripts
        if args.env or flags:
            return _fail("--env/--env.* make a warm start from scripted players; --role/--transcripts is TeleSales' "
                         "SFT on call transcripts (marti-ibrl telesales sft): give one or the other")  # fmt: skip
        from marti_ibrl.commands.telesales import cmd_sft_old_name

        missing = [f"--{k}" for k in ("role", "transcripts") if not getattr(args, k)]
        if missing:
            return _fail(f"the TeleSales form needs {' and '.join(missing)} too")
        for key, value in TELESALES.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
        return cmd_sft_old_name(args)
    if not args.env:
        return _fail("--env NAME is required (an environment with scripted players: dond or module:Class)")
    return make(args, flags)


def env_config(env: str, flags: list[str], pretrain: str | None = None):  # -> EnvConfig
    """The environment ``--env NAME`` with its ``--env.KEY VALUE`` ``flags``, checked as ``train`` checks it (the
    roles' checkpoints ``pretrain``, or assumed when None); ``ValueError`` with one line naming the flag."""
    from marti_ibrl.config import ConfigError, load_config
    from marti_ibrl.config.validate import env_roles

    other = [f for f in flags if f.startswith("--") and not f.startswith("--env.")]
    if other:
        raise ValueError(f"{other[0]}: only --env.KEY VALUE flags set the environment here")
    if any(f.split("=")[0] == "--env.name" for f in flags):
        raise ValueError("give the environment as --env NAME")
    try:
        roles = env_roles(env)
        given = pretrain or "MODEL"
        # the roles' rewards are not the environment's business here (TeleSales' default, its judges, needs an endpoint)
        models = [
            x for i in range(len(roles)) for x in (f"--role{i + 1}.pretrain", given, f"--role{i + 1}.reward_fn", "rule")
        ]
        return load_config(["--env.name", env, *flags, *models], assumed=None if pretrain else []).env
    except ConfigError as e:
        raise ValueError(str(e)) from None


def make(args: argparse.Namespace, flags: list[str]) -> int:
    """The warm start of ``--env`` with its ``--env.*`` flags."""
    from pathlib import Path

    if not os.path.isfile(os.path.join(args.pretrain, "config.json")):
        return _fail(f"--pretrain {args.pretrain}: not a Hugging Face model directory (no config.json)")
    try:
        env_cfg = env_config(args.env, flags, args.pretrain)
    except ValueError as e:
        return _fail(str(e))
    for key, value in defaults_for(args.pretrain).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.batch_size % args.micro_batch_size:
        return _fail(f"--batch-size {args.batch_size} is not a multiple of --micro-batch-size {args.micro_batch_size}")
    from marti_ibrl.sft.make import warm_start

    command = " ".join(["marti-ibrl sft", *map(shlex.quote, sys.argv[2:])]) if sys.argv[1:2] == ["sft"] else ""
    hparams = {k: getattr(args, k) for k in DEFAULTS}
    try:
        record = warm_start(
            env_cfg,
            args.pretrain,
            args.out,
            dialogues=args.dialogues,
            seed=args.seed,
            players=args.players,
            progress=lambda line: print(f"[sft] {line}", flush=True),
            command=command,
            **hparams,
        )
    except ValueError as e:
        return _fail(str(e))
    except RuntimeError as e:  # OpenRLHF's SFT trainer failed: its log's tail
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    valid = record["valid_turns"]["sft"]
    if valid < args.min_valid:  # it ran to the end and learned nothing usable: say so, keep what it made
        print(f"{PROG}: error: the warm start plays {valid:.0%} valid turns in self-play, under --min-valid "
              f"{args.min_valid:.0%}: it did not learn the game's format. Kept in {args.out} (remove it to retry); "
              "try more --dialogues, a higher --lr (a tiny model from scratch: 7e-3) or more --epochs",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"warm start: {args.out} (how it was made: {Path(args.out) / 'sft_record.json'}); train from it with "
          f"--roleN.pretrain {args.out}")  # fmt: skip
    return 0


def add_sft_parser(sub) -> None:
    p = sub.add_parser(
        "sft",
        help="a warm start for any environment with scripted players (OpenRLHF's SFT trainer)",
        description="A warm start for any environment, from its scripted players' dialogues (OpenRLHF's SFT trainer)."
        + "\n\n"
        + __doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--env", default=None, metavar="NAME", help="dond, or module:Class (docs/environments.md)")
    p.add_argument("--pretrain", required=True, metavar="MODEL_DIR", help="Hugging Face model directory to start from")
    p.add_argument("--out", required=True, metavar="DIR", help="the checkpoint directory (must not hold a model)")
    p.add_argument("--players", nargs="+", default=None, metavar="NAME",
                   help="the scripted players to learn from (default: all the environment has)")  # fmt: skip
    p.add_argument("--dialogues", type=int_range(1, 10_000_000), default=2000,
                   help="scripted dialogues, one record per role each (default: 2000)")  # fmt: skip
    p.add_argument("--epochs", type=int_range(1), default=None, help=f"default: {DEFAULTS['epochs']}")
    p.add_argument("--lr", type=float_range(0, lo_open=True), default=None,
                   help=f"default: {DEFAULTS['lr']}, for a tiny model (hidden size <= 256) {TINY_DEFAULTS['lr']}")  # fmt: skip
    p.add_argument("--batch-size", type=int_range(1), default=None,
                   help=f"records per optimizer step (default: {DEFAULTS['batch_size']})")  # fmt: skip
    p.add_argument("--micro-batch-size", type=int_range(1), default=None,
                   help=f"records per forward pass (default: {DEFAULTS['micro_batch_size']}, for a tiny model "
                   f"{TINY_DEFAULTS['micro_batch_size']})")  # fmt: skip
    p.add_argument("--max-len", type=int_range(2), default=None,
                   help=f"tokens per record (default: {DEFAULTS['max_len']})")  # fmt: skip
    p.add_argument("--seed", type=int, default=42, help="default: 42")
    p.add_argument("--min-valid", type=float_range(0, 1), default=0.5, metavar="SHARE",
                   help="the warm start's valid self-played turns below which the command fails (exit 1, the "
                   "checkpoint kept; default: 0.5)")  # fmt: skip
    old = p.add_argument_group("TeleSales' call transcripts (marti-ibrl telesales sft; this old form still works)")
    old.add_argument("--role", default=None, help="sales | customer")
    old.add_argument("--transcripts", default=None, metavar="FILE.jsonl")
    old.add_argument("--lenient", action="store_true", help="skip bad calls instead of failing")
    p.set_defaults(func=cmd_sft, dotted_flags=True)
