"""Outputs that are never shared and never torn (docs/reliability.md).

* :class:`OutputLock`: one writer per output. A run directory (``train``, ``demo``), an evaluation's ``--out``,
  ``play --db`` and ``annotate --db`` are held by one process at a time: an exclusive ``flock`` on a lock file (in
  the directory, or beside the file) that records the holder's pid, host, command and start. The kernel drops the
  lock when its holder exits, however it exits, so a lock file left by a killed process is stale by construction
  and is taken over (said in one line); a live holder makes a second process refuse in one line naming it. On NFS
  (v4) ``flock`` is a lock the server holds: a node that is lost keeps its locks until its lease expires (about 90 s).
  (``fcntl.flock``, not the ``filelock`` library: it keeps no holder record to name, and removes no lock file.)
* :func:`repair_jsonl`: an append-only JSONL file whose last line was cut by a crash (a kill, a full disk) gets its
  torn bytes moved aside to ``FILE.torn`` (appended there, never dropped; the line says how many bytes), so the
  next append continues after the last whole record instead of gluing onto a half one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK_NAME = ".marti-ibrl.lock"


class OutputInUse(RuntimeError):
    """Another live process holds the output; the message names it, ``holder`` is its record."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


class OutputLock:
    """An exclusive hold on ``output`` for as long as this process needs it: a directory (the lock file
    :data:`LOCK_NAME` inside it) or, with ``directory=False``, a file (``FILE.lock`` beside it). ``flag`` names the
    option that chose the output, for the message (``--out``, ``--db``, ``--ckpt.path``); ``note`` goes into the
    holder's record (e.g. a server's link). Released, the lock file is gone, and so is a directory the lock made if
    nothing else was written into it (a refused or failed command leaves no trace)."""

    def __init__(self, output: Path, flag: str, *, directory: bool = True, note: str = ""):
        self.output, self.flag, self.note = Path(output), flag, note
        self.path = self.output / LOCK_NAME if directory else self.output.with_name(self.output.name + ".lock")
        self._fd: int | None = None
        self._made_dir = False
        self.took_over: dict | None = None  # the record of a holder that exited and left its lock file behind
        self.waited_for: str | None = None  # the holder this process waited for (acquire(wait=...)), in words

    def acquire(self, wait: float = 0.0) -> OutputLock:
        """Hold the lock, or :class:`OutputInUse` naming the holder (nothing is changed then). ``wait``: seconds to
        wait for a holder to let go first (a requeued job whose predecessor is still exiting), said in one line;
        :attr:`waited_for` then names that holder (what it wrote meanwhile is its own: the caller judges the output
        again, now that it holds it)."""
        if self._fd is not None:
            return self
        deadline, said = time.monotonic() + wait, False
        while True:
            try:
                return self._acquire()
            except OutputInUse as e:
                if time.monotonic() >= deadline:
                    raise
                if not said:
                    self.waited_for = describe(e.holder)
                    print(f"{self.flag} {self.output}: waiting up to {wait:g} s for {describe(e.holder)} to let go",
                          file=sys.stderr, flush=True)  # fmt: skip
                    said = True
                time.sleep(0.5)

    def _acquire(self) -> OutputLock:
        made = False
        while True:
            if not self.path.parent.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                made = True
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                if self.path.parent.exists():
                    raise
                continue  # a holder that let go removed the directory it had made, left empty: make it again
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_record(fd)
                os.close(fd)
                raise OutputInUse(
                    f"{self.flag} {self.output} is in use by {describe(holder)}; wait for it to finish, stop it, or "
                    f"choose another {self.flag}",
                    holder,
                ) from None
            try:  # the file we locked is still the lock file (a holder that released may have unlinked it)
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        self.took_over = _read_record(fd) or None  # a record, yet no holder: it exited without releasing (killed)
        if self.took_over:
            print(f"{self.flag} {self.output}: its lock was left by {describe(self.took_over)}, which has exited; "
                  "taken over", file=sys.stderr)  # fmt: skip
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(["marti-ibrl", *sys.argv[1:2]]),
            "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            **({"note": self.note} if self.note else {}),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd, self._made_dir = fd, made
        return self

    def release(self) -> None:
        """Let go: the lock file is removed while still locked (a process that opened it meanwhile sees it is gone
        and opens a new one), then closed, which releases the flock."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None
        if self._made_dir:  # made for this command and left empty: leave no trace
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_record(fd: int) -> dict:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def describe(holder: dict) -> str:
    """A holder's record as words: ``pid 12 on host (marti-ibrl eval, since ...)``."""
    if not holder.get("pid"):
        return "another process (it wrote no record yet)"
    what = ", ".join(x for x in (holder.get("command"), f"since {holder.get('since', '?')}") if x)
    return f"pid {holder['pid']} on {holder.get('host', '?')} ({what})"


def repair_jsonl(path: Path) -> str | None:
    """If ``path`` ends in a torn line (no final newline), move those bytes to ``PATH.torn`` (appended), cut the
    file after its last whole line, and return one line saying so; None when the file is whole or absent."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    with path.open("rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return None
        keep, step = size, 1 << 16
        while keep > 0:  # the last newline, read backwards in blocks
            start = max(0, keep - step)
            f.seek(start)
            block = f.read(keep - start)
            at = block.rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            keep = start
        f.seek(keep)
        torn = f.read()
        aside = path.with_name(path.name + ".torn")
        with aside.open("ab") as out:
            out.write(torn + b"\n")
            out.flush()
            os.fsync(out.fileno())
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return (
        f"{path}: its last line was cut by a crash ({len(torn)} bytes without a newline): moved to {aside}; "
        f"continuing after the last whole record"
    )


FULL_DISK_ERRNOS = (28, 122)  # ENOSPC, EDQUOT
FULL_DISK_TEXTS = ("No space left on device", "Disk quota exceeded", "unexpected pos")
"""How a full disk shows where no ``OSError`` carries its errno: Ray re-raises an actor's error as text, and PyTorch's
zip writer (``torch.save``, DeepSpeed's and Hugging Face's checkpoints) says only ``... failed writing file ...:
unexpected pos N vs M``."""


def disk_full(error: BaseException, path: str | os.PathLike) -> str | None:
    """When ``error`` (or its cause or context) is a write that found the disk full, one line saying so: the directory
    ``path`` and the space left on its file system; None for any other error."""
    import shutil

    seen, e = set(), error
    hit = False
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL_DISK_ERRNOS or any(t in str(e) for t in FULL_DISK_TEXTS):
            hit = True
            break
        e = e.__cause__ or e.__context__
    if not hit:
        return None
    try:
        free = f"{shutil.disk_usage(path).free / 2**20:,.0f} MiB free there now"
    except OSError:
        free = "its free space unknown"
    return f"the disk holding {path} is full ({free})"
