"""Numeric flag types with their ranges, for every command's parser: a value out of range is argparse's one
``error:`` line (exit 2) naming the flag, never a traceback or a silent wrap-around later."""

from __future__ import annotations

import argparse
import math


def int_range(lo: int, hi: int | None = None, what: str = ""):
    """An ``int`` in ``[lo, hi]`` (``hi`` None: no upper bound); ``what`` says what the bound is."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            span = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            raise argparse.ArgumentTypeError(f"expected a number {span}{what}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its message
    return parse


def float_range(lo: float, hi: float | None = None, *, lo_open: bool = False):
    """A finite ``float`` in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``); NaN and ±inf are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        low_ok = value > lo if lo_open else value >= lo
        if not math.isfinite(value) or not low_ok or (hi is not None and value > hi):
            span = (f"> {lo:g}" if lo_open else f">= {lo:g}") + ("" if hi is None else f" and <= {hi:g}")
            raise argparse.ArgumentTypeError(f"expected a finite number {span}, got {text}")
        return value

    parse.__name__ = "float"
    return parse


PORT = int_range(1, 65535, " (a TCP port)")
"""``--port``: 1..65535 (the system picks none: a link must say where it listens)."""

MAX_SCENARIOS = 1_000_000
"""``-n`` of every command that plays or generates scenarios/profiles: a documented maximum (a million takes days to
play here), so a typo of many zeros is one line, not hours of generating before the first episode."""
MAX_SAMPLES = 1_000
"""``--samples`` (episodes per scenario and seat / calls per profile)."""


def path_arg(text: str) -> str:
    """A file or directory flag: not empty (``''`` would mean the current directory, or nothing at all)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


path_arg.__name__ = "path"
