"""A run's commit record, ``RUN/trainer_state.json``: what exact resume needs beyond the DeepSpeed checkpoints.

The trainer writes a :class:`Commit` after every role's DeepSpeed checkpoint of iteration k is on disk (atomically:
a temporary file renamed over the old one), so the record never names a checkpoint that is not complete. On
resume (``--ckpt.load_enable``) :meth:`Commit.read` gives it back, :meth:`Commit.check` refuses a run made with
another seed, and :func:`pin_deepspeed_latest` points every role's DeepSpeed ``latest`` at the committed tag, so a
checkpoint written half-way after it (a run killed while saving) is never loaded. Everything random on the driver
is keyed by (seed, stream, iteration) (:func:`marti_ibrl.training.records.stream`), so with this record iteration k+1 is drawn exactly
as it would have been without the interruption. No torch, no Ray: diagnostics and reports read it too.

The run directory is protected here too (:func:`open_run_dir`, before Ray starts, judged while the caller holds the
directory's lock, so what it judges is what it starts in): a directory that holds a run (:func:`run_contents`) is
resumed (``--ckpt.load_enable``, after every file of the committed DeepSpeed steps and every committed pool snapshot is
checked against the record: :func:`verify_files`, :func:`verify_pools`) or started over only when asked
(``--ckpt.overwrite``, :func:`clear_run`); never silently overwritten. A resume with no commit record in a directory
that holds a run is refused (the record is gone, or the run never committed: either way not a start from iteration 1
over its files), and so is any start into a run another process wrote while this one waited for the lock
(``waited_for``): a run that finished meanwhile, or one this process was not asked to resume.

Under ``--train.async_rollout`` the rollout of iteration k+1 is made while k learns, by policies that will not exist
again (the engines' weights before k's syncs): the commit of k therefore holds it (:func:`write_rollout`, a pickle in
``RUN/rollouts/`` named in the record with its size and sha256, checked before it is read back: the file is the
run's own, written by this code; a file that does not check out is refused, never unpickled).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from marti_ibrl.cluster.phases import PHASES_FILE
from marti_ibrl.config import ConfigError
from marti_ibrl.outputs import LOCK_NAME
from marti_ibrl.rollout.transcripts import TRANSCRIPTS_FILE

STATE_FILE = "trainer_state.json"
RUN_FILES = (
    STATE_FILE,
    STATE_FILE + ".tmp",
    "config.yaml",
    "topology.json",
    "sync_checks.jsonl",
    PHASES_FILE,
    TRANSCRIPTS_FILE,
)
"""The files a training run writes at the top of its directory (:func:`clear_run` deletes them, with ``pool/``,
``rollouts/``, ``tensorboard/`` and the role directories)."""
ROLLOUTS_DIR = "rollouts"  # --train.async_rollout: the committed rollouts in flight


class RunDirError(ConfigError):
    """The run directory refuses this start: it holds a run, or what a resume needs does not check out. The message
    names the file and the ways on."""


@dataclass
class Commit:
    """The state of a run after iteration ``iteration``, as ``trainer_state.json`` holds it."""

    iteration: int
    seed: int
    updates: dict[str, int] = field(default_factory=dict)
    """Each trained role's update count (its schedule position and its next pool snapshot's version)."""
    sampler: dict = field(default_factory=dict)
    """The scenario sampler's position (epoch, position)."""
    pools: dict[str, dict] = field(default_factory=dict)
    """Each role's opponent-pool manifest (:meth:`marti_ibrl.algorithm.pool.OpponentPool.manifest`)."""
    history: list[dict] = field(default_factory=list)
    """The per-iteration metrics so far."""
    rollout_log: list[dict] = field(default_factory=list)
    """Per iteration: Eq. 6 configuration, the policies in every seat, scenario order."""
    ahead: dict | None = None
    """``--train.async_rollout``: the rollout of iteration+1, made before this commit (:func:`write_rollout`)."""
    files: dict[str, dict] = field(default_factory=dict)
    """Every file of each role's committed DeepSpeed step (``ROLE/ckpt/_actor/global_stepK/...``, relative to the
    run directory): its ``bytes`` and ``sha256`` (:func:`file_manifest`), checked before a resume loads them
    (:func:`verify_files`). Empty in a record written before it existed (then only the directories are checked)."""

    @classmethod
    def read(cls, run_dir: Path) -> Commit | None:
        """The run's last commit, or None before its first."""
        path = Path(run_dir) / STATE_FILE
        if not path.exists():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as e:  # truncated, empty, or not a record's fields
            raise RunDirError(
                f"{path} is not a readable commit record ({type(e).__name__}: {e}); restore it from a copy, or start "
                "over with --ckpt.overwrite true (or a new --ckpt.path)"
            ) from None

    def write(self, run_dir: Path) -> None:
        """Atomically replace the run's commit record: a half-written one is never picked up."""
        tmp = Path(run_dir) / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(Path(run_dir) / STATE_FILE)

    def check(self, seed: int) -> None:
        """A run resumes with the seed it was made with (its random streams are keyed by it)."""
        if self.seed != seed:
            raise RunDirError(
                f"--train.seed: the run was made with --train.seed {self.seed}, not {seed}: resume it with its seed, "
                "or start a new run with a new --ckpt.path"
            )


def pin_deepspeed_latest(run_dir: Path, actor_checkpoints: list[Path], k: int) -> None:
    """Point every role's DeepSpeed ``latest`` (in ``ROLE/ckpt/_actor``) at the committed tag ``global_step{k}``;
    a FileNotFoundError when a committed checkpoint is missing."""
    tag = f"global_step{k}"
    for ckpt in map(Path, actor_checkpoints):
        if not (ckpt / tag).is_dir():
            raise FileNotFoundError(
                f"resume: {Path(run_dir) / STATE_FILE} commits iteration {k}, but {ckpt / tag} is missing"
            )
        (ckpt / "latest").write_text(tag)


def run_contents(run_dir: Path) -> list[str]:
    """What makes ``run_dir`` hold a run, relative to it: its commit record (``trainer_state.json``), opponent-pool
    snapshots (``pool/ROLE/v*``), role checkpoints (``ROLE/ckpt``, ``ROLE/hf``, non-empty), its transcripts
    (``transcripts.jsonl``, non-empty). Empty: nothing of value to lose (a directory made empty, or a run that stopped
    before it wrote any of these: its ``config.yaml``, ``topology.json`` and logs are replaced)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [STATE_FILE] if (run_dir / STATE_FILE).exists() else []
    found += sorted(str(p.relative_to(run_dir)) for p in run_dir.glob("pool/*/v[0-9]*"))
    found += sorted(
        str(p.relative_to(run_dir)) for name in ("ckpt", "hf") for p in run_dir.glob(f"*/{name}") if _non_empty(p)
    )
    transcripts = run_dir / TRANSCRIPTS_FILE
    if transcripts.is_file() and transcripts.stat().st_size > 0:
        found.append(TRANSCRIPTS_FILE)
    return found


def _shown(found: list[str]) -> str:
    return ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")


def _non_empty(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def check_writable(run_dir: Path) -> None:
    """``--ckpt.path`` is a directory this process can write, or can be made one; nothing is created here."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--ckpt.path: {run_dir} is a file, not a directory")
    parent = run_dir
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise RunDirError(f"--ckpt.path: {run_dir} cannot be made: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        made = "" if parent == run_dir else f" ({parent}, where it would be made)"
        raise RunDirError(f"--ckpt.path: {run_dir} is not writable{made}")


def open_run_dir(
    run_dir: Path,
    *,
    resume: bool,
    overwrite: bool,
    seed: int,
    iterations: int | None = None,
    waited_for: str | None = None,
) -> Commit | None:
    """The checks before a run starts in ``run_dir`` (nothing is written), made while the caller holds the
    directory's lock (:func:`marti_ibrl.training.startup.claim_run_dir`): a writable directory; when resuming, its
    commit record (None when there is none and the directory holds no run: the run starts at iteration 1), its seed,
    every role's DeepSpeed checkpoint at the committed tag (``ROLE/ckpt/_actor/global_stepK``, what
    :func:`pin_deepspeed_latest` pins) and every committed pool snapshot (:func:`verify_pools`); otherwise no run in
    it (:func:`run_contents`) unless ``overwrite``. ``waited_for``: the process (in words) that held the directory
    while this one waited for it; a run found then is that process's, and only an unfinished one (its commit below
    ``iterations``) that this process was asked to resume is taken on (a requeued job whose predecessor was still
    exiting). A :class:`RunDirError` names what is wrong and the ways on."""
    run_dir = Path(run_dir)
    check_writable(run_dir)
    found = run_contents(run_dir)
    if waited_for and found:
        _refuse_a_run_written_while_waiting(run_dir, found, resume, iterations, waited_for)
    if resume:
        commit = Commit.read(run_dir)
        if commit is None:
            if found:  # the record is gone (or never written): the files are a run's, never started over
                raise RunDirError(
                    f"--ckpt.load_enable: {run_dir} has no {STATE_FILE} (the commit a resume starts from) but holds a "
                    f"run ({_shown(found)}): restore {STATE_FILE} from a copy to resume it; if the run never "
                    "committed, start over with --ckpt.overwrite true (deletes it) or a new --ckpt.path"
                )
            return None
        commit.check(seed)
        for role in commit.updates:  # every trained role's DeepSpeed state at the committed tag
            tag = run_dir / role / "ckpt" / "_actor" / f"global_step{commit.iteration}"
            if not tag.is_dir():
                raise RunDirError(
                    f"--ckpt.load_enable: {run_dir / STATE_FILE} commits iteration {commit.iteration}, but {tag} "
                    "is missing: restore it, or start over (--ckpt.overwrite true)"
                )
        verify_files(run_dir, commit)  # every file of those steps as committed (size, then sha256)
        verify_pools(run_dir, commit)
        if commit.ahead is not None:
            read_rollout(run_dir, commit.ahead, check_only=True)
        return commit
    if found and not overwrite:
        raise RunDirError(
            f"--ckpt.path: {run_dir} holds a run ({_shown(found)}); resume it with --ckpt.load_enable true, or start "
            "over with a new --ckpt.path or --ckpt.overwrite true (deletes it)"
        )
    return None


def _refuse_a_run_written_while_waiting(
    run_dir: Path, found: list[str], resume: bool, iterations: int | None, holder: str
) -> None:
    """After a wait for ``holder`` to let go of ``run_dir``: its run is refused unless this process resumes it and it
    is not finished (a requeued job whose predecessor was still exiting)."""
    try:
        commit = Commit.read(run_dir)
    except RunDirError:
        commit = None  # (not readable: refused below, or by the resume's own read)
    done = commit is not None and iterations is not None and commit.iteration >= iterations
    if resume and commit is not None and not done:
        return
    what = (
        f"its finished run ({STATE_FILE} commits iteration {commit.iteration} of {iterations})"
        if done
        else f"a run ({_shown(found)})"
    )
    raise RunDirError(
        f"--ckpt.path: {run_dir} was in use by {holder} while this run waited, and now holds {what}: nothing "
        "of it is changed; choose a new --ckpt.path, or, if this run was meant for that directory, start it again "
        "(--ckpt.load_enable true resumes an unfinished run, --ckpt.overwrite true deletes it)"
    )


HASH_THREADS = 8
"""Files hashed at once: sha256 runs at ~1.7 GiB/s per core here and releases the GIL, so the files of a
checkpoint (one or more per rank) hash side by side (docs/reliability.md gives the cost for a 9B run)."""


def file_manifest(run_dir: Path, dirs: list[Path]) -> dict[str, dict]:
    """``bytes`` and ``sha256`` of every file under ``dirs``, keyed by its path relative to ``run_dir``."""
    from concurrent.futures import ThreadPoolExecutor

    from marti_ibrl.algorithm.pool import file_sha256

    files = sorted(p for d in dirs for p in Path(d).rglob("*") if p.is_file())
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        digests = list(pool.map(file_sha256, files))
    return {
        str(p.relative_to(run_dir)): {"bytes": p.stat().st_size, "sha256": h}
        for p, h in zip(files, digests, strict=True)
    }


def verify_files(run_dir: Path, commit: Commit) -> None:
    """Every file the commit recorded (:attr:`Commit.files`) is there with its size and sha256; a RunDirError names
    the first that is missing, truncated or different (sizes are checked for all before any file is hashed)."""
    from concurrent.futures import ThreadPoolExecutor

    from marti_ibrl.algorithm.pool import file_sha256

    run_dir = Path(run_dir)
    way = f"as {run_dir / STATE_FILE} committed it at iteration {commit.iteration}: restore it, or start over (--ckpt.overwrite true)"
    for name, rec in sorted(commit.files.items()):
        path = run_dir / name
        if not path.is_file():
            raise RunDirError(f"--ckpt.load_enable: {path} is missing, {way}")
        size = path.stat().st_size
        if size != rec["bytes"]:
            what = "truncated" if size < rec["bytes"] else "longer than recorded"
            raise RunDirError(f"--ckpt.load_enable: {path} is {what} ({size} bytes, not {rec['bytes']}), {way}")
    names = sorted(commit.files)
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        digests = pool.map(file_sha256, [run_dir / n for n in names])
        for name, digest in zip(names, digests, strict=True):
            if digest != commit.files[name]["sha256"]:
                raise RunDirError(
                    f"--ckpt.load_enable: {run_dir / name} differs from the file committed (sha256), {way}"
                )


def verify_pools(run_dir: Path, commit: Commit) -> None:
    """Every pool snapshot the commit record lists is on disk as recorded (size, sha256); a RunDirError names the
    first that is not."""
    from marti_ibrl.algorithm.pool import verify_snapshots

    for role, manifest in commit.pools.items():
        try:
            verify_snapshots(Path(run_dir) / "pool" / role, manifest)
        except ValueError as e:
            raise RunDirError(
                f"--ckpt.load_enable: {e}, as {Path(run_dir) / STATE_FILE} committed it at iteration "
                f"{commit.iteration}: restore the file, or start over (--ckpt.overwrite true)"
            ) from None


def clear_run(run_dir: Path, roles: list[str]) -> tuple[list[str], list[str]]:
    """``--ckpt.overwrite``: delete the run in ``run_dir``: its commit record first (so a half-cleared directory never
    resumes), its top-level files (:data:`RUN_FILES`), ``pool/``, ``tensorboard/`` and every role directory (``roles``
    and any other directory holding ``ckpt`` or ``hf``). Returns (deleted, kept): what else is there (an ``eval/``,
    a user's notes) is left as it was."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return [], []
    role_dirs = set(roles) | {p.parent.name for name in ("ckpt", "hf") for p in run_dir.glob(f"*/{name}")}
    deleted = []
    for name in [*RUN_FILES, "pool", ROLLOUTS_DIR, "tensorboard", *sorted(role_dirs)]:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        deleted.append(name)
    return deleted, sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_NAME)  # (the lock is ours)


def write_rollout(run_dir: Path, rollout) -> dict:
    """Write ``rollout`` (``marti_ibrl.trainer.Rollout``, made) to ``RUN/rollouts/kK.pkl``, durably (a temporary file
    fsynced and renamed); returns the commit record's entry for it: iteration, file, size, sha256."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    data = pickle.dumps(rollout, protocol=pickle.HIGHEST_PROTOCOL)
    path = folder / f"k{rollout.k}.pkl"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return {
        "iteration": rollout.k,
        "file": f"{ROLLOUTS_DIR}/{path.name}",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def read_rollout(run_dir: Path, entry: dict, check_only: bool = False):
    """The rollout a commit record's ``ahead`` entry names, after its size and sha256 check out (a RunDirError names
    the file otherwise); with ``check_only``, only the check."""
    path = Path(run_dir) / entry["file"]
    data = path.read_bytes() if path.is_file() else None
    if data is None:
        found = "missing"
    elif len(data) != entry["size"]:
        found = f"{len(data)} bytes, not the {entry['size']} committed"
    elif hashlib.sha256(data).hexdigest() != entry["sha256"]:
        found = "its sha256 differs from the committed one"
    else:
        return None if check_only else pickle.loads(data)
    raise RunDirError(
        f"--ckpt.load_enable: {path} ({found}), the rollout of iteration {entry['iteration']} that "
        f"{Path(run_dir) / STATE_FILE} committed: restore the file, or start over (--ckpt.overwrite true)"
    )


def drop_rollouts(run_dir: Path, keep: str | None) -> None:
    """Delete the rollouts in ``RUN/rollouts/`` but ``keep`` (the committed one's file), e.g. older commits' ones."""
    for path in (Path(run_dir) / ROLLOUTS_DIR).glob("k*.*"):
        if f"{ROLLOUTS_DIR}/{path.name}" != keep:
            path.unlink()
