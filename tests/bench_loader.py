"""Import a script of ``benchmarks/`` as a module, for the tests of the benchmarks."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def benchmark_module(name: str) -> Iterator:
    """``benchmarks/NAME.py`` as module ``NAME`` (registered in sys.modules while in use: dataclasses resolve
    their annotations through it). ``benchmarks/`` is on the path while it loads: scripts import their shared
    ``units`` module from beside them, as they do when run."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(ROOT / "benchmarks"))
        yield module
    finally:
        sys.modules.pop(name, None)


def benchmark_fixture(name: str):
    """A module-scoped fixture yielding ``benchmarks/NAME.py`` (:func:`benchmark_module`): ``bench =
    benchmark_fixture("mini_table2")`` in a test module."""

    @pytest.fixture(scope="module")
    def bench():
        with benchmark_module(name) as module:
            yield module

    return bench
