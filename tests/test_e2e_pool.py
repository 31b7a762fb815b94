"""End to end: opponent pools (Eq. 6) through Ray + DeepSpeed + HF engines on CPU.

``--pool.probs [0,1,0]``: every iteration is "agent1 (current) faces a historical agent2". Iteration 1
has empty pools, so both play current; after it each role snapshots (v1). From iteration 2 on, agent2's
seat is played by snapshot v1 on agent2's pool engines: agent2's current policy acts in no trajectory,
so it has no group members and does not update, although its schedule says it is due.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file
from test_e2e_ibrl import _same, _weights, tiny_flags

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
            *("--pool.probs", "[0,1,0]", "--pool.size", "2"),
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

    from marti_ibrl.rollout.engines import params_digest

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict({k: v.float() for k, v in load_file(str(snapshot_file)).items()}, strict=False)
    return params_digest(model.named_parameters())


def test_configurations_and_opponents_logged(run):
    _, trainer, _, _ = run
    log = trainer.rollout_log
    assert [e["configuration"] for e in log] == ["agent1"] * 3
    assert log[0]["opponents"] == {"agent1": "current", "agent2": "current"}  # pools empty at k=1
    assert [e["opponents"] for e in log[1:]] == [{"agent1": "current", "agent2": "pool:1"}] * 2


def test_historical_role_is_excluded_from_its_groups(run):
    tmp, _, history, _ = run
    assert [m["agent2/scheduled"] for m in history] == [1.0, 1.0, 1.0]
    assert [m["agent2/updated"] for m in history] == [1.0, 0.0, 0.0]
    assert [m["agent2/current_share"] for m in history] == [1.0, 0.0, 0.0]
    assert [m["agent1/updated"] for m in history] == [1.0, 1.0, 1.0]
    ckpt = tmp / "run" / "agent2" / "ckpt"
    # no gradient reached agent2 from the trajectories its snapshot played
    assert _same(_weights(ckpt / "global_step2_hf"), _weights(ckpt / "global_step1_hf"))
    assert _same(_weights(ckpt / "global_step3_hf"), _weights(ckpt / "global_step1_hf"))


def test_pool_manifests_and_files(run):
    tmp, trainer, history, _ = run
    state = json.loads((tmp / "run" / "trainer_state.json").read_text())
    for role, versions in (("agent1", [2, 3]), ("agent2", [1])):  # K=2: agent1's v1 was evicted (oldest first)
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
