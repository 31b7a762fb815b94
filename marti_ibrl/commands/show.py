"""``marti-ibrl show RUN [--iteration K] [--malformed]``: the dialogues a training run kept (``RUN/transcripts.jsonl``,
``--logger.transcripts``), printed readably (:func:`marti_ibrl.rollout.transcripts.format_dialogue`), or where their
malformed turns came from (:func:`marti_ibrl.rollout.transcripts.malformed_summary`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from marti_ibrl.commands.argtypes import int_range


def cmd_show(args: argparse.Namespace) -> int:
    from marti_ibrl.rollout.transcripts import TRANSCRIPTS_FILE, format_dialogue, malformed_summary, read

    run = Path(args.run)
    if not (run / TRANSCRIPTS_FILE).is_file():
        why = (
            "no such directory" if not run.is_dir() else f"no {TRANSCRIPTS_FILE} (trained with --logger.transcripts 0?)"
        )
        print(f"marti-ibrl show: error: {run}: {why}", file=sys.stderr)
        return 2
    every = args.iteration is not None or args.all or args.malformed  # else the last iteration's only
    records = read(run, args.iteration, "all" if every else "last")
    if records.skipped:
        print(f"marti-ibrl show: note: {run / TRANSCRIPTS_FILE}: {records.skipped} line(s) skipped, not kept dialogues "
              "(cut by a crash, binary, or edited)", file=sys.stderr)  # fmt: skip
    if not records:
        kept = sorted({r["iteration"] for r in read(run, which="ends")}) if args.iteration is not None else []
        span = f"{kept[0]}..{kept[-1]}" if kept else "none"
        which = f" for iteration {args.iteration}" if args.iteration is not None else ""
        print(f"marti-ibrl show: error: {run}: no dialogues kept{which} (kept: {span})", file=sys.stderr)
        return 2
    if args.malformed:
        print(malformed_summary(records))
        return 0
    for rec in records[: args.n] if args.n else records:
        print(format_dialogue(rec), end="\n\n")
    return 0


def add_show_parser(sub) -> None:
    show = sub.add_parser(
        "show",
        help="print the dialogues a training run kept (RUN/transcripts.jsonl): the last iteration's, or --iteration K",
        description=__doc__,
    )
    show.add_argument("run", metavar="RUN", help="a training run directory")
    show.add_argument("--iteration", type=int_range(1), default=None, help="its iteration (default: the last)")
    show.add_argument("--all", action="store_true", help="every iteration's")
    show.add_argument("-n", type=int_range(1), default=None, help="at most this many dialogues")
    show.add_argument(
        "--malformed",
        action="store_true",
        help="instead of the dialogues, a table per iteration (every one, or --iteration K) and role: turns "
        "generated, malformed ones (re-sampled attempts included), at which turn, their commonest texts",
    )
    show.set_defaults(func=cmd_show)
