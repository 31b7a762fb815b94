"""What the benchmarks that keep finished units in the repository share (demo_seeds.py, learning_paths.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The checkout's short commit, ``+dirty`` with uncommitted changes to tracked files."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_unit(path: Path, unit: dict) -> None:
    """A finished unit's JSON, written whole or not at all (a kill mid-write leaves the previous file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(unit, indent=1) + "\n")
    tmp.replace(path)
