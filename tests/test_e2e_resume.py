"""Exact resume: a run killed with SIGKILL during iteration 3 and resumed equals a run that never stopped.

Run A trains 4 iterations straight. Run B is killed (``kill -9`` of the driver) while iteration 3 is
rolling out, after iteration 2 was committed; before resuming, we also fake a checkpoint that was being
written when the driver died (a ``global_step3`` directory without its files, and DeepSpeed's ``latest``
pointing at it). ``--ckpt.load_enable`` must resume from the committed iteration 2 and replay 3 and 4
exactly: same opponent configurations, pool snapshots and scenario order, and the same weights. On CPU
(one thread per process, seeded engine sampling and updates) the weights come out bit-identical; the
test allows 1e-6 (fp32) to stay robust to BLAS reduction order.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_e2e_ibrl import _weights, tiny_flags

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
TOLERANCE = 1e-6


def _args(model: str, run_dir: Path) -> list[str]:
    return [
        *tiny_flags(model, run_dir, 4),
        *("--role2.update_every", "2", "--role1.kl_coef", "0", "--role2.kl_coef", "0"),
        *("--train.device", "cpu", "--ray.log_to_driver", "false"),
        *("--pool.probs", "[0.4,0.3,0.3]", "--pool.size", "2"),
        *("--train.seed", "9"),  # draws agent1, agent1, agent2, agent2: iteration 4 plays two Eq. 6 pairings
    ]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "marti_ibrl.cli", "train", *args]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen, log: Path) -> None:
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]


def _committed(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "trainer_state.json").read_text())["iteration"]
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # Ray's local processes die with their driver; be sure


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("resume")
    model = build_tiny_dond_model(tmp / "tiny")
    straight, resumed = tmp / "straight", tmp / "resumed"

    proc = _start(_args(model, straight), tmp / "straight.log")
    _finish(proc, tmp / "straight.log")

    proc = _start(_args(model, resumed), tmp / "killed.log")
    try:
        deadline = time.time() + 600
        while _committed(resumed) < 2:
            assert proc.poll() is None, (tmp / "killed.log").read_text()[-3000:]
            assert time.time() < deadline
            time.sleep(0.2)
        time.sleep(0.3)  # iteration 3 is rolling out
        assert proc.poll() is None, "the run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        _kill_group(proc)
    assert _committed(resumed) == 2
    killed_log = json.loads((resumed / "trainer_state.json").read_text())["rollout_log"]
    # a checkpoint the driver was writing when it died: DeepSpeed's `latest` already points at it
    for role in ("agent1", "agent2"):
        actor = resumed / role / "ckpt" / "_actor"
        (actor / "global_step3").mkdir(exist_ok=True)  # or the real half-written one, if the kill came late
        (actor / "latest").write_text("global_step3")

    proc = _start([*_args(model, resumed), "--ckpt.load_enable"], tmp / "resume.log")
    _finish(proc, tmp / "resume.log")
    return straight, resumed, killed_log, (tmp / "resume.log").read_text()


def _state(run_dir: Path) -> dict:
    return json.loads((run_dir / "trainer_state.json").read_text())


def test_resumed_run_replays_the_same_iterations(runs):
    straight, resumed, killed_log, _ = runs
    a, b = _state(straight), _state(resumed)
    assert a["iteration"] == b["iteration"] == 4
    assert [e["iteration"] for e in b["rollout_log"]] == [1, 2, 3, 4]
    assert b["rollout_log"][:2] == killed_log
    # same opponent configurations (Eq. 6 draws), opponents and scenario order in every iteration
    assert a["rollout_log"] == b["rollout_log"]
    # the killed iteration 3: agent2 is not due (update_every 2), so its pairing against agent1's history is not
    # played, only current play for agent1; iteration 4: agent2 (current) faces agent1's history and agent1 the
    # current agent2, each role learning from its own pairing. Replayed exactly, snapshot included
    assert [e["configuration"] for e in b["rollout_log"]] == ["agent1", "agent1", "agent2", "agent2"]
    current = {"agent1": "current", "agent2": "current"}
    assert b["rollout_log"][2]["pairings"] == [{"learners": ["agent1", "agent2"], "seats": current}]
    history, now = b["rollout_log"][3]["pairings"]
    assert history["learners"] == ["agent2"] and history["seats"]["agent1"].startswith("pool:")
    assert now == {"learners": ["agent1"], "seats": current}
    assert [m["rollout/dialogues"] for m in b["history"]][2:] == [4.0, 8.0]
    assert a["updates"] == b["updates"] == {"agent1": b["updates"]["agent1"], "agent2": b["updates"]["agent2"]}
    assert a["sampler"] == b["sampler"]
    for ha, hb in zip(a["history"], b["history"]):
        for key in ("agent1/reward", "agent2/reward", "agent1/updated", "agent2/updated", "pool/configuration"):
            assert ha[key] == hb[key], key


def test_resumed_pools_match(runs):
    straight, resumed, _, _ = runs
    a, b = _state(straight)["pools"], _state(resumed)["pools"]
    strip = ("seconds",)  # wall time of the write differs
    for role in ("agent1", "agent2"):
        ma = [{k: v for k, v in m.items() if k not in strip} for m in a[role]["members"]]
        mb = [{k: v for k, v in m.items() if k not in strip} for m in b[role]["members"]]
        assert ma == mb, role  # same versions, iterations and sha256 of the weights
        files = sorted(p.name for p in (resumed / "pool" / role).glob("*.safetensors*"))
        assert files == sorted(m["file"] for m in mb)  # no uncommitted or half-written snapshot left behind


def test_resumed_weights_match(runs):
    straight, resumed, _, _ = runs
    for role in ("agent1", "agent2"):
        wa, wb = _weights(straight / role / "hf"), _weights(resumed / role / "hf")
        assert wa.keys() == wb.keys()
        diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
        assert diff <= TOLERANCE, (role, diff)
        init = _weights(straight.parent / "tiny")
        assert any(not torch.equal(wa[k], init[k].to(torch.bfloat16).float()) for k in wa)  # it did train


def test_half_written_checkpoint_was_not_loaded(runs):
    _, resumed, _, log = runs
    for role in ("agent1", "agent2"):
        actor = resumed / role / "ckpt" / "_actor"
        assert (actor / "latest").read_text().strip() == "global_step4"
        assert (actor / "global_step3" / "mp_rank_00_model_states.pt").exists()  # rewritten by the resumed run
