"""End to end: LoRA roles (``--roleN.lora_rank``) through Ray + DeepSpeed + HF engines on CPU.

Both roles train a rank-8 adapter on the same frozen tiny base, with the KL of Eq. 5 on (its reference: the base
with the adapter off, in the actor; no reference model), opponent pools on (``--pool.probs [0,1,0]``, as
tests/e2e/test_e2e_pool.py: iteration 3 has agent1 face agent2's snapshot v1) and ``--train.check_sync``. Asserted: only
adapter parameters changed; π_ref is the base; the pools hold peft adapters with their manifest; the historical
opponent was served by agent2's *current* engines as the adapter ``agent2/pool/v1``; each sync moved the adapter's
bytes only; a run stopped after iteration 2 and resumed ends with the same adapters as the straight run.
"""

from __future__ import annotations

import hashlib
import json

import golden
import pytest
import torch
from test_e2e_ibrl import tiny_flags

pytestmark = pytest.mark.slow

ROLES = ("agent1", "agent2")


def lora_flags(model, run_dir, iterations: int) -> list[str]:
    return [
        *tiny_flags(model, run_dir, iterations),
        *("--role1.lora_rank", "8", "--role2.lora_rank", "8", "--role1.lora_alpha", "16", "--role2.lora_alpha", "16"),
        *("--role1.kl_coef", "0.05", "--role2.kl_coef", "0.05", "--ray.log_to_driver", "false"),
        *("--pool.probs", "[0,1,0]", "--pool.size", "3", "--train.check_sync", "true", "--ds.param_dtype", "fp32"),
    ]


def _base_logprobs(model_dir, sequence: torch.Tensor, n_actions: int) -> torch.Tensor:
    """log π_base of the last ``n_actions`` tokens of ``sequence`` (1, T), computed here with plain HF."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(sequence).logits[:, :-1].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, sequence[:, 1:].unsqueeze(-1)).squeeze(-1)
    return lp[:, -n_actions:]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.rollout.digest import params_digest
    from marti_ibrl.tiny import build_tiny_dond_model
    from marti_ibrl.trainer import IBRLTrainer

    tmp = tmp_path_factory.mktemp("lora")
    model = build_tiny_dond_model(tmp / "tiny")
    trainer = IBRLTrainer(load_config(lora_flags(model, tmp / "run", 3)))
    history = trainer.fit()
    stacks = trainer.stacks
    seq = torch.tensor([[5, 17, 33, 8, 41, 12, 9, 27, 3, 14]])
    action_mask, attention = torch.ones((1, 5), dtype=torch.bool), torch.ones_like(seq)
    out = {
        "base": {r: s.base_digest() for r, s in stacks.items()},
        "adapter": {r: s.adapter_digest() for r, s in stacks.items()},
        "engine_adapters": {r: s.engine_adapter_digests() for r, s in stacks.items()},
        "served": {r: ray.get([e.served_adapters.remote() for e in s.engines]) for r, s in stacks.items()},
        "current": {r: s.adapter.name for r, s in stacks.items()},
        "policy_lp": ray.get(stacks["agent1"].actor._actor_handlers[0].forward.remote(seq, action_mask, attention)),
        "ref_lp": ray.get(stacks["agent1"].actor._actor_handlers[0].forward_base.remote(seq, action_mask, attention)),
        "hf_base_lp": _base_logprobs(model, seq, 5),
        "pretrain": params_digest(
            __import__("transformers")
            .AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
            .named_parameters()
        ),
        "processes": {r: {k: len(v) for k, v in s.processes().items()} for r, s in stacks.items()},
    }
    trainer.close()
    ray.shutdown()
    return tmp, model, trainer, history, out


def test_only_adapter_parameters_changed(run):
    tmp, _, _, history, out = run
    for r in ROLES:
        assert out["base"][r] == out["pretrain"], r  # the frozen base inside the peft model is the checkpoint
        assert [m[f"{r}/updated"] for m in history] == [1.0, 1.0, 1.0]
    # the adapters moved (B starts at 0): the final adapter export has non-zero lora_B for both roles
    from safetensors.torch import load_file

    for r in ROLES:
        final = load_file(str(tmp / "run" / r / "hf" / "adapter_model.safetensors"))
        assert final and all(".lora_" in k for k in final), r
        assert any(v.abs().max() > 0 for k, v in final.items() if "lora_B" in k), r
        assert not (tmp / "run" / r / "hf" / "model.safetensors").exists()  # no full weights written


def test_reference_is_the_base_with_the_adapter_off(run):
    _, _, _, history, out = run
    assert torch.allclose(out["ref_lp"].float(), out["hf_base_lp"], atol=1e-5)
    assert (out["policy_lp"].float() - out["ref_lp"].float()).abs().max() > 1e-6  # the trained adapter is on
    assert all(m["agent1/kl"] >= 0 for m in history if "agent1/kl" in m)
    # no reference process: per role an actor rank and one engine, no pool engines
    for r in ROLES:
        assert out["processes"][r] == {"actor": 1, "reference": 0, "engines": 1, "pool_engines": 0}


def test_engines_serve_the_actors_adapter(run):
    tmp, _, _, _, out = run
    for r in ROLES:
        assert out["engine_adapters"][r] == [out["adapter"][r]], r
    assert out["adapter"]["agent1"] != out["adapter"]["agent2"]
    checks = [json.loads(line) for line in (tmp / "run" / "sync_checks.jsonl").read_text().splitlines()]
    assert len(checks) == 2 * 4  # start-up + 3 iterations, 2 roles: every one passed (else the run stopped)


def test_pool_snapshots_are_adapters_with_a_manifest(run):
    tmp, _, _, _, _ = run
    from marti_ibrl.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_tensors

    state = json.loads((tmp / "run" / "trainer_state.json").read_text())
    for r in ROLES:
        pool_dir = tmp / "run" / "pool" / r
        manifest = json.loads((pool_dir / "manifest.json").read_text())
        assert manifest == state["pools"][r]
        assert [m["version"] for m in manifest["members"]] == [1, 2, 3]
        assert sorted(p.name for p in pool_dir.iterdir()) == ["manifest.json", "v000001", "v000002", "v000003"]
        for m in manifest["members"]:
            d = pool_dir / m["file"]
            assert sorted(p.name for p in d.iterdir()) == sorted([ADAPTER_CONFIG, ADAPTER_WEIGHTS])
            assert hashlib.sha256((d / ADAPTER_WEIGHTS).read_bytes()).hexdigest() == m["sha256"]
            assert sum(p.stat().st_size for p in d.iterdir()) == m["bytes"]
            assert {t.dtype for t in adapter_tensors(d).values()} == {torch.bfloat16}  # --pool.dtype bf16
            config = json.loads((d / ADAPTER_CONFIG).read_text())
            assert config["r"] == 8 and config["peft_type"] == "LORA"


def test_historical_opponent_served_as_an_adapter_by_the_current_engines(run):
    _, _, trainer, history, out = run
    log = trainer.rollout_log
    assert log[2]["opponents"] == {"agent1": "current", "agent2": "current,pool:1"}
    first, second = log[2]["pairings"]
    assert first["seats"] == {"agent1": "current", "agent2": "pool:1"}
    assert first["adapters"] == {"agent1": "agent1/current/v2", "agent2": "agent2/pool/v1"}
    assert second["adapters"] == {"agent1": "agent1/current/v2", "agent2": "agent2/current/v2"}
    served = out["served"]["agent2"][0]
    assert served.get("agent2/pool/v1", 0) > 0  # agent2's one engine served its own snapshot ...
    assert not any(name.startswith("agent1/") for name in served)  # ... and nothing of agent1's
    assert "base" not in served  # every request of a LoRA role names its adapter
    assert out["current"] == {r: f"{r}/current/v3" for r in ROLES}  # start-up sync v0, then one per update


def test_sync_moved_only_adapter_bytes(run):
    tmp, model, _, history, _ = run
    from pathlib import Path

    full = (Path(model) / "model.safetensors").stat().st_size
    adapter = json.loads((tmp / "run" / "pool" / "agent1" / "manifest.json").read_text())["members"][0]["bytes"]
    for r in ROLES:
        moved = [m[f"{r}/sync/bytes"] for m in history]
        assert all(0 < b < full / 4 for b in moved), (moved, full)
        # fp32 sync vs bf16 snapshot of the same adapter: the weights twice the size, the config the same
        assert all(b > adapter for b in moved)
        assert all(m[f"{r}/sync/seconds"] > 0 for m in history)
    # one directory of the current adapter per role is kept (the previous ones were dropped after each sync)
    for r in ROLES:
        assert [p.name for p in (tmp / "run" / r / "adapter_sync").iterdir()] == ["v000003"]


def test_resume_is_exact(run, tmp_path):
    """A run of 2 iterations, then resumed to 3: the same adapters as the straight run."""
    import ray
    from safetensors.torch import load_file

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    tmp, model, _, _, _ = run
    for iterations, resume in ((2, []), (3, ["--ckpt.load_enable", "true"])):
        trainer = IBRLTrainer(load_config([*lora_flags(model, tmp_path / "run", iterations), *resume]))
        try:
            trainer.fit()
        finally:
            trainer.close()
            ray.shutdown()
    for r in ROLES:
        straight = load_file(str(tmp / "run" / r / "hf" / "adapter_model.safetensors"))
        resumed = load_file(str(tmp_path / "run" / r / "hf" / "adapter_model.safetensors"))
        assert straight.keys() == resumed.keys()
        assert all(torch.allclose(straight[k], resumed[k], atol=1e-6) for k in straight), r
    a = json.loads((tmp / "run" / "trainer_state.json").read_text())["rollout_log"]
    b = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["rollout_log"]
    assert a == b


def test_shared_engine_set_is_exact(run, tmp_path):
    """``--rollout.share_engines``: one engine serves both roles' adapters (current and pool snapshots, per request),
    and the run is exactly the run with an engine per role: same dialogues, same final adapters (every request is
    sampled with its own seed and its role's adapter, whichever engine serves it)."""
    import ray
    from safetensors.torch import load_file

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    tmp, model, _, _, _ = run
    trainer = IBRLTrainer(load_config([*lora_flags(model, tmp_path / "run", 3), "--rollout.share_engines", "true"]))
    try:
        trainer.fit()
        stacks = trainer.stacks
        assert stacks["agent1"].engines == stacks["agent2"].engines and len(stacks["agent1"].engines) == 1
        assert ray.cluster_resources()["GPU"] == 3  # 2 actor ranks + 1 engine (4 with an engine per role)
        (served,) = ray.get([e.served_adapters.remote() for e in stacks["agent1"].engines])
    finally:
        trainer.close()
        ray.shutdown()
    assert {n.rsplit("/", 1)[0] for n in served} == {"agent1/current", "agent2/current", "agent2/pool"}
    topo = json.loads((tmp_path / "run" / "topology.json").read_text())["trained"]
    assert [topo[r]["engines_of"] for r in ROLES] == ["agent1", "agent1"]
    for r in ROLES:
        straight = load_file(str(tmp / "run" / r / "hf" / "adapter_model.safetensors"))
        shared = load_file(str(tmp_path / "run" / r / "hf" / "adapter_model.safetensors"))
        assert all(torch.equal(straight[k], shared[k]) for k in straight), r
    a = json.loads((tmp / "run" / "trainer_state.json").read_text())
    b = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert a["rollout_log"] == b["rollout_log"]
    assert [m["agent1/reward"] for m in a["history"]] == [m["agent1/reward"] for m in b["history"]]


def test_zero3_two_ranks(run, tmp_path):
    """LoRA under ZeRO-3 with 2 ranks per role: the adapter's gathers (sync, snapshots, digests), π_ref with the
    adapter off, OpenRLHF's adapter export (``adapter_model.bin`` under ZeRO-3); engines hold the actors' adapters
    after every sync (``--train.check_sync``) and the base does not move."""
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    tmp, model, _, _, out = run
    flags = [*lora_flags(model, tmp_path / "run", 2), "--ds.zero_stage", "3"]
    flags += ["--role1.num_gpus_per_node", "2", "--role2.num_gpus_per_node", "2", "--pool.probs", "[0.5,0.5,0]"]
    trainer = IBRLTrainer(load_config(flags))
    try:
        history = trainer.fit()
        base = {r: s.base_digest() for r, s in trainer.stacks.items()}
        ranks = {r: len(s.actor._actor_handlers) for r, s in trainer.stacks.items()}
    finally:
        trainer.close()
        ray.shutdown()
    assert ranks == {"agent1": 2, "agent2": 2}
    assert base == {r: out["pretrain"] for r in ROLES}
    assert all(m[f"{r}/updated"] == 1.0 for m in history for r in ROLES)
    checks = [json.loads(line) for line in (tmp_path / "run" / "sync_checks.jsonl").read_text().splitlines()]
    assert len(checks) == 6 and all(c["engines"] == [c["actor"]] for c in checks)
    for r in ROLES:
        assert (tmp_path / "run" / r / "hf" / "adapter_config.json").exists()
        assert [
            m["version"] for m in json.loads((tmp_path / "run" / "pool" / r / "manifest.json").read_text())["members"]
        ] == [1, 2]


def test_eval_serves_a_lora_roles_adapter_merged(run, tmp_path, capsys):
    """`marti-ibrl eval --policy RUN/agent1/hf` on a LoRA run: the adapter is merged into its base once (under
    OUT/merged, reused when the evaluation is resumed) and played like any checkpoint; the tables keep its name."""
    from transformers import AutoModelForCausalLM

    from marti_ibrl.cli import main
    from marti_ibrl.lora import MERGED_RECORD, adapter_info

    tmp, model = run[0], run[1]
    adapter = tmp / "run" / "agent1" / "hf"
    out = tmp_path / "eval"
    small = ["--prompt-style", "compact", "--max-rounds", "2", "--max-new-tokens", "12", "--max-len", "512"]
    argv = ["eval", "--policy", f"lora1={adapter}", "--counterpart", "heldout:hardliner", "-n", "2", *small]
    assert main([*argv, "--out", str(out)]) == 0
    assert "lora1 vs hardliner" in capsys.readouterr().out
    assert not __import__("ray").is_initialized()  # the Ray eval started is shut down: the next job gets its own
    (merged,) = (out / "merged").iterdir()
    record = json.loads((merged / MERGED_RECORD).read_text())
    assert record == {"adapter": str(adapter.resolve()), "sha256": adapter_info(adapter)["sha256"], "base": model}
    episodes = [json.loads(x) for x in (out / "episodes" / "lora1__hardliner.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and all(e["policies"][e["policy_role"]] == "lora1" for e in episodes)
    # the merged weights are the trained adapter's: they differ from the base's
    base = dict(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).named_parameters())
    got = dict(AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).named_parameters())
    assert got.keys() == base.keys() and any(not torch.equal(got[k], base[k]) for k in base)
    stamp = (merged / "model.safetensors").stat().st_mtime_ns
    assert main([*argv, "--out", str(out)]) == 0  # resumed: nothing to play, nothing merged again
    assert (merged / "model.safetensors").stat().st_mtime_ns == stamp


def test_golden_trajectory(run):
    """What the LoRA roles' seeded run learned, and their final adapters: pinned (tests/golden.py)."""
    _, _, _, history, out = run
    golden.check("lora", history, ["agent1", "agent2"], out["adapter"])
