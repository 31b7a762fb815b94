"""recipes/slurm-ray.sh on the local Slurm, in seconds rather than training runs: a preemption or time-limit SIGTERM
requeues the job, a user's ``scancel`` cancels it (its SIGTERM reaches a job that is no longer RUNNING), and a
``ray start`` that fails ends the job at once, naming the node, instead of waiting out RAY_WAIT_TIMEOUT.

The signal tests' batch script is the launcher's own trap (``ibrl_on_sigterm``) around a sleep."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_cluster import needs_slurm, until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [needs_slurm, pytest.mark.timeout(300)]


@pytest.fixture
def job_script(tmp_path):
    script = tmp_path / "sleeper.sh"
    script.write_text(
        "#!/usr/bin/env bash\n#SBATCH --requeue\n#SBATCH --open-mode=append\n"
        f"IBRL_NAME=sleeper IBRL_ROOT={tmp_path} RECIPE={script} RUN_DIR={tmp_path}/run\n"
        f"source {ROOT}/recipes/slurm-ray.sh\n"
        "trap ibrl_on_sigterm TERM\n"
        'echo "started (restart ${SLURM_RESTART_COUNT:-0})"\n'
        'sleep 600 &\necho "waiting for $!"\nwait\n'
    )
    return script


def _started(slurm, name: str) -> bool:
    """The job's shell has its trap and waits on its child: a signal now meets the trap, not the shell's start-up
    (in CI, a scancel 0.25 s after the job started ended the shell at once, the trap never run)."""
    return "waiting for" in slurm.log(name)


def test_sigterm_to_the_batch_shell_requeues(local_slurm, job_script):
    job = local_slurm.submit("signals-term", job_script)
    until("the job to start", lambda: _started(local_slurm, "signals-term"), timeout=60, every=0.5)
    local_slurm.run("scancel", "--signal=TERM", "--batch", job)
    try:
        until("the requeue", lambda: local_slurm.job(job).get("Restarts") == "1", timeout=60, every=0.5)
        assert local_slurm.job(job)["JobState"] in ("PENDING", "REQUEUED", "COMPLETING")
        assert "SIGTERM: requeueing job" in local_slurm.log("signals-term")
    finally:
        local_slurm.run("scancel", job)


def test_scancel_cancels(local_slurm, job_script):
    job = local_slurm.submit("signals-cancel", job_script)
    until("the job to start", lambda: _started(local_slurm, "signals-cancel"), timeout=60, every=0.5)
    local_slurm.run("scancel", job)
    assert local_slurm.final_state(job, timeout=60) == "CANCELLED"
    assert local_slurm.job(job).get("Restarts") == "0"
    text = until("the trap's line", lambda: "not requeued here" in (t := local_slurm.log("signals-cancel")) and t, 30)
    assert f"SIGTERM: job {job} is COMPLETING" in text
    assert "requeueing" not in text


def test_a_ray_start_that_fails_ends_the_job_at_once_naming_the_node(local_slurm, tmp_path):
    from marti_ibrl.tiny import build_tiny_dond_model

    model = build_tiny_dond_model(tmp_path / "tiny")
    recipe = ROOT / "recipes" / "dond" / "tiny-cluster-cpu.sh"
    # a head that cannot start: Ray refuses the port at once (a port in use fails the same way after Ray's ~60 s)
    env = dict(DOND_MODEL=model, RUN_DIR=str(tmp_path / "run"), RAY_PORT="no-such-port", RAY_WAIT_TIMEOUT="600")
    job = local_slurm.submit("launcher-ray-fails", recipe, "--rollout.engine", "hf", **env)
    assert local_slurm.final_state(job, timeout=120) == "FAILED"  # well before RAY_WAIT_TIMEOUT
    text = local_slurm.log("launcher-ray-fails")
    assert "error: `ray start` on n1 exited before the cluster was up (its errors above)" in text, text[-3000:]
    assert "submitting: marti-ibrl train" not in text
