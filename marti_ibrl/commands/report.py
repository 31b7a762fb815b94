"""``marti-ibrl report RUN``: ``RUN/report.md`` (:func:`marti_ibrl.eval.report.write_report`)."""

from __future__ import annotations

import argparse
import sys


def cmd_report(args: argparse.Namespace) -> int:
    from marti_ibrl.eval.report import write_report

    try:
        path = write_report(args.run_dir, args.eval, args.reference)
    except (FileNotFoundError, ValueError) as e:
        print(f"marti-ibrl report: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def add_report_parser(sub) -> None:
    report = sub.add_parser("report", help="RUN_DIR/report.md: training curves, eval tables, GEE statistics")
    report.add_argument("run_dir", help="a training run directory (or any directory holding eval/)")
    report.add_argument("--eval", default=None, help="eval directory (default: RUN_DIR/eval)")
    report.add_argument("--reference", default=None, help="reference policy of the GEE comparisons (default: first)")
    report.set_defaults(func=cmd_report)
