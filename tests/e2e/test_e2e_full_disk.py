"""End to end: ``marti-ibrl train`` on a disk that fills up (issue 63): one line saying the disk is full and exit 4
(before: 63 lines of Ray and PyTorch ending "unexpected pos 128 vs 0"), the last commit intact, and after room is made
the same command with ``--ckpt.load_enable true`` finishes the run. The disk is a tmpfs of a few MiB that the test
mounts (root only: skipped elsewhere), grown in place (``remount,size=``) to make room."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_cluster import committed
from test_e2e_ibrl import tiny_flags

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parents[1]
ITERATIONS = 5


def _mount(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


def _train(model: str, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS / "e2e"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "marti_ibrl.cli", "train", *tiny_flags(model, run_dir, ITERATIONS), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def test_a_full_disk_is_one_line_and_the_run_resumes_after_room_is_made(tmp_path):
    from marti_ibrl.tiny import build_tiny_dond_model

    if os.geteuid() != 0:
        pytest.skip("mounting the small file system needs root")
    model = build_tiny_dond_model(tmp_path / "tiny")
    disk = tmp_path / "disk"
    if not _mount(disk, "12m"):  # about 3 iterations of this run's checkpoints, pool and exports
        pytest.skip("this machine does not let the test mount a tmpfs")
    try:
        run_dir = disk / "run"
        full = _train(model, run_dir)
        out = full.stdout + full.stderr
        assert full.returncode == 4, out[-3000:]
        ours = [line for line in out.splitlines() if line.startswith("marti-ibrl train:")]
        assert len(ours) == 1 and ours[0].startswith(
            f"marti-ibrl train: error: the disk holding {run_dir} is full ("
        ), out[-3000:]
        assert "--ckpt.load_enable true" in ours[0]
        at = committed(run_dir)
        assert 1 <= at < ITERATIONS  # (12 MiB hold two or three iterations: a commit to resume from)
        subprocess.run(["mount", "-o", "remount,size=400m", str(disk)], check=True)
        resumed = _train(model, run_dir, "--ckpt.load_enable", "true")
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
        assert committed(run_dir) == ITERATIONS
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
