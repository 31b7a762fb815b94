"""Per-role advantages (paper Eq. 4): Â_g^(i) = (R_i(τ_g) − μ_{i,q}) / σ_{i,q}.

Role i's group G_{i,q} holds the rollouts of scenario q *in which role i's current policy acted*
(:func:`members`); trajectories where the role was played by a historical pool checkpoint (or a frozen
counterpart) are not in its groups at all. Groups are keyed explicitly by ``(role, scenario_uid)``
(:func:`group_key`), never by position, so filtering or reordering samples cannot corrupt them.

The arithmetic lives in OpenRLHF (our patch 0005: ``grouped_reward_baseline``, used by
``RemoteExperienceMaker.compute_advantages_and_returns`` whenever experiences carry
``group_ids``), so every OpenRLHF estimator — group_norm (Eq. 4, the default), rloo,
reinforce_baseline, dr_grpo — works per role. Conventions: a zero-variance group gives advantage 0
(σ + 1e-9 in the denominator), a single-sample group gives 0 (no baseline to compare with).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from marti_ibrl.rollout.dialogue import Trajectory


def group_key(role: str, scenario_uid: str) -> str:
    """The advantage-group id of a sample of ``role`` on scenario ``scenario_uid``."""
    return f"{role}/{scenario_uid}"


def acted_with_current_policy(policies: dict[str, str], role: str) -> bool:
    """Membership rule of G_{i,q}: the role's seat was played by its *current* policy."""
    return policies.get(role) == "current"


def members(trajectories: Sequence[Trajectory], role: str, needed: Sequence[str] = ()) -> list[Trajectory]:
    """The trajectories in role i's groups G_{i,q} (Eq. 4): they belong to role i's own pairing of Eq. 6
    (``learners``, :func:`marti_ibrl.algorithm.pool.pairings`), its *current* policy acted — took the seat and
    spoke at least once (a dialogue can end before a role's first turn, e.g. the opener's malformed turn or
    a three-party deal refused early) —, no frozen counterpart failed to answer, and the rewards its training
    reward needs (``needed``, default its own) were computed: a failed reward (a judge failing after its retries, a
    reward function raising or returning NaN/inf: :func:`marti_ibrl.reward_types.score`) drops the trajectory
    (counted, never trained on as a 0), so no group's baseline ever sees a non-finite reward."""
    needed = set(needed or [role])
    return [
        t
        for t in trajectories
        if acted_with_current_policy(t.policies, role)
        and (t.learners is None or role in t.learners)  # its own Eq. 6 pairing
        and not t.failed
        and t.views[role].action_ranges
        and not needed & t.reward_failures.keys()
    ]


def penalized_attempts(group: Sequence[Trajectory], role: str, penalty: float) -> list[Trajectory]:
    """Role i's discarded malformed attempts in the trajectories of its groups (``group``: :func:`members`, so its
    *current* policy wrote them), each as the dialogue it would have been had it stood: ended malformed by role i at
    that turn, R_i = ``penalty`` (a malformed ending: no deal, 0 utility, plus ``env.invalid_penalty``), in group
    G_{i,q} of the same scenario, its action (m_i = 1) the attempt's tokens alone, after the prompt the policy saw.

    Without them, the runner's re-samples (``env.max_resamples``: the evaluation protocol's retries, §5, also used
    in training) hide a malformed turn unless every attempt fails: one malformed with probability p is penalised at
    p^(1+max_resamples) only (``--train.penalize_resamples``)."""
    from marti_ibrl.envs.base import Outcome
    from marti_ibrl.rollout.dialogue import Trajectory, Turn

    out = []
    for t in group:
        for a in t.discarded:
            if a.role != role:
                continue
            out.append(
                Trajectory(
                    scenario_uid=t.scenario_uid,
                    scenario=t.scenario,
                    seats=t.seats,
                    policies=dict(t.policies),
                    turns=[Turn(role, a.text, a.token_ids, a.logprobs, valid=False)],
                    outcome=Outcome(False, True, info={"fault_role": role, "reason": a.reason, "attempt": True}),
                    rewards={role: float(penalty)},
                    views={role: a.view(t.views[role].system_prompt)},
                    sample_index=t.sample_index,
                    learners=(role,),
                )
            )
    return out


@dataclass(frozen=True)
class GroupSpread:
    """How many of role i's groups G_{i,q} can move its policy this iteration (Eq. 4): a group is *informative* when
    it has two or more members whose training rewards differ, since a group of one or of equal rewards gives every
    member Â = 0 (group_norm, rloo and dr_grpo alike), hence no policy-gradient term in Eq. 5 (only the KL term).
    ``cause`` says why none is informative, for the console (empty when some are)."""

    informative: int
    groups: int
    cause: str = ""


def group_spread(scored: Sequence[tuple[Trajectory, float]]) -> GroupSpread:
    """:class:`GroupSpread` of one role's group members and their training rewards (:meth:`Ablation.scored
    <marti_ibrl.algorithm.ablations.Ablation.scored>`:
    R_i, or an ablation's reward) — the same ``(role, scenario_uid)`` groups the advantages are taken over."""
    by_group: dict[str, list[float]] = {}
    for t, x in scored:
        by_group.setdefault(t.scenario_uid, []).append(float(x))
    informative = sum(1 for xs in by_group.values() if len(xs) >= 2 and max(xs) != min(xs))
    cause = ""
    if scored and not informative:
        rewards = {float(x) for _, x in scored}
        if all(getattr(t.outcome, "malformed", False) for t, _ in scored):
            cause = f"all {len(scored)} of its dialogues ended malformed"
        elif len(rewards) == 1:
            cause = f"its reward was {rewards.pop():g} in all {len(scored)} of its dialogues"
        else:
            cause = "every group's rewards were equal within the group (or it had one member)"
    return GroupSpread(informative, len(by_group), cause)


def role_advantages(
    rewards: torch.Tensor, scenario_uids: Sequence[str], role: str, estimator: str = "group_norm"
) -> torch.Tensor:
    """Per-trajectory advantages (N,) of one role from its rewards (N,) and each sample's scenario.

    The trainer does not call it: OpenRLHF's experience maker computes the same thing there
    (``grouped_reward_baseline`` over the same :func:`group_key` ids, patch 0005). This is that computation on its
    own, for tests, diagnostics and custom pipelines.
    """
    from openrlhf.trainer.ppo_utils.experience_maker import grouped_reward_baseline

    ids = [group_key(role, uid) for uid in scenario_uids]
    shaped, _ = grouped_reward_baseline(rewards.float(), ids, estimator)
    return shaped
