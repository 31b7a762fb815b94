"""End to end (issue 63): a ``marti-ibrl train`` stopped twice, once by a full disk and once by SIGTERM, each time
with one line and exit 4 and its committed iterations intact, and resumed each time by the same command with
``--ckpt.load_enable true``. One run, three processes (the stops' two runs and the run that finishes) where two
separate tests took four start-ups.

1. On a tmpfs of 12 MiB that the test mounts (about 3 iterations of checkpoints, pool and exports): the disk fills,
   one line says so (before: 63 lines of Ray and PyTorch ending "unexpected pos 128 vs 0"), a commit is left.
2. The tmpfs grown in place (``remount,size=``), the resumed run gets SIGTERM after its first new commit: the
   trainer's own cleanup, then one line and exit 4 within seconds, no C++ stack of Ray's teardown (before: exit 134,
   "Aborted"); a commit under way when the signal came finished or was not made, never torn.
3. Resumed once more, the run finishes its next iteration.

Mounting needs root: elsewhere step 1 is left out and step 2 is a fresh run in the test's directory.
"""

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
FILLS_AT = 5  # iterations of the first run: the 12 MiB fill before its end
NEVER_REACHED = 40  # iterations of the run that gets SIGTERM after its first new commit
RESUME = ("--ckpt.load_enable", "true")


def _mount(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


def _train(model: str, run_dir: Path, log: Path, iterations: int, *extra: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS / "e2e"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "marti_ibrl.cli", "train", *tiny_flags(model, run_dir, iterations), *extra]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _ended(proc: subprocess.Popen, timeout: float) -> int:
    """``proc``'s exit code, waited for at most ``timeout`` s; its process group killed either way."""
    try:
        return proc.wait(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _ours(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("marti-ibrl train:")]


def _full_disk(model: str, run_dir: Path, log: Path) -> None:
    assert _ended(_train(model, run_dir, log, FILLS_AT), 900) == 4, log.read_text()[-3000:]
    text = log.read_text()
    ours = _ours(text)
    assert len(ours) == 1 and ours[0].startswith(f"marti-ibrl train: error: the disk holding {run_dir} is full ("), (
        text[-3000:]
    )
    assert "--ckpt.load_enable true" in ours[0]
    assert 1 <= committed(run_dir) < FILLS_AT  # (12 MiB hold two or three iterations: a commit to resume from)


def _sigterm_after_a_new_commit(model: str, run_dir: Path, log: Path, *extra: str) -> None:
    before = committed(run_dir)
    proc = _train(model, run_dir, log, NEVER_REACHED, *extra)
    try:
        deadline = time.monotonic() + 600
        while committed(run_dir) <= before:  # polled, not a fixed wait: slow under load, never early
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no new commit in 600 s"
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
    assert _ours(text) == [
        "marti-ibrl train: stopped by SIGTERM; every committed iteration is kept: resume with the same flags and "
        "--ckpt.load_enable true"
    ], text[-3000:]  # (Ray's de-duplicated actor lines may still be flushed after it, at the process's exit)
    assert "Aborted" not in text and "*** SIG" not in text and "Traceback" not in text, text[-3000:]
    assert took < 30, f"{took:.1f} s from SIGTERM to exit"  # issue 63 asks <= 10 s; 2 busy cores get slack
    assert committed(run_dir) >= at  # a commit under way when the signal came finished or was not made: never torn


def test_a_full_disk_then_sigterm_each_stop_in_one_line_and_the_run_resumes_each_time(tmp_path):
    from marti_ibrl.tiny import build_tiny_dond_model

    model = build_tiny_dond_model(tmp_path / "tiny")
    disk = tmp_path / "disk"
    mounted = os.geteuid() == 0 and _mount(disk, "12m")
    try:
        run_dir = (disk if mounted else tmp_path) / "run"
        if mounted:
            _full_disk(model, run_dir, tmp_path / "full.log")
            subprocess.run(["mount", "-o", "remount,size=400m", str(disk)], check=True)
        _sigterm_after_a_new_commit(model, run_dir, tmp_path / "sigterm.log", *(RESUME if mounted else ()))
        stop = committed(run_dir) + 1
        log = tmp_path / "resume.log"
        assert _ended(_train(model, run_dir, log, stop, *RESUME), 600) == 0, log.read_text()[-3000:]
        assert committed(run_dir) == stop
    finally:
        if mounted:
            with contextlib.suppress(Exception):
                subprocess.run(["umount", "-l", str(disk)], capture_output=True)
