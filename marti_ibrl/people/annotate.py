"""Blind annotation of recorded TeleSales calls (paper §5.4): did the customer consent to add the WeChat contact?

``marti-ibrl annotate EPISODES... --blind`` registers the calls of ``telesales eval`` episode files
(``OUT/episodes/POLICY.jsonl``, :mod:`marti_ibrl.eval.telesales.evaluator`) in the database and serves the page.
Each annotator sees every call once, in an order of their own (a shuffle seeded by their name), and only what was
said:

* hidden: the method (file and policy names; a call is shown by an opaque id, :func:`call_id`), the simulator's
  rubric codes, scores, intents and action labels (a customer turn is shown as its ``reply``), the audit, the outcome;
* shown: the agent's words, with its tool markers as the bracketed notes the customer heard
  (:meth:`~marti_ibrl.eval.telesales.env.TeleSalesEvalEnv.counterpart_text`).

The simulator's recorded outcome (``success``: ``ConfirmAdded``) is kept next to the call as ``simulator_label``
(``yes`` / ``no``) for :mod:`.agreement`. Calls that failed (no transcript to judge) are not registered.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.people.store import Store


def call_id(source: str, episode_id: str) -> str:
    """The opaque id annotators see: a hash of the episode file's name and the episode id."""
    return hashlib.sha256(f"{source}|{episode_id}".encode()).hexdigest()[:12]


def simulator_label(record: dict[str, Any]) -> str:
    """The simulator's recorded outcome as an annotation label: ``yes`` (a successful add) or ``no``."""
    return "yes" if record["success"] else "no"


def load_calls(store: Store, paths: Sequence[str | Path]) -> tuple[int, int]:
    """Register every judgeable call of the episode files (newest line of an episode id wins); (added, already
    there). ``ValueError`` names a file that is not a ``telesales eval`` episode file."""
    from marti_ibrl.eval.episodes import read_episodes

    added = known = 0
    for path in map(Path, paths):
        if not path.is_file():
            raise ValueError(f"{path}: no such episode file")
        try:
            lines = read_episodes(path)
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: cannot read it ({e})") from None
        bad = next((i for i, rec in enumerate(lines, 1) if not isinstance(rec, dict) or "episode_id" not in rec), None)
        if bad is not None:
            raise ValueError(f"{path}: record {bad} has no episode_id: not a `telesales eval` episode file")
        bad = next((i for i, rec in enumerate(lines, 1) if not isinstance(rec["episode_id"], str)), None)
        if bad is not None:
            raise ValueError(f"{path}: record {bad}'s episode_id is not a string: not a `telesales eval` episode file")
        records = {rec["episode_id"]: rec for rec in lines}  # the newest line of an episode id wins
        if not records:
            raise ValueError(f"{path}: no episodes in it")
        for eid, rec in sorted(records.items()):
            missing = [k for k in ("success", "transcript", "policy", "profile_id", "failed") if k not in rec]
            if missing:
                raise ValueError(f"{path}: episode {eid!r} has no {missing}: not a `telesales eval` episode file")
            if why := _misshapen(rec):  # refused now, never served (a string transcript made every /next a 500)
                raise ValueError(f"{path}: episode {eid!r}: {why}: not a `telesales eval` episode file")
            if rec["failed"] or not rec["transcript"]:
                continue
            if store.add_call(call_id(path.name, eid), path.name, rec, simulator_label(rec)):
                added += 1
            else:
                known += 1
    return added, known


def _misshapen(rec: dict[str, Any]) -> str | None:
    """Why an episode record is not of the shape :func:`blind_transcript` and the report read; None when it is."""
    transcript = rec["transcript"]
    if not isinstance(transcript, list):
        return f"its transcript is a {type(transcript).__name__}, not a list of turns"
    for k, t in enumerate(transcript, 1):
        if not (isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("text"), str)):
            return f"turn {k} of its transcript is not a {{role, text}} object"
    for key in ("policy", "profile_id"):
        if not isinstance(rec[key], str | int):
            return f"its {key} is a {type(rec[key]).__name__}"
    return None


def blind_transcript(record: dict[str, Any]) -> list[dict[str, str]]:
    """What an annotator reads of a call: who spoke (agent / customer) and what was said, nothing else."""
    from marti_ibrl.eval.telesales.env import TeleSalesEvalEnv

    env = TeleSalesEvalEnv(sales_mode="prompted")  # spoken(): the words of either format, the labels stripped
    return [
        {"who": "agent" if t["role"] == "sales" else "customer", "text": env.counterpart_text(t["role"], t["text"])}
        for t in record["transcript"]
        if t.get("valid", True)
    ]


def order(annotator: str, ids: Sequence[str]) -> list[str]:
    """The calls in ``annotator``'s own random order (the same on every visit)."""
    seed = int(hashlib.sha256(annotator.encode()).hexdigest()[:16], 16)
    out = sorted(ids)
    random.Random(seed).shuffle(out)
    return out


class Annotation:
    """The annotation page's data: the next unlabelled call of an annotator."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def next_call(self, annotator: str) -> dict[str, Any]:
        calls = {c["id"]: c for c in self.store.calls()}
        done = {row["call_id"] for row in self.store.labels(annotator)}
        queue = order(annotator, list(calls))
        todo = [c for c in queue if c not in done]
        if not todo:
            return {"done": True, "labelled": len(done), "total": len(queue)}
        cid = todo[0]
        return {
            "done": False,
            "call_id": cid,
            "position": len(done) + 1,
            "total": len(queue),
            "transcript": blind_transcript(calls[cid]["record"]),
        }
