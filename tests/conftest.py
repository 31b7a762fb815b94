"""Fixtures shared across test modules."""

from __future__ import annotations

import os

import pytest
from slurm_cluster import SLURM_REASON, LocalSlurm


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
NICE = 10  # the niceness of a worker's other units while the Slurm unit runs (pytest -n)


def _unit(item) -> str:
    """One test module is one unit of work, so a module fixture's training run starts once; every test that uses
    the session's Slurm is in one unit (one Slurm per session)."""
    return SLURM_UNIT if "local_slurm" in item.fixturenames else item.module.__name__


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """``make test`` runs ``pytest -n 2 --dist loadgroup``: the units go out longest first (the Slurm unit, then
    the ``slow`` modules, then the rest), each to whichever worker is free."""

    def rank(item) -> int:
        return 0 if _unit(item) == SLURM_UNIT else 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)  # stable: collection order within each rank
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_unit(item)))


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start anything
def pytest_runtest_setup(item):
    """With ``pytest -n``, a worker runs every unit but the Slurm one at nice 10 (and what it starts inherits it):
    the two cores go first to the Slurm job, whose Ray start-up has 30 s deadlines (a starved raylet failed
    ``ray start`` on the head), and the other worker's tests take the cycles it leaves."""
    stays = not os.environ.get("PYTEST_XDIST_WORKER") or SLURM_REASON is not None or _unit(item) == SLURM_UNIT
    if not stays and (now := os.nice(0)) < NICE:
        os.nice(NICE - now)
