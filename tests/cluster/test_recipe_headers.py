"""The GPU recipes' ``#SBATCH`` headers ask only for what the job needs (issue 65: ``--exclusive``, 64 CPUs a task and
3 days were refused by many sites): the GPUs of each node, 4 CPUs per GPU (what ``slurm-ray.sh`` gives Ray when
``SLURM_CPUS_PER_TASK`` is unset), a day per job (a job at its limit gets SIGTERM, requeues and resumes from its last
commit), and the signal and requeue that make that work. Site options go on the ``sbatch`` line (recipes/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU_RECIPES = sorted(p for p in (ROOT / "recipes").glob("*/qwen*.sh"))


def _header(path: Path) -> dict[str, str]:
    lines = [m.group(1) for m in re.finditer(r"^#SBATCH (\S+)$", path.read_text(), re.M)]
    return dict(line.lstrip("-").split("=", 1) if "=" in line else (line.lstrip("-"), "") for line in lines)


def test_there_are_gpu_recipes() -> None:
    assert len(GPU_RECIPES) == 7


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_gpu_recipe_asks_only_for_what_the_job_needs(recipe: Path) -> None:
    h = _header(recipe)
    gpus = int(h["gres"].removeprefix("gpu:"))
    assert "exclusive" not in h and int(h["cpus-per-task"]) == 4 * gpus
    assert h["time"] == "1-00:00:00" and h["signal"] == "B:TERM@300" and "requeue" in h
    assert h["ntasks-per-node"] == "1" and set(h) <= {
        "job-name", "nodes", "ntasks-per-node", "gres", "cpus-per-task", "time", "output", "requeue", "open-mode",
        "signal",
    }  # fmt: skip


def test_ray_is_told_the_cpus_the_header_asks_for() -> None:
    """slurm-ray.sh's default when Slurm sets no SLURM_CPUS_PER_TASK is the headers' 4 per GPU."""
    assert "cpus=${SLURM_CPUS_PER_TASK:-$((gpn * 4))}" in (ROOT / "recipes" / "slurm-ray.sh").read_text()
