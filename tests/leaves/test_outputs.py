"""Issue 50: one writer per output (a run directory, an evaluation's --out, a play/annotate database) and append-only
files that survive a crash mid-line (marti_ibrl/outputs.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marti_ibrl.outputs import LOCK_NAME, OutputInUse, OutputLock, repair_jsonl

HOLD = textwrap.dedent(
    """
    import sys
    from marti_ibrl.outputs import OutputLock
    lock = OutputLock(sys.argv[1], sys.argv[2], directory=sys.argv[3] == "dir").acquire()
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    lock.release()
    """
)


TINY = ["--config", "recipes/dond/tiny-cpu.yaml", "--role1.pretrain", "recipes/dond/tiny-sft"]
TINY += ["--role2.pretrain", "recipes/dond/tiny-sft"]


class Holder:
    """Another process holding ``output``'s lock until :meth:`stop` (or until it is killed)."""

    def __init__(self, output: Path, flag: str, directory: bool = True):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(output), flag, "dir" if directory else "file"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "held"  # waits for the lock, not for a clock

    def stop(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(60) == 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(60)


def test_a_second_process_is_refused_naming_the_first(tmp_path) -> None:
    out = tmp_path / "eval"
    holder = Holder(out, "--out")
    try:
        with pytest.raises(OutputInUse) as e:
            OutputLock(out, "--out").acquire()
        msg = str(e.value)
        assert msg.startswith(f"--out {out} is in use by pid {holder.proc.pid} on {socket.gethostname()} (marti-ibrl")
        assert msg.endswith("; wait for it to finish, stop it, or choose another --out")
    finally:
        holder.stop()
    with OutputLock(out, "--out") as lock:  # released by the holder: free again
        assert lock.held and lock.took_over is None
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (out / LOCK_NAME).exists()  # released: the lock file is gone ...
    assert not out.exists()  # ... and the directory the first holder made, left empty, too


def test_a_second_holder_may_wait_for_the_first_to_let_go(tmp_path, capsys) -> None:
    """A requeued job whose predecessor is still exiting: acquire(wait=...) takes the lock once it is let go."""
    import threading

    out = tmp_path / "run"
    holder = Holder(out, "--ckpt.path")
    threading.Timer(1.0, holder.stop).start()  # lets go while the second one waits
    with OutputLock(out, "--ckpt.path").acquire(wait=60) as lock:
        assert lock.held
    assert f"waiting up to 60 s for pid {holder.proc.pid} on" in capsys.readouterr().err
    holder2 = Holder(out, "--ckpt.path")
    try:
        with pytest.raises(OutputInUse):
            OutputLock(out, "--ckpt.path").acquire(wait=0.6)  # still held when the wait is over
    finally:
        holder2.stop()


def test_a_directory_removed_by_a_holder_letting_go_is_made_again(tmp_path, monkeypatch) -> None:
    """The race CI met (stop 58): a waiter saw the directory, then the holder let go and removed the directory it
    had made, left empty, before the waiter opened its lock file there. The waiter makes it again and takes the lock."""
    import marti_ibrl.outputs as outputs

    out = tmp_path / "run"
    out.mkdir()
    real_open, calls = os.open, []

    def open_after_the_holder_let_go(path, *args):
        if not calls:
            out.rmdir()  # the holder's release, between the waiter's look at the directory and its open
        calls.append(path)
        return real_open(path, *args)

    monkeypatch.setattr(outputs.os, "open", open_after_the_holder_let_go)
    with OutputLock(out, "--ckpt.path") as lock:
        assert lock.held and len(calls) == 2
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not out.exists()  # made again by this lock, left empty: removed on release


def test_a_killed_holders_lock_is_taken_over_and_said(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    holder = Holder(out, "--ckpt.path")
    holder.kill()  # exits without releasing: the lock file stays, the kernel's flock does not
    assert (out / LOCK_NAME).exists()
    with OutputLock(out, "--ckpt.path") as lock:
        assert lock.took_over["pid"] == holder.proc.pid
    assert f"its lock was left by pid {holder.proc.pid} on" in capsys.readouterr().err


def test_a_file_is_locked_beside_it_and_its_directory_kept(tmp_path) -> None:
    db = tmp_path / "people.sqlite"
    db.write_bytes(b"")
    with OutputLock(db, "--db", directory=False) as lock:
        assert lock.path == tmp_path / "people.sqlite.lock"
        with pytest.raises(OutputInUse, match=r"--db .*people.sqlite is in use by pid"):
            OutputLock(db, "--db", directory=False).acquire()  # another open file description: refused too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["people.sqlite"]


def test_two_evals_into_one_out_the_second_refuses(tmp_path, capsys) -> None:
    """Issue 50: two `eval` processes started together into one --out both wrote (60 episodes twice)."""
    from marti_ibrl.cli import main

    out = tmp_path / "eval"
    holder = Holder(out, "--out")
    try:
        code = main(["eval", "--policy", "p=bot:greedy", "--self-play", "-n", "2", "--out", str(out)])
    finally:
        holder.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"marti-ibrl eval: error: --out {out} is in use by pid")
    assert not out.exists()  # nothing written by the refused one (the holder's directory went with it)


def test_a_second_run_on_a_run_directory_refuses_before_ray(tmp_path) -> None:
    from marti_ibrl.commit import RunDirError
    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    run = tmp_path / "run"
    holder = Holder(run, "--ckpt.path")
    try:
        cfg = load_config([*TINY, "--ckpt.path", str(run), "--ckpt.lock_wait", "0"])
        with pytest.raises(RunDirError, match=rf"^--ckpt.path {run} is in use by pid {holder.proc.pid} "):
            IBRLTrainer(cfg)
    finally:
        holder.stop()
    assert not run.exists()  # refused before anything was written


def test_annotate_on_a_database_in_use_refuses(tmp_path, capsys) -> None:
    from marti_ibrl.cli import main

    db = tmp_path / "labels.sqlite"
    holder = Holder(db, "--db", directory=False)
    try:
        code = main(["annotate", "--blind", "--db", str(db), "--port", "8765"])
    finally:
        holder.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "labels.sqlite is served by another `marti-ibrl` server (pid" in err[0]
    assert not db.exists()


# -- append-only files: a torn last line is moved aside ----------------------------------------------------------


def test_a_whole_file_is_left_alone(tmp_path) -> None:
    path = tmp_path / "a.jsonl"
    assert repair_jsonl(path) is None  # absent
    path.write_text('{"a": 1}\n{"a": 2}\n')
    assert repair_jsonl(path) is None and path.read_text() == '{"a": 1}\n{"a": 2}\n'


@pytest.mark.parametrize("whole", ["", '{"a": 1}\n', '{"a": 1}\n' * 20000])  # none, one, and over a read block
def test_a_torn_last_line_is_moved_aside_and_said(tmp_path, whole) -> None:
    path = tmp_path / "episodes.jsonl"
    path.write_text(whole + '{"a": 3, "b"')
    said = repair_jsonl(path)
    assert path.read_text() == whole
    aside = tmp_path / "episodes.jsonl.torn"
    assert aside.read_text() == '{"a": 3, "b"\n'
    assert said == (
        f"{path}: its last line was cut by a crash (12 bytes without a newline): moved to {aside}; continuing after "
        "the last whole record"
    )
    path.write_text(path.read_text() + "xy")  # a second crash: appended to the same .torn, nothing lost
    repair_jsonl(path)
    assert aside.read_text() == '{"a": 3, "b"\nxy\n' and path.read_text() == whole


def test_a_resumed_run_repairs_its_logs_before_appending(tmp_path, capsys) -> None:
    """The run's append-only logs (phases, sync checks) are repaired when a run opens its directory."""
    from marti_ibrl.config import load_config
    from marti_ibrl.training.startup import claim_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "phases.jsonl").write_text('{"k": 1}\n{"k": 2, "ev')
    # (a run stopped before committing that left transcripts holds a run since issue 63: refused, never dropped;
    # tests/training/test_run_dir.py::test_a_new_run_into_transcripts_alone_is_refused_too)
    cfg = load_config([*TINY, "--ckpt.path", str(run)])
    _, lock = claim_run_dir(cfg, ["agent1", "agent2"])
    lock.release()
    assert (run / "phases.jsonl").read_text() == '{"k": 1}\n'
    assert (run / "phases.jsonl.torn").read_text() == '{"k": 2, "ev\n'
    assert "phases.jsonl: its last line was cut by a crash (12 bytes" in capsys.readouterr().out


def test_a_full_disk_is_recognised_however_it_is_raised(tmp_path) -> None:
    """Issue 63: a full disk under ``train`` ended in "unexpected pos 128 vs 0" (PyTorch's zip writer, re-raised by Ray
    as text) and never said the disk was full."""
    import errno

    from marti_ibrl.outputs import disk_full

    said = disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert said.startswith(f"the disk holding {tmp_path} is full (") and "MiB free there now" in said
    torch_zip = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 128 vs 0")
    assert disk_full(torch_zip, tmp_path)
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as inner:
            raise RuntimeError("ray: the actor died") from inner
    except RuntimeError as outer:
        assert disk_full(outer, tmp_path)  # through the chain
    assert disk_full(ValueError("bad"), tmp_path) is None
    assert disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path) is None
