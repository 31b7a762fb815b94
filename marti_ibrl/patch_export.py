"""``marti-ibrl patch export [--check] [--against DIR] [--out DIR]``: our OpenRLHF series as upstream will see it.

Builds a git repository from the pristine ``openrlhf`` wheel (its ``openrlhf/`` and ``tests/``, as in OpenRLHF's
repository) or clones a user's OpenRLHF checkout (``--against``), then ``git am``s ``patches/openrlhf/`` one patch at
a time: each line says whether the patch applies. With ``--check`` it then runs OpenRLHF's suite in that tree
(``pytest tests``) and counts, per patch, the tests of the files it adds. Exit status 0 only when every patch applies
(and, with ``--check``, the suite passes).
"""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from marti_ibrl.patching import OPENRLHF_VERSION, PATCH_DIR, PatchError, _created_files, patch_files

_GIT_ENV = {  # git am and the base commit need an identity; the patches keep their own From/Date
    "GIT_AUTHOR_NAME": "marti-ibrl patch export",
    "GIT_AUTHOR_EMAIL": "patch-export@localhost",
    "GIT_COMMITTER_NAME": "marti-ibrl patch export",
    "GIT_COMMITTER_EMAIL": "patch-export@localhost",
}


@dataclass
class PatchResult:
    name: str
    subject: str
    applies: bool | None = None  # None: not tried (an earlier patch failed)
    detail: str = ""
    tests: list[str] = field(default_factory=list)  # the test files it adds
    passed: int = 0
    failed: int = 0


def wheel(wheels: Path | None = None) -> Path:
    """The pristine ``openrlhf`` wheel ``make install`` keeps in ``.venv/wheels``."""
    wheels = wheels or Path(sys.prefix) / "wheels"
    found = sorted(wheels.glob(f"openrlhf-{OPENRLHF_VERSION}-*.whl"))
    if not found:
        raise PatchError(f"no openrlhf-{OPENRLHF_VERSION} wheel in {wheels} (`make install` keeps it there)")
    return found[0]


def _git(tree: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **_GIT_ENV}
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, env=env)


def tree_from_wheel(dest: Path, whl: Path | None = None) -> Path:
    """A git repository at ``dest`` holding the wheel's ``openrlhf/`` and ``tests/``, committed as the base."""
    prefix = f"openrlhf-{OPENRLHF_VERSION}.data/purelib/"
    with zipfile.ZipFile(whl or wheel()) as z:
        for name in z.namelist():
            rel = name[len(prefix) :]
            if name.startswith(prefix) and rel.split("/")[0] in ("openrlhf", "tests") and not name.endswith("/"):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                (dest / rel).write_bytes(z.read(name))
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-q", "-m", f"openrlhf {OPENRLHF_VERSION} (wheel)")):
        res = _git(dest, *args)
        if res.returncode != 0:
            raise PatchError(f"git {args[0]} in {dest} failed: {res.stderr.strip()}")
    return dest


def tree_from_checkout(src: Path, dest: Path) -> Path:
    """A clone of the user's OpenRLHF checkout at ``dest`` (their checkout is left as it is)."""
    if not (src / "openrlhf" / "__init__.py").is_file():
        raise PatchError(f"--against {src}: expected an OpenRLHF checkout (a directory with openrlhf/__init__.py)")
    res = subprocess.run(["git", "clone", "-q", str(src), str(dest)], capture_output=True, text=True)
    if res.returncode != 0:
        raise PatchError(f"--against {src}: expected a git repository ({res.stderr.strip()})")
    return dest


def _subject(patch: Path) -> str:
    """The subject without its ``[PATCH n/N]`` (mail headers may fold a long one over several lines)."""
    subject = email.message_from_string(patch.read_text().split("\n\n", 1)[0])["Subject"] or ""
    return re.sub(r"\s+", " ", re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)).strip()


def git_am(tree: Path, patch_dir: Path = PATCH_DIR) -> list[PatchResult]:
    """``git am`` each patch in order; after the first that fails the rest are not tried (they build on it)."""
    results = [PatchResult(p.name, _subject(p), tests=sorted(_created_files(p))) for p in patch_files(patch_dir)]
    for patch, result in zip(patch_files(patch_dir), results):
        res = _git(tree, "am", "-q", str(patch))
        result.applies = res.returncode == 0
        if not result.applies:
            lines = (res.stdout + res.stderr).splitlines()  # git's own lines, without its how-to-continue hints
            result.detail = "\n".join(ln for ln in lines if ln.startswith(("error:", "Patch failed", "fatal:")))
            _git(tree, "am", "--abort")
            break
    return results


def run_suite(tree: Path, results: list[PatchResult]) -> tuple[int, int, str]:
    """OpenRLHF's suite in ``tree`` (its ``openrlhf`` shadows the installed one): (passed, failed, summary line);
    each patch's ``passed`` / ``failed`` count the tests of the files it adds."""
    junit = tree / ".pytest-junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "tests"]
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if not junit.exists():
        raise PatchError(f"OpenRLHF's suite did not run in {tree}:\n{(out.stdout + out.stderr)[-2000:]}")
    passed = failed = 0
    by_file = {t: r for r in results for t in r.tests}
    for case in ET.parse(junit).getroot().iter("testcase"):
        ok = not any(case.find(tag) is not None for tag in ("failure", "error"))
        if case.find("skipped") is not None:
            continue
        passed, failed = passed + ok, failed + (not ok)
        rel = case.get("classname", "").split(".")  # tests.test_x[.Class]
        result = next((r for f, r in by_file.items() if Path(f).with_suffix("").parts == tuple(rel[:2])), None)
        if result is not None:
            result.passed, result.failed = result.passed + ok, result.failed + (not ok)
    lines = reversed(out.stdout.splitlines())
    summary = next((ln for ln in lines if " in " in ln and ("passed" in ln or "failed" in ln)), "")
    return passed, failed, summary.strip("= ")


def main(check: bool = False, against: str | None = None, out: str | None = None) -> int:
    if shutil.which("git") is None:
        raise PatchError("git is required (apt-get install git)")
    with tempfile.TemporaryDirectory(prefix="openrlhf-series-") as tmp:
        tree = Path(out) if out else Path(tmp) / "openrlhf"
        if out and tree.exists() and any(tree.iterdir()):
            raise PatchError(f"--out {tree}: expected a new or empty directory")
        tree.mkdir(parents=True, exist_ok=True)
        if against:
            shutil.rmtree(tree)
            tree_from_checkout(Path(against).resolve(), tree)
        else:
            tree_from_wheel(tree)
        base = "your checkout " + against if against else f"the openrlhf {OPENRLHF_VERSION} wheel"
        print(f"git am of {PATCH_DIR.name}/ onto {base} ({tree})")
        results = git_am(tree)
        suite = check and all(r.applies for r in results)
        passed, failed, summary = run_suite(tree, results) if suite else (0, 0, "")
        for r in results:
            state = {True: "applies", False: "FAILS", None: "not tried"}[r.applies]
            tests = f", {r.passed} test(s) passed" + (f", {r.failed} FAILED" if r.failed else "") if suite else ""
            print(f"{r.name[:4]} {state:9s} {r.subject}{tests}")
            if r.detail:
                print("     " + r.detail.replace("\n", "\n     "))
        if suite:
            print(f"OpenRLHF's suite with the series: {summary} ({passed} passed, {failed} failed)")
        if out:
            print(f"the series is committed in {tree} (git log; edit, then git format-patch -o patches/openrlhf)")
        return 0 if all(r.applies for r in results) and not failed and (suite or not check) else 1
