"""What the policies said: a sample of every iteration's dialogues, kept in ``RUN/transcripts.jsonl``.

One JSON line per kept dialogue (``--logger.transcripts N`` per iteration, default 4; -1 all; 0 none): the
iteration, the scenario and sample, the speaking order, who played each seat (``current``, ``pool:V``,
``frozen:NAME``), every turn (role, text, whether the env accepted it, malformed attempts discarded before it), the
discarded attempts' texts and reasons, the per-role rewards and the outcome. Appended and fsynced as each iteration learns, so a killed run keeps what it
played; a resumed run first drops the lines of iterations after its commit (it plays them again, identically).
``marti-ibrl show RUN`` prints them (:func:`format_dialogue`); tensorboard's text tab shows each iteration's.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

TRANSCRIPTS_FILE = "transcripts.jsonl"


def turn_records(traj) -> list[dict[str, Any]]:
    """A trajectory's turns as JSON: role, text, valid, resamples (the same shape as evaluation episodes)."""
    return [{"role": t.role, "text": t.text, "valid": t.valid, "resamples": t.resamples} for t in traj.turns]


def transcript_record(k: int, traj) -> dict[str, Any]:
    """One kept dialogue of iteration ``k``."""
    outcome = traj.outcome
    return {
        "iteration": k,
        "scenario_uid": traj.scenario_uid,
        "sample_index": traj.sample_index,
        "seats": list(traj.seats),
        "policies": dict(traj.policies),
        "turns": turn_records(traj),
        "rewards": dict(traj.rewards),
        "agreed": bool(outcome.agreed) if outcome else False,
        "malformed": bool(outcome.malformed) if outcome else False,
        "fault_role": outcome.info.get("fault_role") if outcome else None,
        "reason": outcome.info.get("reason", "") if outcome else "",
        "utilities": dict(outcome.utilities) if outcome else {},
        "truncated": bool(traj.truncated),
        "discarded": [{"role": a.role, "text": a.text, "reason": a.reason} for a in traj.discarded],
    }


def sample(trajectories: Sequence, n: int, rng: random.Random) -> list:
    """``n`` of the iteration's dialogues in their order (-1: all; 0: none), drawn with the run's seeded ``rng``."""
    if n < 0 or n >= len(trajectories):
        return list(trajectories)
    keep = sorted(rng.sample(range(len(trajectories)), n))
    return [trajectories[i] for i in keep]


def append(run_dir: str | Path, records: Sequence[dict]) -> None:
    """Append ``records`` to ``RUN/transcripts.jsonl``, flushed and fsynced (on disk before the next iteration)."""
    if not records:
        return
    with open(Path(run_dir) / TRANSCRIPTS_FILE, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def keep(run_dir: str | Path, k: int, trajectories: Sequence, n: int, rng: random.Random, logger=None) -> None:
    """``--logger.transcripts N``: a seeded sample of iteration k's dialogues, on disk before k+1 starts; shown in
    the text tab of ``logger`` (OpenRLHF's tensorboard or wandb logger) when there is one."""
    records = [transcript_record(k, t) for t in sample(trajectories, n, rng)]
    append(run_dir, records)
    if records and logger is not None:
        text = "\n\n".join(f"```\n{format_dialogue(r)}\n```" for r in records)
        rewards = [x for r in records for x in r["rewards"].values()]
        logger.log_train(k, {"generated_samples": (text, mean(rewards) if rewards else 0.0)})


def keep_until(run_dir: str | Path, k: int) -> int:
    """A resume from the commit of iteration ``k``: drop the lines of later iterations (they are played again);
    returns how many were dropped. The file is rewritten atomically."""
    path = Path(run_dir) / TRANSCRIPTS_FILE
    if not path.exists():
        return 0
    lines = path.read_bytes().splitlines(keepends=True)  # bytes: a line that is not UTF-8 is a line like any other
    kept = [line for line in lines if _iteration(line) <= k]
    if len(kept) == len(lines):
        return 0
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(b"".join(kept))
    tmp.replace(path)
    return len(lines) - len(kept)


def _iteration(line: bytes) -> int:
    from marti_ibrl import safeparse

    try:
        return int(safeparse.loads(line.decode("utf-8"))["iteration"])
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return 1 << 62  # not a whole record: dropped with the uncommitted ones


FIELDS = ("iteration", "scenario_uid", "sample_index", "seats", "policies", "turns", "rewards", "agreed", "malformed")


MAX_LINE = 64 << 20
"""The longest line :func:`read` parses (a kept dialogue is a few KB): a longer one is skipped unread."""


def _whole(rec: object) -> bool:
    """A record as :func:`transcript_record` writes it (a line edited or cut is not one): every field
    :func:`format_dialogue` and :func:`malformed_summary` read, of its type."""

    def turn_ok(t: object) -> bool:
        if not (isinstance(t, dict) and {"role", "text", "valid"} <= t.keys()):
            return False
        n = t.get("resamples") or 0
        return isinstance(t["role"], str) and isinstance(t["text"], str) and isinstance(n, int) and n >= 0

    return (
        isinstance(rec, dict)
        and all(k in rec for k in FIELDS)
        and isinstance(rec["iteration"], int)
        and not isinstance(rec["iteration"], bool)
        and isinstance(rec["turns"], list)
        and all(turn_ok(t) for t in rec["turns"])
        and isinstance(rec["rewards"], dict)
        and isinstance(rec["policies"], dict)
        and isinstance(rec["seats"], list)
        and all(isinstance(s, str) for s in rec["seats"])
        and (rec["agreed"] or not rec["malformed"] or "fault_role" in rec)
        and isinstance(rec.get("discarded", []), list)
    )


class Kept(list):
    """The records :func:`read` kept; ``skipped``: the lines that were not whole records (cut by a crash, even inside
    a UTF-8 character; binary; nested past :data:`marti_ibrl.safeparse.MAX_DEPTH`; edited; over :data:`MAX_LINE`)."""

    skipped: int = 0
    seen: int = 0
    """The whole records read (of the iteration asked for), kept or not (``which``)."""


def _lines(path: Path):
    """The file's lines as bytes, streamed; None for a line longer than :data:`MAX_LINE` (read past, never held)."""
    with open(path, "rb") as f:
        while line := f.readline(MAX_LINE + 1):
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                yield None
            else:
                yield line


def read(run_dir: str | Path, iteration: int | None = None, which: str = "all") -> Kept:
    """The kept dialogues of a run (of one ``iteration``), streamed: ``which`` ``"all"``, ``"last"`` (the last
    iteration's only) or ``"ends"`` (the first and the last iteration's), so memory holds what is returned, not the
    file. A line that is not a whole record is skipped and counted (:class:`Kept`)."""
    from marti_ibrl import safeparse

    path = Path(run_dir) / TRANSCRIPTS_FILE
    out = Kept()
    if not path.is_file():
        return out
    for line in _lines(path):
        try:
            rec = safeparse.loads(line.decode("utf-8")) if line is not None else None
        except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            rec = None
        if not _whole(rec):
            out.skipped += bool(line is None or line.strip())
            continue
        if iteration is not None and rec["iteration"] != iteration:
            continue
        out.seen += 1
        if which != "all" and out and rec["iteration"] > out[-1]["iteration"]:  # a later iteration: the earlier go
            first = out[0]["iteration"]
            out[:] = [r for r in out if which == "ends" and r["iteration"] == first]
        out.append(rec)
    return out


def format_dialogue(rec: dict) -> str:
    """A kept dialogue as text: a header (iteration, scenario, who played, outcome, rewards), then one line per turn
    (``!`` marks a turn the env refused; ``~`` a malformed attempt re-sampled before the next, with the env's reason;
    ``(+N discarded)`` such attempts where a record does not hold their text)."""
    seats = ", ".join(f"{r}={rec['policies'].get(r, '?')}" for r in rec["seats"])
    ending = "agreed" if rec["agreed"] else f"malformed by {rec['fault_role']}" if rec["malformed"] else "no deal"
    if rec.get("reason") and not rec["agreed"]:
        ending += f" ({rec['reason']})"
    rewards = ", ".join(
        f"{r} {x:+.2f}" if isinstance(x, int | float) else f"{r} {x}" for r, x in sorted(rec["rewards"].items())
    )
    head = (
        f"iteration {rec['iteration']} · {rec['scenario_uid']} #{rec['sample_index']} · {seats} · {ending} · "
        f"reward {rewards or '-'}"
    )
    lines = [head]
    discarded = [a for a in rec.get("discarded", ()) if isinstance(a, dict)]  # in the order they were written
    for t in rec["turns"]:
        n = t.get("resamples") or 0
        before = [a for a in discarded if a.get("role") == t["role"]][:n]
        for a in before:  # the malformed attempts re-sampled before this turn, as the policy wrote them
            discarded.remove(a)
            lines.append(f"  {t['role']:>10}: ~ {a.get('text', '')}  [discarded: {a.get('reason') or 'malformed'}]")
        mark = "" if t["valid"] else "! "
        extra = f"  (+{n} discarded)" if n and not before else ""
        lines.append(f"  {t['role']:>10}: {mark}{t['text']}{extra}")
    return "\n".join(lines)


def malformed_turns(rec: dict) -> list[tuple[str, int, str]]:
    """(role, turn number from 1, text) of every malformed turn a kept dialogue holds: the attempts re-sampled before a
    turn (``discarded``; text "" where the record does not hold it) and a turn that stayed malformed."""
    discarded = [a for a in rec.get("discarded", ()) if isinstance(a, dict)]
    out = []
    for i, t in enumerate(rec["turns"], start=1):
        n = t.get("resamples") or 0
        before = [a for a in discarded if a.get("role") == t["role"]][:n]
        for a in before:
            discarded.remove(a)
            out.append((t["role"], i, str(a.get("text", ""))))
        out += [(t["role"], i, "")] * (n - len(before))  # a record that does not hold their texts
        if not t["valid"]:
            out.append((t["role"], i, t["text"]))
    return out


def malformed_summary(records: Sequence[dict], texts: int = 2) -> str:
    """Per iteration and role of the kept dialogues: turns generated (re-sampled attempts included), how many were
    malformed, at which turn of the dialogue, and the ``texts`` commonest malformed texts: where malformed turns come
    from (``marti-ibrl show RUN --malformed``)."""
    rows = [["iteration", "role", "generated", "malformed", "at turn", "commonest malformed texts"]]
    keys = sorted({(r["iteration"], t["role"]) for r in records for t in r["turns"]})
    for k, role in keys:
        recs = [r for r in records if r["iteration"] == k]
        generated = sum(1 + (t.get("resamples") or 0) for r in recs for t in r["turns"] if t["role"] == role)
        bad = [(i, text) for r in recs for who, i, text in malformed_turns(r) if who == role]
        at = Counter(i for i, _ in bad)
        common = Counter(text[:40] or "(text not kept)" for _, text in bad).most_common(texts)
        rows.append([
            str(k), role, str(generated), f"{len(bad)} ({len(bad) / generated:.0%})" if generated else "0",
            ", ".join(f"{i}: {n}" for i, n in sorted(at.items())) or "-",
            "; ".join(f"{json.dumps(t, ensure_ascii=False)} x{n}" for t, n in common) or "-",
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[-1]]) for row in rows)
