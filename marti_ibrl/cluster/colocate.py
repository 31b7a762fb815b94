"""The colocated hybrid engine (``--train.colocate role|all``): which GPU bundles a role's processes share,
and when its engines sleep and wake and its DeepSpeed states are offloaded and reloaded.

An iteration runs the phases :func:`marti_ibrl.cluster.placement.phases` lists (``marti-ibrl plan`` prints them):

1. **generation** — every trained role's engines wake (all of vLLM's memory, or only the KV cache when a weight sync
   already woke the weights), the joint rollout runs, and they sleep again (vLLM sleep level 1: weights to CPU, KV
   cache dropped). The actors' DeepSpeed states are offloaded all the while; their bf16 weights stay, and the
   log-prob passes of the experience use them after the engines sleep. A full-weight role has no pool engines: in
   an iteration that faces its history (Eq. 6) the rollout plays the pairing of current policies first, then its
   own engines load the sampled snapshot (:meth:`ColocationPhases.load_snapshots`) for the pairing that faces it, then take
   their actor's weights back (:meth:`ColocationPhases.restore`). Each pairing is batched and seeded apart in every layout
   (:class:`~marti_ibrl.rollout.runner.DialogueRunner` passes), so the dialogues equal the separate layout's.
2. **training** — each due role reloads its states, takes its update and offloads them (OpenRLHF's ``ppo_train``
   with ``--ds.enable_sleep``: reload → fit → offload). ``role``: the roles at once (their GPUs are apart); ``all``:
   at once when ``marti-ibrl plan`` says both fit, else one after the other (:func:`updates_together`).
3. **sync** — each updated role's engines wake their weights only and take the actor's (OpenRLHF's
   ``broadcast_to_vllm`` with ``--vllm.enable_sleep``); the next generation wakes their KV cache.

Every step is one line of ``RUN/phases.jsonl`` (:class:`marti_ibrl.cluster.phases.PhaseLog`), in every mode (``none``
records generate, train and sync only), so the order is tested from what ran (:func:`marti_ibrl.cluster.phases.violations`).

On CPU the calls are the same and in the same order, and change nothing: vLLM-CPU cannot be built with sleep mode
(``enable_sleep_mode`` is dropped there, :func:`marti_ibrl.rollout.vllm_engine.vllm_engine_class`) and its worker ignores
sleep and wake ("sleep mode is not supported on CPU"); the HF engine's are no-ops; DeepSpeed's offload moves CPU
tensors to the CPU. The records say ``"effect": "none on cpu"`` and ``topology.json`` says ``sleep: unsupported on
cpu``. What is tested on CPU is the order and that a colocated run equals the separate layout; the memory freed is
``benchmarks/gpu_smoke.sh``'s to measure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from marti_ibrl.cluster.phases import PhaseLog
from marti_ibrl.cluster.placement import colocated, has_reference, trained_roles
from marti_ibrl.config import Config

ENGINE_SHARE = 0.2
"""The share of a bundle's GPU each engine asks for on a shared placement group: OpenRLHF's ``create_vllm_engines``
fixes it (``num_gpus=0.2`` with a ``shared_pg``)."""
CPU_EFFECT = "none on cpu"
"""What sleep, wake, offload and reload change on CPU (see the module doc)."""


def ds_share(cfg: Config) -> float:
    """The share of a bundle's GPU each DeepSpeed rank (actor or reference) asks Ray for when colocated: OpenRLHF's
    0.2, or less when more processes share a bundle (``all`` with two roles and references: 2 engines × 0.2 and
    4 DeepSpeed ranks × 0.15). Ray only counts it; the memory is what ``marti-ibrl plan`` checks."""
    roles = trained_roles(cfg)
    tenants = [roles] if cfg.train.colocate == "all" else [[r] for r in roles]
    shares = []
    for group in tenants:
        ranks = sum(1 + has_reference(r) for r in group)  # actor, and a reference of its own
        shares.append(math.floor((1.0 - ENGINE_SHARE * len(group)) / ranks * 1e4 + 1e-6) / 1e4)  # never above
    return min([ENGINE_SHARE, *shares])


def placement_groups(cfg: Config) -> dict[str, Any]:
    """role -> the placement group its actor, reference and engines share: one per trained role (``role``), one
    for all of them (``all``); empty for ``none``. One bundle ``{"GPU": 1, "CPU": 1}`` per actor rank, packed (as
    OpenRLHF's ``colocate_all``); on CPU the GPUs are the logical device slots Ray was started with."""
    if not colocated(cfg):
        return {}
    import ray
    from ray.util.placement_group import placement_group

    groups: dict[str, Any] = {}
    shared = None
    for role in trained_roles(cfg):
        if cfg.train.colocate == "all" and shared is not None:
            groups[role.name] = shared
            continue
        pg = placement_group([{"GPU": 1, "CPU": 1}] * (role.num_nodes * role.num_gpus_per_node), strategy="PACK")
        ray.get(pg.ready())
        groups[role.name] = shared = pg
    return groups


def updates_together(cfg: Config, gpu_memory_gib: float | None) -> bool:
    """Whether the due roles reload, train and offload at once: always for ``none`` and ``role`` (their GPUs are
    apart), and for ``all`` when ``marti-ibrl plan`` says both fit on a GPU of ``gpu_memory_gib`` (None: on CPU, where
    nothing is freed, at once)."""
    if cfg.train.colocate != "all" or gpu_memory_gib is None or len(trained_roles(cfg)) < 2:
        return True
    from marti_ibrl.cluster.plan import roles_update_together

    return roles_update_together(cfg, gpu_memory_gib)


def device_memory_gib(stacks: Mapping[str, Any]) -> float:
    """The memory of the GPU the first role's first actor rank runs on, in GiB (what :func:`updates_together` plans
    with)."""
    import ray

    def total(_actor) -> float:
        import torch

        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30

    from marti_ibrl.backend.internals import actor_handles

    first = actor_handles(next(iter(stacks.values())).actor)[0]
    return ray.get(first.__ray_call__.remote(total))


class ColocationPhases:
    """Drives one run's phases (see the module doc) and records each in ``RUN/phases.jsonl``.

    ``stacks``: the trained roles' :class:`~marti_ibrl.backend.stack.RoleStack` (their ``engines`` and
    ``actor`` groups are all it touches). ``together``: :func:`updates_together`. ``effect``: what sleeping changes
    here (:data:`CPU_EFFECT` on CPU, None on GPUs)."""

    def __init__(self, cfg: Config, stacks: Mapping[str, Any], log: PhaseLog, together: bool = True) -> None:
        self.colocated = colocated(cfg)
        self.stacks = dict(stacks)
        self.log = log
        self.together = together or cfg.train.colocate != "all"
        # colocated engines start asleep (create_vllm_engines with vllm_enable_sleep) and actors offloaded
        # (OpenRLHF's init with ds.enable_sleep); a weight sync wakes an engine set's weights only
        self.weights_awake = {r: not self.colocated for r in self.stacks}
        self.holding_snapshot: set[str] = set()  # roles whose engines hold a pool snapshot (until restore)

    # -- the calls, each recorded -----------------------------------------------------------------------------

    def _engines(self, role: str, method: str, **kwargs) -> None:
        from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call  # OpenRLHF's own call (it waits)

        batch_vllm_engine_call(self.stacks[role].engines, method, **kwargs)

    def _actors(self, roles: Sequence[str], method: str) -> None:
        import ray

        ray.get([ref for r in roles for ref in self.stacks[r].actor.async_run_method(method_name=method)])

    def wake(self, k: int, role: str, weights_only: bool = False) -> None:
        """Wake the role's engines: their weights only (before a sync), or whatever still sleeps (before generating:
        everything, or the KV cache when a sync woke the weights). Nothing when they are awake or not colocated."""
        if not self.colocated:
            return
        if weights_only:
            if self.weights_awake[role]:
                return
            tags = ["weights"]
        else:
            tags = ["kv_cache"] if self.weights_awake[role] else ["weights", "kv_cache"]
        with self.log.phase(k, role, "engines", "wake", tags=tags):
            self._engines(role, "wake_up", tags=tags)
        self.weights_awake[role] = True

    def sleep(self, k: int, role: str) -> None:
        if not self.colocated:
            return
        with self.log.phase(k, role, "engines", "sleep", level=1):
            self._engines(role, "sleep", level=1)
        self.weights_awake[role] = False

    def record_start(self) -> None:
        """Iteration 0's records: the state OpenRLHF left the colocated processes in while starting them (engines
        put to sleep by ``create_vllm_engines``, actors' states offloaded by their ``init_model_from_pretrained``)."""
        if not self.colocated:
            return
        roles = list(self.stacks)
        with self.log.phases([(0, r, "engines", "sleep") for r in roles], level=1, by="create_vllm_engines"):
            pass
        with self.log.phases([(0, r, "actor", "offload") for r in roles], by="init_model_from_pretrained"):
            pass

    # -- the phases -------------------------------------------------------------------------------------------

    @contextmanager
    def generation(self, k: int) -> Iterator[None]:
        """Around the joint rollout: every role's engines awake; each role's ``generate`` record spans it. Engines
        that served a pool snapshot (:meth:`load_snapshots`) get their actor's weights back before they sleep."""
        for role in self.stacks:
            self.wake(k, role)
        with self.log.phases([(k, role, "engines", "generate") for role in self.stacks]):
            yield
        self.restore(k)
        for role in self.stacks:
            self.sleep(k, role)

    def load_snapshots(self, k: int, loads: Mapping[str, str]) -> None:
        """Before a rollout pass: each role's engines load the pool snapshot file ``loads[role]`` (Eq. 6's history,
        served by the role's own engines when colocated: it has no pool engines)."""
        import ray

        for role, path in loads.items():
            with self.log.phase(k, role, "engines", "load", snapshot=path):
                ray.get([e.load_weights_file.remote(path) for e in self.stacks[role].engines])
            self.holding_snapshot.add(role)

    def restore(self, k: int) -> None:
        """The engines that hold a pool snapshot take their actor's weights again (the same broadcast as a sync; the
        actor's weights did not change)."""
        import ray

        roles = sorted(self.holding_snapshot, key=list(self.stacks).index)
        if roles:
            with self.log.phases([(k, r, "engines", "restore") for r in roles]):
                ray.get([ref for r in roles for ref in self.stacks[r].sync_engines_async()])
        self.holding_snapshot.clear()

    def update(
        self, k: int, roles: Sequence[str], start: Callable[[str], tuple[list | None, Any]]
    ) -> tuple[dict[str, dict], dict[str, Any]]:
        """Every role in ``roles`` takes its update: ``start(role)`` starts it (refs to its status, or None when it
        has no sample; and how its samples were dealt). Colocated: reload → fit → offload, the roles at once or in
        turn (:attr:`together`). Returns (status per role that trained, deal per role)."""
        import ray

        status, splits = {}, {}
        turns = [list(roles)] if self.together else [[r] for r in roles]
        for turn in turns:
            if self.colocated:
                with self.log.phases([(k, r, "actor", "reload") for r in turn]):
                    self._actors(turn, "reload_states")
            started = {}
            for r in turn:
                refs, splits[r] = start(r)
                if refs is not None:
                    started[r] = refs
            with self.log.phases([(k, r, "actor", "train") for r in started]):
                status.update({r: ray.get(refs)[0] for r, refs in started.items()})
            if self.colocated:
                with self.log.phases([(k, r, "actor", "offload") for r in turn]):
                    self._actors(turn, "offload_states")
        return status, splits

    def sync(self, k: int, roles: Sequence[str], start: Callable[[str], list]) -> dict[str, list]:
        """Each role in ``roles`` syncs its engines from its actor (``start(role)``: the refs of the broadcast, or of
        a LoRA role's adapter sync); colocated engines wake their weights first. Returns role -> the sync's results."""
        import ray

        for r in roles:
            self.wake(k, r, weights_only=True)
        with self.log.phases([(k, r, c, "sync") for r in roles for c in ("actor", "engines")]):
            refs = {r: start(r) for r in roles}
            return {r: ray.get(rs) for r, rs in refs.items()}

    def wake_for_reading(self, k: int, roles: Sequence[str]) -> None:
        """Before reading the engines' weights (``--train.check_sync``): wake the weights of any asleep."""
        for r in roles:
            self.wake(k, r, weights_only=True)


def sleep_summary(cfg: Config, device: str, engine_kind: str) -> str:
    """``topology.json``'s ``sleep``: what sleeping does in this run."""
    if not colocated(cfg):
        return "off (--train.colocate none)"
    if device != "cuda":
        return "unsupported on cpu (the calls are made and recorded in phases.jsonl; nothing is freed)"
    if engine_kind != "vllm":
        return "unsupported by hf engines (the calls are made; nothing is freed)"
    return "vllm sleep level 1 (weights offloaded, KV cache dropped); DeepSpeed states offloaded while generating"
