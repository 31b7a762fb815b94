"""``marti_ibrl.patching`` on a pristine openrlhf 0.11.2 extracted from the wheel: apply / check / revert; the series
as ``git format-patch`` output that ``git am`` takes (``marti_ibrl.patch_export``); DeepSpeed's gather fix (0.19.8)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import struct
import sys
import zipfile
from pathlib import Path

import pytest

from marti_ibrl import patch_export, patching

PACKAGE_PREFIX = "openrlhf-0.11.2.data/purelib/"
REPO = Path(__file__).resolve().parents[2]


def _wheel() -> Path:
    try:
        return patch_export.wheel()
    except patching.PatchError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def pristine_zip() -> dict[str, bytes]:
    """The wheel's ``openrlhf`` package and its top-level ``tests`` package (OpenRLHF's suite)."""
    with zipfile.ZipFile(_wheel()) as z:
        files = {
            n[len(PACKAGE_PREFIX) :]: z.read(n)
            for n in z.namelist()
            if n.startswith((PACKAGE_PREFIX + "openrlhf/", PACKAGE_PREFIX + "tests/")) and not n.endswith("/")
        }
    assert "openrlhf/trainer/ppo_utils/experience_maker.py" in files and "tests/test_experience.py" in files
    return files


@pytest.fixture
def root(tmp_path: Path, pristine_zip: dict[str, bytes]) -> Path:
    for rel, data in pristine_zip.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return tmp_path


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for package in ("openrlhf", "tests")
        for p in sorted((root / package).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _bytecode_is_current(source: Path) -> bool:
    """Python's own test for a timestamp-validated .pyc: the source's mtime and size in the header."""
    pyc = Path(importlib.util.cache_from_source(str(source)))
    if not pyc.exists():
        return False
    header, st = pyc.read_bytes()[:16], source.stat()
    flags, mtime, size = struct.unpack("<III", header[4:16])
    return header[:4] == importlib.util.MAGIC_NUMBER and flags == 0 and (mtime, size) == (int(st.st_mtime), st.st_size)


def _touched() -> list[str]:
    return sorted(patching._touched_files(patching.patch_files()))


def test_apply_is_idempotent_and_revert_restores_pristine(root: Path, capsys: pytest.CaptureFixture) -> None:
    names = [p.name for p in patching.patch_files()]
    assert len(names) >= 6 and names == sorted(names)
    pristine = _snapshot(root)

    assert [s.state for s in patching.status(root)] == ["pending"] * len(names)
    assert patching.main("check", str(root)) == 1
    assert capsys.readouterr().out.count("pending") == len(names)

    assert patching.apply(root) == names
    assert [s.state for s in patching.status(root)] == ["applied"] * len(names)
    assert patching.main("check", str(root)) == 0
    assert capsys.readouterr().out.count("applied") == len(names)

    # the result is byte-identical to the installed (patched) package, for every file a patch touches
    installed = patching.installed_root()
    touched = _touched()
    assert "openrlhf/trainer/ppo_utils/experience_maker.py" in touched
    for rel in touched:
        assert (root / rel).read_bytes() == (installed / rel).read_bytes(), rel
    patched = _snapshot(root)
    assert {rel for rel in pristine.keys() | patched.keys() if patched.get(rel) != pristine.get(rel)} == set(touched)
    created = {rel for p in patching.patch_files() for rel in patching._created_files(p)}
    assert len(created) == len(names) and set(patched) - set(pristine) == created  # one new test file per patch
    for rel in touched:  # their bytecode is current: no process recompiles them at import
        assert _bytecode_is_current(root / rel), rel

    assert patching.apply(root) == []  # idempotent: nothing left to do, nothing changed
    assert _snapshot(root) == patched

    assert patching.revert(root) == names
    assert _snapshot(root) == pristine
    assert patching.revert(root) == []
    assert [s.state for s in patching.status(root)] == ["pending"] * len(names)


def _first_removed_line(patch: Path) -> tuple[str, str] | None:
    """(file, text) of the first line a patch removes (None for a patch that only adds)."""
    current = ""
    diff = "diff --git " + patch.read_text().split("\ndiff --git ", 1)[1]
    for line in diff.splitlines():
        if line.startswith("--- a/"):
            current = line[len("--- a/") :].split("\t")[0]
        elif line.startswith("-") and not line.startswith("---") and line[1:].strip():
            return current, line[1:]
    return None


@pytest.mark.parametrize("which", [0, -1])
def test_conflict_raises_and_changes_no_file(root: Path, which: int) -> None:
    # patches whose first removed line is in the pristine sources (0008's removes a line 0002 added)
    pristine = [
        p for p in patching.patch_files() if (r := _first_removed_line(p)) and r[1] in (root / r[0]).read_text()
    ]
    patch = pristine[which]
    rel, line = _first_removed_line(patch)
    path = root / rel
    text = path.read_text()
    assert line in text
    path.write_text(text.replace(line, line + "  # edited by hand", 1))
    before = _snapshot(root)

    states = {s.name: s.state for s in patching.status(root)}
    assert states[patch.name] == "conflict"
    assert [n for n, s in states.items() if s == "conflict"] == [patch.name]

    with pytest.raises(patching.PatchError, match=re.escape(patch.name)) as err:
        patching.apply(root)
    assert "nothing was changed" in str(err.value)
    assert _snapshot(root) == before
    assert patching.main("check", str(root)) == 1


def test_apply_and_revert_leave_hard_linked_copies_alone(root: Path, tmp_path_factory) -> None:
    """uv installs package files as hard links to its cache: patching must replace the installed files, never write
    through the link (that patched uv's cache, so a reinstalled "pristine" wheel came back patched)."""
    cache = tmp_path_factory.mktemp("uv-cache")
    shipped = [rel for rel in _touched() if (root / rel).exists()]  # not the test files the patches create
    for rel in shipped:
        os.link(root / rel, cache / rel.replace("/", "_"))
    pristine = {rel: (root / rel).read_bytes() for rel in shipped}
    assert patching.apply(root)
    for rel in shipped:
        assert (cache / rel.replace("/", "_")).read_bytes() == pristine[rel], rel  # the cache is untouched
        assert (root / rel).read_bytes() != pristine[rel] and (root / rel).stat().st_nlink == 1
    assert patching.revert(root)
    assert {rel: (root / rel).read_bytes() for rel in _touched() if (root / rel).exists()} == pristine
    assert not list(root.rglob("*.marti-ibrl-tmp"))


def test_conflict_on_a_partly_patched_tree_is_all_or_nothing(root: Path) -> None:
    patching.apply(root)
    rel, _ = _first_removed_line(patching.patch_files()[0])
    # after apply, the removed line is gone; break a line the patch *adds* instead
    path = root / rel
    added = next(
        ln[1:]
        for ln in patching.patch_files()[0].read_text().splitlines()
        if ln.startswith("+") and not ln.startswith("+++") and ln[1:].strip() and ln[1:] in path.read_text()
    )
    path.write_text(path.read_text().replace(added, added + "  # drift", 1))
    before = _snapshot(root)
    with pytest.raises(patching.PatchError):
        patching.revert(root)
    assert _snapshot(root) == before


def test_installed_root_checks_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    root = patching.installed_root()
    assert (root / "openrlhf" / "__init__.py").is_file()

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.11.3")
    with pytest.raises(patching.PatchError, match=r"installed openrlhf is 0\.11\.3.*patches are for 0\.11\.2"):
        patching.installed_root()
    with pytest.raises(patching.PatchError, match="0.11.3"):
        patching.main("check")

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(patching.PatchError, match="not installed"):
        patching.installed_root()


@pytest.mark.parametrize("series", patching.SERIES, ids=lambda s: s.package)
def test_installed_package_is_fully_patched(series: patching.Series) -> None:
    states = {s.name: s.state for s in patching.status(patching.installed_root(series), series.patch_dir)}
    assert states and set(states.values()) == {"applied"}, states
    root = patching.installed_root(series)
    for rel in patching._touched_files(patching.patch_files(series.patch_dir)):
        assert _bytecode_is_current(root / rel), rel


def test_a_reinstalled_wheel_leaves_test_files_that_apply_takes_over(
    root: Path, pristine_zip: dict[str, bytes]
) -> None:
    """Reinstalling the pristine wheel (every `make install`) restores the files its RECORD lists and leaves the test
    files our patches created: apply must create them anew, not refuse them as a conflict."""
    names = [p.name for p in patching.patch_files()]
    patching.apply(root)
    patched = _snapshot(root)
    for rel, data in pristine_zip.items():  # what reinstalling the wheel restores
        (root / rel).write_bytes(data)
    assert [s.state for s in patching.status(root)] == ["pending"] * len(names)
    assert patching.apply(root) == names
    assert _snapshot(root) == patched


def test_deepspeed_is_the_release_with_the_gather_fix() -> None:
    """DeepSpeed 0.19.8 waits on every all-gather handle of a blocking multi-parameter gather (its PR #8539, once our
    patches/deepspeed/0001): the pins and the installed version agree, and no DeepSpeed patch is left to apply."""
    pins = {
        path: re.findall(r"deepspeed==([\d.]+)", (REPO / path).read_text())
        for path in ("requirements/openrlhf-cpu.txt", "setup.py")
    }
    assert pins == {"requirements/openrlhf-cpu.txt": ["0.19.8"], "setup.py": ["0.19.8"]}
    assert importlib.metadata.version("deepspeed") == "0.19.8"
    assert [s.package for s in patching.SERIES] == ["openrlhf"]
    assert not list((REPO / "patches").glob("deepspeed/*.patch"))


# Two gloo ranks, ZeRO-3 on CPU: gather each Linear's weight and bias together (the blocking multi-parameter gather of
# transformers' ZeRO-3 loading and of DeepSpeed's consolidated state dict) and compare with one-at-a-time gathers.
_GATHERS = """
import os, sys, torch, deepspeed
deepspeed.init_distributed("gloo")
torch.manual_seed(0)
with deepspeed.zero.Init(config_dict_or_path={"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}):
    m = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
truth = {}
for n, p in m.named_parameters():
    with deepspeed.zero.GatheredParameters([p]):
        truth[n] = p.detach().clone()
wrong = 0
for _ in range(int(sys.argv[1])):
    for i, lin in enumerate(m):
        with deepspeed.zero.GatheredParameters([lin.weight, lin.bias]):
            wrong += not (torch.equal(lin.weight, truth[f"{i}.weight"]) and torch.equal(lin.bias, truth[f"{i}.bias"]))
print(f"RANK {os.environ['RANK']} WRONG {wrong}", flush=True)
torch.distributed.barrier()
"""


@pytest.mark.e2e  # a two-rank torch.distributed.run of DeepSpeed ZeRO-3: minutes on 2 busy cores
def test_deepspeed_multi_parameter_gathers_are_complete_on_gloo(tmp_path: Path) -> None:
    """The guard for DeepSpeed's fix (ours upstreamed: PR #8539, in 0.19.8): before it about one gather in ten read a
    weight gloo was still writing (43-45 of 400 per rank on 0.19.6, measured); the weights must be the truth on every
    one of 2 x 400 gathers (50 rounds of 8 Linears per rank)."""
    import subprocess

    from child_env import END_OF_SCRIPT, child_env

    script = tmp_path / "gathers.py"
    script.write_text(_GATHERS + END_OF_SCRIPT)

    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    out = subprocess.run([*run, "50"], capture_output=True, text=True, env=child_env(), timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(re.findall(r"RANK (\d) WRONG (\d+)", out.stdout)) == [("0", "0"), ("1", "0")], out.stdout[-2000:]


def test_no_patches_found(tmp_path: Path) -> None:
    with pytest.raises(patching.PatchError, match="no patches found"):
        patching.patch_files(tmp_path)


_SERIES = patching.patch_files()


@pytest.mark.parametrize("patch", _SERIES, ids=lambda p: p.name)
def test_each_patch_is_git_format_patch_output_citing_its_own_tests(patch: Path) -> None:
    """What `git am` needs (an mbox "From <sha>" line, From, Date, `[PATCH n/N]` numbered in order) and a `Tested:`
    paragraph citing the test files the patch adds to OpenRLHF's suite, which a maintainer can run."""
    text = patch.read_text()
    header, body = text.split("\n\n", 1)
    n, total = _SERIES.index(patch) + 1, len(_SERIES)
    assert re.match(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001\nFrom: \S", header), header[:120]
    assert re.search(r"^Date: \S", header, re.MULTILINE), header
    assert re.search(rf"^Subject: \[PATCH {n}/{total}\] \S", header, re.MULTILINE), header
    message = body.split("\n---\n", 1)[0]
    tested = message.split("\nTested: ", 1)[1].split("\n\n", 1)[0] if "\nTested: " in message else ""
    created = patching._created_files(patch)
    assert created and all(re.fullmatch(r"tests/test_\w+\.py", rel) for rel in created), created
    assert set(re.findall(r"tests/test_\w+\.py", tested)) == created, tested  # cites exactly its own tests
    assert "marti" not in message.lower()  # upstream cannot run our tests, nor needs our name


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_series_git_ams_onto_a_tree_of_the_pristine_wheel(tmp_path: Path) -> None:
    """`git am` takes the whole series on a repository made from the wheel (what `make upstream-check` starts
    from), and the result is the installed, patched OpenRLHF with one new test file per patch."""
    tree = patch_export.tree_from_wheel(tmp_path / "openrlhf", _wheel())
    results = patch_export.git_am(tree)
    assert [(r.name, r.applies) for r in results] == [(p.name, True) for p in _SERIES], results
    assert [len(r.tests) for r in results] == [1] * len(_SERIES)
    log = patch_export._git(tree, "log", "--format=%s", "--reverse").stdout.splitlines()
    assert log[1:] == [r.subject for r in results] and all(log[1:])
    installed = patching.installed_root()
    for rel in _touched():
        assert (tree / rel).read_bytes() == (installed / rel).read_bytes(), rel


def test_export_refuses_a_directory_that_is_not_an_openrlhf_checkout(tmp_path: Path, capsys) -> None:
    from marti_ibrl.cli import main

    assert main(["patch", "export", "--against", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--against" in err and "openrlhf/__init__.py" in err, err
