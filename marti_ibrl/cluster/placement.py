"""Where a job's processes go: the devices each component of each role asks Ray for. No torch, no Ray.

:func:`placement` is the one list of them: ``train`` sizes its Ray start-up with it (:func:`device_slots`, used by
``backend/stack.py``) and ``marti-ibrl plan`` prints it, so the two cannot disagree. Per trained role, in
the order :meth:`RoleStack.start <marti_ibrl.backend.stack.RoleStack.start>` creates them:

* ``engines``: ``roleN.num_engines`` rollout engines of ``roleN.tensor_parallel_size`` GPUs each (current policy);
  with ``rollout.share_engines`` only the first trained role's, serving every LoRA role (:func:`shares_engines`);
* ``pool engines``: ``pool.num_engines`` more of the same size serving the role's historical checkpoints (Eq. 6),
  only when opponent pools are on (:func:`uses_pool`) and the role trains full weights: a LoRA role's snapshots are
  adapters its own engines serve (:func:`pool_engine_count`);
* ``actor``: ``roleN.num_nodes × roleN.num_gpus_per_node`` DeepSpeed ranks, one GPU each;
* ``reference``: as many ranks again, holding π_ref of Eq. 5, only when ``roleN.kl_coef > 0`` and the role trains
  full weights (:func:`has_reference`; a LoRA role's π_ref is its base with the adapter off, in its actor);
  with ``roleN.colocate_ref`` they share the actor's GPUs (0 GPUs of their own).

Per frozen role (unilateral baselines), each ``checkpoint:`` counterpart gets ``roleN.num_engines`` engines of
``roleN.tensor_parallel_size`` GPUs. ``cfg`` is a run's effective config: :func:`~marti_ibrl.config.load_config` has
applied its ``--ablation`` (``no_stabilization`` turns the pools off).

``--train.colocate`` (:data:`~marti_ibrl.config.COLOCATE`) says which components share GPUs. ``none``: apart from a
``colocate_ref`` reference, every component has GPUs of its own. ``role``: a trained role's engines and reference sit
on its actor's GPUs (one bundle per actor rank, as OpenRLHF's ``colocate_all``); ``all``: every trained role's
engines, actors and references sit on the first trained role's actor GPUs. A component on another's GPUs is
``shared`` (it counts none: :attr:`Component.gpus` is 0) and names its ``group``; :func:`gpu_map` says which GPUs
each one occupies. Colocated roles have no pool engines: their own engines serve their snapshots
(:func:`pool_served_by`), and the GPUs alternate between the :func:`phases` (engines awake for a joint rollout,
then asleep while DeepSpeed trains). Frozen roles' engines keep GPUs of their own in every mode (they never sleep).
"""

from __future__ import annotations

from dataclasses import dataclass

from marti_ibrl.config import Config, RoleConfig

ENGINES, POOL_ENGINES, ACTOR, REFERENCE = "engines", "pool engines", "actor", "reference"
FROZEN_ENGINES = "frozen engines"
SHARED = "shared"
"""The GPU group of ``--train.colocate all`` (every trained role's components)."""


@dataclass(frozen=True)
class Component:
    """One group of Ray actors of one role: ``count`` processes of ``gpus_each`` GPUs, all loading ``model``."""

    role: str
    kind: str
    model: str
    count: int
    gpus_each: int
    group: str = ""
    """The GPUs it shares with other components (colocated): a role's name (its actor's GPUs) or :data:`SHARED`;
    empty when it has GPUs of its own."""
    shared: bool = False
    """It sits on GPUs another component of its ``group`` counts (the group's owner: the first actor in it)."""

    @property
    def gpus(self) -> int:
        """GPUs of its own (0 when ``shared``): what :func:`device_slots` adds up."""
        return 0 if self.shared else self.count * self.gpus_each


def trained_roles(cfg: Config) -> list[RoleConfig]:
    return [r for r in cfg.roles if not r.frozen]


def uses_pool(cfg: Config) -> bool:
    """Opponent pools need two trained roles and some probability of facing history (Eq. 6)."""
    return len(trained_roles(cfg)) >= 2 and cfg.pool.probs[0] < 1.0


def has_reference(role: RoleConfig) -> bool:
    """The role keeps a reference model (its initial checkpoint) only when its KL term is on, and only for full
    weights: a LoRA role's reference is its own actor with the adapter off (marti_ibrl/lora.py)."""
    return role.kl_coef > 0 and role.lora_rank == 0


def colocated(cfg: Config) -> bool:
    """``--train.colocate role`` or ``all``: engines share GPUs with DeepSpeed models and sleep in turn."""
    return cfg.train.colocate != "none"


def reference_on_actor_gpus(cfg: Config, role: RoleConfig) -> bool:
    """The role's reference shares its actor's GPUs: ``roleN.colocate_ref``, or any ``--train.colocate`` mode."""
    return has_reference(role) and (role.colocate_ref or colocated(cfg))


def pool_engine_count(cfg: Config, role: RoleConfig) -> int:
    """Pool engines of a trained role (Eq. 6): none without pools, for a LoRA role (its snapshots are adapters its
    current engines serve per request) or when colocated (its own engines serve them), else ``pool.num_engines`` (1
    when unset)."""
    if not uses_pool(cfg) or role.lora_rank > 0 or colocated(cfg):
        return 0
    return 1 if cfg.pool.num_engines is None else cfg.pool.num_engines


def shares_engines(cfg: Config, role: RoleConfig) -> bool:
    """``--rollout.share_engines``: a trained role after the first serves its adapters from the first role's engines
    (and starts none)."""
    return cfg.rollout.share_engines and not role.frozen and role is not trained_roles(cfg)[0]


def frozen_checkpoints(role: RoleConfig) -> list[str]:
    """Paths of a frozen role's ``checkpoint:`` counterparts (each served by its own engines)."""
    from marti_ibrl.rollout.players import parse_player_spec

    return [s["path"] for s in map(parse_player_spec, role.frozen) if s["kind"] == "checkpoint"]


def placement(cfg: Config) -> list[Component]:
    """Every component the trainer starts, with its device count (see the module docstring)."""
    out = []
    owner = None  # --train.colocate all: the first trained role's actor counts the shared GPUs
    for role in cfg.roles:
        tp = role.tensor_parallel_size
        if role.frozen:
            out += [Component(role.name, FROZEN_ENGINES, p, role.num_engines, tp) for p in frozen_checkpoints(role)]
            continue
        group = {"none": "", "role": role.name, "all": SHARED}[cfg.train.colocate]
        own = cfg.train.colocate != "all" or owner is None  # this role's actor counts its group's GPUs
        owner = owner or role.name
        if not shares_engines(cfg, role):
            out.append(Component(role.name, ENGINES, role.pretrain, role.num_engines, tp, group, bool(group)))
        if pool_engine_count(cfg, role):
            out.append(Component(role.name, POOL_ENGINES, role.pretrain, pool_engine_count(cfg, role), tp))
        ranks = role.num_nodes * role.num_gpus_per_node
        out.append(Component(role.name, ACTOR, role.pretrain, ranks, 1, group, not own))
        if has_reference(role):  # on the actor's GPUs when colocated, none of its own
            on_actor = reference_on_actor_gpus(cfg, role)
            ref_group = group or (role.name if on_actor else "")
            out.append(Component(role.name, REFERENCE, role.pretrain, ranks, 1, ref_group, on_actor))
    return out


def gpu_map(cfg: Config) -> dict[Component, range]:
    """The GPUs (indices into the job's :func:`device_slots`) each component of :func:`placement` occupies: one of its
    own takes the next ones in placement order; a shared one, its group's, which its owner (the group's first actor)
    counts. Every GPU of a group holds one rank of each actor and reference in it and one TP shard of each engine
    set (``num_engines × tensor_parallel_size`` = ranks)."""
    components, own, start = placement(cfg), {}, 0
    for c in components:
        if not c.shared:
            own[c] = range(start, start + c.gpus)
            start += c.gpus
    groups = {c.group or c.role: r for c, r in own.items() if c.kind == ACTOR}
    return {c: groups[c.group] if c.shared else own[c] for c in components}


def pool_served_by(cfg: Config, role: RoleConfig) -> str:
    """Who serves the role's historical checkpoints (Eq. 6): ``""`` without pools (or a frozen role)."""
    if not uses_pool(cfg) or role.frozen:
        return ""
    if pool_engine_count(cfg, role):
        return f"{pool_engine_count(cfg, role)} pool engine{'s' * (pool_engine_count(cfg, role) != 1)}"
    if role.lora_rank > 0:
        return "its own engines (snapshots are adapters, one per request)"
    return "its own engines (colocated: the snapshot's weights are loaded into them; no pool engines)"


@dataclass(frozen=True)
class Phase:
    """One step of a colocated iteration (:func:`phases`): which components hold their full memory on the GPUs."""

    name: str
    engines_awake: bool
    """Engines hold their weights and KV cache; asleep they hold neither (vLLM sleep level 1)."""
    training: tuple[str, ...]
    """Roles whose DeepSpeed states (gradients, optimizer states, fp32 master weights) are on the GPUs, with their
    activations; every other actor and reference keeps only its weights there."""
    what: str


def phases(cfg: Config, together: bool = True) -> list[Phase]:
    """The order of a colocated iteration (empty for ``--train.colocate none``: every component always resident).
    ``together``: the trained roles' log-prob passes and updates run at once (always for ``role``: their GPUs are
    apart); else one role after the other (``all`` when both at once do not fit: ``marti-ibrl plan`` decides)."""
    if not colocated(cfg):
        return []
    roles = tuple(r.name for r in trained_roles(cfg))
    out = [
        Phase(
            "generation",
            True,
            (),
            "engines awake (weights + KV cache) for the joint rollout of "
            + ("every role" if cfg.train.colocate == "all" else "every role, each on its own GPUs")
            + "; DeepSpeed optimizer states, gradients and fp32 master weights offloaded to CPU, bf16 weights stay",
        )
    ]
    if together or cfg.train.colocate == "role" or len(roles) == 1:
        out.append(
            Phase("training", False, roles, "engines asleep; log-prob passes and updates of the due roles at once")
        )
    else:
        for name in roles:
            out.append(Phase(f"training {name}", False, (name,), f"engines asleep; {name}'s log-prob pass and update"))
    out.append(
        Phase(
            "sync",
            False,
            (),
            "engines' weights woken (no KV cache) and updated from their actors (CUDA IPC on GPU), then generation",
        )
    )
    return out


def device_slots(cfg: Config) -> int:
    """Device slots ("GPU" resources) the job asks Ray for: the sum over :func:`placement`."""
    return sum(c.gpus for c in placement(cfg))
