"""End to end: opponent pools (Eq. 6) through Ray + DeepSpeed + HF engines on CPU.

``--pool.probs [0,1,0]``: every iteration is "agent1 (current) faces a historical agent2", played as Eq. 6 writes
it: agent1's groups hold current agent1 vs a snapshot of agent2, agent2's hold current agent2 vs the *current*
agent1. Iteration 1 has empty pools and iteration 2 only agent2's v1, which is agent2's current policy (not history):
both are played all-current, feeding both roles. Iteration 3 faces agent2's v1 on its pool engines (v2 is current):
both pairings play the whole batch, and both roles update.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file
from test_e2e_ibrl import _weights, tiny_flags

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.tiny import build_tiny_dond_model
    from marti_ibrl.trainer import IBRLTrainer

    tmp = tmp_path_factory.mktemp("pool")
    model = build_tiny_dond_model(tmp / "tiny")
    cfg = load_config(
        [
            *tiny_flags(model, tmp / "run", 3),
            *("--role1.kl_coef", "0", "--role2.kl_coef", "0", "--ray.log_to_driver", "false"),
            *("--pool.probs", "[0,1,0]", "--pool.size", "3"),
        ]
    )
    trainer = IBRLTrainer(cfg)
    history = trainer.fit()
    stacks = trainer.stacks
    digests = {r: (s.weights_digest(), s.engine_digests(), s.engine_digests(s.pool_engines)) for r, s in stacks.items()}
    # make agent1's pool engines serve its newest snapshot, as a historical iteration facing agent1 would
    newest = trainer.pools["agent1"].members[-1]
    ray.get(
        [e.load_weights_file.remote(str(trainer.pools["agent1"].path(newest))) for e in stacks["agent1"].pool_engines]
    )
    digests["agent1_pool_after_load"] = stacks["agent1"].engine_digests(stacks["agent1"].pool_engines)
    ray.shutdown()
    return tmp, trainer, history, digests


def _file_digest(model_dir, snapshot_file) -> str:
    """What an HF engine holding this snapshot reports: the tiny model with the file's weights, fp32."""
    from transformers import AutoModelForCausalLM

    from marti_ibrl.rollout.digest import params_digest

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict({k: v.float() for k, v in load_file(str(snapshot_file)).items()}, strict=False)
    return params_digest(model.named_parameters())


def test_configurations_and_pairings_logged(run):
    _, trainer, _, _ = run
    log = trainer.rollout_log
    current = {"agent1": "current", "agent2": "current"}
    assert [e["configuration"] for e in log] == ["agent1"] * 3
    for e in log[:2]:  # empty pools, then only agent2's current policy as v1: nothing historical to face
        assert e["opponents"] == current
        assert e["pairings"] == [{"learners": ["agent1", "agent2"], "seats": current}]
    assert log[2]["opponents"] == {"agent1": "current", "agent2": "current,pool:1"}
    assert log[2]["pairings"] == [
        {"learners": ["agent1"], "seats": {"agent1": "current", "agent2": "pool:1"}},
        {"learners": ["agent2"], "seats": current},
    ]


def test_in_a_history_iteration_both_roles_update_from_their_own_pairing(run):
    """Replaces the old check that agent2 skipped its update whenever agent1 faced history: as Eq. 6 writes it,
    agent2 (current) then faces the current agent1 and learns from that pairing. Snapshot tokens are in no group:
    each role's samples in iteration 3 come from its own pairing's B x G = 4 dialogues, out of the 8 played."""
    _, _, history, _ = run
    assert [m["rollout/dialogues"] for m in history] == [4.0, 4.0, 8.0]
    for r in ("agent1", "agent2"):
        assert [m[f"{r}/scheduled"] for m in history] == [1.0, 1.0, 1.0]
        assert [m[f"{r}/updated"] for m in history] == [1.0, 1.0, 1.0]
        assert all(0 < m[f"{r}/samples_made"] - m[f"{r}/samples_penalized"] <= 4 for m in history), r
    assert [m["agent2/current_share"] for m in history] == [1.0, 1.0, 0.5]
    assert [m["agent1/current_share"] for m in history] == [1.0, 1.0, 1.0]


def test_pool_manifests_and_files(run):
    tmp, trainer, history, _ = run
    state = json.loads((tmp / "run" / "trainer_state.json").read_text())
    for role, versions in (("agent1", [1, 2, 3]), ("agent2", [1, 2, 3])):  # K=3: nothing evicted yet
        pool_dir = tmp / "run" / "pool" / role
        manifest = json.loads((pool_dir / "manifest.json").read_text())
        assert manifest == state["pools"][role]
        assert [m["version"] for m in manifest["members"]] == versions
        assert sorted(p.name for p in pool_dir.glob("*.safetensors")) == [f"v{v:06d}.safetensors" for v in versions]
        for m in manifest["members"]:
            data = (pool_dir / m["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == m["sha256"] and len(data) == m["bytes"]
            assert {t.dtype for t in load_file(str(pool_dir / m["file"])).values()} == {torch.bfloat16}
            assert m["seconds"] > 0
    # agent1's snapshot v3 is its final policy
    v3 = load_file(str(tmp / "run" / "pool" / "agent1" / "v000003.safetensors"))
    final = _weights(tmp / "run" / "agent1" / "hf")
    assert all(torch.equal(v3[k].float(), final[k]) for k in final)


def test_engines_hold_the_right_weights(run):
    tmp, _, _, digests = run
    for role in ("agent1", "agent2"):
        actor, engines, _ = digests[role]
        assert engines and all(e == actor for e in engines), role  # current engines: never old weights
    v1 = _file_digest(tmp / "tiny", tmp / "run" / "pool" / "agent2" / "v000001.safetensors")
    assert digests["agent2"][2] == [v1]  # agent2's pool engine served snapshot v1
    v3 = _file_digest(tmp / "tiny", tmp / "run" / "pool" / "agent1" / "v000003.safetensors")
    assert digests["agent1_pool_after_load"] == [v3]
    assert digests["agent1"][1] == [digests["agent1"][0]]  # loading a snapshot left the current engines alone
