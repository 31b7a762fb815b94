"""The component ablations of Table 3, one flag each (``--ablation NAME``), as a registry: :data:`ABLATIONS`.

* ``none``: the full IB-RL iteration.
* ``shared_reward``: no reward isolation. Both roles optimise one common reward, the **sum of every
  role's reward** R(τ) = Σ_j R_j(τ); groups, masks and optimizers stay per role.
* ``joint_norm``: per-role rewards, but the advantage of Eq. 4 is normalised over the *joint* pool of
  all trained roles' rewards per scenario, Â = (R_i(τ) − μ_q) / σ_q with μ_q, σ_q over every
  (role, trajectory) pair of scenario q, instead of over role i's own group.
* ``no_stabilization``: no opponent pool (p_both = 1) and every role updates every iteration (§4.2 off).

An :class:`Ablation` is three switches; everything else is the full IB-RL iteration. Its config changes are
applied once, where a run's config is made (:func:`marti_ibrl.config.load_config`, through :func:`resolve`), so
the trainer, ``plan`` and :func:`marti_ibrl.cluster.placement.placement` all see the effective config. The trainer asks the
run's ablation (:func:`get`) for the reward each role optimises and whether advantages are joint.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from marti_ibrl.config.schema import Config
    from marti_ibrl.rollout.dialogue import Trajectory


@dataclass(frozen=True)
class Ablation:
    """One row of Table 3: which of IB-RL's components are switched off."""

    name: str
    shared_reward: bool = False
    """R(τ) = Σ_j R_j(τ) for every role instead of its own R_i(τ)."""
    joint_baseline: bool = False
    """Eq. 4's μ, σ over every trained role's rewards of scenario q instead of role i's group G_{i,q}."""
    stabilization: bool = True
    """§4.2: opponent pools (Eq. 6) and staggered updates; off, p_both = 1 and u_i(k) = 1 for every role."""

    def resolve(self, cfg: Config) -> tuple[Config, list[str]]:
        """The effective config of a run under this ablation and a line per value it changed. The input is never
        modified; without changes it is returned as is."""
        if self.stabilization:
            return cfg, []
        out, changes = copy.deepcopy(cfg), []
        if out.pool.probs[0] != 1.0:
            changes.append(f"pool.probs {list(out.pool.probs)} -> [1.0, 0, ...] (no opponent pool)")
            out.pool.probs = [1.0] + [0.0] * (len(out.pool.probs) - 1)
        for i, role in enumerate(out.roles, start=1):
            if role.update_every != 1:
                changes.append(f"role{i}.update_every {role.update_every} -> 1 (no staggered updates)")
                role.update_every = 1
        return (out, changes) if changes else (cfg, [])

    def rewards_needed(self, role: str, roles: Sequence[str]) -> list[str]:
        """The roles whose rewards R_j(τ) role ``role``'s training reward is made of (a trajectory missing one of
        them, e.g. after a judge failure, cannot be in the role's group)."""
        return list(roles) if self.shared_reward else [role]

    def training_reward(self, trajectory: Trajectory, role: str) -> float:
        """The reward role ``role`` optimises on ``trajectory``: R_i(τ), or Σ_j R_j(τ) under ``shared_reward``."""
        if self.shared_reward:
            return float(sum(trajectory.rewards.values()))
        return float(trajectory.rewards[role])

    def scored(
        self, trajectories: Sequence[Trajectory], trained: Sequence[str], roles: Sequence[str], penalty: float | None
    ) -> dict[str, list[tuple[Trajectory, float]]]:
        """Per trained role, its group members (Eq. 4, :func:`~marti_ibrl.algorithm.advantages.members`) and, with
        a ``penalty`` (``--train.penalize_resamples``: ``--env.invalid_penalty``), its penalised discarded attempts
        (:func:`~marti_ibrl.algorithm.advantages.penalized_attempts`), each with the reward it optimises
        (:meth:`training_reward`); under ``joint_baseline``, with its advantage normalised over every role's."""
        from marti_ibrl.algorithm.advantages import members, penalized_attempts

        scored = {}
        for r in trained:
            group = members(trajectories, r, self.rewards_needed(r, roles))
            if penalty is not None:  # its discarded malformed attempts, each a sample of its own
                group += penalized_attempts(group, r, penalty)
            scored[r] = [(t, self.training_reward(t, r)) for t in group]
        if self.joint_baseline:
            flat = [(r, t.scenario_uid, x) for r in trained for t, x in scored[r]]
            shaped = iter(joint_normalized_advantages(flat))
            scored = {r: [(t, next(shaped)) for t, _ in scored[r]] for r in trained}
        return scored


ABLATIONS: dict[str, Ablation] = {
    a.name: a
    for a in (
        Ablation("none"),
        Ablation("shared_reward", shared_reward=True),
        Ablation("joint_norm", joint_baseline=True),
        Ablation("no_stabilization", stabilization=False),
    )
}
"""Every ``--ablation``, by name (``none`` is the full method)."""


def get(name: str) -> Ablation:
    """The ablation called ``name``; a ValueError naming the known ones otherwise."""
    try:
        return ABLATIONS[name]
    except KeyError:
        raise ValueError(f"unknown ablation {name!r}: must be one of {tuple(ABLATIONS)}") from None


def resolve(cfg: Config) -> tuple[Config, list[str]]:
    """The effective config of ``cfg``'s ablation and a line per value it changed (:meth:`Ablation.resolve`)."""
    return get(cfg.ablation).resolve(cfg)


def joint_normalized_advantages(
    samples: Sequence[tuple[str, str, float]],
) -> list[float]:
    """``joint_norm``: (R − μ_q) / σ_q over every (role, scenario_uid, reward) sample of the same scenario.

    The same arithmetic as Eq. 4 (OpenRLHF's ``grouped_reward_baseline``, group_norm), with the group
    keyed by scenario only, so both roles' rewards share one baseline and one scale.
    """
    import torch  # here, not at the top: the registry is used by torch-free code (config, plan, placement)
    from openrlhf.trainer.ppo_utils.experience_maker import grouped_reward_baseline

    rewards = torch.tensor([r for _, _, r in samples], dtype=torch.float64)
    shaped, _ = grouped_reward_baseline(rewards, [uid for _, uid, _ in samples], "group_norm")
    return shaped.tolist()
