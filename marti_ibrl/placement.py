"""Where a job's processes go: the devices each component of each role asks Ray for. No torch, no Ray.

:func:`placement` is the one list of them: ``train`` sizes its Ray start-up with it (:func:`device_slots`, used by
``backend/openrlhf_glue.py``) and ``marti-ibrl plan`` prints it, so the two cannot disagree. Per trained role, in
the order :meth:`RoleStack.start <marti_ibrl.backend.openrlhf_glue.RoleStack.start>` creates them:

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
``roleN.tensor_parallel_size`` GPUs. Apart from a colocated reference, every component has GPUs of its own (no vLLM
sleep / hybrid engine). ``cfg`` is a run's effective config: :func:`~marti_ibrl.config.load_config` has applied
its ``--ablation`` (``no_stabilization`` turns the pools off).
"""

from __future__ import annotations

from dataclasses import dataclass

from marti_ibrl.config import Config, RoleConfig

ENGINES, POOL_ENGINES, ACTOR, REFERENCE = "engines", "pool engines", "actor", "reference"
FROZEN_ENGINES = "frozen engines"


@dataclass(frozen=True)
class Component:
    """One group of Ray actors of one role: ``count`` processes of ``gpus_each`` GPUs, all loading ``model``."""

    role: str
    kind: str
    model: str
    count: int
    gpus_each: int

    @property
    def gpus(self) -> int:
        return self.count * self.gpus_each


def trained_roles(cfg: Config) -> list[RoleConfig]:
    return [r for r in cfg.roles if not r.frozen]


def uses_pool(cfg: Config) -> bool:
    """Opponent pools need two trained roles and some probability of facing history (Eq. 6)."""
    return len(trained_roles(cfg)) >= 2 and cfg.pool.probs[0] < 1.0


def has_reference(role: RoleConfig) -> bool:
    """The role keeps a reference model (its initial checkpoint) only when its KL term is on, and only for full
    weights: a LoRA role's reference is its own actor with the adapter off (marti_ibrl/lora.py)."""
    return role.kl_coef > 0 and role.lora_rank == 0


def pool_engine_count(cfg: Config, role: RoleConfig) -> int:
    """Pool engines of a trained role (Eq. 6): none without pools or for a LoRA role (its snapshots are adapters its
    current engines serve per request), else ``pool.num_engines`` (1 when unset)."""
    if not uses_pool(cfg) or role.lora_rank > 0:
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
    for role in cfg.roles:
        tp = role.tensor_parallel_size
        if role.frozen:
            out += [Component(role.name, FROZEN_ENGINES, p, role.num_engines, tp) for p in frozen_checkpoints(role)]
            continue
        if not shares_engines(cfg, role):
            out.append(Component(role.name, ENGINES, role.pretrain, role.num_engines, tp))
        if pool_engine_count(cfg, role):
            out.append(Component(role.name, POOL_ENGINES, role.pretrain, pool_engine_count(cfg, role), tp))
        ranks = role.num_nodes * role.num_gpus_per_node
        out.append(Component(role.name, ACTOR, role.pretrain, ranks, 1))
        if has_reference(role):  # colocated: on the actor's GPUs, none of its own
            out.append(Component(role.name, REFERENCE, role.pretrain, ranks, 0 if role.colocate_ref else 1))
    return out


def device_slots(cfg: Config) -> int:
    """Device slots ("GPU" resources) the job asks Ray for: the sum over :func:`placement`."""
    return sum(c.gpus for c in placement(cfg))
