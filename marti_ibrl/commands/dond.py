"""``marti-ibrl dond ...`` subcommands: sample scenarios, check a Lewis-format data file.

DoND's :class:`~marti_ibrl.envs.registry.EnvSpec` (``marti_ibrl/entries/dond.py``) names
:func:`add_dond_subparsers` as its CLI hook; each subcommand stores its handler ``(args) -> int`` as ``args.func``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from marti_ibrl.commands.argtypes import MAX_SCENARIOS, int_range
from marti_ibrl.envs.dond.game import is_complementary, utility
from marti_ibrl.envs.dond.scenarios import LewisRecord, generate_scenarios, parse_lewis_line


def cmd_sample(args: argparse.Namespace) -> int:
    """Print ``args.n`` generated scenarios as JSON lines ``{"counts": [...], "values": [[...], [...]]}``."""
    for scenario in generate_scenarios(args.n, args.seed):
        print(json.dumps(scenario.to_json()))
    return 0


def record_scores(record: LewisRecord) -> tuple[int, int]:
    """(own, partner) score of a line under the environment's rules: Σ picks·values on a deal, else (0, 0)."""
    if not record.agreed or record.own_picks is None or record.partner_picks is None:
        return 0, 0
    if not is_complementary(record.counts, record.own_picks, record.partner_picks):
        return 0, 0
    return utility(record.own_picks, record.values), utility(record.partner_picks, record.partner_values)


def check_lines(lines: list[str]) -> tuple[dict[str, int], list[int], list[int]]:
    """Re-score every line of a Lewis-format file with the environment's rules.

    A recorded agreement is consistent iff the two recorded picks are complementary (the DondEnv deal rule,
    Lewis et al. 2017); the scores Σ picks·values then follow from the picks (:func:`record_scores`; the Lewis
    format records no separate score field, so there is nothing else to compare). A recorded no-deal (``<disagree>`` /
    ``<no_agreement>`` / ``<disconnect>``) is consistent by construction. Blank lines are skipped.
    Returns the summary counts, the 1-based numbers of mismatching lines and of unparseable lines.
    """
    summary = {"lines": 0, "agreed": 0, "no_deal": 0, "mismatches": 0, "unparseable": 0}
    mismatches: list[int] = []
    unparseable: list[int] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        summary["lines"] += 1
        try:
            record = parse_lewis_line(line)
        except ValueError:
            unparseable.append(lineno)
            continue
        if not record.agreed:
            summary["no_deal"] += 1
            continue
        summary["agreed"] += 1
        assert record.own_picks is not None and record.partner_picks is not None
        if not is_complementary(record.counts, record.own_picks, record.partner_picks):
            mismatches.append(lineno)
    summary["mismatches"] = len(mismatches)
    summary["unparseable"] = len(unparseable)
    return summary, mismatches, unparseable


def cmd_check_data(args: argparse.Namespace) -> int:
    """Check a Lewis-format file; print one JSON summary; exit 1 (offending lines on stderr) on any problem."""
    path = Path(args.file)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        print(f"marti-ibrl dond check-data: error: {path}: cannot read it as text ({why})", file=sys.stderr)
        return 2
    summary, mismatches, unparseable = check_lines(lines)
    print(json.dumps(summary))
    if mismatches:
        print(f"{path}: outcome mismatch at lines {', '.join(map(str, mismatches))}", file=sys.stderr)
    if unparseable:
        print(f"{path}: unparseable lines {', '.join(map(str, unparseable))}", file=sys.stderr)
    return 1 if mismatches or unparseable else 0


def add_dond_subparsers(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``dond sample`` and ``dond check-data`` to an argparse ``subparsers`` object; returns the dond parser."""
    dond = subparsers.add_parser("dond", help="Deal-or-No-Deal utilities")
    sub = dond.add_subparsers(dest="dond_command", required=True)

    sample = sub.add_parser("sample", help="print generated scenarios as JSON lines")
    sample.add_argument("-n", type=int_range(1, MAX_SCENARIOS), default=10, help="number of scenarios")
    sample.add_argument("--seed", type=int, default=0)
    sample.set_defaults(func=cmd_sample)

    check = sub.add_parser("check-data", help="parse and re-score a Lewis et al. (2017) data file")
    check.add_argument("file", help="Lewis-format file (one dialogue perspective per line)")
    check.set_defaults(func=cmd_check_data)
    return dond
