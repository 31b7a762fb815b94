"""SFT data: an environment's scripted players' dialogues as one chat record per role (``{"messages": [...]}``),
JSONL (:func:`scripted_records`, any environment with ``scripted_players()``; DoND's bots: :func:`sft_records`).

Each record is the role's side of the dialogue exactly as the RL rollout renders it
(:func:`marti_ibrl.envs.base.role_messages`); see :mod:`marti_ibrl.sft` for why records end with the role's own
last turn."""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.envs.base import role_messages
from marti_ibrl.envs.dond import DondEnv, DondScenario
from marti_ibrl.envs.dond.bots import scripted_players as negotiators
from marti_ibrl.envs.dond.protocol import parse_utterance

Record = dict[str, Any]

RENDERING_KEYS = ("prompt_style", "max_rounds", "bot_speech", "show_complement")
"""The DoND environment settings (``EnvConfig`` fields) an SFT record's text depends on: a warm start made under other
values was trained on text the RL rollout never shows (the demo's and mini Table 2's SFT records compare them)."""


def rendering(env_cfg: Any) -> dict[str, Any]:
    """``env_cfg``'s :data:`RENDERING_KEYS` as a dict (``env_cfg``: an ``EnvConfig`` or a mapping)."""
    get = env_cfg.__getitem__ if isinstance(env_cfg, dict) else lambda k: getattr(env_cfg, k)
    return {k: get(k) for k in RENDERING_KEYS}


Player = Callable[[Any, str, Sequence[tuple[str, str]], random.Random], str]
"""A scripted player of an environment (``env.scripted_players()``, docs/environments.md): ``player(scenario, role,
history, rng) -> text``, the next turn of ``role`` given the dialogue so far (``[(role, text), ...]``); it must only
make turns the environment accepts."""


def scripted_dialogue(
    env: Any,
    scenario: Any,
    players: Mapping[str, Player],
    seats: Sequence[str],
    rng: random.Random,
    max_turns: int = 200,
) -> list[tuple]:
    """One dialogue of ``players`` (one per role) through the environment; its ``[(role, text), ...]`` (``(role, text,
    shown)`` where the env says what each role is shown: ``TurnResult.shown``). A turn the environment refuses, or
    no end within ``max_turns``, is a ``RuntimeError`` naming the player's role."""
    state = env.new_state(scenario, tuple(seats))
    history: list[tuple] = []
    for _ in range(max_turns):
        role = env.current_role(state)
        text = players[role](scenario, role, history, rng)
        result = env.step(state, role, text)
        if not result.valid:
            raise RuntimeError(f"the scripted {role} made a turn the environment refuses ({result.reason}): {text!r}")
        history.append((role, text) if result.shown is None else (role, text, result.shown))
        if result.done:
            return history
    raise RuntimeError(f"a scripted dialogue did not end within {max_turns} turns")


def scripted_records(
    env: Any,
    scenarios: Iterable[Any],
    players: Mapping[str, Player],
    seed: int,
    cut: Callable[[list[tuple]], tuple[str, int] | None] | None = None,
) -> list[Record]:
    """SFT records from the scripted players' dialogues, one per scenario, one record per role that spoke.

    Dialogue ``i`` is played by the combination ``i mod n`` of ``players`` over the roles (every ordered choice,
    self-play included; ``n = len(players) ** len(roles)``); the speaking order is ``env.fixed_seats`` when the
    environment has one, else the opener rotates from one dialogue to the next and shifts every full cycle of
    combinations, so each combination plays every seating. ``cut(history) -> (role, k)``: ``role``'s record of that
    dialogue shows only its first ``k`` turns (None: all). Deterministic in ``seed``.
    """
    if not players:
        raise ValueError("scripted_records needs at least one scripted player")
    roles = tuple(env.roles)
    combos = list(itertools.product(list(players), repeat=len(roles)))
    fixed = getattr(env, "fixed_seats", None)
    rng = random.Random(seed)
    records: list[Record] = []
    for i, scenario in enumerate(scenarios):
        shift = (i + i // len(combos)) % len(roles)
        seats = tuple(fixed) if fixed else roles[shift:] + roles[:shift]
        by_role = {role: players[name] for role, name in zip(roles, combos[i % len(combos)], strict=True)}
        history = scripted_dialogue(env, scenario, by_role, seats, random.Random(rng.randrange(2**31)))
        short = cut(history) if cut is not None else None
        for role in roles:
            shown = history[: short[1]] if short is not None and short[0] == role else history
            messages = role_messages(env, scenario, shown, role)
            if len(messages) > 1:
                records.append({"messages": messages})
    return records


def sft_records(
    env: DondEnv, scenarios: Iterable[DondScenario], bots: list[str], seed: int, accept_share: float = 1.0
) -> list[Record]:
    """DoND's SFT records: :func:`scripted_records` of the scripted negotiators named ``bots`` (in that order; every
    ordered pair plays both seatings). Deterministic in ``seed``.

    ``accept_share`` < 1: only that share of the dialogues (drawn from their own stream, so the dialogues played are
    those of 1.0) teaches the acceptance: in the others, the record of the role whose ``<selection>`` answered a
    ``<try>`` ends at its turn before (or is dropped if it had none); the counterpart's record, its confirmation
    included, is kept. The bots close ~85% of their dialogues: a model that imitates them well closes nearly every
    deal in self-play, and IB-RL from it has no agreement left to learn; one taught the protocol, the offers and the
    confirmations but few acceptances starts low, as the demo's warm start does (docs/measured.md).
    """
    if not bots:
        raise ValueError("sft_records needs at least one bot name")
    if not 0.0 <= accept_share <= 1.0:
        raise ValueError(f"accept_share must be in [0, 1], got {accept_share}")
    known = negotiators(env)
    unknown = [b for b in bots if b not in known]
    if unknown:
        raise ValueError(f"unknown bot {unknown[0]!r}; known: {sorted(known)}")
    keep = random.Random(f"{seed}/accept")

    def cut(history: list[tuple[str, str]]) -> tuple[str, int] | None:
        if accept_share >= 1.0 or keep.random() < accept_share:
            return None
        k = _acceptance(history)
        return None if k is None else (history[k][0], k)

    return scripted_records(env, scenarios, {b: known[b] for b in bots}, seed, cut)


def _acceptance(history: list[tuple[str, str]]) -> int | None:
    """Index of the first turn that answers a ``<try>`` with a ``<selection>`` (the acceptance), else None."""
    last = None
    for k, (_, text) in enumerate(history):
        kind = parse_utterance(text).kind
        if kind == "selection" and last == "try":
            return k
        last = kind
    return None


def write_sft_data(path: str | os.PathLike[str], records: Iterable[Record]) -> str:
    """Write ``records`` as JSON lines; returns the path as str."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return str(out)
