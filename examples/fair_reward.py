"""A custom DoND reward: own utility, minus a penalty for unequal splits (fairness shaping).

Plug it into a role with ``--role1.reward_fn fair_reward:fair_share`` (run from this directory or put
it on PYTHONPATH). The signature is the one every reward function has: (trajectory, role, scenario).
"""

from __future__ import annotations

FAIRNESS_WEIGHT = 0.5


def fair_share(trajectory, role: str, scenario) -> float:
    """R_i(τ) = u_i − w·|u_i − u_other| on a deal, 0 without one (minus nothing: malformed turns score 0)."""
    utilities = trajectory.outcome.utilities
    if not trajectory.outcome.agreed:
        return 0.0
    others = [u for r, u in utilities.items() if r != role]
    return utilities[role] - FAIRNESS_WEIGHT * sum(abs(utilities[role] - u) for u in others) / len(others)
