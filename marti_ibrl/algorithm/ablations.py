"""The component ablations of Table 3, one flag each (``--ablation NAME``).

* ``shared_reward``: no reward isolation. Both roles optimise one common reward, the **sum of every
  role's reward** R(τ) = Σ_j R_j(τ); groups, masks and optimizers stay per role.
* ``joint_norm``: per-role rewards, but the advantage of Eq. 4 is normalised over the *joint* pool of
  all trained roles' rewards per scenario, Â = (R_i(τ) − μ_q) / σ_q with μ_q, σ_q over every
  (role, trajectory) pair of scenario q, instead of over role i's own group.
* ``no_stabilization``: no opponent pool (p_both = 1) and every role updates every iteration (§4.2 off).

Everything else is the full IB-RL iteration; the trainer asks this module for the two hooks.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from marti_ibrl.config import Config
from marti_ibrl.rollout.dialogue import Trajectory


def resolve(cfg: Config) -> tuple[Config, list[str]]:
    """The effective config of an ablation and a line per value it changed (printed and logged by the trainer)."""
    if cfg.ablation != "no_stabilization":
        return cfg, []
    cfg = copy.deepcopy(cfg)
    changes = []
    if cfg.pool.probs[0] != 1.0:
        changes.append(f"pool.probs {list(cfg.pool.probs)} -> [1.0, 0, ...] (no opponent pool)")
        cfg.pool.probs = [1.0] + [0.0] * (len(cfg.pool.probs) - 1)
    for i, role in enumerate(cfg.roles, start=1):
        if role.update_every != 1:
            changes.append(f"role{i}.update_every {role.update_every} -> 1 (no staggered updates)")
            role.update_every = 1
    return cfg, changes


def rewards_needed(ablation: str, role: str, roles: Sequence[str]) -> list[str]:
    """The roles whose rewards R_j(τ) role ``role``'s training reward is made of (a trajectory missing one of them,
    e.g. after a judge failure, cannot be in the role's group)."""
    return list(roles) if ablation == "shared_reward" else [role]


def training_reward(ablation: str, trajectory: Trajectory, role: str) -> float:
    """The reward role ``role`` optimises on ``trajectory``: R_i(τ), or Σ_j R_j(τ) under ``shared_reward``."""
    if ablation == "shared_reward":
        return float(sum(trajectory.rewards.values()))
    return float(trajectory.rewards[role])


def joint_normalized_advantages(
    samples: Sequence[tuple[str, str, float]],
) -> list[float]:
    """``joint_norm``: (R − μ_q) / σ_q over every (role, scenario_uid, reward) sample of the same scenario.

    The same arithmetic as Eq. 4 (OpenRLHF's ``grouped_reward_baseline``, group_norm), with the group
    keyed by scenario only, so both roles' rewards share one baseline and one scale.
    """
    import torch  # here, not at the top: resolve() is used by torch-free code (marti_ibrl.placement)
    from openrlhf.trainer.ppo_utils.experience_maker import grouped_reward_baseline

    rewards = torch.tensor([r for _, _, r in samples], dtype=torch.float64)
    shaped, _ = grouped_reward_baseline(rewards, [uid for _, uid, _ in samples], "group_norm")
    return shaped.tolist()
