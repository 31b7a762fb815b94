"""Decoupled role-update scheduling (paper §4.2): u_i(k) ∈ {0, 1} gates role i's update at iteration k.

A role with ``update_every = n`` updates on iterations k = n, 2n, 3n, ... (k counts from 1, Alg. 1).
The paper's default for its two roles: the agent updates every iteration, the user every second one.
A role that is not due neither steps its optimizer nor re-syncs its rollout engines.
"""

from __future__ import annotations

from collections.abc import Mapping


def is_due(iteration: int, update_every: int) -> bool:
    """u_i(k): whether a role with period ``update_every`` updates at (1-based) ``iteration``."""
    if iteration < 1 or update_every < 1:
        raise ValueError(f"iteration ({iteration}) and update_every ({update_every}) must be >= 1")
    return iteration % update_every == 0


def roles_due(iteration: int, update_every: Mapping[str, int]) -> list[str]:
    """The roles that update at ``iteration``, in the mapping's order."""
    return [role for role, every in update_every.items() if is_due(iteration, every)]


def num_updates(iterations: int, update_every: int) -> int:
    """How many times a role updates in ``iterations`` iterations (sizes its LR scheduler)."""
    if iterations < 0 or update_every < 1:
        raise ValueError(f"iterations ({iterations}) must be >= 0 and update_every ({update_every}) >= 1")
    return iterations // update_every
