"""End to end: SIGTERM to ``marti-ibrl train`` (issue 63): the trainer's own cleanup runs, then one line and exit 4
within seconds, with no C++ stack of Ray's teardown (before: exit 134, "Aborted"); the committed iterations are
intact, and the same command with ``--ckpt.load_enable true`` finishes the run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import committed
from test_e2e_ibrl import tiny_flags

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parents[1]
ITERATIONS = 40  # never reached: the run is stopped after its first commit


def _train(model: str, run_dir: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS / "e2e"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "marti_ibrl.cli", "train", *tiny_flags(model, run_dir, ITERATIONS), *extra]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def test_sigterm_stops_train_with_one_line_and_exit_4_and_the_run_resumes(tmp_path):
    from marti_ibrl.tiny import build_tiny_dond_model

    model = build_tiny_dond_model(tmp_path / "tiny")
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    proc = _train(model, run_dir, log)
    try:
        deadline = time.monotonic() + 600
        while committed(run_dir) < 1:  # polled, not a fixed wait: slow under load, never early
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no commit in 600 s"
            time.sleep(0.2)
        at = committed(run_dir)
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert rc == 4, text[-3000:]
    ours = [line for line in text.splitlines() if line.startswith("marti-ibrl train:")]
    assert ours == [
        "marti-ibrl train: stopped by SIGTERM; every committed iteration is kept: resume with the same flags and "
        "--ckpt.load_enable true"
    ], text[-3000:]  # (Ray's de-duplicated actor lines may still be flushed after it, at the process's exit)
    assert "Aborted" not in text and "*** SIG" not in text and "Traceback" not in text, text[-3000:]
    assert took < 30, f"{took:.1f} s from SIGTERM to exit"  # issue 63 asks <= 10 s; 2 busy cores get slack
    assert committed(run_dir) >= at  # a commit under way when the signal came finished or was not made: never torn
    stop = committed(run_dir) + 1
    resumed = _train(
        model, run_dir, tmp_path / "resume.log", "--ckpt.load_enable", "true", "--train.iterations", str(stop)
    )
    assert resumed.wait(timeout=600) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert committed(run_dir) == stop
