"""Table 11 of the paper (Appendix D): the user simulator's per-turn behavior rubric, B01-B18.

Each entry (:class:`RubricEntry`) is a behavior of the sales agent and what it does to the simulated customer's three
scores (:data:`SCORES`: willingness, trust, patience). Several entries may fire in one turn; the fired entries'
deltas are summed and each score is clipped to [0, 1] (:func:`apply_rubric`). The simulator reports the codes it
fired (:func:`~.outputs.validate_simulator_turn`), and the evaluation call applies them itself
(:meth:`~.env.TeleSalesEvalEnv.check_customer`); the simulator's prompt lists the table (:func:`rubric_text`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SCORES = ("willingness", "trust", "patience")


@dataclass(frozen=True)
class RubricEntry:
    """One Table 11 row; ``delta`` is (Δw, Δt, Δp) before clipping, ``None`` for B15 (a same-turn marker)."""

    code: str
    behavior: str
    delta: tuple[float, float, float] | None


RUBRIC: dict[str, RubricEntry] = {e.code: e for e in (RubricEntry(*row) for row in (
    ("B01", "Directly and concretely answers the current main question", (0.05, 0.05, 0.02)),
    ("B02", "States identity, call source, and reason for contact", (0.0, 0.06, 0.01)),
    ("B03", "Admits uncertainty and explicitly offers to verify", (0.01, 0.05, -0.02)),
    ("B04", "Provides verifiable evidence or concrete content", (0.08, 0.07, 0.01)),
    ("B05", "Explains the follow-up purpose, related to the question", (0.04, 0.05, 0.01)),
    ("B06", "Respects privacy or explicitly reduces disturbance", (0.0, 0.03, 0.04)),
    ("B07", "User said they are busy; agent keeps pitching at length", (-0.05, -0.03, -0.10)),
    ("B08", "No answer at all, only pushes adding the contact", (-0.04, -0.04, -0.03)),
    ("B09", 'Vague pricing, false "lowest price", exaggerated guarantees, or manufactured urgency', (0.0, -0.15, 0.0)),
    ("B10", "Repeats the same push 3+ turns with no new information", (-0.04, 0.0, -0.05)),
    ("B11", "Answer completely unrelated to the user's question", (0.0, -0.03, -0.04)),
    ("B12", "Keeps requesting the contact after explicit refusal", (-0.12, -0.10, -0.12)),
    ("B13", "Light next-step push after answering the main question", (0.02, 0.0, 0.01)),
    ("B14", "Pure transitional talk, no information gain", (0.0, 0.0, 0.0)),
    ("B15", "Issues a contact invitation or actionable entry", None),
    ("B16", "Noticeably long, written-style, script-like utterance", (-0.10, -0.05, -0.15)),
    ("B17", "Brief, natural, and on-point", (0.0, 0.03, 0.05)),
    ("B18", "Visible utterance >= 120 characters (markers removed)", (0.0, 0.0, -0.10)),
))}  # fmt: skip
"""Table 11. B15's cell reads "same-turn behaviors": it changes nothing itself; the other entries that fire in the
same turn (e.g. B05, B08, B12) carry the change."""


def check_codes(codes: Sequence[str]) -> None:
    """Every code is a Table 11 code (B01-B18), none twice."""
    unknown = [c for c in codes if c not in RUBRIC]
    if unknown:
        raise ValueError(f"unknown rubric codes: {', '.join(map(repr, unknown))} (B01-B18)")
    if len(set(codes)) != len(codes):
        raise ValueError(f"a rubric code fired twice in one turn: {list(codes)}")


def apply_rubric(state: Mapping[str, float], codes: Sequence[str]) -> dict[str, float]:
    """Table 11: each score + Σ of the fired entries' deltas, clipped to [0, 1]. Unknown or repeated codes raise."""
    check_codes(codes)
    missing = [s for s in SCORES if s not in state]
    if missing:
        raise ValueError(f"state lacks {', '.join(missing)}")
    deltas = [RUBRIC[c].delta for c in codes if RUBRIC[c].delta is not None]
    return {s: round(min(1.0, max(0.0, state[s] + sum(d[i] for d in deltas))), 6) for i, s in enumerate(SCORES)}


def rubric_text() -> str:
    """Table 11 as the simulator's prompt lists it (Table 9, our rendering): one line per code, its behavior and its
    score changes."""
    return "\n".join(f"- {e.code} {e.behavior}: {_changes(e)}" for e in RUBRIC.values())


def _changes(entry: RubricEntry) -> str:
    if entry.delta is None:
        return "same-turn behaviors (no change of its own)"
    return ", ".join(f"{s} {d:+.2f}" if d else f"{s} 0" for s, d in zip(SCORES, entry.delta))
