"""Glue to OpenRLHF's Ray + DeepSpeed pipeline: one independent stack per role.

Each role gets its own OpenRLHF args namespace (built from OpenRLHF's own parser, patch 0006), its
own DeepSpeed strategy, policy actor group (own optimizer state, LR, scheduler, checkpoint dir),
reference actor group (its initial checkpoint, for the KL of Eq. 5), rollout engines (vLLM on GPU,
HF generate on CPU, weight-sync group named after the role) and experience maker. Nothing is shared
between roles except the dialogues. The same code runs on CPU (gloo, object-store weight sync,
logical "GPU" slots standing for devices) and on GPUs (NCCL, vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ray
import torch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.trainer.ray.launcher import RayActorGroup, ReferenceModelActor
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor

from marti_ibrl.algorithm.loss import IsolatedPolicyLoss
from marti_ibrl.algorithm.schedule import num_updates
from marti_ibrl.config import Config, RoleConfig
from marti_ibrl.procenv import child_env_vars
from marti_ibrl.rollout.engines import create_engines, params_digest


class IsolatedActorPPOTrainer(ActorPPOTrainer):
    """OpenRLHF's actor trainer with the role-isolated loss of Eq. 5 (installed via patch 0004)."""

    def __init__(self, strategy, *args, **kwargs):
        super().__init__(strategy, *args, **kwargs)
        a = strategy.args
        self.actor_loss_fn = IsolatedPolicyLoss(
            clip_eps_low=a.actor.eps_clip_low_high[0],
            clip_eps_high=a.actor.eps_clip_low_high[1],
            dual_clip=a.actor.dual_clip,
            token_level_loss=a.actor.loss_agg_mode == "token-mean",
            policy_loss_type=a.actor.policy_loss_type,
        )


class RolePolicyActorBase(PolicyModelActor.__ray_actor_class__):
    """A role's DeepSpeed policy actor: OpenRLHF's PolicyModelActor with the isolated trainer."""

    trainer_cls = IsolatedActorPPOTrainer

    def weights_digest(self) -> str:
        """sha256 over the (gathered) parameters, identical on every rank; for tests and logs."""
        import deepspeed

        zero3 = self.strategy.args.ds.zero_stage == 3

        def gathered():
            for name, p in self.actor.model.module.named_parameters():
                with deepspeed.zero.GatheredParameters([p], enabled=zero3):
                    yield name, p

        return params_digest(gathered())


RolePolicyActor = ray.remote(num_gpus=1)(RolePolicyActorBase)


def resolve_device(cfg: Config) -> str:
    if cfg.train.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.train.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--train.device cuda: no CUDA device is visible")
    return cfg.train.device


def has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def role_dir(cfg: Config, role: RoleConfig) -> Path:
    return Path(cfg.ckpt.path) / role.name


def samples_per_iteration(cfg: Config) -> int:
    return cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt


def role_args(cfg: Config, role: RoleConfig, device: str) -> SimpleNamespace:
    """The role's OpenRLHF args: OpenRLHF's own defaults (its parser), then our per-role values."""
    from openrlhf.cli.train_ppo_ray import get_parser
    from openrlhf.utils.config import hierarchize

    a = hierarchize(get_parser().parse_args([]))
    # post-parse fix-ups that train_ppo_ray's __main__ applies
    a.actor.eps_clip_low_high = (role.eps_clip, role.eps_clip)
    a.algo.advantage.is_correction_threshold = list(a.algo.advantage.is_correction_threshold)
    a.critic.model_name_or_path = None

    a.actor.model_name_or_path = role.pretrain
    a.actor.num_nodes = a.ref.num_nodes = role.num_nodes
    a.actor.num_gpus_per_node = a.ref.num_gpus_per_node = role.num_gpus_per_node
    a.actor.adam.lr = role.lr
    a.actor.lr_scheduler = "constant"
    a.actor.lr_warmup_ratio = 0.0
    a.actor.eps_clip = role.eps_clip
    a.actor.entropy_coef = role.entropy_coef if role.entropy_coef > 0 else None
    a.actor.gradient_checkpointing_enable = cfg.ds.gradient_checkpointing
    a.algo.kl.init_coef = role.kl_coef
    a.algo.kl.use_loss = True  # Eq. 5: −β·KL(π_θ ‖ π_ref) in the objective, k3 estimator
    a.algo.kl.estimator = "k3"
    a.algo.advantage.estimator = role.advantage_estimator
    a.rollout.n_samples_per_prompt = cfg.rollout.n_samples_per_prompt
    a.rollout.batch_size = cfg.rollout.batch_size
    a.rollout.micro_batch_size = cfg.rollout.micro_batch_size
    a.rollout.temperature = cfg.rollout.temperature  # the Actor scores log-probs at the sampling temperature
    a.rollout.max_new_tokens = cfg.rollout.max_new_tokens
    a.data.max_len = cfg.rollout.max_len
    a.train.batch_size = samples_per_iteration(cfg)  # one optimizer step per role per epoch per update
    a.train.micro_batch_size = cfg.train.micro_batch_size
    a.train.max_epochs = cfg.train.max_epochs
    a.train.seed = cfg.train.seed
    a.ds.zero_stage = cfg.ds.zero_stage
    a.ds.param_dtype = cfg.ds.param_dtype
    if cfg.ds.attn_implementation != "auto":
        a.ds.attn_implementation = cfg.ds.attn_implementation
    else:
        import importlib.util

        use_fa = device == "cuda" and importlib.util.find_spec("flash_attn") is not None
        a.ds.attn_implementation = "flash_attention_2" if use_fa else "sdpa"
    out = role_dir(cfg, role)
    a.ckpt.path = str(out / "ckpt")
    a.ckpt.output_dir = str(out / "hf")
    a.ckpt.save_hf = cfg.ckpt.save_hf
    a.ckpt.load_enable = cfg.ckpt.load_enable
    a.ckpt.max_num = cfg.ckpt.max_num
    a.vllm.num_engines = role.num_engines
    a.vllm.tensor_parallel_size = role.tensor_parallel_size
    a.vllm.gpu_memory_utilization = role.gpu_memory_utilization
    a.vllm.sync_backend = "nccl" if device == "cuda" else "object_store"
    a.vllm.sync_group_name = f"ibrl_{role.name}"  # patch 0004: roles never share a sync group
    a.logger.tensorboard_dir = cfg.logger.tensorboard_dir or str(Path(cfg.ckpt.path) / "tensorboard")
    a.logger.wandb.project = cfg.logger.wandb_project
    a.logger.wandb.run_name = cfg.logger.wandb_run_name or Path(cfg.ckpt.path).name
    return a


def device_slots(cfg: Config) -> int:
    """How many device slots ("GPU" resources) the job needs: actor + reference ranks + engine GPUs per role."""
    total = 0
    for role in cfg.roles:
        ranks = role.num_nodes * role.num_gpus_per_node
        total += ranks * (2 if role.kl_coef > 0 else 1) + role.num_engines * role.tensor_parallel_size
    return total


def init_ray(cfg: Config, device: str) -> None:
    """Connect to a cluster (``ray.address``) or start a local Ray; on CPU, declare one logical device per slot."""
    if ray.is_initialized():
        return
    env_vars = {**child_env_vars(), "NCCL_CUMEM_ENABLE": "0"}
    if not cfg.ray.log_to_driver:
        import logging

        for name in list(logging.root.manager.loggerDict):  # OpenRLHF's per-step INFO lines in the driver
            if name.split(".")[0] == "openrlhf":
                logging.getLogger(name).setLevel(logging.WARNING)
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, runtime_env={"env_vars": env_vars}, log_to_driver=cfg.ray.log_to_driver)
        return
    kwargs = {"num_cpus": cfg.ray.num_cpus}
    if device == "cpu":
        # Each "GPU" is a scheduling slot for one actor or engine process: the placement code is the
        # GPU code, unchanged. Processes share the cores, one thread each.
        slots = device_slots(cfg)
        env_vars["OMP_NUM_THREADS"] = "1"
        kwargs = {"num_cpus": cfg.ray.num_cpus or slots + 2, "num_gpus": slots, "logging_level": "ERROR"}
    ray.init(
        include_dashboard=False,
        runtime_env={"env_vars": env_vars},
        log_to_driver=cfg.ray.log_to_driver,
        **kwargs,
    )


@dataclass
class RoleStack:
    """Everything one role owns on the cluster."""

    role: RoleConfig
    args: SimpleNamespace
    strategy: Any
    engines: list
    actor: RayActorGroup
    ref: RayActorGroup | None
    maker: RemoteExperienceMaker
    tokenizer: Any

    @classmethod
    def start(cls, cfg: Config, role: RoleConfig, device: str) -> RoleStack:
        """Create the role's engines and actor groups (models load in :meth:`init_models`)."""
        from openrlhf.utils import get_strategy
        from transformers import AutoTokenizer

        args = role_args(cfg, role, device)
        strategy = get_strategy(args)
        use_vllm = device == "cuda" and has_vllm()
        engines = create_engines(
            args,
            role.pretrain,
            cfg.train.seed + 1000 * (cfg.roles.index(role) + 1),
            use_vllm,
            role.num_engines,
            role.tensor_parallel_size,
            cfg.rollout.max_len,
        )
        actor = RayActorGroup(role.num_nodes, role.num_gpus_per_node, RolePolicyActor, pg=None, num_gpus_per_actor=1)
        ref = None
        if role.kl_coef > 0:
            ref = RayActorGroup(role.num_nodes, role.num_gpus_per_node, ReferenceModelActor, pg=None)
        tokenizer = AutoTokenizer.from_pretrained(role.pretrain)
        maker = RemoteExperienceMaker(actor, None, None, ref, FixedKLController(0.0), strategy, tokenizer)
        return cls(role, args, strategy, engines, actor, ref, maker, tokenizer)

    def init_models(self, iterations: int) -> list:
        """Load the DeepSpeed models (async refs); the LR scheduler is sized to the role's own update count."""
        epochs = self.args.train.max_epochs
        max_steps = max(1, num_updates(iterations, self.role.update_every) * epochs)
        refs = self.actor.async_init_model_from_pretrained(self.strategy, self.role.pretrain, max_steps, self.engines)
        if self.ref is not None:
            refs += self.ref.async_init_model_from_pretrained(self.strategy, self.role.pretrain)
        return refs

    # -- the role's update, in OpenRLHF's own order: append -> fit -> broadcast ------------------------------

    def make_experiences(self, samples: list) -> list:
        """Actor/reference log-probs and per-group advantages (Eq. 4) for the role's samples."""
        return self.maker.make_experience_batch(samples)

    def fit_async(self, experiences: list) -> list:
        ray.get(self.actor.async_run_method_batch(method_name="append", experience=experiences))
        return self.actor.async_run_method(method_name="fit", kl_ctl=self.role.kl_coef)

    def sync_engines_async(self) -> list:
        return self.actor.async_run_method(method_name="broadcast_to_vllm")

    def save_checkpoint_async(self, tag: str, client_states: dict) -> list:
        return self.actor.async_run_method(method_name="save_checkpoint", tag=tag, client_states=client_states)

    def save_hf_async(self) -> list:
        return self.actor.async_save_model()

    def weights_digest(self) -> str:
        return ray.get(self.actor.async_run_method(method_name="weights_digest"))[0]

    def engine_digests(self) -> list[str]:
        return ray.get([e.weights_digest.remote() for e in self.engines])
