"""Exact resume: interrupted runs, resumed, equal a run that never stopped.

Every run here is asynchronous (``--train.async_rollout``, staleness 1: the rollout of k+1 runs while k updates, and
the commit of k holds it), the hardest case for resume: an interruption almost always lands during an overlap, and
the rollout ahead was made by weights that no longer exist. (Synchronous resume: tests/e2e/test_e2e_colocate.py's
``role`` run, tests/e2e/test_e2e_lora.py.) The straight run trains 4 iterations. The interrupted run is interrupted the hardest way this machine allows:

* **On the local Slurm** (CI; ``tests/slurm_cluster.py``): ``recipes/dond/tiny-cluster-cpu.sh`` is submitted with
  ``sbatch``. After its first commit the batch shell gets SIGTERM (preemption: the recipe requeues the job, and the
  requeued job resumes by itself from the last commit). Once the requeued job has committed an iteration of its own,
  n2's raylet and every process under it are killed (a lost node: the actor, engines and ranks there die with it; the
  raylet alone let its workers finish a tiny run before they noticed), and the job must fail with an
  error naming n2 and nothing half-committed. The run is then re-submitted by hand with ``--ckpt.load_enable true``.
* **Without Slurm**: the driver is killed (``kill -9``) while iteration 3 is rolling out, and resumed.

Before the last resume we also fake a checkpoint that was being written when the job died (a ``global_stepK``
directory without its files, and DeepSpeed's ``latest`` pointing at it). Resuming must start from the last committed
iteration and replay the rest exactly: same opponent configurations, pool snapshots and scenario order, and the same
weights. Every run has the recipe's YAML made light for its start-ups (one ZeRO-2 rank and one HF engine per role,
KL off, so no reference), with toy rewards that vary across rollouts, so gradients and Adam states are real. On CPU
(one thread per process, seeded engine sampling and updates) the weights come out bit-identical; the test allows
1e-6 (fp32) to stay robust to BLAS reduction order.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from slurm_cluster import N2_ADDRESS, committed, needs_slurm, until
from test_e2e_ibrl import _weights
from test_e2e_tiny_cluster import _sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

TESTS = Path(__file__).resolve().parents[1]
RECIPE = TESTS.parent / "recipes" / "dond" / "tiny-cluster-cpu.sh"
ITERATIONS = 4
TOLERANCE = 1e-6


def _flags() -> list[str]:
    """What every run overrides in the recipe's YAML (the model and run directory aside)."""
    return [
        *("--rollout.engine", "hf", "--role1.num_engines", "1", "--pool.num_engines", "1"),
        *("--role1.num_gpus_per_node", "1", "--role2.num_gpus_per_node", "1", "--ds.zero_stage", "2"),
        *("--role1.kl_coef", "0", "--role2.kl_coef", "0", "--role1.colocate_ref", "false"),
        *("--role2.colocate_ref", "false", "--role1.lr", "5e-3", "--role2.lr", "5e-3"),
        *("--role1.reward_fn", "test_e2e_ibrl:toy_reward", "--role2.reward_fn", "test_e2e_ibrl:toy_reward"),
        # 4 scenarios x 24 tokens: an iteration long enough (~2-3 s) that the lost-node fault lands while the
        # requeued job still has iterations to play even when the test's polls are slow under load (CI saw a job of
        # 2 scenarios x 12 tokens finish its last two iterations, ~2.7 s, before the node was taken away)
        *("--env.max_rounds", "2", "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2"),
        *("--rollout.max_new_tokens", "24", "--rollout.max_len", "384"),
        *("--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2"),
        *("--pool.probs", "[0.4,0.3,0.3]", "--pool.size", "2", "--train.iterations", str(ITERATIONS)),
        *("--ckpt.save_steps", "1", "--ckpt.save_hf", "true", "--train.check_sync", "true"),
        *("--train.seed", "9"),  # draws agent1, agent1, agent2, agent2: iteration 4 plays two Eq. 6 pairings
        *("--train.async_rollout", "true"),
    ]


def _python_path() -> str:  # the toy reward's module, for the driver
    return os.pathsep.join([str(TESTS), str(TESTS / "e2e"), os.environ.get("PYTHONPATH", "")])  # helpers; toy_reward


def _start(model: str, run_dir: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": _python_path()}
    cmd = [sys.executable, "-m", "marti_ibrl.cli", "train", "--config", str(RECIPE.with_suffix(".yaml"))]
    cmd += ["--role1.pretrain", model, "--role2.pretrain", model, *_flags(), "--ckpt.path", str(run_dir), *extra]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen, log: Path) -> None:
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # Ray's local processes die with their driver; be sure


def _fake_half_written_checkpoint(run_dir: Path) -> int:
    """A checkpoint the driver was writing when it died: DeepSpeed's ``latest`` already points at it."""
    step = committed(run_dir) + 1
    for role in ("agent1", "agent2"):
        actor = run_dir / role / "ckpt" / "_actor"
        (actor / f"global_step{step}").mkdir(exist_ok=True)  # or the real half-written one, if the kill came late
        (actor / "latest").write_text(f"global_step{step}")
    return step


def _killed_locally(model: str, tmp: Path, run_dir: Path) -> dict:
    proc = _start(model, run_dir, tmp / "killed.log")
    try:
        deadline = time.time() + 600
        while committed(run_dir) < 2:
            assert proc.poll() is None, (tmp / "killed.log").read_text()[-3000:]
            assert time.time() < deadline
            time.sleep(0.2)
        time.sleep(0.3)  # iteration 3 is rolling out
        assert proc.poll() is None, "the run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        _kill_group(proc)
    assert committed(run_dir) == 2
    return {}


def _submit(slurm, name: str, model: str, run_dir: Path, *extra: str) -> str:
    """sbatch the recipe with the runs' flags (the model and run directory as the recipe takes them)."""
    env = dict(DOND_MODEL=model, RUN_DIR=str(run_dir), PYTHONPATH=_python_path())
    return slurm.submit(name, RECIPE, *_flags(), *extra, **env)


def _lose_node(address: str) -> None:
    """A lost node, as when its machine goes away: its raylet and every process under it (the workers holding the
    roles' actors, engines and ranks, Ray's agents) SIGKILLed at once. The raylet alone is not enough: its workers
    notice their raylet's death only later, and CI once saw them finish the run's last two iterations (≈ 3 s) first."""
    found = subprocess.run(
        ["pgrep", "-f", f"raylet/raylet .*--node_ip_address={address}"], capture_output=True, text=True
    ).stdout.split()
    assert found, f"no raylet runs for {address}"
    tree = list(found)
    for pid in tree:  # grows while it is walked: breadth-first over the descendants
        tree += subprocess.run(["pgrep", "-P", pid], capture_output=True, text=True).stdout.split()
    for pid in reversed(tree):  # the workers first, the raylet last: none outlives it
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _preempted_and_lost_on_slurm(slurm, model: str, run_dir: Path) -> dict:
    job = _submit(slurm, "resume-b", model, run_dir)
    slurm.until_job(job, "B's first commit", lambda: committed(run_dir) >= 1, every=0.2)
    slurm.run("scancel", "--signal=TERM", "--batch", job)  # preemption: SIGTERM to the batch shell
    until("B requeued", lambda: slurm.job(job).get("Restarts", "0") != "0")
    until("B pending", lambda: slurm.job(job).get("JobState") == "PENDING")
    at_sigterm = committed(run_dir)
    # (Slurm holds a requeued job for ~2 minutes before it is eligible again; the test does not wait)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    slurm.until_job(job, "the requeued B's own commit", lambda: committed(run_dir) > at_sigterm, every=0.2)
    _lose_node(N2_ADDRESS)
    return dict(
        job=job,
        at_sigterm=at_sigterm,
        state=slurm.final_state(job),
        at_loss=committed(run_dir),
        restarts=slurm.job(job).get("Restarts"),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory, local_slurm):
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("resume")
    model = build_tiny_dond_model(tmp / "tiny")
    straight, resumed = tmp / "straight", tmp / "resumed"

    _finish(_start(model, straight, tmp / "straight.log"), tmp / "straight.log")
    if local_slurm is None:
        faults = _killed_locally(model, tmp, resumed)
    else:
        faults = _preempted_and_lost_on_slurm(local_slurm, model, resumed)
    killed = json.loads((resumed / "trainer_state.json").read_text())
    killed_log, killed_ahead = killed["rollout_log"], killed["ahead"]
    faked = _fake_half_written_checkpoint(resumed)
    if local_slurm is None:
        _finish(_start(model, resumed, tmp / "resume.log", "--ckpt.load_enable", "true"), tmp / "resume.log")
        log = (tmp / "resume.log").read_text()
    else:
        job = _submit(local_slurm, "resume-c", model, resumed, "--ckpt.load_enable", "true")
        faults["resubmitted"] = local_slurm.final_state(job)  # re-submitted by hand, same RUN_DIR
        log = local_slurm.log("resume-c")
    return SimpleNamespace(
        model=model,
        straight=straight,
        straight_log=(tmp / "straight.log").read_text(),
        resumed=resumed,
        killed_log=killed_log,
        killed_ahead=killed_ahead,
        faked=faked,
        log=log,
        slurm=local_slurm,
        faults=faults,
    )


def _state(run_dir: Path) -> dict:
    return json.loads((run_dir / "trainer_state.json").read_text())


def test_resumed_run_replays_the_same_iterations(runs):
    a, b = _state(runs.straight), _state(runs.resumed)
    assert a["iteration"] == b["iteration"] == ITERATIONS
    assert [e["iteration"] for e in b["rollout_log"]] == [1, 2, 3, 4]
    assert 2 <= len(runs.killed_log) < ITERATIONS  # interrupted after iteration 2 or 3 was committed
    assert b["rollout_log"][: len(runs.killed_log)] == runs.killed_log
    # the interrupted commit held the next iteration's rollout, made before it; the finished runs hold none
    assert runs.killed_ahead["iteration"] == len(runs.killed_log) + 1
    assert runs.killed_ahead["file"] == f"rollouts/k{len(runs.killed_log) + 1}.pkl"
    assert a["ahead"] is b["ahead"] is None and not list((runs.resumed / "rollouts").iterdir())
    assert [m["agent1/async/staleness"] for m in b["history"]] == [0.0, 1.0, 1.0, 1.0]
    # same opponent configurations (Eq. 6 draws), opponents and scenario order in every iteration
    assert a["rollout_log"] == b["rollout_log"]
    # the kept dialogues (--logger.transcripts): the killed run's lines after its commit were dropped on resume and
    # played again, identically; nothing twice, nothing missing
    from marti_ibrl.rollout.transcripts import read

    kept = read(runs.resumed)
    assert [r["iteration"] for r in kept] == sorted(r["iteration"] for r in kept)
    assert kept == read(runs.straight) and {r["iteration"] for r in kept} == {1, 2, 3, 4}
    # iteration 3: agent2 is not due (update_every 2), so its pairing against agent1's history is not played, only
    # current play for agent1; iteration 4: agent2 (current) faces agent1's history and agent1 the current agent2,
    # each role learning from its own pairing. Replayed exactly, snapshot included
    assert [e["configuration"] for e in b["rollout_log"]] == ["agent1", "agent1", "agent2", "agent2"]
    current = {"agent1": "current", "agent2": "current"}
    assert b["rollout_log"][2]["pairings"] == [{"learners": ["agent1", "agent2"], "seats": current}]
    history, now = b["rollout_log"][3]["pairings"]
    assert history["learners"] == ["agent2"] and history["seats"]["agent1"].startswith("pool:")
    assert now == {"learners": ["agent1"], "seats": current}
    assert [m["rollout/dialogues"] for m in b["history"]][2:] == [8.0, 16.0]  # 4 scenarios x G=2, x2 pairings
    assert a["updates"] == b["updates"] == {"agent1": b["updates"]["agent1"], "agent2": b["updates"]["agent2"]}
    assert a["sampler"] == b["sampler"]
    for ha, hb in zip(a["history"], b["history"]):
        for key in ("agent1/reward", "agent2/reward", "agent1/updated", "agent2/updated", "pool/configuration"):
            assert ha[key] == hb[key], key
    grads = [m["agent1/actor_grad_norm"] for m in a["history"]]
    assert grads == [m["agent1/actor_grad_norm"] for m in b["history"]]
    assert all(g > 0 for g in grads[:2])  # real gradients before the interruption: Adam has states to restore


def test_train_ends_saying_where_the_run_is_its_report_and_what_to_run_next(runs):
    lines = [line for line in runs.straight_log.splitlines() if line.startswith("[train] ")]
    run = runs.straight
    assert lines[0].startswith(f"[train] run directory: {run} (HF checkpoints: {run}/<role>/hf")
    assert lines[1] == f"[train] report: {run}/report.md (curves in {run}/figures)"
    assert (run / "report.md").read_text().startswith(f"# Report: {run.name}")
    assert (run / "figures" / "outcome_curves.png").stat().st_size > 0
    assert lines[2].startswith("[train] first 2 -> last 2 iterations: agreement ")
    assert lines[3] == f"[train] what they said: marti-ibrl show {run} (--malformed: where malformed turns came from)"
    assert lines[4].startswith(f"[train] evaluate it: marti-ibrl eval --run {run} --policy agent1={run}/agent1/hf ")
    # and it started with one line per stage, each with its seconds
    stages = [line.split(": ")[0] for line in runs.straight_log.splitlines() if line.startswith("[start-up] ")]
    assert stages == [
        "[start-up] Ray (a local cluster)",
        "[start-up] agent1",
        "[start-up] agent2",
        "[start-up] models loaded",
        "[start-up] engines synced to the actors' weights",
    ]


def test_resumed_pools_match(runs):
    a, b = _state(runs.straight)["pools"], _state(runs.resumed)["pools"]
    strip = ("seconds",)  # wall time of the write differs
    for role in ("agent1", "agent2"):
        ma = [{k: v for k, v in m.items() if k not in strip} for m in a[role]["members"]]
        mb = [{k: v for k, v in m.items() if k not in strip} for m in b[role]["members"]]
        assert ma == mb, role  # same versions, iterations and sha256 of the weights
        files = sorted(p.name for p in (runs.resumed / "pool" / role).glob("*.safetensors*"))
        assert files == sorted(m["file"] for m in mb)  # no uncommitted or half-written snapshot left behind


def test_resumed_weights_match(runs):
    init = _weights(Path(runs.model))
    for role in ("agent1", "agent2"):
        wa, wb = _weights(runs.straight / role / "hf"), _weights(runs.resumed / role / "hf")
        assert wa.keys() == wb.keys()
        diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
        assert diff <= TOLERANCE, (role, diff)
        assert not torch.equal(wa["model.embed_tokens.weight"], init["model.embed_tokens.weight"])  # it did train


def test_resumed_engines_hold_the_resumed_weights(runs):
    """After the resume's start-up and every replayed iteration each engine holds its actor's weights, and those are
    the straight run's (``--train.check_sync``'s digests)."""
    straight, resumed = _sync(runs.straight), _sync(runs.resumed)
    assert straight.keys() == resumed.keys() == {(k, r) for k in range(ITERATIONS + 1) for r in ("agent1", "agent2")}
    for key, rec in resumed.items():
        assert set(rec["engines"]) == {rec["actor"]} == {straight[key]["actor"]}, key


def test_half_written_checkpoint_was_not_loaded(runs):
    for role in ("agent1", "agent2"):
        actor = runs.resumed / role / "ckpt" / "_actor"
        assert (actor / "latest").read_text().strip() == f"global_step{ITERATIONS}"
        # rewritten by the resumed run
        assert (actor / f"global_step{runs.faked}" / "mp_rank_00_model_states.pt").exists()
    assert f"commits iteration {runs.faked - 1}; resuming at iteration {runs.faked} of 4" in runs.log, runs.log[-3000:]


# -- what only Slurm checks -----------------------------------------------------------------------------------


@needs_slurm
def test_sigterm_requeues_the_job_and_the_requeued_job_resumes_by_itself(runs):
    text = runs.slurm.log("resume-b")
    assert 1 <= runs.faults["at_sigterm"] < ITERATIONS
    assert "SIGTERM: requeueing job" in text
    assert re.search(r"restarted \(requeue 1\): resuming from .*'s last commit", text)
    assert "--ckpt.load_enable true" in text.split("restarted (requeue 1)")[1]
    assert runs.faults["at_loss"] > runs.faults["at_sigterm"]  # the requeued job trained on


@needs_slurm
def test_a_lost_node_fails_the_job_naming_it_with_nothing_half_committed(runs):
    faults, text = runs.faults, runs.slurm.log("resume-b")
    assert faults["state"] == "FAILED", text[-4000:]
    assert faults["restarts"] == "1"  # a failure is not requeued: only preemption is
    lost, kept = faults["at_loss"] + 1, faults["at_loss"]
    match = re.search(rf"Ray node n2 \(127\.0\.0\.3, id \w+\) was lost during iteration {lost}; it ran ([^.]+)\.", text)
    assert match, text[-4000:]
    assert re.search(r"agent[12] (actor|engines|pool_engines) \(\d\)", match.group(1)), match.group(1)
    assert f"the run directory {runs.resumed} holds iteration {kept} as committed" in text
    assert faults["resubmitted"] == "COMPLETED", runs.log[-4000:]
