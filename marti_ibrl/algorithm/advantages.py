"""Per-role advantages (paper Eq. 4): Â_g^(i) = (R_i(τ_g) − μ_{i,q}) / σ_{i,q}.

Role i's group G_{i,q} holds the rollouts of scenario q *in which role i's current policy acted*;
trajectories where the role was played by a historical pool checkpoint (or a frozen counterpart)
are not in its groups at all. Groups are keyed explicitly by ``(role, scenario_uid)``, never by
position, so filtering or reordering samples cannot corrupt them.

The arithmetic lives in OpenRLHF (our patch 0005: ``grouped_reward_baseline``, used by
``RemoteExperienceMaker.compute_advantages_and_returns`` whenever experiences carry
``group_ids``), so every OpenRLHF estimator — group_norm (Eq. 4, the default), rloo,
reinforce_baseline, dr_grpo — works per role. Conventions: a zero-variance group gives advantage 0
(σ + 1e-9 in the denominator), a single-sample group gives 0 (no baseline to compare with).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_key(role: str, scenario_uid: str) -> str:
    """The advantage-group id of a sample of ``role`` on scenario ``scenario_uid``."""
    return f"{role}/{scenario_uid}"


def acted_with_current_policy(policies: dict[str, str], role: str) -> bool:
    """Membership rule of G_{i,q}: the role's seat was played by its *current* policy."""
    return policies.get(role) == "current"


def role_advantages(
    rewards: torch.Tensor, scenario_uids: Sequence[str], role: str, estimator: str = "group_norm"
) -> torch.Tensor:
    """Per-trajectory advantages (N,) of one role from its rewards (N,) and each sample's scenario.

    This is the exact function the trainer uses (through OpenRLHF's experience maker); exposed for
    tests, diagnostics and custom pipelines.
    """
    from openrlhf.trainer.ppo_utils.experience_maker import grouped_reward_baseline

    ids = [group_key(role, uid) for uid in scenario_uids]
    shaped, _ = grouped_reward_baseline(rewards.float(), ids, estimator)
    return shaped
