"""Environments of your own: ``--env.name my_module:MyEnv``.

``MyEnv`` is a class implementing :class:`marti_ibrl.envs.base.DialogueEnv` (``roles``, ``system_prompt``,
``new_state``, ``current_role``, ``step``, ``finish_malformed``, ``abort``, ``outcome``, ``reward``; optionally
``counterpart_text(speaker, text, scenario)`` and ``fixed_seats``) plus two hooks the trainer calls::

    roles = ("buyer", "seller")                           # class attribute: read before anything is built

    def __init__(self, cfg: marti_ibrl.config.EnvConfig)  # max_rounds, invalid_penalty, data, ... as you need

    def training_scenarios(self, seed: int) -> list[tuple[str, object]]
        # (uid, scenario) pairs; uid names the scenario's GRPO groups (Eq. 4)

The module must be importable (on ``PYTHONPATH``). ``examples/price_negotiation.py`` is a complete one in under
150 lines. Everything else (rollouts, masks, per-role groups, pools, schedule, checkpoints) is the same trainer.
:func:`custom_spec` makes the class an :class:`~marti_ibrl.envs.registry.EnvSpec` (its ``roles``,
:func:`make_custom_env`, the ``rule`` reward), which :func:`marti_ibrl.envs.registry.get` registers like the
built-in environments.
"""

from __future__ import annotations

import importlib
from typing import Any

from marti_ibrl.envs.spec import EnvSpec

REQUIRED = ("system_prompt", "new_state", "current_role", "step", "finish_malformed", "abort", "outcome", "reward")


def load_env_class(spec: str) -> type:
    """Import ``module:Class`` and check it has ``roles`` and the methods the runner and trainer call."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ImportError(f"expected module:Class, got {spec!r}")
    cls = getattr(importlib.import_module(module_name), attr)
    roles = getattr(cls, "roles", None)
    if not isinstance(roles, (tuple, list)) or len(roles) < 2 or not all(isinstance(r, str) for r in roles):
        raise TypeError(f"{spec}: needs a class attribute `roles`, a tuple of at least two role names")
    missing = [m for m in (*REQUIRED, "training_scenarios") if not callable(getattr(cls, m, None))]
    if missing:
        raise TypeError(f"{spec}: missing methods {', '.join(missing)} (see marti_ibrl/envs/custom.py)")
    return cls


def custom_spec(name: str) -> EnvSpec:
    """The registry's spec of ``module:Class``: its roles, :func:`make_custom_env`, rule rewards, no judges."""
    return EnvSpec(name=name, roles=tuple(load_env_class(name).roles), factory=make_custom_env)


def make_custom_env(cfg: Any, seed: int) -> tuple[Any, list[tuple[str, Any]]]:
    """The environment ``cfg.name`` built from the env config, and its training scenarios for ``seed``."""
    env = load_env_class(cfg.name)(cfg)
    scenarios = list(env.training_scenarios(seed))
    if not scenarios:
        raise ValueError(f"{cfg.name}: training_scenarios({seed}) returned no scenarios")
    return env, scenarios
