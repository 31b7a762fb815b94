"""``marti-ibrl plan`` and the Slurm recipes: placement, memory per GPU, fit checks (no GPU, no Ray)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_model import fake_checkpoint

from marti_ibrl.cli import main as cli_main
from marti_ibrl.cluster.memory import PROCESS_OVERHEAD, VLLM_RUNTIME, GiB
from marti_ibrl.cluster.placement import ACTOR, ENGINES, device_slots, placement
from marti_ibrl.cluster.plan import make_plan
from marti_ibrl.cluster.sizing import MODEL_TABLE, model_spec
from marti_ibrl.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
RECIPES_32 = ["dond/qwen3.5-4b", "dond/qwen3.5-9b", "telesales/qwen3.5-4b", "telesales/qwen3.5-9b"]
RECIPES_8 = ["dond/qwen3.5-4b-1node"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    """Checkpoint directories holding the Qwen3.5 configs of the built-in table, nested as a multimodal
    checkpoint nests them (``text_config``)."""
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for key, text in MODEL_TABLE.items():
        out[key] = str(fake_checkpoint(root / key, {"model_type": "qwen3_5", "text_config": text}))
    return out


def recipe_env(recipe: str, checkpoints: dict[str, str], tmp: Path) -> dict[str, str]:
    model = checkpoints["qwen3.5-9b" if "9b" in recipe else "qwen3.5-4b"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(DOND_MODEL=model, SALES_MODEL=model, CUSTOMER_MODEL=model, RUN_DIR=str(tmp / "run"))
    env.update(JUDGE_BASE_URL="https://judge.example/v1", JUDGE_MODEL="judge", JUDGE_API_KEY_ENV="IBRL_TEST_JUDGE_KEY")
    env["IBRL_TEST_JUDGE_KEY"] = "secret"
    return env


def recipe_flags(recipe: str, env: dict[str, str]) -> list[str]:
    """The flags the recipe hands to `marti-ibrl train` (its --print-flags mode runs the script's own code)."""
    out = subprocess.run(
        ["bash", str(ROOT / "recipes" / f"{recipe}.sh"), "--print-flags"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def sbatch_allocation(recipe: str) -> tuple[int, int]:
    text = (ROOT / "recipes" / f"{recipe}.sh").read_text()
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)$", text, re.M).group(1))
    gpus = int(re.search(r"^#SBATCH --gres=gpu:(\d+)$", text, re.M).group(1))
    assert "IBRL_NODES=" not in text and "IBRL_GPUS_PER_NODE=" not in text  # the header is the one place
    return nodes, gpus


@pytest.mark.parametrize("recipe", RECIPES_32 + RECIPES_8)
def test_plan_flags_after_the_recipe_win_over_its_header(recipe, checkpoints, tmp_path):
    env = recipe_env(recipe, checkpoints, tmp_path)
    script = str(ROOT / "recipes" / f"{recipe}.sh")
    nodes, gpus = sbatch_allocation(recipe)
    run = subprocess.run(["bash", script, "--plan"], env=env, capture_output=True, text=True)
    assert f"allocation {nodes} node{'s' if nodes > 1 else ''} × {gpus} GPUs" in run.stdout, run.stdout + run.stderr
    run = subprocess.run(
        ["bash", script, "--plan", "--nodes", "2", "--gpus-per-node", "4", "--gpu-memory", "40"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert "allocation 2 nodes × 4 GPUs = 8" in run.stdout and "(of 40.0)" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("recipe", RECIPES_32 + RECIPES_8)
def test_recipe_fits_its_allocation(recipe, checkpoints, tmp_path, monkeypatch, capsys):
    env = recipe_env(recipe, checkpoints, tmp_path)
    monkeypatch.setenv("IBRL_TEST_JUDGE_KEY", "secret")
    flags = recipe_flags(recipe, env)
    assert flags[:2] == ["--config", str(ROOT / "recipes" / f"{recipe}.yaml")]  # the YAML beside the script
    assert flags[flags.index("--ckpt.path") + 1] == str(tmp_path / "run")
    cfg = load_config(flags)  # exactly what train parses (every check: the checkpoints exist here)
    nodes, gpus = sbatch_allocation(recipe)
    assert nodes * gpus == (8 if recipe in RECIPES_8 else 32)
    plan = make_plan(cfg, nodes=nodes, gpus_per_node=gpus, gpu_memory_gib=80)
    assert plan.problems == []
    assert plan.total_gpus == device_slots(cfg) == nodes * gpus
    assert all(u.total <= 80 * GiB for u in plan.usages)
    assert {m.source for m in plan.models.values()} == {str(Path(cfg.roles[0].pretrain) / "config.json")}
    assert cli_main(["plan", *flags, "--nodes", str(nodes), "--gpus-per-node", str(gpus), "--strict"]) == 0
    assert "fits" in capsys.readouterr().out.splitlines()[-1]


def test_recipe_shell_scripts():
    scripts = sorted((ROOT / "recipes").rglob("*.sh"))
    assert {f"{p.parent.name}/{p.stem}" for p in scripts} >= set(RECIPES_32 + RECIPES_8)
    for script in scripts:
        out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, (script, out.stderr)
    for recipe in RECIPES_32 + RECIPES_8:
        assert (ROOT / "recipes" / f"{recipe}.yaml").is_file()


def test_recipe_errors_without_its_variables_or_slurm(checkpoints, tmp_path):
    env = recipe_env("dond/qwen3.5-4b", checkpoints, tmp_path)
    del env["DOND_MODEL"]
    out = subprocess.run(["bash", str(ROOT / "recipes/dond/qwen3.5-4b.sh")], env=env, capture_output=True, text=True)
    assert out.returncode == 2
    assert "error: set DOND_MODEL" in out.stderr
    env = recipe_env("telesales/qwen3.5-9b", checkpoints, tmp_path)
    out = subprocess.run(
        ["bash", str(ROOT / "recipes/telesales/qwen3.5-9b.sh")], env=env, capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "not inside a Slurm job: submit with sbatch" in out.stderr


# A tiny Qwen2 (tied embeddings) whose placement, memory and LoRA parameter counts the tests work out by hand.
TINY_QWEN2 = {
    "model_type": "qwen2",
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}


def _tiny_qwen2(tmp_path: Path) -> str:
    """A checkpoint directory holding TINY_QWEN2's config.json (what the plan reads) and stand-in weights."""
    return str(fake_checkpoint(tmp_path, TINY_QWEN2))


def test_hand_computed_placement_and_memory(tmp_path):
    """A tiny Qwen2 (tied embeddings): every number worked out by hand."""
    m = _tiny_qwen2(tmp_path)
    cfg = load_config(
        [
            *("--role1.pretrain", m, "--role2.pretrain", m, "--train.device", "cuda"),
            *("--role1.num_gpus_per_node", "2", "--role2.num_gpus_per_node", "2", "--role2.kl_coef", "0"),
            *("--role1.num_engines", "2", "--pool.num_engines", "1", "--ds.zero_stage", "2"),
            *("--rollout.max_len", "256", "--rollout.micro_batch_size", "4", "--train.micro_batch_size", "2"),
        ]
    )
    # role1: engines 2, pool 1, actor 2, reference 2; role2 (kl 0: no reference): engines 1, pool 1, actor 2
    got = [(c.role, c.kind, c.count, c.gpus) for c in placement(cfg)]
    assert got == [
        ("agent1", "engines", 2, 2),
        ("agent1", "pool engines", 1, 1),
        ("agent1", "actor", 2, 2),
        ("agent1", "reference", 2, 2),
        ("agent2", "engines", 1, 1),
        ("agent2", "pool engines", 1, 1),
        ("agent2", "actor", 2, 2),
    ]
    plan = make_plan(cfg, nodes=2, gpus_per_node=8, gpu_memory_gib=80)
    assert plan.total_gpus == 11 and plan.problems == []

    # embedding 1000*64 = 64000; per layer: q 64*64 + k, v 2*64*32 + o 64*64 = 12288, q/k/v biases 64 + 2*32 = 128,
    # MLP 3*64*128 = 24576, norms 2*64 = 128 -> 37120; 2 layers + final norm 64 -> 138304
    spec = plan.models[m]
    assert spec.params == 64000 + 2 * 37120 + 64 == 138304
    assert spec.kv_bytes_per_token == 2 * 2 * (2 * 16) * 2 == 256  # layers x (K, V) x kv heads x head dim x bf16
    actor = next(u for u in plan.usages if (u.component.role, u.component.kind) == ("agent1", "actor"))
    # bf16, ZeRO-2 over 2 ranks: weights 2 B/param whole, gradients 2 B and Adam 12 B split in two
    per_token_layer = 2 * (8 * 64 + 3 * 128)  # 1792
    update = 2 * 256 * (2 * per_token_layer + 1000 * 10)  # train micro-batch 2, no checkpointing, no entropy
    logprob = 4 * 256 * (per_token_layer + 1000 * 6)  # rollout micro-batch 4
    assert (update, logprob) == (6955008, 7979008)
    assert actor.parts == {
        "weights": 276608,
        "gradients": 138304,
        "Adam states": 829824,
        "activations": 7979008,
        "overhead": PROCESS_OVERHEAD,
    }
    assert actor.total == 276608 + 138304 + 829824 + 7979008 + GiB
    ref = next(u for u in plan.usages if u.component.kind == "reference")
    assert ref.parts == {"weights": 276608, "activations": 7979008, "overhead": GiB}
    engine = plan.usages[0]
    kv = 40 * GiB - 276608 - VLLM_RUNTIME  # gpu_memory_utilization 0.5 of 80 GiB
    assert engine.parts == {"weights": 276608, "runtime": 2 * GiB, "KV cache": kv}
    assert engine.sequences == kv // (256 * 256)
    assert engine.total == 40 * GiB

    # --role1.colocate_ref: the reference's 2 ranks move onto the actor's 2 GPUs (11 -> 9); those GPUs then hold
    # the reference's weights and process too, and the two log-prob passes that run side by side
    cfg.roles[0].colocate_ref = True
    plan = make_plan(cfg, nodes=2, gpus_per_node=8, gpu_memory_gib=80)
    assert [(c.kind, c.gpus) for c in placement(cfg) if c.role == "agent1"][2:] == [("actor", 2), ("reference", 0)]
    assert plan.total_gpus == 9 and plan.problems == []
    actor, ref = (u for u in plan.usages if u.component.role == "agent1" and u.component.kind in ("actor", "reference"))
    assert actor.parts == {
        "weights": 276608,
        "gradients": 138304,
        "Adam states": 829824,
        "reference weights": 276608,
        "activations": 2 * 7979008,
        "overhead": 2 * PROCESS_OVERHEAD,
    }
    assert ref.parts == {} and "on the actor's GPUs" in ref.note
    with pytest.raises(ConfigError, match=r"^--role2\.colocate_ref: no reference model to colocate \(kl_coef 0\)"):
        load_config([*(f"--role{i}.pretrain={m}" for i in (1, 2)), "--role2.kl_coef", "0", "--role2.colocate_ref"])


def test_does_not_fit_exits_2_with_one_message(checkpoints, tmp_path, capsys):
    env = recipe_env("dond/qwen3.5-9b", checkpoints, tmp_path)
    flags = recipe_flags("dond/qwen3.5-9b", env)
    assert cli_main(["plan", *flags, "--nodes", "4", "--ds.zero_stage", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marti-ibrl plan: error: does not fit: agent1 actor needs ")
    assert "GiB per GPU > 80.0 GiB" in err[0] and "try --ds.zero_stage 3" in err[0]
    # the hint names only what the job does not set yet (the recipe sets gradient checkpointing; issue 65)
    assert "--ds.gradient_checkpointing true" not in err[0] and "LoRA roles (--roleN.lora_rank 16" in err[0]
    assert cli_main(["plan", *flags, "--nodes", "4", "--role1.num_gpus_per_node", "8"]) == 2
    err = capsys.readouterr().err
    assert (
        "does not fit: the job needs 36 GPUs, the allocation has 4 × 8 = 32" in err
    )  # +4 actor ranks (reference colocated)
    assert cli_main(["plan", *flags, "--nodes", "4", "--gpu-memory", "20"]) == 2  # 0.85 x 20 GiB < 9B weights
    assert "agent1 engines: 0.85 × 20.0 GiB leaves no KV cache for one 4096-token sequence" in capsys.readouterr().err


def test_plan_without_checkpoints_sizes_by_name_unless_strict(tmp_path, capsys):
    recipe = str(ROOT / "recipes/dond/qwen3.5-4b.yaml")
    flags = ["--config", recipe, "--role1.pretrain", "/nowhere/Qwen3.5-4B", "--role2.pretrain", "/nowhere/x"]
    assert cli_main(["plan", *flags, "--nodes", "4"]) == 0  # role2's size: from the recipe's name
    out = capsys.readouterr().out
    assert "qwen3.5-4b (built-in table, assumed; from the checkpoint name)" in out
    assert "qwen3.5-4b (built-in table, assumed; from the recipe name)" in out
    assert "not checked here (assumed present where train runs; --strict checks them): /nowhere/Qwen3.5-4B" in out
    assert cli_main(["plan", *flags, "--nodes", "4", "--model-config", "qwen3.5-9b", "--ds.zero_stage", "3"]) == 0
    assert "8.95B params" in capsys.readouterr().out
    assert cli_main(["plan", *flags, "--strict"]) == 2
    assert "--role1.pretrain: not a directory: /nowhere/Qwen3.5-4B" in capsys.readouterr().err
    assert cli_main(["plan", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "--config: no such file" in capsys.readouterr().err


def test_train_starts_ray_with_the_planned_slots(checkpoints, tmp_path, monkeypatch):
    """train's Ray start-up asks for exactly the GPUs plan counts (one function: placement.device_slots)."""
    from marti_ibrl.backend import cluster

    env = recipe_env("telesales/qwen3.5-4b", checkpoints, tmp_path)
    monkeypatch.setenv("IBRL_TEST_JUDGE_KEY", "secret")
    cfg = load_config(recipe_flags("telesales/qwen3.5-4b", env) + ["--ray.address", "auto"])
    asked = []
    monkeypatch.setattr(cluster, "start_ray", lambda slots, *a, **k: asked.append(slots))
    cluster.init_ray(cfg, "cuda")
    assert asked == [make_plan(cfg, nodes=4).total_gpus] == [32]


def test_ablation_resolved_like_the_trainer(checkpoints):
    m = checkpoints["qwen3.5-4b"]
    cfg = load_config(["--role1.pretrain", m, "--role2.pretrain", m, "--ablation", "no_stabilization"])
    assert not [c for c in placement(cfg) if c.kind == "pool engines"]  # the trainer turns the pools off first
    assert device_slots(cfg) == 2 * 3


@pytest.mark.parametrize("key", sorted(MODEL_TABLE))
def test_parameter_count_matches_transformers(key):
    """The architecture formula on the built-in Qwen3.5 configs equals transformers' own count (meta device)."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    text = {k: v for k, v in MODEL_TABLE[key].items() if k != "model_type"}
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text))
    assert model_spec(MODEL_TABLE[key], key).params == sum(p.numel() for p in model.parameters())


def test_plan_imports_neither_torch_nor_ray():
    code = (
        "import sys; from marti_ibrl.cli import main; "
        "rc = main(['plan', '--config', 'recipes/dond/qwen3.5-9b.yaml', '--role1.pretrain', '/x/Qwen3.5-9B', "
        "'--role2.pretrain', '/x/Qwen3.5-9B', '--nodes', '4']); "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'vllm', 'deepspeed', 'transformers')]; "
        "assert rc == 0 and not heavy, (rc, heavy[:5])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_plan_lora_roles(tmp_path, capsys):
    """plan with LoRA roles: adapter parameters as peft counts them; the actor holds gradients and Adam states of the
    adapter only; no reference, no pool engines, and the GPUs that saves."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from marti_ibrl.cluster.sizing import lora_params

    m = _tiny_qwen2(tmp_path)
    flags = [
        *("--role1.pretrain", m, "--role2.pretrain", m, "--train.device", "cuda", "--ds.zero_stage", "2"),
        *("--role1.lora_rank", "8", "--role2.num_gpus_per_node", "2"),
    ]
    cfg = load_config(flags)
    plan = make_plan(cfg, nodes=1, gpus_per_node=8)
    spec = plan.models[m]
    # per layer r·(in+out): q 8·128, k 8·96, v 8·96, o 8·128, gate/up/down 8·192 each = 8192; 2 layers
    assert lora_params(spec, 8, ["all-linear"]) == 16384
    qwen = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in TINY_QWEN2.items() if k != "model_type"}))
    peft = get_peft_model(qwen, LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert peft.get_nb_trainable_parameters()[0] == 16384  # peft's own count
    assert lora_params(spec, 8, ["q_proj", "v_proj"]) == 2 * (1024 + 768)
    actor = next(u for u in plan.usages if (u.component.role, u.component.kind) == ("agent1", "actor"))
    assert actor.parts["weights"] == spec.params * 2 and actor.parts["adapter"] == 16384 * 2
    assert actor.parts["gradients"] == 16384 * 2 and actor.parts["Adam states"] == 16384 * 12
    assert {(c.role, c.kind) for c in plan.components if c.role == "agent1"} == {("agent1", ENGINES), ("agent1", ACTOR)}
    (summary,) = plan.lora
    assert (summary.role, summary.params, summary.snapshot_bytes) == ("agent1", 16384, 16384 * 2)
    assert (summary.gpus_saved, summary.reference_gpus, summary.pool_gpus) == (2, 1, 1)
    assert cli_main(["plan", *flags, "--nodes", "1"]) == 0
    out = capsys.readouterr().out
    assert "agent1: LoRA r=8, 0.02M adapter params; a pool snapshot 32 KiB" in out
    assert (
        "no reference model, no pool engines: 2 GPUs fewer than full weights with these flags (reference 1, pool" in out
    )


def _check_shared(tmp_path: Path, srun_body: str) -> subprocess.CompletedProcess:
    """recipes/slurm-ray.sh's check that every node sees the repository and RUN_DIR, with ``srun`` a stand-in."""
    fake = tmp_path / "fake-srun"
    fake.write_text(f"#!/usr/bin/env bash\n{srun_body}\n")
    fake.chmod(0o755)
    script = (
        f"RECIPE={ROOT}/recipes/dond/tiny-cluster-cpu.sh; source {ROOT}/recipes/prologue.sh; "
        f"source {ROOT}/recipes/slurm-ray.sh; ibrl_check_shared 2 && echo passed"
    )
    env = {**os.environ, "RUN_DIR": str(tmp_path / "run"), "SLURM_JOB_ID": "7", "IBRL_SRUN": str(fake)}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)


def test_a_run_directory_a_node_does_not_see_stops_the_job_in_one_line(tmp_path):
    # every task runs on this machine: both "nodes" see the repository and the file written in RUN_DIR
    seen = _check_shared(tmp_path, 'while [[ $1 != bash ]]; do shift; done; exec "$@"')
    assert (seen.returncode, seen.stdout, seen.stderr) == (0, "passed\n", "")
    # n2 mounts something else there: its task prints its name
    lost = _check_shared(tmp_path, "echo n2")
    assert (lost.returncode, lost.stdout) == (2, "")
    assert lost.stderr == (
        f"tiny-cluster-cpu: error: not visible on n2: the repository ({ROOT}) or RUN_DIR ({tmp_path / 'run'}); both "
        "must be on a file system every node mounts (RUN_DIR=/shared/path sbatch ...)\n"
    )
    assert not list((tmp_path / "run").glob(".ibrl-shared-*"))  # the check leaves nothing behind


# -- plan --fit (marti_ibrl/cluster/layouts.py) ---------------------------------------------------------------------------

ALLOCATIONS = [(4, 8, 80.0), (2, 8, 80.0), (1, 8, 80.0), (1, 4, 80.0), (1, 8, 40.0)]  # 32, 16, 8, 4 GPUs; 8 x 40 GiB


@pytest.mark.parametrize("recipe", RECIPES_32)
def test_every_layout_plan_fit_proposes_passes_plan_strict(recipe, checkpoints, tmp_path, monkeypatch, capsys):
    from marti_ibrl.cluster.layouts import propose, smallest_fit

    monkeypatch.setenv("IBRL_TEST_JUDGE_KEY", "secret")
    flags = recipe_flags(recipe, recipe_env(recipe, checkpoints, tmp_path))
    cfg = load_config(flags)
    fitted = 0
    for nodes, gpn, mem in ALLOCATIONS:
        alloc = ["--nodes", str(nodes), "--gpus-per-node", str(gpn), "--gpu-memory", str(mem)]
        layouts = propose(cfg, nodes=nodes, gpus_per_node=gpn, gpu_memory_gib=mem)
        if (nodes, gpn, mem) == (4, 8, 80.0):  # the recipe's own allocation: the recipe itself comes first
            assert layouts and layouts[0].flags == [] and layouts[0].idle == 0
        for layout in layouts:
            assert layout.gpus + layout.idle == nodes * gpn and layout.peak_gib <= mem
            assert cli_main(["plan", *flags, *layout.flags, *alloc, "--strict"]) == 0, (alloc, layout.flags)
            assert capsys.readouterr().out.splitlines()[-1] == "fits"
        fitted += bool(layouts)
        assert cli_main(["plan", *flags, *alloc, "--fit"]) == (0 if layouts else 2)
        out = capsys.readouterr()
        if layouts:  # printed as proposed, each with the flags to add
            assert out.out.startswith(f"layouts that fit {nodes} × {gpn} GPUs of {mem:g} GiB (best first):")
            assert out.out.count("\n   add: ") == len(layouts)
            continue
        bigger = smallest_fit(cfg, nodes=nodes, gpus_per_node=gpn, gpu_memory_gib=mem)
        assert bigger is not None, (recipe, alloc)  # every recipe fits somewhere near
        change, layout = bigger
        assert f"the smallest change that fits: {change}, with" in out.err
        grown = dict(zip(alloc[::2], alloc[1::2])) | dict([change.split()])
        assert cli_main(["plan", *flags, *layout.flags, *[x for kv in grown.items() for x in kv], "--strict"]) == 0
        capsys.readouterr()
    assert fitted >= 3  # 32, 16 and 8 GPUs of 80 GiB at least


def test_plan_fit_proposes_lora_roles_where_no_full_weight_layout_fits(checkpoints, tmp_path, capsys):
    """Issue 65: 2 nodes × 4 GPUs of 40 GiB and the 4B DoND recipe: "the smallest change that fits: --nodes 5", though
    LoRA roles fit (found by hand). LoRA layouts now come after every full-weight one, saying what they change."""
    from marti_ibrl.cluster.layouts import propose

    flags = recipe_flags("dond/qwen3.5-4b", recipe_env("dond/qwen3.5-4b", checkpoints, tmp_path))
    alloc = ["--nodes", "2", "--gpus-per-node", "4", "--gpu-memory", "40"]
    assert cli_main(["plan", *flags, *alloc, "--fit"]) == 0
    out = capsys.readouterr().out
    assert "(LoRA: rank-16 adapters trained on the frozen checkpoint" in out and "far fewer trained parameters" in out
    layouts = propose(load_config(flags), nodes=2, gpus_per_node=4, gpu_memory_gib=40)
    assert layouts and all(x.lora for x in layouts)  # nothing of full weights fits here
    for layout in layouts:
        assert layout.flags[:8] == [*("--role1.lora_rank", "16", "--role2.lora_rank", "16"),
                                    *("--role1.colocate_ref", "false", "--role2.colocate_ref", "false")]  # fmt: skip
        assert cli_main(["plan", *flags, *layout.flags, *alloc, "--strict"]) == 0, layout.flags
        assert capsys.readouterr().out.splitlines()[-1] == "fits"
    # where full weights fit, they come first: the recipe's own allocation lists no LoRA layout before them
    mixed = propose(load_config(flags), nodes=1, gpus_per_node=8, gpu_memory_gib=80, limit=1000)
    kinds = [x.lora for x in mixed]
    assert False in kinds and True in kinds and kinds == sorted(kinds)


def test_the_plan_fit_table_in_the_docs_is_current():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "plan_fit_table.py"), "--check"], capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_header_is_read_where_needed_not_when_the_launcher_is_sourced(tmp_path):
    """A job script of its own may source recipes/slurm-ray.sh for its functions (tests/e2e/test_slurm_launcher.py's
    sleeper: the SIGTERM trap) without an allocation header; --plan, which needs one, says what is missing."""
    script = tmp_path / "own.sh"
    script.write_text("#!/usr/bin/env bash\n#SBATCH --requeue\n")
    src = (
        f"IBRL_NAME=own IBRL_ROOT={tmp_path} RECIPE={script} RUN_DIR={tmp_path}/run; source {ROOT}/recipes/slurm-ray.sh"
    )
    sourced = subprocess.run(["bash", "-c", f"{src}; type ibrl_on_sigterm >/dev/null && echo ok"], capture_output=True,
                             text=True)  # fmt: skip
    assert (sourced.returncode, sourced.stdout) == (0, "ok\n"), sourced.stderr
    header = subprocess.run(["bash", "-c", f"{src}; ibrl_sbatch_header"], capture_output=True, text=True)
    assert header.returncode == 2
    assert header.stderr == f"own: error: {script} has no '#SBATCH --nodes=N' line (the recipe's allocation)\n"


def _worker_start(tmp_path: Path, first: str, env: dict) -> subprocess.CompletedProcess:
    """recipes/slurm-ray.sh's worker ``ray start``, passed to its step as the recipe passes it (``declare -f``), with
    ``ray`` a stand-in: its first try prints FIRST and exits 1 leaving a daemon behind; every later try succeeds."""
    fake = tmp_path / "fake-ray"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f"n=$(cat {tmp_path}/tries 2>/dev/null || echo 0); echo $((n + 1)) >{tmp_path}/tries\n"
        f'if ((n == 0)); then sleep 1000 >/dev/null 2>&1 & echo $! >{tmp_path}/left; echo "{first}"; exit 1; fi\n'
        'echo "ray $* (try $((n + 1)))"\n'
    )
    fake.chmod(0o755)
    script = (
        f"RECIPE={ROOT}/recipes/dond/tiny-cluster-cpu.sh; source {ROOT}/recipes/prologue.sh; "
        f"source {ROOT}/recipes/slurm-ray.sh; "
        'bash -c "$(declare -f ibrl_worker_start); ibrl_worker_start \\"\\$@\\"" ibrl_worker_start '
        f"{fake} start --block"
    )
    return subprocess.run(["bash", "-c", script], env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def test_a_worker_ray_start_that_times_out_registering_is_started_again_and_its_leftovers_ended(tmp_path):
    job = {"SLURM_JOB_ID": f"t{os.getpid()}", "SLURM_STEP_ID": "3"}
    # the same job's other step (the head's, on a shared node) is not this step's to end
    other = subprocess.Popen(["sleep", "1000"], env={**os.environ, **job, "SLURM_STEP_ID": "2"})
    try:
        timed_out = "Exception: The current node timed out during startup. This could happen because ..."
        done = _worker_start(tmp_path, timed_out, job)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{timed_out}\nray start --block (try 2)\n"
        assert done.stderr.endswith("`ray start` timed out registering with the head; starting it again (2 of 3)\n")
        left = int((tmp_path / "left").read_text())
        assert not Path(f"/proc/{left}").exists() or "zombie" in Path(f"/proc/{left}/status").read_text().lower()
        assert other.poll() is None
    finally:
        other.kill()


def test_a_worker_ray_start_that_fails_otherwise_is_not_started_again(tmp_path):
    failed = _worker_start(tmp_path, "ValueError: bad --num-gpus", {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "1"})
    try:
        assert (failed.returncode, failed.stdout, failed.stderr) == (1, "ValueError: bad --num-gpus\n", "")
        assert (tmp_path / "tries").read_text() == "1\n"
    finally:
        subprocess.run(["kill", (tmp_path / "left").read_text().strip()])


def _in_job_plan(tmp_path: Path, env: dict, nvidia_smi: str | None, flags: list[str], *call: str):
    """recipes/slurm-ray.sh in a job whose first node is n1 (``IBRL_HEAD``), with ``nvidia-smi`` a stand-in printing
    NVIDIA_SMI (None: one that fails, as where there is no GPU), then ``call`` with TRAIN_FLAGS = ``flags``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    body = f"printf '{nvidia_smi}'" if nvidia_smi is not None else "echo 'NVIDIA-SMI has failed' >&2; exit 9"
    fake.write_text(f"#!/usr/bin/env bash\n[[ $* == *memory.total* ]] || exit 3\n{body}\n")
    fake.chmod(0o755)
    script = (
        f"RECIPE={ROOT}/recipes/dond/qwen3.5-4b.sh; source {ROOT}/recipes/prologue.sh; "
        f'source {ROOT}/recipes/slurm-ray.sh; IBRL_HEAD=n1; TRAIN_FLAGS=("$@"); {" ".join(call)}'
    )
    env = {**env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "5"}
    env.pop("GPU_MEMORY_GIB", None)
    return subprocess.run(["bash", "-c", script, "in-job", *flags], env=env, capture_output=True, text=True)


def test_the_in_job_preflight_plans_with_the_nodes_own_gpu_memory(checkpoints, tmp_path):
    env = recipe_env("dond/qwen3.5-4b", checkpoints, tmp_path)
    flags = recipe_flags("dond/qwen3.5-4b", env)
    nodes, gpus = sbatch_allocation("dond/qwen3.5-4b")
    # nvidia-smi's smallest GPU, MiB to GiB rounded down to a tenth (an H100's 81559 MiB: 79.6)
    asked = _in_job_plan(tmp_path, env, "81559\n81559\n", [], "ibrl_gpu_memory")
    assert (asked.returncode, asked.stdout) == (0, "79.6\n"), asked.stderr
    asked = _in_job_plan(tmp_path, env, "81920\n40960\n", [], "ibrl_gpu_memory")
    assert asked.stdout == "40.0\n"
    # the recipe, written for 80 GiB, fits an H100 node and is refused on a 40 GiB one before anything starts
    fits = _in_job_plan(tmp_path, env, "81559\n", flags, "ibrl_plan", str(nodes), str(gpus), "--strict")
    assert fits.returncode == 0 and "(of 79.6)" in fits.stdout, fits.stdout + fits.stderr
    refused = _in_job_plan(tmp_path, env, "40960\n", flags, "ibrl_plan", str(nodes), str(gpus), "--strict")
    assert refused.returncode == 2 and "(of 40.0)" in refused.stdout, refused.stdout + refused.stderr
    # GPU_MEMORY_GIB wins; without it and without an answer from nvidia-smi: one line asking for it, no plan
    told = _in_job_plan(tmp_path, env, None, [], "GPU_MEMORY_GIB=40;", "ibrl_gpu_memory")
    assert (told.returncode, told.stdout) == (0, "40\n"), told.stderr
    unknown = _in_job_plan(tmp_path, env, None, flags, "ibrl_plan", str(nodes), str(gpus), "--strict")
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr == (
        "qwen3.5-4b: error: cannot tell the memory of this job's GPUs (no nvidia-smi answer on n1): set "
        f"GPU_MEMORY_GIB, GiB per GPU, e.g. GPU_MEMORY_GIB=40 sbatch {ROOT}/recipes/dond/qwen3.5-4b.sh\n"
    )
    # outside a job (--plan): the 80 GiB the recipes are written for
    outside = subprocess.run(["bash", str(ROOT / "recipes/dond/qwen3.5-4b.sh"), "--plan"], env=env,
                             capture_output=True, text=True)  # fmt: skip
    assert outside.returncode == 0 and "(of 80.0)" in outside.stdout, outside.stdout + outside.stderr
