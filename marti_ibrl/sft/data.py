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

Record = dict[str, Any]

RENDERING_KEYS = ("prompt_style", "max_rounds", "bot_speech", "show_complement")
"""The DoND environment settings (``EnvConfig`` fields) an SFT record's text depends on: a warm start made under other
values was trained on text the RL rollout never shows (the demo's and mini Table 2's SFT records compare them)."""


def rendering(env_cfg: Any) -> dict[str, Any]:
    """``env_cfg``'s :data:`RENDERING_KEYS` as a dict (``env_cfg``: an ``EnvConfig`` or a mapping)."""
    get = env_cfg.__getitem__ if isinstance(env_cfg, dict) else lambda k: getattr(env_cfg, k)
    return {k: get(k) for k in RENDERING_KEYS}


def sft_records(env: DondEnv, scenarios: Iterable[DondScenario], bots: list[str], seed: int) -> list[Record]:
    """One scripted dialogue per scenario, two records (one per role) each: ``{"messages": [...]}``.

    Dialogue ``i`` is played by the ordered bot pair ``i mod len(pairs)`` (every ordered pair of ``bots``, self-play
    included), assigned to ``env.roles`` in that order; the opening seat alternates from one dialogue to the next and
    flips every full cycle of pairs, so each pair plays both seatings. Deterministic in ``seed``.
    """
    if not bots:
        raise ValueError("sft_records needs at least one bot name")
    pairs = list(itertools.product(bots, repeat=2))
    rng = random.Random(seed)
    roles = tuple(env.roles)
    records: list[Record] = []
    for i, scenario in enumerate(scenarios):
        first, second = pairs[i % len(pairs)]
        flip = (i + i // len(pairs)) % 2
        seats = roles[::-1] if flip else roles
        bots_by_role = {roles[0]: make_bot(first), roles[1]: make_bot(second)}
        state, _ = play_dialogue(env, scenario, bots_by_role, seed=rng.randrange(2**31), seats=seats)
        for role in roles:
            messages = role_messages(env, scenario, state.history, role)
            if len(messages) > 1:
                records.append({"messages": messages})
    return records


def write_sft_data(path: str | os.PathLike[str], records: Iterable[Record]) -> str:
    """Write ``records`` as JSON lines; returns the path as str."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return str(out)
