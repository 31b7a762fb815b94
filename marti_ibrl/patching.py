"""Apply, check and revert our patches on the installed OpenRLHF (``patches/openrlhf/NNNN-*.patch``): one
:class:`Series` per patched package, pinned to its version.

The patches are ``git format-patch`` output against the pristine wheel's files (``openrlhf==0.11.2``: paths
``a/openrlhf/...``, and the new tests each adds to OpenRLHF's suite, ``b/tests/test_*.py``, the top-level ``tests``
package the wheel ships), applied with GNU ``patch -p1`` in the directory that holds the package (site-packages);
``git am`` takes them too (``marti-ibrl patch export``). Each patch is in exactly one of three states:

- ``applied``   — it reverses cleanly (applying again is a no-op: idempotent);
- ``pending``   — it applies cleanly;
- ``conflict``  — neither: the installed files differ from what the patch expects. We refuse.

``apply`` and ``revert`` are all-or-nothing: every patch is dry-run first, so a conflict changes no file.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import py_compile
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

OPENRLHF_VERSION = "0.11.2"
PATCHES = Path(__file__).resolve().parent.parent / "patches"
PATCH_DIR = PATCHES / "openrlhf"


@dataclass(frozen=True)
class Series:
    """The patches of one installed package, for one pinned version of it."""

    package: str
    version: str
    patch_dir: Path


# DeepSpeed's one fix (ZeRO-3's blocking multi-parameter gather waits on every handle) is upstream since 0.19.8
SERIES = (Series("openrlhf", OPENRLHF_VERSION, PATCH_DIR),)


class PatchError(RuntimeError):
    """A patch cannot be applied / reverted, or the installed OpenRLHF is not the pinned version."""


@dataclass
class PatchStatus:
    name: str
    state: str  # applied | pending | conflict
    detail: str = ""


def patch_files(patch_dir: Path = PATCH_DIR) -> list[Path]:
    files = sorted(Path(patch_dir).glob("[0-9][0-9][0-9][0-9]-*.patch"))
    if not files:
        raise PatchError(f"no patches found in {patch_dir}")
    return files


def installed_root(series: Series = SERIES[0]) -> Path:
    """The directory containing the installed package of ``series`` (default openrlhf), after checking its version."""
    package, pinned = series.package, series.version
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError as e:
        raise PatchError(f"{package} is not installed (run `make install`)") from e
    if version != pinned:
        raise PatchError(
            f"installed {package} is {version}, but the patches are for {pinned}; "
            f"install {package}=={pinned} (see docs/openrlhf.md: upstreaming and rebasing the patches)"
        )
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(f"cannot locate the {package} package")
    return Path(list(spec.submodule_search_locations)[0]).parent


def _patch(root: Path, patch: Path, *extra: str) -> subprocess.CompletedProcess:
    if shutil.which("patch") is None:
        raise PatchError("GNU `patch` is required (apt-get install patch)")
    # --force: never guess that a patch is reversed (--batch would), we decide that ourselves
    cmd = [
        "patch",
        "-p1",
        "--force",
        "--silent",
        "--no-backup-if-mismatch",
        "-r",
        os.devnull,
        "-d",
        str(root),
    ]
    return subprocess.run([*cmd, *extra, "-i", str(patch)], capture_output=True, text=True)


def _created_files(patch: Path) -> set[str]:
    """The files ``patch`` creates (``--- /dev/null``): the tests it adds to OpenRLHF's suite."""
    lines = patch.read_text().splitlines()
    return {
        b[6:].split("\t")[0].strip()
        for a, b in zip(lines, lines[1:])
        if a == "--- /dev/null" and b.startswith("+++ b/")
    }


def _touched_files(patches: list[Path]) -> set[str]:
    return {
        line[6:].split("\t")[0].strip()
        for p in patches
        for line in p.read_text().splitlines()
        if line.startswith("+++ b/")
    }


def _plan(root: Path, scratch: Path, patch_dir: Path) -> list[PatchStatus]:
    """Judge each patch on a scratch copy of the package; leaves ``scratch`` fully patched.

    Phase 1 reverts applied patches newest first (later patches may touch the context of earlier
    ones, so only this order works); phase 2 applies every patch in order to the now-pristine copy.
    """
    patches = patch_files(patch_dir)
    for package in sorted({rel.split("/")[0] for rel in _touched_files(patches)}):  # openrlhf, tests
        if (root / package).is_dir():  # a tree without OpenRLHF's tests/ gets the new test files alone
            shutil.copytree(root / package, scratch / package, ignore=shutil.ignore_patterns("__pycache__"))
    applied = set()
    for p in reversed(patches):
        if _patch(scratch, p, "--reverse", "--dry-run").returncode == 0:
            _patch(scratch, p, "--reverse")
            applied.add(p.name)
    out = []
    for p in patches:
        if p.name not in applied:  # a test file left by an earlier install of this patch (reinstalling the wheel
            for rel in _created_files(p):  # leaves files its RECORD does not list): the patch creates it anew
                (scratch / rel).unlink(missing_ok=True)
        res = _patch(scratch, p, "--forward")
        if res.returncode != 0:
            out.append(PatchStatus(p.name, "conflict", (res.stdout + res.stderr).strip()))
            continue
        out.append(PatchStatus(p.name, "applied" if p.name in applied else "pending"))
    return out


def status(root: Path, patch_dir: Path = PATCH_DIR) -> list[PatchStatus]:
    """Each patch's state: applied, pending or conflict."""
    with tempfile.TemporaryDirectory() as tmp:
        return _plan(root, Path(tmp), patch_dir)


def _transition(root: Path, patch_dir: Path, want_applied: bool) -> list[str]:
    """Bring every patch to the wanted state, all-or-nothing: on a scratch copy first, then copy the files."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        statuses = _plan(root, scratch, patch_dir)
        bad = [s for s in statuses if s.state == "conflict"]
        if bad:
            lines = "\n".join(f"  {s.name}: {s.detail}" for s in bad)
            raise PatchError(f"patch does not apply to the installed package (nothing was changed):\n{lines}")
        changing = [s.name for s in statuses if (s.state == "pending") == want_applied]
        touched = sorted(_touched_files(patch_files(patch_dir)))
        if changing and not want_applied:
            for p in reversed(patch_files(patch_dir)):
                res = _patch(scratch, p, "--reverse")
                if res.returncode != 0:
                    raise PatchError(f"reverting {p.name} failed: {res.stdout}{res.stderr}")
        for rel in touched if changing else []:
            _replace(scratch / rel, root / rel)
        # current bytecode, else every process recompiles them at import (and, under PYTHONDONTWRITEBYTECODE,
        # writes nothing): ≈ 0.5 s per Ray worker
        for rel in touched:
            if rel.endswith(".py") and (root / rel).exists():
                with contextlib.suppress(OSError):  # a read-only install: compiled at import, as before
                    py_compile.compile(str(root / rel))
        return changing


def _replace(src: Path, dst: Path) -> None:
    """``dst`` becomes a new file with ``src``'s bytes (and ``dst``'s mode), renamed into place: an installer that
    hard-links package files to its cache (uv does) keeps a pristine cache, which writing ``dst`` in place would
    change for every later install. A file a patch creates comes and goes with it (``src`` absent: ``dst`` removed)."""
    if not src.exists():
        dst.unlink(missing_ok=True)
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".marti-ibrl-tmp")
    shutil.copyfile(src, tmp)
    shutil.copymode(dst if dst.exists() else src, tmp)
    os.replace(tmp, dst)


def apply(root: Path, patch_dir: Path = PATCH_DIR) -> list[str]:
    """Apply every pending patch; returns the names applied now (empty when all were already applied)."""
    return _transition(root, patch_dir, want_applied=True)


def revert(root: Path, patch_dir: Path = PATCH_DIR) -> list[str]:
    """Revert every applied patch; returns the names reverted now."""
    return _transition(root, patch_dir, want_applied=False)


def main(action: str, root: str | None = None) -> int:
    """``marti-ibrl patch apply|check|revert [--root DIR]``: every series on the installed packages, or the
    OpenRLHF series on the openrlhf package under ``DIR``; check exits 1 unless every patch is applied."""
    targets = [(SERIES[0], Path(root))] if root else [(s, installed_root(s)) for s in SERIES]
    ok = True
    for series, target in targets:
        name = series.package
        if action == "apply":
            done = apply(target, series.patch_dir)
            print(
                f"{name}: applied {len(done)} patch(es)"
                + (": " + ", ".join(done) if done else " (all already applied)")
            )
        elif action == "revert":
            done = revert(target, series.patch_dir)
            print(f"{name}: reverted {len(done)} patch(es)" + (": " + ", ".join(done) if done else ""))
        else:
            statuses = status(target, series.patch_dir)
            for s in statuses:
                print(f"{s.state:9s} {name}/{s.name}" + (f"\n{s.detail}" if s.detail else ""))
            ok = ok and all(s.state == "applied" for s in statuses)
    return 0 if ok else 1
