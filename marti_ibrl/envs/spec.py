"""What one environment is, for everything outside it: :class:`EnvSpec`, the record :mod:`marti_ibrl.envs.registry`
holds per ``--env.name``. Its own module so that an environment's spec (built-in or ``module:Class``,
:mod:`marti_ibrl.envs.custom`) can be declared without importing the registry that loads it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marti_ibrl.reward_types import JUDGE, RULE

if TYPE_CHECKING:
    from marti_ibrl.config.schema import Config, EnvConfig, JudgeConfig

Factory = Callable[["EnvConfig", int], tuple[Any, list[tuple[str, Any]]]]
"""``factory(env_cfg, seed) -> (env, [(uid, scenario), ...])``: the env and its training scenarios."""
Judges = Callable[["JudgeConfig", "EnvConfig", Sequence[str]], tuple[Any, dict[str, Any]]]
"""``judges(judge_cfg, env_cfg, roles) -> (client, {role: judge})``: the endpoint client (``close()``,
``stats_snapshot()``) and each role's judge (``reward_fn(rule_reward)``, ``stats``)."""


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
    scripted_players: Callable[[Any], dict[str, Any]] | None = None
    """``scripted_players(env) -> {name: player}``: the env's scripted players when its class has no
    ``scripted_players()`` method (DoND: its negotiators); what ``marti-ibrl sft --env`` learns from."""
    evaluate: Callable[[Any], int] | None = None
    """``evaluate(args) -> exit status``: ``marti-ibrl eval --env NAME`` on its parsed arguments (policies vs
    counterparts, the protocol from ``--run``); None: ``marti-ibrl eval`` does not evaluate it."""
    play: Callable[[Any, Callable[[], Any], str], Any] | None = None
    """``play(args, seat, name)``: the game a person plays against a policy in ``marti-ibrl play --env NAME``
    (:mod:`marti_ibrl.people`), from ``play``'s arguments, the policy's seat (loaded on call) and its name; None: not
    playable by a person."""
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
