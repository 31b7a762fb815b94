"""TeleSales commands: ``marti-ibrl telesales sft --role sales|customer``, ``telesales profiles`` and
``telesales eval``; :func:`add_telesales_parsers` adds all three (TeleSales'
:class:`~marti_ibrl.envs.registry.EnvSpec` CLI hook, ``marti_ibrl/entries/telesales.py``). The old name
``marti-ibrl sft --role R --transcripts F`` still works and says where the command went (``marti-ibrl sft`` is now
any environment's warm start from scripted players: :mod:`marti_ibrl.commands.sft`).

``marti-ibrl telesales sft``: SFT initialisation of a TeleSales role from call transcripts (paper §5.1: both roles start from SFT
checkpoints; transcript format and training views: :mod:`marti_ibrl.envs.telesales.transcripts`).

Validates the transcripts, converts them to the role's view (Tables 15/16 system prompts, what the role hears),
writes ``OUT/sft_data.jsonl`` and fine-tunes ``--pretrain`` with OpenRLHF's own SFT trainer
(:func:`marti_ibrl.sft.run_sft`); the checkpoint (HF model + tokenizer) is ``OUT`` itself, its log ``OUT/sft.log``.
Input errors (role, files, transcripts, hyperparameters, records that cannot fill one optimizer step) exit 2 with
one line before any training; a failed training run exits 1 with the log's tail.

``marti-ibrl telesales profiles``: customer profiles as JSON lines (paper Appendix D; :mod:`marti_ibrl.envs.telesales.profiles`).

``marti-ibrl telesales eval``: the held-out evaluation, :mod:`marti_ibrl.commands.telesales_eval`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from marti_ibrl.commands.argtypes import MAX_SCENARIOS, float_range, int_range, path_arg
from marti_ibrl.envs.telesales.env import SEATS, TeleSalesEnv
from marti_ibrl.envs.telesales.transcripts import TranscriptError, load_transcripts, records_for_role

PROG = "marti-ibrl telesales sft"
DATA_FILE = "sft_data.jsonl"


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def check_lengths(pretrain: str, records: list[dict], max_len: int, batch_size: int) -> str | None:
    """Tokenize ``records`` as OpenRLHF's multiturn SFT dataset does; warn about records it drops (their prompt,
    all but the last message, reaches ``max_len - 2`` tokens) or truncates. Returns an error when the tokenizer has
    no chat template or fewer than ``batch_size`` records remain (no optimizer step would run), else None."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(pretrain)
    except Exception as e:  # any loading failure is an input error here
        return f"cannot load the tokenizer of {pretrain}: {e}"
    if not tokenizer.chat_template:
        return f"the tokenizer of {pretrain} has no chat template (OpenRLHF's multiturn SFT needs one)"

    def n_tokens(messages: list[dict], prompt: bool) -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    dropped = truncated = 0
    for record in records:
        messages = record["messages"]
        if n_tokens(messages[:-1], True) >= max_len - 2:
            dropped += 1
        elif n_tokens(messages, False) > max_len:
            truncated += 1
    if dropped:
        _warn(f"{dropped} of {len(records)} records have a prompt of >= --max-len - 2 = {max_len - 2} tokens: "
              "OpenRLHF drops them")  # fmt: skip
    if truncated:
        _warn(f"{truncated} of {len(records)} records are longer than --max-len {max_len} tokens: OpenRLHF cuts them")
    kept = len(records) - dropped
    if kept < batch_size:
        return f"{kept} usable records, fewer than --batch-size {batch_size}: no optimizer step would run"
    return None


def cmd_sft(args: argparse.Namespace) -> int:
    if args.role not in SEATS:
        return _fail(f"unknown role {args.role!r} (expected sales or customer)")
    for flag in ("epochs", "batch_size", "micro_batch_size", "max_len"):
        if getattr(args, flag) < 1:
            return _fail(f"--{flag.replace('_', '-')} must be >= 1 (got {getattr(args, flag)})")
    if not args.lr > 0:
        return _fail(f"--lr must be > 0 (got {args.lr})")
    if args.batch_size % args.micro_batch_size:
        return _fail(f"--batch-size {args.batch_size} is not a multiple of --micro-batch-size {args.micro_batch_size}")
    if not os.path.isfile(args.transcripts):
        return _fail(f"transcripts file not found: {args.transcripts}")
    if not os.path.isdir(args.pretrain):
        return _fail(f"pretrain model directory not found: {args.pretrain}")
    if not os.path.isfile(os.path.join(args.pretrain, "config.json")):
        return _fail(f"{args.pretrain} is not a Hugging Face model directory (no config.json)")

    env = TeleSalesEnv()
    try:
        loaded = load_transcripts(args.transcripts, env, strict=not args.lenient)
    except TranscriptError as e:
        return _fail(f"{e}" if args.lenient else f"{e}; --lenient skips bad calls")
    except (OSError, UnicodeDecodeError) as e:
        return _fail(f"cannot read {args.transcripts}: {e}")
    for error in loaded.skipped:
        _warn(f"skipped {error}")
    if loaded.skipped:
        _warn(f"skipped {len(loaded.skipped)} bad calls, kept {len(loaded.calls)}")
    records = records_for_role(loaded.calls, args.role, env)
    if not records:
        return _fail(f"no {args.role} turns in {args.transcripts}")
    problem = check_lengths(args.pretrain, records, args.max_len, args.batch_size)
    if problem:
        return _fail(problem)

    from marti_ibrl import sft

    data = sft.write_sft_data(os.path.join(args.out, DATA_FILE), records)
    print(f"{len(records)} {args.role} SFT records from {len(loaded.calls)} calls -> {data}", flush=True)
    hparams: dict[str, Any] = dict(
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        micro_batch_size=args.micro_batch_size,
        max_len=args.max_len,
        seed=args.seed,
    )
    try:
        out = sft.run_sft(args.pretrain, data, args.out, progress=lambda line: print(line, flush=True), **hparams)
    except RuntimeError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print(f"{args.role} checkpoint: {out} (log: {os.path.join(out, 'sft.log')})")
    return 0


def cmd_sft_old_name(args: argparse.Namespace) -> int:
    """``marti-ibrl sft --role R --transcripts F``: the old name of ``marti-ibrl telesales sft``; runs it, after one
    line saying so."""
    print(f"marti-ibrl sft: note: this is {PROG} (TeleSales' SFT); the old name still works", file=sys.stderr)
    return cmd_sft(args)


def add_sft_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Wire ``sft`` into ``telesales``' subparsers."""
    p = subparsers.add_parser(
        "sft",
        help="SFT a role on call transcripts with OpenRLHF's SFT trainer (paper §5.1)",
        description=" ".join(__doc__.split("\n\n")[1:3]).replace("\n", " "),
    )
    p.add_argument("--role", required=True, help="sales | customer")
    p.add_argument("--transcripts", required=True, metavar="FILE.jsonl",
                   help="call transcripts (format: marti_ibrl/envs/telesales/transcripts.py)")  # fmt: skip
    p.add_argument("--pretrain", required=True, metavar="MODEL_DIR", help="Hugging Face model directory to start from")
    p.add_argument(
        "--out", required=True, metavar="DIR", help="the checkpoint directory (also sft_data.jsonl, sft.log)"
    )
    p.add_argument("--epochs", type=int_range(1), default=1, help="default: 1")
    p.add_argument("--lr", type=float_range(0, lo_open=True), default=1e-5, help="default: 1e-5")
    p.add_argument("--batch-size", type=int_range(1), default=16, help="records per optimizer step (default: 16)")
    p.add_argument("--micro-batch-size", type=int_range(1), default=1, help="records per forward pass (default: 1)")
    p.add_argument("--max-len", type=int_range(2), default=4096, help="tokens per record (default: 4096)")
    p.add_argument("--seed", type=int, default=42, help="default: 42")
    p.add_argument(
        "--lenient", action="store_true", help="skip bad calls (each reported, then counted) instead of failing"
    )
    p.set_defaults(func=cmd_sft)
    return p


# ---- marti-ibrl telesales profiles ----
def cmd_telesales_profiles(args: argparse.Namespace) -> int:
    from marti_ibrl.envs.telesales.profiles import SPLITS, generate_profiles, write_jsonl

    def fail(message: str) -> int:
        print(f"marti-ibrl telesales profiles: error: {message}", file=sys.stderr)
        return 2

    if args.split not in SPLITS:
        return fail(f"unknown split {args.split!r} (expected one of: {', '.join(SPLITS)})")
    if args.n < 1:
        return fail(f"-n must be >= 1 (got {args.n})")
    if args.out != "-" and os.path.exists(args.out) and not args.overwrite:
        what = "a directory" if os.path.isdir(args.out) else "a file"
        return fail(f"--out {args.out} is {what} already; give another --out, or --overwrite to replace a file")
    profiles = generate_profiles(args.n, args.seed, args.split)
    if args.out == "-":
        write_jsonl(profiles, sys.stdout)
        return 0
    try:
        with open(args.out, "w", encoding="utf-8") as fp:
            write_jsonl(profiles, fp)
    except OSError as e:
        return fail(f"cannot write {args.out}: {e.strerror or e}")
    print(f"wrote {args.n} {args.split} profiles to {args.out}", file=sys.stderr)
    return 0


def add_profiles_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Wire ``profiles`` into ``marti-ibrl telesales`` (handler in ``args.func``)."""
    profiles = subparsers.add_parser(
        "profiles", help="generate customer profiles as JSON lines (paper Appendix D; training 28, eval 40 attributes)"
    )
    profiles.add_argument("--split", default="eval", help="train | eval (default: eval)")
    profiles.add_argument("-n", type=int_range(1, MAX_SCENARIOS), default=500, help="number of profiles (default: 500)")
    profiles.add_argument("--seed", type=int, default=0)
    profiles.add_argument("--out", default="-", type=path_arg, help="output JSONL file, or - for stdout (default)")
    profiles.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    profiles.set_defaults(func=cmd_telesales_profiles)
    return profiles


# ---- marti-ibrl telesales calls ----
def cmd_telesales_calls(args: argparse.Namespace) -> int:
    """Scripted calls (:mod:`marti_ibrl.envs.telesales.scripted`) as transcripts ``telesales sft`` reads."""
    import json

    from marti_ibrl.envs.telesales import scripted

    def fail(message: str) -> int:
        print(f"marti-ibrl telesales calls: error: {message}", file=sys.stderr)
        return 2

    unknown = [s for s in args.strategies if s not in scripted.STRATEGIES]
    if unknown:
        return fail(f"unknown strategy {unknown[0]!r} (expected some of: {', '.join(scripted.STRATEGIES)})")
    if os.path.exists(args.out) and not args.overwrite:
        what = "a directory" if os.path.isdir(args.out) else "a file"
        return fail(f"--out {args.out} is {what} already; give another --out, or --overwrite to replace a file")
    if os.path.isdir(args.out):
        return fail(f"--out {args.out} is a directory; give a file")
    calls = scripted.scripted_calls(args.n, args.seed, args.strategies)
    try:
        with open(args.out, "w", encoding="utf-8") as fp:
            for call in calls:
                fp.write(json.dumps({k: call[k] for k in ("call_id", "profile", "turns")}, ensure_ascii=False) + "\n")
    except OSError as e:
        return fail(f"cannot write {args.out}: {e.strerror or e}")
    for strategy in args.strategies:
        mine = [c for c in calls if c["strategy"] == strategy]
        added = sum(c["reason"] == "contact_added" for c in mine)
        print(f"{strategy}: contact added in {added} of {len(mine)} calls", file=sys.stderr)
    print(f"wrote {len(calls)} calls to {args.out} (marti-ibrl telesales sft --transcripts {args.out} ...)",
          file=sys.stderr)  # fmt: skip
    return 0


def add_calls_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Wire ``calls`` into ``marti-ibrl telesales`` (handler in ``args.func``)."""
    from marti_ibrl.envs.telesales.scripted import STRATEGIES

    calls = subparsers.add_parser(
        "calls", help="scripted call transcripts (four sales strategies, a rule-based customer) for telesales sft"
    )
    calls.add_argument("-n", type=int_range(1, 100_000), default=200,
                       help="training profiles; each strategy calls every one (default: 200)")  # fmt: skip
    calls.add_argument("--seed", type=int, default=0)
    calls.add_argument("--strategies", nargs="+", default=list(STRATEGIES), metavar="NAME",
                       help=f"sales strategies to play (default: all: {' '.join(STRATEGIES)})")  # fmt: skip
    calls.add_argument("--out", required=True, type=path_arg, help="output JSONL file of call transcripts")
    calls.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    calls.set_defaults(func=cmd_telesales_calls)
    return calls


def add_telesales_parsers(subparsers: Any) -> None:
    """Add ``telesales sft``, ``telesales profiles``, ``telesales calls``, ``telesales eval`` to ``subparsers`` (the old name ``marti-ibrl
    sft --role R --transcripts F`` is a form of :mod:`marti_ibrl.commands.sft`, which runs :func:`cmd_sft_old_name`)."""
    telesales = subparsers.add_parser("telesales", help="Vehicle TeleSales: role SFT, profiles, held-out eval")
    telesales_sub = telesales.add_subparsers(dest="telesales_command", required=True)
    add_sft_parser(telesales_sub)
    add_profiles_parser(telesales_sub)
    add_calls_parser(telesales_sub)
    from marti_ibrl.commands.telesales_eval import add_telesales_eval_parser

    add_telesales_eval_parser(telesales_sub)
