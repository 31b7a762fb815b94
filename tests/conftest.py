"""Fixtures shared across test modules."""

from __future__ import annotations

import pytest
from ray_watchdog import pytest_timeout_cancel_timer, pytest_timeout_set_timer  # noqa: F401 (hooks)
from same_iterations import same_iterations  # noqa: F401 (fixture)
from slurm_cluster import SLURM_REASON, LocalSlurm
from tiers import assign_tiers, pytest_runtest_makereport, pytest_runtest_protocol  # noqa: F401 (hooks)


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory):
    """The session's two-node Slurm on this machine (tests/slurm_cluster.py), or None where it cannot run."""
    if SLURM_REASON is not None:
        yield None
        return
    slurm = LocalSlurm(tmp_path_factory.mktemp("local_slurm"))
    try:
        yield slurm
    finally:
        slurm.down()


SLURM_UNIT = "local_slurm"


SESSION_UNITS = ("local_slurm", "same_iterations")  # session fixtures: every test that uses one is in its unit


def _unit(item) -> str:
    """One test module is one unit of work, so a module fixture's training run starts once; every test that uses
    a session fixture of :data:`SESSION_UNITS` is in that fixture's unit (one Slurm, one set of runs per session)."""
    return next((name for name in SESSION_UNITS if name in item.fixturenames), item.module.__name__)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Every test's tier, ``unit`` or ``e2e`` (tests/tiers.py; before ``-m`` deselects), then the units in the order
    they start: the Slurm unit, then the ``slow`` modules, then the rest (``make test`` runs ``pytest -n 2 --dist
    loadgroup``: each to whichever worker is free)."""
    assign_tiers(items)

    def rank(item) -> int:
        return 0 if _unit(item) == SLURM_UNIT else 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)  # stable: collection order within each rank
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_unit(item)))
