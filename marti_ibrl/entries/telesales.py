"""Vehicle TeleSales in the environment registry (:mod:`marti_ibrl.envs.registry`): roles ``sales`` and
``customer``, rewarded by their role-specific LLM judges by default (paper §5.1; :mod:`marti_ibrl.envs.telesales.judges`).

The call ends at ``2 * --env.max_rounds`` turns; scenarios are customer profiles, read from ``--env.data``
(``marti-ibrl telesales profiles --split train``) or generated. ``--env.lang`` must name a prompt language. Its
subcommands are ``marti-ibrl telesales sft / profiles / eval`` (and ``sft``, its old name) (:mod:`marti_ibrl.commands.telesales`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marti_ibrl.envs.spec import EnvSpec
from marti_ibrl.reward_types import JUDGE


def make_telesales(cfg: Any, seed: int) -> tuple[Any, list[tuple[str, Any]]]:
    """The TeleSales env and its training profiles as (sample_id, profile) pairs."""
    from marti_ibrl.envs.telesales.env import TeleSalesEnv
    from marti_ibrl.envs.telesales.profiles import generate_profiles, read_jsonl

    env = TeleSalesEnv(max_turns=2 * cfg.max_rounds, invalid_penalty=cfg.invalid_penalty, lang=cfg.lang)
    profiles = read_jsonl(cfg.data, "train") if cfg.data else generate_profiles(cfg.num_scenarios, seed, "train")
    return env, [(p["sample_id"], p) for p in profiles]


def make_judges(judge_cfg: Any, env_cfg: Any, roles: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """The judges of ``roles`` in the env's prompt language, sharing one endpoint client."""
    from marti_ibrl.envs.telesales.judges import make_judges as judges

    return judges(judge_cfg, env_cfg.lang, roles)


def check(cfg: Any) -> None:
    """``--env.lang`` names a language the TeleSales prompts exist in."""
    from marti_ibrl.config.schema import ConfigError
    from marti_ibrl.envs.telesales.prompts import languages

    if cfg.env.lang not in languages():
        raise ConfigError(f"--env.lang: TeleSales prompts exist in {languages()}, not {cfg.env.lang!r}")


def add_commands(subparsers: Any) -> None:
    """``marti-ibrl telesales profiles``, ``telesales eval`` and ``sft``."""
    from marti_ibrl.commands.telesales import add_telesales_parsers

    add_telesales_parsers(subparsers)


def scripted_players(env: Any) -> dict[str, Any]:
    """The scripted sales strategies and rule-based customer as the generic warm start's players
    (:func:`marti_ibrl.envs.telesales.scripted.scripted_players`)."""
    from marti_ibrl.envs.telesales.scripted import scripted_players as players

    return players(env)


def play_game(args: Any, seat: Any, name: str) -> Any:
    """A person as the customer of a call (``marti-ibrl play --env telesales``, :mod:`marti_ibrl.people`)."""
    from marti_ibrl.people.games import telesales_game

    return telesales_game(args, seat, name)


TELESALES = EnvSpec(
    name="telesales",
    title="Vehicle TeleSales",
    roles=("sales", "customer"),
    factory=make_telesales,
    default_reward=JUDGE,
    judges=make_judges,
    check=check,
    commands=add_commands,
    scripted_players=scripted_players,
    play=play_game,
)
SPECS = (TELESALES,)
