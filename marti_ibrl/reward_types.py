"""The reward vocabulary shared by :mod:`marti_ibrl.rewards` and the environments' judges, below both.

``RewardFn`` is R_i(τ): ``fn(trajectory, role, scenario) -> float``; ``RULE`` and ``JUDGE`` name the two built-in
rewards (``--roleN.reward_fn rule|judge``); :class:`RewardUnavailable` is what a reward raises when it cannot be
computed. Nothing here imports an environment, so an env's judges (``envs/telesales/judges.py``) and the reward
plumbing (``rewards.py``) both import this module and not each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RewardFn = Callable[[Any, str, Any], float]
RULE, JUDGE = "rule", "judge"


class RewardUnavailable(Exception):
    """No reward for this (trajectory, role); ``kind`` is a count key, the message the logged reason."""

    def __init__(self, reason: str, kind: str = "unavailable") -> None:
        super().__init__(reason)
        self.reason, self.kind = reason, kind
