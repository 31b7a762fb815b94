"""Fixtures shared across test modules."""

from __future__ import annotations

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
