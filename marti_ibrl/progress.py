"""Progress bars that read well both on a terminal and in a log file (a Slurm job's ``.out``, ``> log``).

On a terminal, :func:`bar` is tqdm as it is. When stderr is not a terminal it is the same tqdm writing through
:class:`PlainLines`: every update becomes one plain line (no carriage return, no cursor movement), at most one per
:data:`LOG_INTERVAL` seconds per bar (and its last state when it closes), so a job file reads top to bottom.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from tqdm import tqdm

LOG_INTERVAL = 30.0
"""Seconds between two lines of one bar in a log file."""
_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # cursor moves and erasures tqdm uses for nested bars


class PlainLines:
    """A text stream for tqdm that turns its redraws into whole lines: ``\\r`` and ANSI control sequences become
    line ends or nothing, blank and repeated lines are dropped."""

    def __init__(self, stream: Any):
        self.stream = stream
        self._last = ""

    def write(self, text: str) -> int:
        for part in re.split(r"[\r\n]", _CONTROL.sub("", text)):
            part = part.strip()
            if part and part != self._last:
                self.stream.write(part + "\n")
                self._last = part
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def log_style(stream: Any = None) -> dict[str, Any]:
    """tqdm's keyword arguments for ``stream`` (default stderr): nothing on a terminal, plain lines otherwise."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return {}
    return {"file": PlainLines(stream), "mininterval": LOG_INTERVAL, "maxinterval": LOG_INTERVAL, "ascii": True}


def bar(*args: Any, **kwargs: Any) -> tqdm:
    """``tqdm(*args, **kwargs)``, in plain lines when stderr is not a terminal (:func:`log_style`)."""
    return tqdm(*args, **{**log_style(kwargs.get("file")), **kwargs})


def line(text: str) -> None:
    """``text`` as one line on stdout, flushed now and written above any live bar (``tqdm.write``): a run's table
    rows read as they happen, in a terminal as in a Slurm ``.out``."""
    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()
