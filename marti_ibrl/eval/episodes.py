"""What every evaluation shares: ``NAME=SPEC`` names on the command line (:func:`parse_named`) and the episode
files, one JSONL line per finished episode (:func:`read_episodes` skips a line cut by a kill; :func:`resume_episodes`
moves it aside before an evaluation appends).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

SELF = "self"


_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True)
class Named:
    """``NAME=SPEC`` from the command line (the name labels tables and files)."""

    name: str
    spec: str


def parse_named(text: str, default_prefix: str = "") -> Named:
    """``NAME=SPEC`` or a bare ``SPEC`` (named after its last path component / bot name)."""
    name, eq, spec = text.partition("=")
    if not eq or ":" in name or "/" in name:
        spec = text
        if spec.startswith("endpoint:"):  # endpoint:MODEL@URL: the model, not the URL's last path component
            tail = spec.removeprefix("endpoint:").split("@")[0]
        else:
            tail = spec.rstrip("/").split("/")[-1].split(":")[-1]
        name = f"{default_prefix}{tail}" if default_prefix else tail
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", name)
    if not _NAME.match(name):
        raise ValueError(f"bad name in {text!r}: use NAME=SPEC with NAME of letters, digits, _ . + -")
    return Named(name, spec)


def read_episodes(path: Path) -> list[dict]:
    """Episodes of a JSONL file; a line that is not a JSON object (a truncated last line killed mid-write, bytes that
    are not UTF-8, nesting past :data:`marti_ibrl.safeparse.MAX_DEPTH`) is ignored."""
    from marti_ibrl import safeparse

    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        try:
            episode = safeparse.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            continue
        if isinstance(episode, dict):
            out.append(episode)
    return out


def resume_episodes(path: Path) -> list[dict]:
    """The episodes of a file about to be appended to: a last line torn by a crash is first moved aside
    (:func:`marti_ibrl.outputs.repair_jsonl`, said on stderr), so the next episode starts on a line of its own."""
    from tqdm import tqdm

    from marti_ibrl.outputs import repair_jsonl

    said = repair_jsonl(path)
    if said:
        tqdm.write(said, file=sys.stderr)
    return read_episodes(path)
