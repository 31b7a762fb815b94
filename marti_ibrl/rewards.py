"""Per-role rewards R_i(τ) (paper §3.1, §5.1): the env's rule reward, or a user function.

A custom reward function is given as ``--roleN.reward_fn my_module:my_fn`` and has the signature::

    def my_fn(trajectory: marti_ibrl.rollout.dialogue.Trajectory, role: str, scenario) -> float

``trajectory`` holds the finished dialogue (``turns``, ``seats``, ``outcome`` with per-role
``utilities``, the env ``state``); ``role`` is the role being scored; ``scenario`` the env scenario.
Each role's reward is computed independently; rewards are not assumed zero-sum or aligned.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

RewardFn = Callable[[Any, str, Any], float]


def load_reward_fn(spec: str) -> RewardFn:
    """Import ``module:function`` and check it takes (trajectory, role, scenario)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ImportError(f"expected module:function, got {spec!r}")
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise TypeError(f"{spec} is not callable")
    try:
        inspect.signature(fn).bind(None, "role", None)
    except TypeError as e:
        raise TypeError(f"{spec} must accept (trajectory, role, scenario): {e}") from None
    return fn


def env_reward(env) -> RewardFn:
    """The environment's rule reward (DoND: own utility on a deal, 0 otherwise, minus invalid penalty)."""

    def reward(trajectory, role: str, scenario) -> float:
        return float(env.reward(trajectory.state, role))

    return reward
