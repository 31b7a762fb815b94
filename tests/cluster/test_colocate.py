"""``--train.colocate none|role|all`` (issue 37, the planning half): the flag's checks, which component sits on which
GPU, the colocated phases, the per-phase memory ``marti-ibrl plan`` prints, the colocated 4B recipes and the KV use of
the separate layout. No GPU, no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_model import fake_checkpoint
from test_plan import ROOT, TINY_QWEN2, checkpoints, recipe_env, recipe_flags, sbatch_allocation  # noqa: F401

from marti_ibrl.cli import main as cli_main
from marti_ibrl.cluster.memory import PROCESS_OVERHEAD, VLLM_ASLEEP, VLLM_RUNTIME, GiB
from marti_ibrl.cluster.placement import (
    ACTOR,
    ENGINES,
    POOL_ENGINES,
    REFERENCE,
    SHARED,
    device_slots,
    gpu_map,
    phases,
    placement,
    pool_served_by,
)
from marti_ibrl.cluster.plan import make_plan
from marti_ibrl.cluster.sizing import MODEL_TABLE, model_spec
from marti_ibrl.config import ConfigError, load_config

RECIPES = ["dond/qwen3.5-4b-colocated", "telesales/qwen3.5-4b-colocated"]


@pytest.fixture
def tiny(tmp_path) -> str:
    fake_checkpoint(tmp_path, TINY_QWEN2)
    return str(tmp_path)


def _cfg(tiny: str, *flags: str):
    return load_config(["--role1.pretrain", tiny, "--role2.pretrain", tiny, *flags])


TWO_RANKS = (
    *("--role1.num_gpus_per_node", "2", "--role1.num_engines", "2"),
    *("--role2.num_gpus_per_node", "2", "--role2.num_engines", "2"),
)


def _where(cfg) -> dict[tuple[str, str], tuple[list[int], bool]]:
    return {(c.role, c.kind): (list(r), c.shared) for c, r in gpu_map(cfg).items()}


def test_separate_layout_unchanged(tiny):
    """``none`` (the default): every component on GPUs of its own, pool engines as before, no phases."""
    cfg = _cfg(tiny, *TWO_RANKS)
    assert cfg.train.colocate == "none"
    assert _where(cfg) == {
        ("agent1", ENGINES): ([0, 1], False),
        ("agent1", POOL_ENGINES): ([2], False),
        ("agent1", ACTOR): ([3, 4], False),
        ("agent1", REFERENCE): ([5, 6], False),
        ("agent2", ENGINES): ([7, 8], False),
        ("agent2", POOL_ENGINES): ([9], False),
        ("agent2", ACTOR): ([10, 11], False),
        ("agent2", REFERENCE): ([12, 13], False),
    }
    assert device_slots(cfg) == 14 and phases(cfg) == []
    assert pool_served_by(cfg, cfg.roles[0]) == "1 pool engine"
    cfg = _cfg(tiny, *TWO_RANKS, "--role1.colocate_ref")  # the reference on its actor's GPUs, as before
    assert _where(cfg)[("agent1", REFERENCE)] == ([3, 4], True) and device_slots(cfg) == 12


def test_role_mode_each_role_on_its_own_gpus(tiny):
    cfg = _cfg(tiny, *TWO_RANKS, "--train.colocate", "role")
    assert [(c.role, c.kind, c.count, c.gpus_each, c.group, c.shared) for c in placement(cfg)] == [
        ("agent1", ENGINES, 2, 1, "agent1", True),  # no pool engines: its own engines serve its snapshots
        ("agent1", ACTOR, 2, 1, "agent1", False),  # the actor's bundles are the group's GPUs
        ("agent1", REFERENCE, 2, 1, "agent1", True),
        ("agent2", ENGINES, 2, 1, "agent2", True),
        ("agent2", ACTOR, 2, 1, "agent2", False),
        ("agent2", REFERENCE, 2, 1, "agent2", True),
    ]
    assert _where(cfg) == {
        ("agent1", ENGINES): ([0, 1], True),
        ("agent1", ACTOR): ([0, 1], False),
        ("agent1", REFERENCE): ([0, 1], True),
        ("agent2", ENGINES): ([2, 3], True),
        ("agent2", ACTOR): ([2, 3], False),
        ("agent2", REFERENCE): ([2, 3], True),
    }
    assert device_slots(cfg) == 4  # 14 apart
    assert pool_served_by(cfg, cfg.roles[0]).startswith("its own engines (colocated")
    # the roles' GPUs are apart: their updates always run at once, whatever the memory
    assert [(p.name, p.engines_awake, p.training) for p in phases(cfg, together=False)] == [
        ("generation", True, ()),
        ("training", False, ("agent1", "agent2")),
        ("sync", False, ()),
    ]


def test_all_mode_every_role_on_the_same_gpus(tiny):
    cfg = _cfg(tiny, *TWO_RANKS, "--train.colocate", "all")
    assert [(c.role, c.kind, c.group, c.shared) for c in placement(cfg)] == [
        ("agent1", ENGINES, SHARED, True),
        ("agent1", ACTOR, SHARED, False),  # the first trained role's actor counts the shared GPUs
        ("agent1", REFERENCE, SHARED, True),
        ("agent2", ENGINES, SHARED, True),
        ("agent2", ACTOR, SHARED, True),
        ("agent2", REFERENCE, SHARED, True),
    ]
    assert _where(cfg) == {
        ("agent1", ENGINES): ([0, 1], True),
        ("agent1", ACTOR): ([0, 1], False),
        ("agent1", REFERENCE): ([0, 1], True),
        ("agent2", ENGINES): ([0, 1], True),
        ("agent2", ACTOR): ([0, 1], True),
        ("agent2", REFERENCE): ([0, 1], True),
    }
    assert device_slots(cfg) == 2
    assert [(p.name, p.training) for p in phases(cfg, together=True)] == [
        ("generation", ()),
        ("training", ("agent1", "agent2")),
        ("sync", ()),
    ]
    assert [(p.name, p.engines_awake, p.training) for p in phases(cfg, together=False)] == [
        ("generation", True, ()),
        ("training agent1", False, ("agent1",)),
        ("training agent2", False, ("agent2",)),
        ("sync", False, ()),
    ]


def test_lora_roles_colocated(tiny):
    """A LoRA role has no reference (its base with the adapter off) and serves its snapshots as adapters."""
    cfg = _cfg(tiny, *TWO_RANKS, "--train.colocate", "all", "--role2.lora_rank", "8")
    assert _where(cfg) == {
        ("agent1", ENGINES): ([0, 1], True),
        ("agent1", ACTOR): ([0, 1], False),
        ("agent1", REFERENCE): ([0, 1], True),
        ("agent2", ENGINES): ([0, 1], True),
        ("agent2", ACTOR): ([0, 1], True),
    }
    assert pool_served_by(cfg, cfg.roles[1]) == "its own engines (snapshots are adapters, one per request)"
    assert pool_served_by(_cfg(tiny, "--pool.probs", "[1.0,0,0]", "--train.colocate", "role"), cfg.roles[0]) == ""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--train.colocate", "off"], "--train.colocate: must be one of none, role, all, got 'off'"),
        (
            ["--train.colocate", "role", "--role1.num_gpus_per_node", "4", "--role1.num_engines", "2"],
            "--role1.num_engines: --train.colocate role puts one engine GPU on each actor GPU (OpenRLHF's "
            "colocate_all): role1 has 4 actor ranks (num_nodes × num_gpus_per_node) but 2 engines × TP1 = 2 engine "
            "GPUs",
        ),
        (
            ["--train.colocate", "all", "--role1.num_gpus_per_node", "2", "--role1.num_engines", "2"],
            "--train.colocate: all puts every trained role on the same GPUs: give every role as many actor ranks "
            "(num_nodes × num_gpus_per_node), got [2, 1]",
        ),
        (
            ["--train.colocate", "role", "--pool.num_engines", "2"],
            "--pool.num_engines: no pool engines with --train.colocate role: each role's own engines serve its "
            "snapshots; leave it unset",
        ),
        (
            [
                "--train.colocate",
                "all",
                "--rollout.share_engines",
                *("--role1.lora_rank", "8", "--role2.lora_rank", "8"),
            ],
            "--rollout.share_engines: not with --train.colocate all: each role's engines sit on its own actor's GPUs",
        ),
        (
            ["--train.colocate", "role", "--train.device", "cuda", "--rollout.engine", "hf"],
            "--rollout.engine: --train.colocate role on GPU needs vLLM engines (their sleep mode frees the GPU for "
            "training); hf cannot sleep",
        ),
        (
            ["--train.colocate", "all", "--train.device", "cuda", "--ds.zero_stage", "0"],
            "--ds.zero_stage: --train.colocate all offloads the optimizer states while engines generate (OpenRLHF's "
            "--ds.enable_sleep): ZeRO-0 has no offloadable optimizer; use 1, 2 or 3",
        ),
    ],
)
def test_config_refuses_with_one_line(tiny, flags, message):
    with pytest.raises(ConfigError) as e:
        _cfg(tiny, *flags)
    assert str(e.value) == message


def test_cpu_is_allowed(tiny, capsys):
    """On CPU nothing can sleep, which is no reason to refuse the layout (pool.num_engines 0 is fine colocated);
    ``plan`` says that the processes only share slots there."""
    flags = ["--role1.pretrain", tiny, "--role2.pretrain", tiny, "--train.device", "cpu", "--rollout.engine", "hf"]
    flags += ["--train.colocate", "role", "--pool.num_engines", "0", "--ds.zero_stage", "0"]
    assert load_config(flags).train.colocate == "role"
    assert cli_main(["plan", *flags, "--nodes", "1"]) == 0
    out = capsys.readouterr().out
    assert "train.device cpu: no sleep mode (vLLM-CPU, HF engines): the processes only share slots" in out


# -- memory per phase, by hand ----------------------------------------------------------------------------------

P4B = 4205751296  # Qwen3.5-4B's language model (test_plan checks the formula against transformers)
VOCAB, HIDDEN, INTER, LAYERS = 248320, 2560, 9216, 32


def _actor_by_hand(max_len: int, rollout_micro: int, entropy: bool) -> dict[str, int]:
    """A ZeRO-3 bf16 rank of 8 with its colocated reference (module docstring of marti_ibrl/cluster/memory.py)."""
    largest = VOCAB * HIDDEN  # the embedding: the largest tensor ZeRO-3 gathers
    per_token_layer = 2 * (8 * HIDDEN + 3 * INTER)
    update = max_len * (LAYERS * 2 * HIDDEN + per_token_layer + VOCAB * (10 + 8 * entropy))  # checkpointing, micro 1
    logprobs = rollout_micro * max_len * (per_token_layer + 6 * VOCAB)
    return {
        "weights": P4B * 2 // 8,
        "gradients": P4B * 2 // 8,
        "Adam states": P4B * 12 // 8,
        "ZeRO-3 gathers": 2 * largest * 2,
        "reference weights": P4B * 2 // 8,
        "reference gathers": 2 * largest * 2,
        "activations": max(update, 2 * logprobs),  # the actor's and the reference's log-prob passes side by side
        "overhead": 2 * PROCESS_OVERHEAD,
    }


@pytest.mark.parametrize("recipe", RECIPES)
def test_colocated_recipe_fits_one_node(recipe, checkpoints, tmp_path, monkeypatch, capsys):  # noqa: F811
    env = recipe_env(recipe, checkpoints, tmp_path)
    monkeypatch.setenv("IBRL_TEST_JUDGE_KEY", "secret")
    flags = recipe_flags(recipe, env)
    assert flags[:2] == ["--config", str(ROOT / "recipes" / f"{recipe}.yaml")]
    cfg = load_config(flags)
    assert cfg.train.colocate == "all" and (cfg.ds.zero_stage, cfg.pool.num_engines) == (3, None)
    assert sbatch_allocation(recipe) == (1, 8)
    plan = make_plan(cfg, nodes=1, gpus_per_node=8, gpu_memory_gib=80)
    assert plan.problems == [] and plan.total_gpus == device_slots(cfg) == 8
    assert plan.models[cfg.roles[0].pretrain].params == P4B
    assert not [c for c in plan.components if c.kind == POOL_ENGINES]
    a1, a2 = (r.name for r in cfg.roles)

    telesales = recipe.startswith("telesales")
    actor = _actor_by_hand(6144 if telesales else 4096, 1, entropy=telesales)
    got = {(u.component.role, u.component.kind): u for u in plan.usages}
    assert got[(a1, ACTOR)].parts == got[(a2, ACTOR)].parts == actor
    engine = int(0.4 * 80 * GiB)  # gpu_memory_utilization 0.4: the engine's whole budget
    kv = engine - P4B * 2 - VLLM_RUNTIME
    assert got[(a1, ENGINES)].parts == {"weights": P4B * 2, "runtime": VLLM_RUNTIME, "KV cache": kv}
    resident = P4B * 2 // 8 * 2 + 2 * PROCESS_OVERHEAD  # actor + reference bf16 weights (÷8), two processes
    by_phase = {pu.phase.name: pu.parts for pu in plan.phases}
    assert by_phase["generation"] == {
        f"{a1} engines": engine,
        f"{a1} actor (resident)": resident,
        f"{a2} engines": engine,
        f"{a2} actor (resident)": resident,
    }
    both = 2 * VLLM_ASLEEP + 2 * sum(actor.values())
    if not telesales:  # DoND: both roles' log-prob passes and updates fit at once
        assert plan.updates_together is True
        assert by_phase["training"] == {
            f"{a1} engines": VLLM_ASLEEP,
            f"{a1} actor": sum(actor.values()),
            f"{a2} engines": VLLM_ASLEEP,
            f"{a2} actor": sum(actor.values()),
        }
        assert both <= 80 * GiB and round(both / GiB, 1) == 57.3
    else:  # TeleSales (entropy bonus, 6k tokens): both at once would not fit, so one after the other
        assert plan.updates_together is False and plan.together_bytes == both > 80 * GiB
        assert round(both / GiB, 1) == 87.2
        assert by_phase[f"training {a1}"] == {
            f"{a1} engines": VLLM_ASLEEP,
            f"{a1} actor": sum(actor.values()),
            f"{a2} engines": VLLM_ASLEEP,
            f"{a2} actor (resident)": resident,
        }
        assert set(by_phase) == {"generation", f"training {a1}", f"training {a2}"}
    assert round((2 * engine + 2 * resident) / GiB, 1) == 71.9
    assert all(pu.total <= 80 * GiB for pu in plan.phases)

    assert cli_main(["plan", *flags, "--nodes", "1", "--gpus-per-node", "8", "--strict"]) == 0
    out = capsys.readouterr().out
    assert f"  generation (shared)          71.9 GiB per GPU = {a1} engines 32.0 + {a1} actor (resident) 4.0" in out
    if telesales:
        assert "  updates: one role after the other (both at once would need 87.2 GiB per GPU > 80.0)" in out
    else:
        assert "  updates: both roles at once (they fit together)" in out
    assert f"pool: {a1}'s snapshots are served by its own engines (colocated" in out
    assert f"{a2} engines, {a2} actor, {a2} reference on the 8 shared GPUs; engines sleep while DeepSpeed trains" in out
    # 8 dialogues per engine in 22.2 GiB of KV: 128 sequences of 4096 tokens (DoND), 94 of 6144 (TeleSales)
    assert f"KV use at this batch {8.5 if telesales else 6.2}%; on the shared GPUs (colocated)" in out
    assert out.splitlines()[-1] == "fits"


def test_phase_that_does_not_fit_is_one_problem(checkpoints, tmp_path, monkeypatch, capsys):  # noqa: F811
    flags = recipe_flags("dond/qwen3.5-4b-colocated", recipe_env("dond/qwen3.5-4b-colocated", checkpoints, tmp_path))
    # 0.55 of 80 GiB for agent1's engines: awake beside agent2's (0.4) and the weights that stay, 83.9 GiB
    assert cli_main(["plan", *flags, "--nodes", "1", *("--role1.gpu_memory_utilization", "0.55")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "marti-ibrl plan: error: does not fit: generation on the shared GPUs needs 83.9 GiB per GPU > 80.0 GiB "
        "(agent1 engines 44.0 + agent1 actor (resident) 4.0 + agent2 engines 32.0 + agent2 actor (resident) 4.0); "
        "lower --roleN.gpu_memory_utilization, or --ds.zero_stage 3 to split the weights that stay "
        "(--fit proposes layouts that fit)"
    ]


def test_separate_layout_kv_use_is_about_2_percent(checkpoints, tmp_path, monkeypatch):  # noqa: F811
    """The 32-GPU DoND 4B recipe: 64 dialogues on 10 engines per role, each engine with KV room for ~336 sequences of
    4096 tokens: ~2% of the KV cache is used (issue 37)."""
    cfg = load_config(recipe_flags("dond/qwen3.5-4b", recipe_env("dond/qwen3.5-4b", checkpoints, tmp_path)))
    plan = make_plan(cfg, nodes=4)
    (engines, _) = [u for u in plan.usages if u.component.kind == ENGINES]
    kv = int(0.85 * 80 * GiB) - P4B * 2 - VLLM_RUNTIME
    per_sequence = 4096 * 8 * 2 * 4 * 256 * 2 + 24 * (32 * 128 * 128 * 4 + (2 * 2048 + 4096) * 3 * 2)
    assert per_sequence == 4096 * 32768 + 51511296
    assert engines.sequences == kv // per_sequence == 336
    assert engines.kv_use == pytest.approx(64 / 10 * per_sequence / kv)
    assert round(100 * engines.kv_use, 1) == 1.9
    assert "KV use at this batch 1.9%" in engines.note
    pool = next(u for u in plan.usages if u.component.kind == POOL_ENGINES)
    assert pool.kv_use is None  # pool engines serve only the dialogues that face history


def test_model_table_is_what_the_hand_numbers_assume():
    m = model_spec(MODEL_TABLE["qwen3.5-4b"], "qwen3.5-4b")
    assert (m.params, m.vocab, m.hidden, m.intermediate, m.layers) == (P4B, VOCAB, HIDDEN, INTER, LAYERS)
    assert m.largest_tensor == VOCAB * HIDDEN


def test_docs_describe_the_runtime_and_what_is_not_measured():
    text = (ROOT / "docs/cluster.md").read_text()
    section = text.split("## Colocated layouts", 1)[1].split("\n## ", 1)[0]
    for part in ("colocate.py", "phases.jsonl", "tests/e2e/test_e2e_colocate.py", "pool snapshots", "not measured yet"):
        assert part in section, part
    assert Path(ROOT / "docs/images/colocated_layouts.png").is_file()
