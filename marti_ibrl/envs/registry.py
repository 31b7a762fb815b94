"""The environment registry: one :class:`EnvSpec` per environment, the only place that says what ``--env.name`` means.

A spec says everything the rest of the package needs to know about an environment, so nothing else dispatches on
its name: its roles (``--roleN`` flags, role names), its factory (the env and its training scenarios), its default
reward (``rule`` or ``judge``), its LLM judges, its checks of a :class:`~marti_ibrl.config.Config`, its
``marti-ibrl`` subcommands, the env options only it reads, its scripted training bots, and whether one policy can
play any of its seats.

Built-in specs live with their environment: ``dond`` and ``dond3`` in ``marti_ibrl/envs/dond/spec.py``,
``telesales`` in ``marti_ibrl/envs/telesales/spec.py`` (:data:`BUILTIN`), loaded on first use. A ``module:Class``
name, an environment of your own (:mod:`marti_ibrl.envs.custom`), is resolved by :func:`get` and registered the same
way. Importing this module imports no environment; factories, judges and commands import theirs when called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marti_ibrl.reward_types import JUDGE, RULE

if TYPE_CHECKING:
    from marti_ibrl.config import Config, EnvConfig, JudgeConfig

BUILTIN = ("marti_ibrl.envs.dond.spec", "marti_ibrl.envs.telesales.spec")
"""Modules declaring the built-in specs, each in a ``SPECS`` tuple, registered in this order."""

Factory = Callable[["EnvConfig", int], tuple[Any, list[tuple[str, Any]]]]
"""``factory(env_cfg, seed) -> (env, [(uid, scenario), ...])``: the env and its training scenarios."""
Judges = Callable[["JudgeConfig", "EnvConfig", Sequence[str]], tuple[Any, dict[str, Any]]]
"""``judges(judge_cfg, env_cfg, roles) -> (client, {role: judge})``: the endpoint client (``close()``,
``stats_snapshot()``) and each role's judge (``reward_fn(rule_reward)``, ``stats``)."""


class UnknownEnvironment(ValueError):
    """``--env.name`` names no registered environment and is no ``module:Class``."""


@dataclass(frozen=True)
class EnvSpec:
    """What one environment is, for everything outside it."""

    name: str
    """``--env.name``."""
    roles: tuple[str, ...]
    """Role names, in ``--roleN`` order; known before anything is built."""
    factory: Factory
    """The env and its training scenarios from an :class:`~marti_ibrl.config.EnvConfig` and a seed."""
    title: str = ""
    """How error messages name it (default: ``name``), e.g. ``two-party dond``."""
    default_reward: str = RULE
    """A trained role's reward when ``reward_fn`` is unset: ``rule`` (the env's rule reward) or ``judge``."""
    judges: Judges | None = None
    """The env's role-specific LLM judges (``reward_fn: judge``); None: it has none."""
    check: Callable[[Config], None] | None = None
    """Checks of the env-specific parts of a Config; raises :class:`~marti_ibrl.config.ConfigError` naming the flag."""
    commands: Callable[[Any], None] | None = None
    """Adds the env's ``marti-ibrl`` subcommands to an argparse ``subparsers`` (:mod:`marti_ibrl.commands`)."""
    options: frozenset[str] = field(default_factory=frozenset)
    """``EnvConfig`` fields only some environments read (``show_complement``); set for any other env, refused."""
    training_bots: Callable[[], Collection[str]] | None = None
    """Names of the scripted bots ``--roleN.frozen bot:NAME`` may name; None: the env has no bots."""
    interchangeable_roles: bool = False
    """Every role plays the same game from its own side, so one policy can take any seat (seat-averaged evaluation:
    ``marti-ibrl diagnose``)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("EnvSpec: name must be non-empty")
        roles = tuple(self.roles)
        if len(roles) < 2 or not all(isinstance(r, str) and r for r in roles) or len(set(roles)) != len(roles):
            raise ValueError(f"EnvSpec {self.name}: roles must be at least two distinct names, got {list(roles)}")
        object.__setattr__(self, "roles", roles)
        object.__setattr__(self, "title", self.title or self.name)
        if self.default_reward not in (RULE, JUDGE):
            raise ValueError(
                f"EnvSpec {self.name}: default_reward must be {RULE} or {JUDGE}, not {self.default_reward!r}"
            )
        if self.default_reward == JUDGE and self.judges is None:
            raise ValueError(f"EnvSpec {self.name}: default_reward {JUDGE} needs judges")


_SPECS: dict[str, EnvSpec] = {}
_LOADED: list[bool] = []  # non-empty once the built-in specs are registered


def _load_builtins() -> None:
    if _LOADED:
        return
    specs = [spec for module in BUILTIN for spec in importlib.import_module(module).SPECS]
    _LOADED.append(True)
    for spec in specs:
        register(spec)


def register(spec: EnvSpec, replace: bool = False) -> EnvSpec:
    """Add ``spec`` under its name and return it; a name already taken is refused unless ``replace``."""
    _load_builtins()
    if not replace and spec.name in _SPECS:
        raise ValueError(f"environment {spec.name!r} is already registered")
    _SPECS[spec.name] = spec
    return spec


def get(name: str) -> EnvSpec:
    """The spec of ``name``. ``module:Class`` is imported and checked (:func:`marti_ibrl.envs.custom.custom_spec`:
    ``ImportError``/``AttributeError``/``TypeError`` when it does not load) and registered, again on every call, so a
    reloaded module is seen; any other unregistered name raises :class:`UnknownEnvironment` listing the known ones."""
    _load_builtins()
    if ":" in name:
        from marti_ibrl.envs.custom import custom_spec

        return register(custom_spec(name), replace=True)
    if name not in _SPECS:
        raise UnknownEnvironment(
            f"unknown environment {name!r} (known: {', '.join(names())}, or module:Class of your own)"
        )
    return _SPECS[name]


def names() -> list[str]:
    """Registered environment names: the built-ins, then any registered since (``module:Class`` ones once resolved)."""
    _load_builtins()
    return list(_SPECS)


def specs() -> list[EnvSpec]:
    """Every registered spec, in :func:`names` order."""
    _load_builtins()
    return list(_SPECS.values())
