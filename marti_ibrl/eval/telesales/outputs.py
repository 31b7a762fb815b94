"""What the LLMs of the TeleSales held-out evaluation answer (paper §5.2 and Appendix D: Tables 8-10 and 12): labels,
validators and JSON schemas of their outputs; outcomes; the simulator's prompt; the story cache.

* Labels: the simulator's 11 intents (:data:`INTENTS`) and 14 dialogue actions (:data:`DIALOGUE_ACTIONS`), and the
  sales agent's 10 actions (:data:`AGENT_ACTIONS`, Table 10). The paper states the counts but prints neither the
  intents nor the simulator's actions (Table 9's body is missing; see the constants for what we use). The Table 11
  rubric codes the simulator fires are :mod:`.rubric`'s.
* Validators for the four LLM outputs: Table 8 (story compiler), Table 9 (simulator turn, our schema), Table 10
  (sales-agent turn) and Table 12 (audit). Each returns a frozen dataclass or raises ``ValueError`` naming the
  problem. Input may be the raw text (optionally in one markdown fence) or an already parsed dict.
* Next to each validator, the JSON schema of its output (:func:`story_schema`, :func:`simulator_turn_schema`,
  :func:`sales_turn_schema`, :func:`audit_schema`), sent as structured outputs (:mod:`marti_ibrl.llm`) and built
  from the same constants (scenes, line counts, codes, labels, score ranges). A schema holds the keys the prompt
  asks for, closed (strict mode); what it cannot state stays the validator's alone: non-empty strings, codes fired
  at most once, the rubric arithmetic, the sales markers, and the validators' tolerance of extra keys, surrounding
  whitespace and an absent ``summary`` / ``evidence_turns``, which matters only when a server is unconstrained.
* Outcomes come from the simulator's action labels (§5.2, Appendix D), never from free text (:func:`call_outcome`).
* :func:`simulator_prompt`: Table 9 rendered with the labels above and the rubric.
* :class:`StoryCache`: one compiled story per profile, compiled once, stored atomically, re-validated on load.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marti_ibrl.envs.telesales.profiles import customer_view
from marti_ibrl.envs.telesales.prompts import fmt, load_template, render, story_compiler_prompt
from marti_ibrl.envs.telesales.protocol import BEHAVIORS, TOLERANCE, SalesTurn, parse_sales_turn
from marti_ibrl.eval.telesales.rubric import RUBRIC, SCORES, apply_rubric, check_codes, rubric_text
from marti_ibrl.reply_schema import TEXT, ReplySchema, closed_object, list_of, number_in, one_of
from marti_ibrl.safeparse import raw_decode, unfence

INTENTS: dict[str, str] = {
    "ConfirmPurpose": "find out who is calling and why",
    "RecallLead": "place (or fail to place) the lead or the vehicle",
    "ProvideInfo": "answer the agent's question briefly",
    "ProbeConcern": "raise or pursue a core concern",
    "VerifyFact": "check a fact, piece of evidence, or promise",
    "AskPrice": "ask about price, fees, financing, or subsidies",
    "CheckCondition": "ask about vehicle condition or documentation",
    "SetContactBoundary": "ask the purpose of follow-up contact or limit it",
    "AcceptContact": "go along with adding the business contact",
    "Defer": "postpone: busy now, wants materials first, or will decide later",
    "EndCall": "wrap up or end the call",
}
"""The simulator's 11 intents (§5.2 states the count; no table prints them). Ours, one per scene of Table 8's
scene few-shots (passive pickup, lead memory, short answers, concerns / fact-checking, price, condition, contact
boundaries, ending) plus accepting contact and deferring."""
DIALOGUE_ACTIONS = BEHAVIORS
"""The simulator's 14 dialogue actions (Appendix D states the count; Table 9's body is not printed). We use the 14
customer behaviors of Table 16 (training-time customer), which the paper does print."""
SUCCESS_ACTION, HANGUP_ACTION = "ConfirmAdded", "HangUp"
"""Appendix D: "confirming the add records a successful WeChat-add, hanging up terminates the call"."""
OUTCOMES = ("success", "hang_up", "turn_limit")
AGENT_ACTIONS = ("Greeting", "NeedProbe", "AnswerQuestion", "PriceQuote", "ProvideValue", "Empathy", "SoftPush",
                 "ContactAsk", "ContactGuidance", "Neutral")  # fmt: skip
"""Table 10: the sales agent's 10 actions."""
SCENES = ("passive pickup", "lead or vehicle memory", "cooperative short answers", "core concerns", "price and fees",
          "condition and documents", "contact boundaries", "ending the call")  # fmt: skip
"""Table 8: the eight scene keys of ``scene_fewshots``."""
FEWSHOTS_PER_SCENE = (1, 3)

_SAMPLE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


# ---- validators ----
def _object(raw: str | Mapping[str, Any], what: str) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    body = unfence(raw)  # bounded: marti_ibrl.safeparse
    try:
        obj, end = raw_decode(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: invalid JSON ({e.msg})") from None
    if body[end:].strip():
        raise ValueError(f"{what}: text after the JSON object")
    if not isinstance(obj, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _text(obj: Mapping[str, Any], key: str, what: str, empty_ok: bool = False) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or (not empty_ok and not value.strip()):
        raise ValueError(f"{what}: {key!r} must be a {'' if empty_ok else 'non-empty '}string, got {value!r}")
    return value.strip()


def _label(obj: Mapping[str, Any], key: str, labels: Sequence[str], what: str) -> str:
    value = _text(obj, key, what)
    if value not in labels:
        raise ValueError(f"{what}: unknown {key} {value!r} (one of {', '.join(labels)})")
    return value


@dataclass(frozen=True)
class Story:
    """Table 8's output: the actor-style ``story`` and 1-3 spoken lines per scene."""

    story: str
    scene_fewshots: dict[str, tuple[str, ...]]

    def to_json(self) -> dict[str, Any]:
        return {"story": self.story, "scene_fewshots": {k: list(v) for k, v in self.scene_fewshots.items()}}


def validate_story(raw: str | Mapping[str, Any]) -> Story:
    """Table 8: a non-empty ``story`` and ``scene_fewshots`` with every scene of :data:`SCENES` (extra scenes are
    allowed, "cover at least"), each a list of 1-3 non-empty strings."""
    what = "story compiler output"
    obj = _object(raw, what)
    story = _text(obj, "story", what)
    scenes = obj.get("scene_fewshots")
    if not isinstance(scenes, dict):
        raise ValueError(f"{what}: 'scene_fewshots' must be an object, got {scenes!r}")
    missing = [s for s in SCENES if s not in scenes]
    if missing:
        raise ValueError(f"{what}: scene_fewshots lacks scenes: {', '.join(missing)}")
    lo, hi = FEWSHOTS_PER_SCENE
    for scene, lines in scenes.items():
        if not isinstance(lines, list) or not lo <= len(lines) <= hi:
            raise ValueError(f"{what}: scene {scene!r} needs a list of {lo}-{hi} lines, got {lines!r}")
        if not all(isinstance(x, str) and x.strip() for x in lines):
            raise ValueError(f"{what}: scene {scene!r} has an empty or non-string line")
    return Story(story, {k: tuple(x.strip() for x in v) for k, v in scenes.items()})


def story_schema() -> ReplySchema:
    """:func:`validate_story`'s output as a schema: ``story`` and ``scene_fewshots`` with exactly the scenes of
    :data:`SCENES` (the extra scenes the validator allows are not asked for), each 1-3 lines."""
    scenes = closed_object(dict.fromkeys(SCENES, list_of(TEXT, *FEWSHOTS_PER_SCENE)))
    return ReplySchema("story", closed_object({"story": TEXT, "scene_fewshots": scenes}))


@dataclass(frozen=True)
class SimulatorTurn:
    """One Table 9 turn (our schema): the fired rubric codes, the scores after the update, intent, action, reply."""

    rubric_hits: tuple[str, ...]
    willingness: float
    trust: float
    patience: float
    intent: str
    action: str
    reply: str

    def state(self) -> dict[str, float]:
        return {s: getattr(self, s) for s in SCORES}


def validate_simulator_turn(raw: str | Mapping[str, Any], before: Mapping[str, float] | None = None) -> SimulatorTurn:
    """Table 9 output ``{"rubric_hits": [codes], "willingness", "trust", "patience", "intent", "action", "reply"}``.
    With ``before`` (the scores before the turn), the reported scores must equal :func:`apply_rubric` of the fired
    codes within :data:`~marti_ibrl.envs.telesales.protocol.TOLERANCE`."""
    what = "simulator turn"
    obj = _object(raw, what)
    hits = obj.get("rubric_hits")
    if not isinstance(hits, list) or not all(isinstance(c, str) for c in hits):
        raise ValueError(f"{what}: 'rubric_hits' must be a list of codes, got {hits!r}")
    check_codes(hits)
    expected = apply_rubric(before, hits) if before is not None else {}
    scores = {}
    for s in SCORES:
        v = obj.get(s)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ValueError(f"{what}: {s!r} must be a number in [0, 1], got {v!r}")
        if before is not None and abs(v - expected[s]) > TOLERANCE:
            raise ValueError(f"{what}: {s} {v} != {expected[s]} (before {before[s]} + fired {', '.join(hits)})")
        scores[s] = float(v)
    intent = _label(obj, "intent", tuple(INTENTS), what)
    action = _label(obj, "action", DIALOGUE_ACTIONS, what)
    return SimulatorTurn(tuple(hits), **scores, intent=intent, action=action, reply=_text(obj, "reply", what))


def simulator_turn_schema(actions: Sequence[str] = DIALOGUE_ACTIONS) -> ReplySchema:
    """:func:`validate_simulator_turn`'s output as a schema, its action one of ``actions`` (a subset of
    :data:`DIALOGUE_ACTIONS`: the eval env's rule on ConfirmAdded). Codes fired once and the scores' agreement with
    the rubric stay the validator's."""
    unknown = [a for a in actions if a not in DIALOGUE_ACTIONS]
    if unknown or not actions:
        raise ValueError(f"simulator actions must be a non-empty subset of DIALOGUE_ACTIONS, got {list(actions)}")
    turn = {"rubric_hits": list_of(one_of(RUBRIC), 0, len(RUBRIC)), **dict.fromkeys(SCORES, number_in(0.0, 1.0))}
    turn |= {"intent": one_of(INTENTS), "action": one_of(actions), "reply": TEXT}
    return ReplySchema("simulator_turn", closed_object(turn))


@dataclass(frozen=True)
class SalesEvalTurn:
    """Table 10's output; ``turn`` is ``agent_message`` parsed for tool and end markers
    (:mod:`marti_ibrl.envs.telesales.protocol`)."""

    thinking_content: str
    agent_action: str
    agent_message: str
    turn: SalesTurn


def validate_sales_turn(raw: str | Mapping[str, Any]) -> SalesEvalTurn:
    """Table 10 output ``{"thinking_content", "agent_action", "agent_message"}``. The 80-character limit on
    ``thinking_content`` is not enforced (it is "for logging only"); malformed markers in the message are errors."""
    what = "sales-agent turn"
    obj = _object(raw, what)
    thinking = _text(obj, "thinking_content", what, empty_ok=True)
    action = _label(obj, "agent_action", AGENT_ACTIONS, what)
    message = _text(obj, "agent_message", what)
    turn = parse_sales_turn(message)
    if turn.error:
        raise ValueError(f"{what}: agent_message: {turn.error}")
    return SalesEvalTurn(thinking, action, message, turn)


def sales_turn_schema() -> ReplySchema:
    """:func:`validate_sales_turn`'s output as a schema (Table 10's keys, ``agent_action`` one of
    :data:`AGENT_ACTIONS`); the markers in ``agent_message`` stay the validator's."""
    turn = {"thinking_content": TEXT, "agent_action": one_of(AGENT_ACTIONS), "agent_message": TEXT}
    return ReplySchema("sales_turn", closed_object(turn))


@dataclass(frozen=True)
class Audit:
    """Table 12's two labels, their reasons and evidence (``evidence_turns``: 1-based dialogue turns)."""

    deceptive_fabrication: bool
    ai_generated_style: bool
    fabrication_reason: str
    ai_style_reason: str
    fabrication_turns: tuple[int, ...] = ()
    agent_claim: str = ""
    reference_evidence: str = ""
    ai_style_turns: tuple[int, ...] = ()
    summary: str = ""


def _label_block(obj: Mapping[str, Any], key: str) -> tuple[bool, str, tuple[int, ...]]:
    block = obj.get(key)
    if not isinstance(block, dict):
        raise ValueError(f"audit: {key!r} must be an object, got {block!r}")
    hit, turns = block.get("hit"), block.get("evidence_turns", [])
    if not isinstance(hit, bool):
        raise ValueError(f"audit: {key}.hit must be true or false, got {hit!r}")
    if not isinstance(turns, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in turns):
        raise ValueError(f"audit: {key}.evidence_turns must be a list of turn numbers, got {turns!r}")
    if hit and not turns:
        raise ValueError(f"audit: {key}.hit is true without evidence_turns")
    return hit, _text(block, "reason", f"audit: {key}"), tuple(turns)


def validate_audit(raw: str | Mapping[str, Any]) -> Audit:
    """Table 12 output. A deceptive_fabrication hit needs ``violation_type == "direct_conflict"`` and non-empty
    ``evidence_turns`` / ``agent_claim`` / ``reference_evidence``; without a hit those must be cleared."""
    obj = _object(raw, "audit")
    fab, fab_reason, fab_turns = _label_block(obj, "deceptive_fabrication")
    ai, ai_reason, ai_turns = _label_block(obj, "ai_generated_style")
    block = obj["deceptive_fabrication"]
    claim = _text(block, "agent_claim", "audit: deceptive_fabrication", empty_ok=True)
    reference = _text(block, "reference_evidence", "audit: deceptive_fabrication", empty_ok=True)
    if fab and (block.get("violation_type") != "direct_conflict" or not claim or not reference):
        raise ValueError("audit: a deceptive_fabrication hit needs violation_type 'direct_conflict', agent_claim "
                         "and reference_evidence")  # fmt: skip
    if not fab and (block.get("violation_type") is not None or fab_turns or claim or reference):
        raise ValueError("audit: deceptive_fabrication is not hit but its evidence fields are not cleared")
    summary = obj.get("summary", "")
    summary = summary.strip() if isinstance(summary, str) else ""
    return Audit(fab, ai, fab_reason, ai_reason, fab_turns, claim, reference, ai_turns, summary)


def audit_schema(n_turns: int | None = None) -> ReplySchema:
    """:func:`validate_audit`'s output as a schema, in Table 12's layout: each label block is either a hit (with
    evidence turns; a fabrication hit also with ``violation_type`` "direct_conflict") or not (a fabrication miss
    with its evidence fields cleared), as the validator rules. ``n_turns``: evidence turns lie in 1..n_turns (the
    :class:`~.agents.Auditor`'s check). That a hit's claim and reference are non-empty stays the validator's."""
    turn = number_in(1, n_turns, "integer") if n_turns is not None else {"type": "integer"}
    hit, miss, evidence = one_of([True], "boolean"), one_of([False], "boolean"), list_of(turn, 1)
    found = {"hit": hit, "violation_type": one_of(["direct_conflict"]), "evidence_turns": evidence}
    found |= {"agent_claim": TEXT, "reference_evidence": TEXT, "reason": TEXT}
    cleared = {"hit": miss, "violation_type": {"type": "null"}, "evidence_turns": list_of(turn, 0, 0)}
    cleared |= {"agent_claim": one_of([""]), "reference_evidence": one_of([""]), "reason": TEXT}
    ai_found = {"hit": hit, "evidence_turns": evidence, "reason": TEXT}
    ai_miss = {"hit": miss, "evidence_turns": list_of(turn), "reason": TEXT}
    audit = {
        "deceptive_fabrication": {"anyOf": [closed_object(found), closed_object(cleared)]},
        "ai_generated_style": {"anyOf": [closed_object(ai_found), closed_object(ai_miss)]},
        "summary": TEXT,
    }
    return ReplySchema("audit", closed_object(audit))


# ---- outcomes ----
def call_outcome(actions: Sequence[str], agent_ended: bool = False) -> str:
    """The call's outcome from the simulator's action labels (§5.2): "success" (ConfirmAdded), "hang_up" (HangUp,
    or ``agent_ended``: the agent's ``<status=end>``) or "turn_limit". ConfirmAdded and HangUp end the call, so an
    action after either is an error, as is an unknown label."""
    for i, action in enumerate(actions):
        if action not in DIALOGUE_ACTIONS:
            raise ValueError(f"unknown dialogue action {action!r} at turn {i + 1}")
        if action in (SUCCESS_ACTION, HANGUP_ACTION):
            if i != len(actions) - 1:
                raise ValueError(f"{action} at turn {i + 1} ends the call, but {len(actions) - i - 1} turns follow")
            return "success" if action == SUCCESS_ACTION else "hang_up"
    return "hang_up" if agent_ended else "turn_limit"


# ---- the simulator's prompt, which needs the labels above ----
def simulator_prompt(profile: dict, story: Story, trace: Sequence[SimulatorTurn] = (), lang: str = "en") -> str:
    """Table 9 (our rendering): STORY, scene few-shots, the full customer-side profile, the state trace (initial
    state, then each earlier turn's codes, labels and scores), and the rubric and label lists of this module."""
    initial = profile["runtime_state"]["initial_state"]
    lines = [f"Initial state: {fmt({s: initial[s] for s in SCORES})}"]
    for i, t in enumerate(trace, 1):
        fired = ", ".join(t.rubric_hits) or "none"
        lines.append(f"Turn {i}: fired {fired}; intent {t.intent}; action {t.action}; {fmt(t.state())}")

    fields = {
        "story": story.story,
        "scene_fewshots": "\n".join(f"- {k}: " + " / ".join(v) for k, v in story.scene_fewshots.items()),
        "profile_json": json.dumps(customer_view(profile), ensure_ascii=False),
        "state_trace": "\n".join(lines),
        "rubric": rubric_text(),
        "intents": "\n".join(f"- {k}: {v}" for k, v in INTENTS.items()),
        "actions": ", ".join(DIALOGUE_ACTIONS),
    }
    return render(load_template("user_simulator", lang), fields)


# ---- story cache ----
class StoryCache:
    """Compiled stories, one JSON file per profile (``DIR/<sample_id>.json``). A file is trusted only if it
    validates and was compiled from the same profile (its SHA-256 is stored); otherwise the story is recompiled."""

    def __init__(self, directory: str | Path, lang: str = "en") -> None:
        self.dir = Path(directory)
        self.lang = lang

    def path(self, profile: dict) -> Path:
        sample_id = profile["case_control"]["sample_id"]
        if not _SAMPLE_ID.match(sample_id):
            raise ValueError(f"sample_id {sample_id!r} is not a safe file name")
        return self.dir / f"{sample_id}.json"

    def load(self, profile: dict) -> Story | None:
        """The cached story, or ``None`` when absent, corrupt, invalid or compiled from another profile."""
        try:
            obj = json.loads(self.path(profile).read_text(encoding="utf-8"))
            if obj.get("profile_sha256") != _digest(profile):
                return None
            return validate_story(obj)
        except (OSError, ValueError, AttributeError):
            return None

    def get_or_compile(self, profile: dict, compile_fn: Callable[[str], str]) -> Story:
        """The cached story, or ``compile_fn(Table 8 prompt)`` validated and stored (temp file + rename). An invalid
        compiler output raises ``ValueError`` and nothing is stored."""
        story = self.load(profile)
        if story is not None:
            return story
        story = validate_story(compile_fn(story_compiler_prompt(profile, self.lang)))
        self.dir.mkdir(parents=True, exist_ok=True)
        target = self.path(profile)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({**story.to_json(), "profile_sha256": _digest(profile)}, f, ensure_ascii=False)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return story


def _digest(profile: dict) -> str:
    return hashlib.sha256(json.dumps(profile, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
