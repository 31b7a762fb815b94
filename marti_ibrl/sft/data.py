"""SFT data: scripted bot-vs-bot DoND dialogues as one chat record per role (``{"messages": [...]}``), JSONL.

Each record is the role's side of the dialogue exactly as the RL rollout renders it
(:func:`marti_ibrl.envs.base.role_messages`); see :mod:`marti_ibrl.sft` for why records end with the role's own
last turn."""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from marti_ibrl.envs.base import role_messages
from marti_ibrl.envs.dond import DondEnv, DondScenario, make_bot, play_dialogue
from marti_ibrl.envs.dond.protocol import parse_utterance

Record = dict[str, Any]

RENDERING_KEYS = ("prompt_style", "max_rounds", "bot_speech", "show_complement")
"""The DoND environment settings (``EnvConfig`` fields) an SFT record's text depends on: a warm start made under other
values was trained on text the RL rollout never shows (the demo's and mini Table 2's SFT records compare them)."""


def rendering(env_cfg: Any) -> dict[str, Any]:
    """``env_cfg``'s :data:`RENDERING_KEYS` as a dict (``env_cfg``: an ``EnvConfig`` or a mapping)."""
    get = env_cfg.__getitem__ if isinstance(env_cfg, dict) else lambda k: getattr(env_cfg, k)
    return {k: get(k) for k in RENDERING_KEYS}


def sft_records(
    env: DondEnv, scenarios: Iterable[DondScenario], bots: list[str], seed: int, accept_share: float = 1.0
) -> list[Record]:
    """One scripted dialogue per scenario, two records (one per role) each: ``{"messages": [...]}``.

    Dialogue ``i`` is played by the ordered bot pair ``i mod len(pairs)`` (every ordered pair of ``bots``, self-play
    included), assigned to ``env.roles`` in that order; the opening seat alternates from one dialogue to the next and
    flips every full cycle of pairs, so each pair plays both seatings. Deterministic in ``seed``.

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
    pairs = list(itertools.product(bots, repeat=2))
    rng = random.Random(seed)
    keep = random.Random(f"{seed}/accept")
    roles = tuple(env.roles)
    records: list[Record] = []
    for i, scenario in enumerate(scenarios):
        first, second = pairs[i % len(pairs)]
        flip = (i + i // len(pairs)) % 2
        seats = roles[::-1] if flip else roles
        bots_by_role = {roles[0]: make_bot(first), roles[1]: make_bot(second)}
        state, _ = play_dialogue(env, scenario, bots_by_role, seed=rng.randrange(2**31), seats=seats)
        history = list(state.history)
        accept = _acceptance(history) if accept_share < 1.0 and keep.random() >= accept_share else None
        for role in roles:
            shown = history[:accept] if accept is not None and history[accept][0] == role else history
            messages = role_messages(env, scenario, shown, role)
            if len(messages) > 1:
                records.append({"messages": messages})
    return records


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
