"""benchmarks/gpu_smoke.sh on a machine without a GPU: exit 2 at once, before Ray, saying why."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_smoke.sh"


def run(env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    return out, time.perf_counter() - start


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_no_nvidia_smi_fails_fast():
    out, seconds = run(dict(os.environ))
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        == "gpu_smoke: error: no NVIDIA GPU here (nvidia-smi not found); this smoke test needs a CUDA GPU"
    )
    assert seconds < 5 and out.stdout == ""


def test_torch_without_cuda_fails_before_ray(tmp_path):
    """A driver that answers (a stub nvidia-smi) but a CPU-only torch: the torch check stops it."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    out, _ = run(env)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"gpu_smoke: error: torch.cuda.is_available() is False (torch {torch.__version__}): "
        'a CUDA build of torch is needed (pip install -e ".[gpu]")'
    )
    assert not (tmp_path / "out").exists()  # nothing built, no Ray started
