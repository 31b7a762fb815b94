"""A warm start for any game: ``marti-ibrl sft --env NAME`` (:func:`warm_start`).

An environment that ships scripted players (``scripted_players()``, docs/environments.md) gets its warm start the way
DoND's demo gets its own: the players' dialogues (:func:`marti_ibrl.sft.data.scripted_records`, every combination of
players over the roles, every seating) become one chat record per role, rendered exactly as the RL rollout renders
them; OpenRLHF's SFT trainer fine-tunes the model on them (:func:`marti_ibrl.sft.train.run_sft`); and the model is
checked before and after by self-play (:func:`marti_ibrl.sft.checks.valid_turns`: the share of sampled turns the
environment accepts). ``OUT/sft_record.json`` says how it was made and what it reached.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.sft.checks import valid_turns
from marti_ibrl.sft.data import Record, scripted_records, write_sft_data
from marti_ibrl.sft.train import run_sft, sft_loss_curve

SFT_RECORD = "sft_record.json"
DATA_FILE = "sft_data.jsonl"
CHECK_SCENARIOS = 32
"""Scenarios of the self-play check (their own seed), before and after."""
CHECK_TURNS = 4
"""Turns of each self-played dialogue in the check (fewer if it ends)."""
LAX = 0.9
"""A base model (before any SFT) that plays this share of valid turns or more: the game's check accepts most text,
and the check's "after" says little (TextArena's SimpleNegotiation accepts any message)."""


def players_of(env: Any, names: Sequence[str] | None, title: str) -> dict[str, Any]:
    """The scripted players of ``env`` (the environment ``title`` names): its class's ``scripted_players()``, else its
    registry spec's; those named in ``names`` (all when None), in that order. ``ValueError`` with one line when it has
    none or a name is unknown."""
    from marti_ibrl.envs import registry

    spec = registry.get(title)
    own = getattr(env, "scripted_players", None)
    provide = own if own is not None else (lambda: spec.scripted_players(env)) if spec.scripted_players else None
    if provide is None:
        raise ValueError(
            f"{title} has no scripted players to learn from: give its class a scripted_players() method "
            "(docs/environments.md, 'A warm start')"
        )
    players = dict(provide())
    if not players:
        raise ValueError(f"{title}: scripted_players() returned no players")
    unknown = [n for n in names or () if n not in players]
    if unknown:
        raise ValueError(f"--players: {title} has no scripted player {unknown[0]!r}; it has {', '.join(players)}")
    return {n: players[n] for n in names} if names else players


def too_long(pretrain: str, records: Sequence[Record], max_len: int) -> tuple[int, int]:
    """How many ``records`` are longer than ``max_len`` tokens as ``pretrain``'s chat template renders them (all
    their messages), and the longest's length. OpenRLHF's SFT dataset drops a record whose turns before its last reach
    ``max_len - 2`` tokens and cuts any other at ``max_len``, silently: a record over ``max_len`` is one of those."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pretrain)
    lengths = [
        len(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"]) for r in records
    ]
    return sum(n > max_len for n in lengths), max(lengths, default=0)


def warm_start(
    env_cfg: Any,
    pretrain: str,
    out: str | Path,
    *,
    dialogues: int,
    seed: int,
    players: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    command: str = "",
    **hparams: Any,
) -> dict[str, Any]:
    """SFT ``pretrain`` on ``dialogues`` scripted dialogues of the environment ``env_cfg`` into ``out``; returns
    (and writes to ``out/sft_record.json``) the record: settings, command, records, seconds, loss first/last, and
    the share of valid self-played turns of the base and of the warm start.

    The dialogues play the env's training scenarios for ``seed + 1`` (cycled when there are fewer), the check those
    for ``seed + 2``: both apart from IB-RL's (``seed``). ``hparams``: :func:`run_sft`'s (epochs, lr, batch_size,
    micro_batch_size, max_len). ``out`` must not hold a model (nothing is overwritten): ``ValueError``.
    """
    from dataclasses import asdict

    from marti_ibrl.envs import make_env

    out = Path(out)
    if (out / "config.json").exists() or (out / SFT_RECORD).exists():
        raise ValueError(f"--out {out} already holds a model; remove it or give another --out")
    say = progress or (lambda line: None)
    env, played = _played(env_cfg, dialogues, seed)
    chosen = players_of(env, players, env_cfg.name)
    records = _scripted(env, env_cfg.name, played, chosen, seed)
    if hparams.get("max_len") is not None:
        _refuse_too_long(pretrain, records, hparams["max_len"])
    data = write_sft_data(out / DATA_FILE, records)
    say(f"{len(records)} SFT records from {dialogues} dialogues of {', '.join(chosen)} -> {data}")
    _, check = make_env(env_cfg, seed + 2)
    check = [s for _, s in check][:CHECK_SCENARIOS]
    base = valid_turns(pretrain, env, check, CHECK_TURNS, seed)["valid"]
    t0 = time.perf_counter()
    run_sft(pretrain, data, str(out), seed=seed, progress=progress, **hparams)
    seconds = time.perf_counter() - t0
    after = valid_turns(str(out), env, check, CHECK_TURNS, seed)
    curve = sft_loss_curve(str(out))
    record = {
        "settings": {
            "env": asdict(env_cfg),
            "players": list(chosen),
            "dialogues": dialogues,
            "seed": seed,
            "pretrain": str(pretrain),
            "sft": hparams,
        },
        "command": command,
        "records": len(records),
        "seconds": round(seconds, 1),
        "loss": [round(curve[0][1], 3), round(curve[-1][1], 3)] if curve else [],
        "valid_turns": {"base": round(base, 3), "sft": round(after["valid"], 3)},
        "dialogues_ended": round(after["ended"], 3),
    }
    (out / SFT_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    say(_check_line(env_cfg.name, len(check), base, after))
    return record


def _played(env_cfg: Any, dialogues: int, seed: int) -> tuple[Any, list[Any]]:
    """The env and the scenarios of ``dialogues`` scripted dialogues: its training scenarios for ``seed + 1``,
    cycled when there are fewer."""
    from marti_ibrl.envs import make_env

    env, train = make_env(env_cfg, seed + 1)
    scenarios = [s for _, s in train]
    if not scenarios:
        raise ValueError(f"{env_cfg.name}: no training scenarios to play")
    return env, list(itertools.islice(itertools.cycle(scenarios), dialogues))


def _scripted(env: Any, name: str, played: Sequence[Any], players: dict[str, Any], seed: int) -> list[Record]:
    """:func:`scripted_records`, a scripted player that broke the env's rules a ``ValueError`` naming the env."""
    try:
        return scripted_records(env, played, players, seed)
    except RuntimeError as e:
        raise ValueError(f"{name}: {e}") from None


def _refuse_too_long(pretrain: str, records: Sequence[Record], max_len: int) -> None:
    """A ``ValueError`` when records are longer than ``max_len`` (:func:`too_long`): OpenRLHF's SFT would drop them,
    or cut their last turns, without a word."""
    long, longest = too_long(pretrain, records, max_len)
    if long:
        raise ValueError(
            f"{long} of {len(records)} SFT records are longer than --max-len {max_len} tokens with {pretrain}'s "
            f"chat template (the longest: {longest}); OpenRLHF would drop or cut them: give --max-len {longest} "
            "or more, or shorter dialogues"
        )


def _check_line(name: str, scenarios: int, base: float, after: dict[str, float]) -> str:
    """What the self-play check found, before and after; where the base already passes it (:data:`LAX`), that it
    says little of what was learned."""
    line = (
        f"valid self-played turns ({scenarios} scenarios, up to {CHECK_TURNS} turns): {base:.0%} before, "
        f"{after['valid']:.0%} after; {after['ended']:.0%} of the dialogues reached their end"
    )
    if base >= LAX:
        line += (
            f"; the base already played {base:.0%}: {name} accepts most text, so this check says little of what was "
            "learned (the loss does: sft_record.json)"
        )
    return line


BASE_RECORD = "base_model.json"
"""Beside a base model made by :func:`base_model`: what it was made from and how."""


def game_texts(env_cfg: Any, dialogues: int, seed: int) -> tuple[list[str], str]:
    """Text of the game ``env_cfg`` names, for a tokenizer: every message of ``dialogues`` scripted dialogues as the
    rollout renders them for each role (system prompts and turns), or, when the game has no scripted players, each
    role's opening messages over as many scenarios. Returns the texts and where they came from."""
    from marti_ibrl.envs.base import role_messages

    env, played = _played(env_cfg, dialogues, seed)
    try:
        players = players_of(env, None, env_cfg.name)
    except ValueError:  # no scripted players: the openings alone
        messages = [m for s in played for role in env.roles for m in role_messages(env, s, [], role)]
        source = f"the openings of {len(played)} scenarios (the game has no scripted players)"
    else:
        messages = [m for r in _scripted(env, env_cfg.name, played, players, seed) for m in r["messages"]]
        source = f"{len(played)} dialogues of its scripted players ({', '.join(players)})"
    return [str(m["content"]) for m in messages], source


def base_model(
    env_cfg: Any, out: str | Path, *, dialogues: int = 500, seed: int = 0, vocab_size: int = 1024, command: str = ""
) -> dict[str, Any]:
    """A tiny base model for any game in ``out``: the demo's architecture (:data:`~marti_ibrl.sft.DEMO_TINY_MODEL`,
    random weights) with a byte-level BPE tokenizer trained on the game's own text (:func:`game_texts`), so its turns
    are a few tokens each; what ``marti-ibrl sft --env`` then teaches the format. Writes and returns the record
    (:data:`BASE_RECORD`). ``out`` must not hold a model (nothing is overwritten): ``ValueError``."""
    from dataclasses import asdict

    from marti_ibrl.sft.presets import DEMO_TINY_MODEL
    from marti_ibrl.tiny import build_tiny_model

    out = Path(out)
    if (out / "config.json").exists():
        raise ValueError(f"--out {out} already holds a model; remove it or give another --out")
    texts, source = game_texts(env_cfg, dialogues, seed)
    build_tiny_model(out, texts, vocab_size=vocab_size, seed=seed, **DEMO_TINY_MODEL)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    record = {
        "settings": {
            "env": asdict(env_cfg),
            "dialogues": dialogues,
            "seed": seed,
            "vocab_size": vocab_size,
            "architecture": dict(DEMO_TINY_MODEL),
        },  # fmt: skip
        "command": command,
        "text_from": source,
        "vocabulary": len(tokenizer),
        "mean_tokens_per_message": round(sum(len(tokenizer(t)["input_ids"]) for t in texts) / len(texts), 1),
    }
    (out / BASE_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record
