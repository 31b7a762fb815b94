"""Dialogue environments. ``make_env`` builds the configured one with its training scenarios.

Which environments exist, and what each one's name means (roles, factory, rewards, checks, commands), is said once,
in the registry (:mod:`marti_ibrl.envs.registry`); the built-in ones declare their specs in their own packages
(``dond/spec.py``, ``telesales/spec.py``), ``module:Class`` names are environments of your own (:mod:`.custom`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from marti_ibrl.envs import registry
from marti_ibrl.envs.base import DialogueEnv, Outcome, TurnResult

if TYPE_CHECKING:
    from marti_ibrl.config.schema import EnvConfig

__all__ = ["DialogueEnv", "Outcome", "TurnResult", "make_env"]


def make_env(cfg: EnvConfig, seed: int) -> tuple[DialogueEnv, list[tuple[str, object]]]:
    """The environment and its training scenarios as (uid, scenario) pairs (its registry spec's factory)."""
    return registry.get(cfg.name).factory(cfg, seed)
