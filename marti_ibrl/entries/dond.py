"""Deal-or-No-Deal in the environment registry (:mod:`marti_ibrl.envs.registry`): ``dond``, the paper's two-party
game (Lewis et al. 2017 scenarios or generated ones), and ``dond3``, its three-party variant.

Both give roles the rule reward (own utility on a deal, minus the invalid penalty); both have interchangeable roles.
Only ``dond`` reads ``--env.show_complement``, takes Lewis-format data and has scripted training bots
(``--roleN.frozen bot:NAME``); its subcommands are ``marti-ibrl dond sample / check-data``
(:mod:`marti_ibrl.commands.dond`).
"""

from __future__ import annotations

from typing import Any

from marti_ibrl.envs.spec import EnvSpec


def make_dond(cfg: Any, seed: int) -> tuple[Any, list[tuple[str, Any]]]:
    """The two-party DondEnv and its scenarios: ``cfg.data`` (Lewis format) or ``cfg.num_scenarios`` generated."""
    from marti_ibrl.envs.dond.game import DondEnv
    from marti_ibrl.envs.dond.scenarios import generate_scenarios, load_lewis_file

    env = DondEnv(
        roles=DOND.roles,
        max_rounds=cfg.max_rounds,
        invalid_penalty=cfg.invalid_penalty,
        prompt_style=cfg.prompt_style,
        bot_speech=cfg.bot_speech,
        show_complement=cfg.show_complement,
    )
    scenarios = load_lewis_file(cfg.data) if cfg.data else generate_scenarios(cfg.num_scenarios, seed)
    return env, [(s.uid, s) for s in scenarios]


def make_dond3(cfg: Any, seed: int) -> tuple[Any, list[tuple[str, Any]]]:
    """The three-party env and ``cfg.num_scenarios`` generated scenarios (there is no data file format for it)."""
    from marti_ibrl.envs.dond.three_party import ThreePartyDondEnv, generate_three_party_scenarios

    if cfg.data:
        raise ValueError(
            f"--env.data is not supported for dond3 (got {cfg.data!r}): its scenarios come from the generator"
        )
    env = ThreePartyDondEnv(
        roles=DOND3.roles,
        max_rounds=cfg.max_rounds,
        invalid_penalty=cfg.invalid_penalty,
        prompt_style=cfg.prompt_style,
        bot_speech=cfg.bot_speech,
    )
    return env, [(s.uid, s) for s in generate_three_party_scenarios(cfg.num_scenarios, seed)]


def training_bots() -> Any:
    """The scripted negotiators a frozen two-party DoND seat may be (``bot:NAME``)."""
    from marti_ibrl.envs.dond.bots import TRAINING_BOTS

    return TRAINING_BOTS


def scripted_players(env: Any) -> Any:
    """The scripted negotiators as players of ``env`` (``marti-ibrl sft --env dond``)."""
    from marti_ibrl.envs.dond.bots import scripted_players as players

    return players(env)


def add_commands(subparsers: Any) -> None:
    """``marti-ibrl dond sample`` and ``dond check-data``."""
    from marti_ibrl.commands.dond import add_dond_subparsers

    add_dond_subparsers(subparsers)


def evaluate(args: Any) -> int:
    """``marti-ibrl eval --env dond`` (:mod:`marti_ibrl.eval.dond.command`)."""
    from marti_ibrl.eval.dond.command import evaluate as run

    return run(args)


def play_game(args: Any, seat: Any, name: str) -> Any:
    """A person's seat of two-party DoND (``marti-ibrl play --env dond``, :mod:`marti_ibrl.people`)."""
    from marti_ibrl.people.games import dond_game

    return dond_game(args, seat, name)


DOND = EnvSpec(
    name="dond",
    title="two-party dond",
    roles=("agent1", "agent2"),
    factory=make_dond,
    commands=add_commands,
    options=frozenset({"show_complement", "prompt_style", "bot_speech"}),
    training_bots=training_bots,
    scripted_players=scripted_players,
    evaluate=evaluate,
    play=play_game,
    interchangeable_roles=True,
)
DOND3 = EnvSpec(
    name="dond3",
    title="three-party dond3",
    roles=("agent1", "agent2", "agent3"),
    factory=make_dond3,
    options=frozenset({"prompt_style", "bot_speech"}),
    interchangeable_roles=True,
)
SPECS = (DOND, DOND3)
