"""The environment registry: one :class:`EnvSpec` per environment, the only place that says what ``--env.name`` means.

A spec says everything the rest of the package needs to know about an environment, so nothing else dispatches on
its name: its roles (``--roleN`` flags, role names), its factory (the env and its training scenarios), its default
reward (``rule`` or ``judge``), its LLM judges, its checks of a :class:`~marti_ibrl.config.Config`, its
``marti-ibrl`` subcommands, the env options only it reads, its scripted training bots, and whether one policy can
play any of its seats.

Built-in specs live above the environments and beside the commands they name: ``dond`` and ``dond3`` in
``marti_ibrl/entries/dond.py``, ``telesales`` in ``marti_ibrl/entries/telesales.py`` (:data:`BUILTIN`), loaded on
first use. A ``module:Class``
name, an environment of your own (:mod:`marti_ibrl.envs.custom`), and ``textarena:GAME-ID``, a TextArena two-player
game (:mod:`marti_ibrl.envs.arena`), are resolved by :func:`get` and registered the same way. Importing this module imports no environment; factories, judges and commands import theirs when called.
"""

from __future__ import annotations

import importlib

from marti_ibrl.envs.spec import EnvSpec

__all__ = ["BUILTIN", "EnvSpec", "UnknownEnvironment", "get", "names", "register", "specs"]

BUILTIN = ("marti_ibrl.entries.dond", "marti_ibrl.entries.telesales")
"""Modules declaring the built-in specs, each in a ``SPECS`` tuple, registered in this order."""


class UnknownEnvironment(ValueError):
    """``--env.name`` names no registered environment and is no ``module:Class``."""


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
    if name.startswith("textarena:"):  # TextArena's two-player games (marti_ibrl/envs/arena.py)
        from marti_ibrl.envs.arena import arena_spec

        return register(arena_spec(name), replace=True)
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
