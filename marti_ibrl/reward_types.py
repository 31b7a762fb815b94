"""The reward vocabulary shared by :mod:`marti_ibrl.rewards` and the environments' judges, below both.

``RewardFn`` is R_i(τ): ``fn(trajectory, role, scenario) -> float``; ``RULE`` and ``JUDGE`` name the two built-in
rewards (``--roleN.reward_fn rule|judge``); :class:`RewardUnavailable` is what a reward raises when it cannot be
computed, and :func:`score` the one place a reward is called (every failure, whatever its cause, becomes one).
Nothing here imports an environment, so an env's judges (``envs/telesales/judges.py``) and the reward plumbing
(``rewards.py``, the rollout runner) all import this module and not each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

RewardFn = Callable[[Any, str, Any], float]
RULE, JUDGE = "rule", "judge"


class RewardUnavailable(Exception):
    """No reward for this (trajectory, role); ``kind`` is a count key, the message the logged reason."""

    def __init__(self, reason: str, kind: str = "unavailable") -> None:
        super().__init__(reason)
        self.reason, self.kind = reason, kind


NON_FINITE = "non_finite"
"""The failure kind of a reward that came back NaN or ±inf."""


def score(fn: RewardFn, trajectory: Any, role: str, scenario: Any) -> float:
    """R_role(τ) = ``fn(trajectory, role, scenario)`` as a finite float, or :class:`RewardUnavailable`.

    Whatever goes wrong becomes a RewardUnavailable with its reason, so the sample leaves the role's groups
    (counted, never trained on, never a crash): the function's own RewardUnavailable as it is; any other exception
    with its type as the kind and its message as the reason (``ValueError: ...``); a value that is not a number
    (kind ``not_a_number``), or NaN/±inf (kind :data:`NON_FINITE`: one NaN reward makes its whole group's
    advantages, and then the policy's weights, NaN)."""
    try:
        value = fn(trajectory, role, scenario)
    except RewardUnavailable:
        raise
    except Exception as e:  # a user's reward function: any bug in it costs the sample, not the run
        raise RewardUnavailable(str(e) or repr(e), type(e).__name__) from e
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise RewardUnavailable(f"returned {value!r}, not a number", "not_a_number") from None
    if not math.isfinite(value):
        raise RewardUnavailable(f"returned {value}", NON_FINITE)
    return value
