"""What the benchmarks that keep finished units in the repository share (demo_seeds.py, learning_paths.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


TUNING_BELOW = 1000
"""The seed rule (docs/measured.md, "The seed rule"): seeds below this may be tuned on; seeds from it up judge."""
DEMO_SEEDS = tuple(range(1010, 1020))
"""The ten acceptance seeds of ``make demo``'s recipe (benchmarks/demo_seeds.py), fixed before their runs: the
rule's second block, since the recipe changed (warm start, 60 iterations) after seed 1000 of the first ran on it."""
PATH_SEEDS = (2000, 2001, 2002)
"""The acceptance seeds of every path in benchmarks/learning_paths.py, fixed before their runs."""
TUNED_ON = {"demo": (42, 1, 2, 3, 4, 7, 11), "learning_paths": (42, 1, 7, 11)}
"""The seeds each recipe was tuned or inspected on (reports name them beside the acceptance seeds)."""


def commit() -> str:
    """The checkout's short commit, ``+dirty`` with uncommitted changes to tracked files (other than
    ``benchmarks/results/``)."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(  # the benchmarks' own result files (written as their units finish) are not the code
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
        cwd=ROOT,
        capture_output=True,
    )
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_unit(path: Path, unit: dict) -> None:
    """A finished unit's JSON, written whole or not at all (a kill mid-write leaves the previous file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(unit, indent=1) + "\n")
    tmp.replace(path)


class LoadMeter:
    """The machine's 1-minute load average while a unit runs, sampled every ``every`` seconds in a daemon thread.

    A unit's seconds are a time only when nothing else ran beside it; ``mean`` (with ``os.cpu_count()``) says how
    busy the machine was, so a report can tell a time from a run measured beside another (``busy``).
    """

    def __init__(self, every: float = 10.0) -> None:
        import threading

        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import os

        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 2) if self.samples else None


def busy(unit: dict, own_load: float) -> bool:
    """Whether a unit ran beside other work: its mean load average above ``own_load`` (what the unit's own processes
    keep busy, measured alone) plus one core. Units without a record are taken as alone."""
    load = unit.get("load_average")
    return load is not None and load > own_load + 1.0


def unit_parser(doc: str, out: str, unit: str = "unit") -> argparse.ArgumentParser:
    """The command line every unit benchmark shares: ``--out`` (where its runs go), ``--rerun``, ``--report-only``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", default=out, help="where the runs go (not kept in the repository)")
    p.add_argument("--rerun", action="store_true", help=f"run a {unit} again even when its results file exists")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from benchmarks/results only")
    return p
