"""LoRA roles without Ray: the flags, placement (no reference, no pool engines), adapter files, pools of adapters,
the merged export, and the HF engine serving adapters per request (marti_ibrl/lora.py)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from marti_ibrl.algorithm.pool import OpponentPool, Snapshot
from marti_ibrl.cluster.placement import ACTOR, ENGINES, POOL_ENGINES, REFERENCE, device_slots, placement
from marti_ibrl.config import ConfigError, load_config
from marti_ibrl.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterRef,
    adapter_info,
    adapter_tensors,
    base_param_name,
    current_adapter,
    export_merged,
    is_lora_param,
    peft_target_modules,
    pool_adapter,
    vllm_max_lora_rank,
    write_adapter,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from marti_ibrl.tiny import build_tiny_dond_model

    return build_tiny_dond_model(tmp_path_factory.mktemp("tiny") / "m")


def _cfg(tiny: str, *flags: str):
    return load_config(["--role1.pretrain", tiny, "--role2.pretrain", tiny, *flags])


def test_flags_reach_openrlhf(tiny):
    from marti_ibrl.backend.args import role_args

    cfg = _cfg(tiny, "--role1.lora_rank", "8", "--role1.lora_alpha", "32", "--role1.lora_dropout", "0.1")
    cfg2 = _cfg(tiny, "--role2.lora_rank", "4", "--role2.target_modules", "[q_proj,v_proj]")
    a = role_args(cfg, cfg.roles[0], "cpu")
    assert (a.ds.lora.rank, a.ds.lora.alpha, a.ds.lora.target_modules, a.ds.lora.dropout) == (8, 32, "all-linear", 0.1)
    assert role_args(cfg, cfg.roles[1], "cpu").ds.lora.rank == 0  # role2 trains full weights
    b = role_args(cfg2, cfg2.roles[1], "cpu")
    assert (b.ds.lora.rank, b.ds.lora.target_modules) == (4, ["q_proj", "v_proj"])


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--role1.lora_rank", "-1"], "--role1.lora_rank"),
        (["--role1.lora_rank", "8", "--role1.lora_alpha", "0"], "--role1.lora_alpha"),
        (["--role2.lora_rank", "8", "--role2.lora_dropout", "1.0"], "--role2.lora_dropout"),
        (["--role1.lora_rank", "8", "--role1.target_modules", "[]"], "--role1.target_modules"),
        (["--role1.lora_rank", "8", "--role1.colocate_ref", "true"], "--role1.colocate_ref"),
        (["--role1.lora_rank", "1024"], "--role1.lora_rank"),  # rollout.engine auto: vLLM on GPUs
        (["--pool.num_engines", "0", "--role1.lora_rank", "8"], "--pool.num_engines"),  # role2: full weights
        (["--pool.num_engines", "-1"], "--pool.num_engines"),
        (["--rollout.share_engines", "true", "--role1.lora_rank", "8"], "--rollout.share_engines"),  # role2 full
        (
            ["--rollout.share_engines", "true", "--role1.lora_rank", "8", "--role2.lora_rank", "8"]
            + ["--role2.num_engines", "2"],
            "--rollout.share_engines",
        ),
    ],
)
def test_bad_lora_flags_name_the_flag(tiny, flags, flag):
    with pytest.raises(ConfigError, match=f"^{flag}:"):
        _cfg(tiny, *flags)


def test_placement_lora_roles_have_no_reference_and_no_pool_engines(tiny):
    full = _cfg(tiny)
    lora = _cfg(tiny, "--role1.lora_rank", "8", "--role2.lora_rank", "8")
    mixed = _cfg(tiny, "--role1.lora_rank", "8", "--pool.num_engines", "2")
    kinds = {(c.role, c.kind): c.count for c in placement(full)}
    assert kinds == {
        **{(r, k): 1 for r in ("agent1", "agent2") for k in (ENGINES, POOL_ENGINES, ACTOR, REFERENCE)},
    }
    assert {(c.role, c.kind) for c in placement(lora)} == {
        (r, k) for r in ("agent1", "agent2") for k in (ENGINES, ACTOR)
    }
    assert device_slots(full) - device_slots(lora) == 4  # per role: a reference rank and a pool engine
    assert {(c.role, c.kind): c.count for c in placement(mixed)} == {
        ("agent1", ENGINES): 1,
        ("agent1", ACTOR): 1,
        ("agent2", ENGINES): 1,
        ("agent2", POOL_ENGINES): 2,  # --pool.num_engines is the full-weight role's
        ("agent2", ACTOR): 1,
        ("agent2", REFERENCE): 1,
    }
    # with every trained role on LoRA, 0 pool engines is valid
    assert _cfg(tiny, "--role1.lora_rank", "8", "--role2.lora_rank", "8", "--pool.num_engines", "0")
    shared = _cfg(tiny, "--role1.lora_rank", "8", "--role2.lora_rank", "8", "--rollout.share_engines", "true")
    assert {(c.role, c.kind) for c in placement(shared)} == {("agent1", ENGINES), ("agent1", ACTOR), ("agent2", ACTOR)}
    assert device_slots(lora) - device_slots(shared) == 1


def test_shared_engines_serve_every_roles_adapters(tiny):
    from marti_ibrl.backend.args import engine_lora

    own = _cfg(tiny, "--role1.lora_rank", "8", "--role2.lora_rank", "16", "--pool.size", "3")
    shared = _cfg(tiny, "--role1.lora_rank", "8", "--role2.lora_rank", "16", "--pool.size", "3")
    shared.rollout.share_engines = True
    assert engine_lora(own, own.roles[0]) == {"max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 5}
    assert engine_lora(shared, shared.roles[0]) == {"max_loras": 4, "max_lora_rank": 16, "max_cpu_loras": 10}
    assert engine_lora(_cfg(tiny), _cfg(tiny).roles[0]) is None


def test_names_ids_and_ranks():
    assert peft_target_modules(["all-linear"]) == "all-linear"
    assert peft_target_modules(["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError):
        vllm_max_lora_rank(513)
    a = [current_adapter("agent1", 1, v, "p") for v in range(3)] + [pool_adapter("agent1", 1, v, "p") for v in (1, 2)]
    b = [current_adapter("agent2", 2, v, "p") for v in range(3)] + [pool_adapter("agent2", 2, v, "p") for v in (1, 2)]
    assert len({x.id for x in a + b}) == len({x.name for x in a + b}) == 10  # unique ids and names, > 0
    assert a[1] == AdapterRef("agent1/current/v1", a[1].id, "p") and all(x.id > 0 for x in a + b)
    assert is_lora_param("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight")
    assert not is_lora_param("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
    assert base_param_name("base_model.model.model.layers.0.mlp.up_proj.base_layer.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert base_param_name("base_model.model.model.norm.weight") == "model.norm.weight"


def _peft(tiny: str, rank: int = 4, seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    for n, p in peft.named_parameters():  # a trained adapter: B != 0
        if "lora_B" in n:
            p.data.normal_(0, 0.05)
    return peft


def test_written_adapter_is_peft_loadable_and_merges(tiny, tmp_path):
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    peft = _peft(tiny)
    state = get_peft_model_state_dict(peft)
    info = write_adapter(tmp_path / "v000001", state, peft.peft_config["default"], base_model=tiny)
    d = tmp_path / "v000001"
    assert sorted(p.name for p in d.iterdir()) == sorted([ADAPTER_CONFIG, ADAPTER_WEIGHTS])
    assert info == adapter_info(d) and info["bytes"] == sum(p.stat().st_size for p in d.iterdir())
    assert json.loads((d / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == tiny
    assert not (tmp_path / "v000001.tmp").exists()
    saved = adapter_tensors(d)
    assert saved.keys() == state.keys() and all(torch.equal(saved[k], state[k]) for k in state)
    ids = torch.tensor([[5, 17, 33, 8, 41, 12]])
    with torch.no_grad():
        want = peft(ids).logits
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), str(d))
        assert torch.allclose(loaded(ids).logits, want, atol=1e-5)
        out = export_merged(tiny, str(d), str(tmp_path / "merged"))
        merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
        assert not any(is_lora_param(n) for n, _ in merged.named_parameters())
        assert torch.allclose(merged(ids).logits, want, atol=1e-4)
        base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        assert (base(ids).logits - want).abs().max() > 1e-3  # the adapter does change the policy
    assert (out / "tokenizer.json").exists()


def test_servable_checkpoint_merges_an_adapter_once(tiny, tmp_path, monkeypatch):
    """eval's path for a LoRA role's ROLE/hf: merged into its base under the cache once, reused while the adapter's
    weights and base are the same, made again when they change; an ordinary checkpoint is served as it is."""
    from peft import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    import marti_ibrl.lora as lora
    from marti_ibrl.eval.dond.command import merge_adapters
    from marti_ibrl.eval.episodes import Named

    assert lora.servable_checkpoint(tiny, tmp_path / "cache") == tiny and not (tmp_path / "cache").exists()
    peft = _peft(tiny, seed=5)
    d = tmp_path / "run" / "agent1" / "hf"
    write_adapter(d, get_peft_model_state_dict(peft), peft.peft_config["default"], base_model=tiny)
    merges = []
    real = lora.export_merged
    monkeypatch.setattr(lora, "export_merged", lambda *a, **k: merges.append(a) or real(*a, **k))
    first = lora.servable_checkpoint(d, tmp_path / "cache")
    assert lora.servable_checkpoint(d, tmp_path / "cache") == first and len(merges) == 1
    ids = torch.tensor([[7, 3, 19, 4]])
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(first, dtype=torch.float32)(ids).logits
        assert torch.allclose(got, peft(ids).logits, atol=1e-4)
    peft2 = _peft(tiny, seed=6)  # the role trained on: same directory, other weights
    write_adapter(d, get_peft_model_state_dict(peft2), peft2.peft_config["default"], base_model=tiny)
    second = lora.servable_checkpoint(d, tmp_path / "cache")
    assert second != first and len(merges) == 2
    pairs = [(Named("ib", f"checkpoint:{d}"), Named("hardliner", "heldout:hardliner"), "held-out")]
    assert (
        merge_adapters(pairs, tmp_path / "cache") == [(Named("ib", f"checkpoint:{second}"), pairs[0][1], "held-out")]
        and len(merges) == 2
    )
    config = json.loads((d / ADAPTER_CONFIG).read_text())
    (d / ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": "/nowhere"}))
    with pytest.raises(ValueError, match=r"hf: base checkpoint '/nowhere' \(named by its adapter_config.json\) is not"):
        lora.servable_checkpoint(d, tmp_path / "cache")


def test_pool_of_adapters_gc_and_resume(tmp_path):
    pool = OpponentPool(tmp_path / "pool", "agent1", 2, adapters=True)
    assert pool.path_for(3).name == "v000003"
    for v in (1, 2, 3):
        d = pool.path_for(v)
        d.mkdir(parents=True)
        (d / ADAPTER_WEIGHTS).write_bytes(b"x" * v)
        pool.add(Snapshot("agent1", v, v, d.name, "sha", v, 0.1), random.Random(0))
    (pool.dir / "v000004.tmp").mkdir()  # half-written: never in a manifest
    assert [m.version for m in pool.members] == [2, 3]
    assert pool.gc(set()) == ["v000001", "v000004.tmp"]
    assert sorted(p.name for p in pool.dir.iterdir()) == ["v000002", "v000003"]
    again = OpponentPool(tmp_path / "pool", "agent1", 2, adapters=True)
    again.load_manifest(pool.manifest())
    assert [m.version for m in again.members] == [2, 3]


def test_hf_engine_serves_adapters_per_request(tiny, tmp_path):
    """The HF engine with LoRA: each request with its own adapter (loaded on first use), the base without one, and
    the same tokens as HF + peft; a sync replaces the current adapter."""
    from peft import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from marti_ibrl.rollout.digest import params_digest
    from marti_ibrl.rollout.engines import HFGenerateEngine

    adapters = []
    for i in range(2):
        peft = _peft(tiny, seed=i)
        path = tmp_path / f"a{i}"
        write_adapter(path, get_peft_model_state_dict(peft), peft.peft_config["default"], tiny)
        adapters.append(AdapterRef(f"agent1/pool/v{i}", i + 1, str(path)).as_dict())
    engine = HFGenerateEngine(tiny, lora={"max_loras": 2})
    prompt = [[5, 17, 33, 8, 41, 12]]
    sampling = {"temperature": 1e-4, "max_new_tokens": 6, "seed": 1}
    outs = {a["name"]: engine.generate_batch(prompt, sampling, adapter=a)[0]["token_ids"] for a in adapters}
    base = engine.generate_batch(prompt, sampling)[0]["token_ids"]
    for i, a in enumerate(adapters):  # greedy tokens of HF + peft with the same adapter
        model = _peft(tiny, seed=i)
        ids = torch.tensor(prompt)
        with torch.no_grad():
            want = model.generate(input_ids=ids, do_sample=False, max_new_tokens=6)[0, 6:].tolist()
        assert outs[a["name"]][: len(want)] == want[: len(outs[a["name"]])]
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        want = plain.generate(input_ids=torch.tensor(prompt), do_sample=False, max_new_tokens=6)[0, 6:].tolist()
    assert base[: len(want)] == want[: len(base)]
    assert engine.served_adapters() == {"agent1/pool/v0": 1, "agent1/pool/v1": 1, "base": 1}
    assert engine.adapter_digest("agent1/pool/v0") == params_digest(adapter_tensors(adapters[0]["path"]).items())
    engine.remove_adapter(adapters[0])
    assert "agent1/pool/v0" not in engine.adapters
    engine.load_adapter(adapters[0])  # the sync path: loaded now
    assert engine.adapter_digest("agent1/pool/v0") == params_digest(adapter_tensors(adapters[0]["path"]).items())


def test_export_merged_command(tiny, tmp_path, capsys):
    from peft import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from marti_ibrl.cli import main

    peft = _peft(tiny, seed=3)
    write_adapter(tmp_path / "a", get_peft_model_state_dict(peft), peft.peft_config["default"], base_model=tiny)
    assert main(["export-merged", str(tmp_path / "a"), str(tmp_path / "m")]) == 0
    assert f"wrote {tmp_path / 'm'}" in capsys.readouterr().out
    ids = torch.tensor([[7, 3, 19, 4]])
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"), dtype=torch.float32)(ids).logits
        assert torch.allclose(got, peft(ids).logits, atol=1e-4)
    assert main(["export-merged", str(tmp_path), str(tmp_path / "x")]) == 2  # not an adapter
    assert "no adapter_config.json" in capsys.readouterr().err
    assert main(["export-merged", str(tmp_path / "a"), str(tmp_path / "x"), "--base", "/nowhere"]) == 2
    assert "base checkpoint '/nowhere' (given) is not a directory" in capsys.readouterr().err
    # issue 63: OUT holding files is refused (was overwritten); a corrupt adapter is one line (was SafetensorError)
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.is_file()}
    assert main(["export-merged", str(tmp_path / "a"), str(tmp_path / "m")]) == 2
    assert "OUT: " in capsys.readouterr().err  # exists and is not empty
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.is_file()} == before
    assert main(["export-merged", str(tmp_path / "a"), str(tmp_path / "m"), "--overwrite"]) == 0
    capsys.readouterr()
    weights = tmp_path / "a" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # cut in half
    assert main(["export-merged", str(tmp_path / "a"), str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("marti-ibrl export-merged: error: ADAPTER: ")
        and "truncated" in err
        and len(err.splitlines()) == 1
    )
    assert not (tmp_path / "y").exists()


def test_plan_shared_engines(tiny, capsys):
    from marti_ibrl.cli import main

    flags = ["--role1.pretrain", tiny, "--role2.pretrain", tiny, "--role1.lora_rank", "8", "--role2.lora_rank", "8"]
    flags += ["--role1.num_engines", "3", "--role2.num_engines", "3", "--rollout.share_engines", "true"]
    assert main(["plan", *flags]) == 0
    out = capsys.readouterr().out
    assert (
        "engines: agent1's 3 × TP1 serve the adapters of agent1, agent2 (--rollout.share_engines): 3 GPUs fewer" in out
    )
    assert "total: 5 GPUs" in out  # 3 engines + 2 actor ranks
