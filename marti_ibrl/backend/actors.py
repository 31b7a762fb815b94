"""OpenRLHF's actors and trainer, subclassed for IB-RL: a role's policy actor (its own optimizer state, LR, scheduler,
checkpoint dir; adapters for LoRA roles; weight digests), its reference actor (the initial checkpoint, for the KL of
Eq. 5), the isolated PPO trainer (Eq. 5 on the role's own tokens) and experience maker (the role's own groups).
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from pathlib import Path

import ray
import torch
from openrlhf.trainer.ppo_utils.experience import (
    Experience,
    remove_padding_in_sequences,
    split_experience_batch,
)
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ray.launcher import RayActorGroup, ReferenceModelActor
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor

from marti_ibrl.algorithm.loss import IsolatedPolicyLoss
from marti_ibrl.backend.finite import NonFiniteError
from marti_ibrl.backend.internals import actor_handles, replicas, restart_accumulation
from marti_ibrl.procenv import listen_port
from marti_ibrl.rollout.digest import params_digest


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
            # the engines' log-probs correct Eq. 5's ratio (--train.async_rollout: samples one update old)
            is_correction_level=a.algo.advantage.is_correction_level,
            is_correction_mode=a.algo.advantage.is_correction_mode,
            is_correction_gating=a.algo.advantage.is_correction_gating,
            is_correction_threshold=a.algo.advantage.is_correction_threshold,
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
    return len(actor_handles(group)) // replicas(group)


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
        restart_accumulation(engine, self.strategy, gas)
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
