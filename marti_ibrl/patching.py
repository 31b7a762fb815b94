"""Apply, check and revert our patches (``patches/openrlhf/NNNN-*.patch``) on the installed OpenRLHF.

The patches are plain unified diffs against the pristine ``openrlhf==0.11.2`` sources (paths
``a/openrlhf/...``), applied with GNU ``patch -p1`` in the directory that holds the ``openrlhf``
package (site-packages). Each patch is in exactly one of three states:

- ``applied``   — it reverses cleanly (applying again is a no-op: idempotent);
- ``pending``   — it applies cleanly;
- ``conflict``  — neither: the installed files differ from what the patch expects. We refuse.

``apply`` and ``revert`` are all-or-nothing: every patch is dry-run first, so a conflict changes no file.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

OPENRLHF_VERSION = "0.11.2"
PATCH_DIR = Path(__file__).resolve().parent.parent / "patches" / "openrlhf"


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


def installed_root() -> Path:
    """The directory containing the installed ``openrlhf`` package, after checking its version."""
    try:
        version = importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError as e:
        raise PatchError("openrlhf is not installed (run `make install`)") from e
    if version != OPENRLHF_VERSION:
        raise PatchError(
            f"installed openrlhf is {version}, but the patches are for {OPENRLHF_VERSION}; "
            f"install openrlhf=={OPENRLHF_VERSION} (see README: upstreaming / rebasing the patches)"
        )
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("cannot locate the openrlhf package")
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
    shutil.copytree(
        root / "openrlhf",
        scratch / "openrlhf",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    applied = set()
    for p in reversed(patches):
        if _patch(scratch, p, "--reverse", "--dry-run").returncode == 0:
            _patch(scratch, p, "--reverse")
            applied.add(p.name)
    out = []
    for p in patches:
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
            raise PatchError(f"patch does not apply to the installed openrlhf (nothing was changed):\n{lines}")
        changing = [s.name for s in statuses if (s.state == "pending") == want_applied]
        if not changing:
            return []
        if not want_applied:
            for p in reversed(patch_files(patch_dir)):
                res = _patch(scratch, p, "--reverse")
                if res.returncode != 0:
                    raise PatchError(f"reverting {p.name} failed: {res.stdout}{res.stderr}")
        for rel in sorted(_touched_files(patch_files(patch_dir))):
            shutil.copyfile(scratch / rel, root / rel)
        return changing


def apply(root: Path, patch_dir: Path = PATCH_DIR) -> list[str]:
    """Apply every pending patch; returns the names applied now (empty when all were already applied)."""
    return _transition(root, patch_dir, want_applied=True)


def revert(root: Path, patch_dir: Path = PATCH_DIR) -> list[str]:
    """Revert every applied patch; returns the names reverted now."""
    return _transition(root, patch_dir, want_applied=False)


def main(action: str, root: str | None = None) -> int:
    """``marti-ibrl patch apply|check|revert [--root DIR]``; check exits 1 unless every patch is applied."""
    target = Path(root) if root else installed_root()
    if action == "apply":
        done = apply(target)
        print(f"applied {len(done)} patch(es)" + (": " + ", ".join(done) if done else " (all already applied)"))
        return 0
    if action == "revert":
        done = revert(target)
        print(f"reverted {len(done)} patch(es)" + (": " + ", ".join(done) if done else ""))
        return 0
    statuses = status(target)
    for s in statuses:
        print(f"{s.state:9s} {s.name}" + (f"\n{s.detail}" if s.detail else ""))
    return 0 if all(s.state == "applied" for s in statuses) else 1
