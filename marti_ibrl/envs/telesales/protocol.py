"""TeleSales turn protocols of the two training roles (paper Appendix E, Tables 15 and 16).

* Sales agent (Table 15): free spoken text with optional markers: the tools
  ``<call_function=add_business_contact(phone_number=PHONE_NUMBER)>`` and ``<call_function=send_contact_invitation>``
  (each at most once; the environment also enforces at most once per *call*) and ``<status=end>`` (ends the call).
* Customer (Table 16): exactly one JSON object per turn with ``behavior`` (one of :data:`BEHAVIORS`), ``stage``
  (one of :data:`STAGES`), ``willingness_before/after/delta``, ``patience_before/after/delta`` and ``reply``.
  Scores lie in [0, 1], deltas in [-0.20, 0.15], ``after = clip(before + delta, 0, 1)`` and ``before`` equals the
  previous turn's ``after`` (all within :data:`TOLERANCE`). Extra keys are ignored; a JSON object wrapped in one
  markdown fence (```json ... ```) is accepted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from marti_ibrl.safeparse import raw_decode, unfence

TOOL_ARGS = {"add_business_contact": ("phone_number",), "send_contact_invitation": ()}
"""Table 15's tools and their arguments."""
TOOLS = tuple(TOOL_ARGS)
BEHAVIORS = (
    "Greeting", "AskQuestion", "ExpressConcern", "Hesitate", "RequestValue", "PartialAgree", "AgreeWeChat",
    "DeclineSoft", "DeclineHard", "HangUp", "Interruption", "ConfirmAdded", "IgnoreRequest", "RejectRequest",
)  # fmt: skip
"""Table 16, behavior policy rule 4: the 14 customer behaviors."""
AFTER_AGREEMENT = ("ConfirmAdded", "IgnoreRequest", "RejectRequest")
"""Table 16, rule 5: available only after the customer has verbally agreed to add WeChat (``AgreeWeChat``)."""
STAGES = ("opening", "exploration", "objection", "decision", "wechat_pending")
SCORES = ("willingness", "patience")
DELTA_RANGE = (-0.20, 0.15)
TOLERANCE = 0.011
"""Numeric slack for the consistency checks (scores are written with two decimals)."""
KEYS = ("behavior", "stage", *(f"{s}_{k}" for s in SCORES for k in ("before", "after", "delta")), "reply")

# whitespace before a missing argument list has one reading only (``\s*(?:\(...\))?\s*>`` is quadratic in it)
_MARKER = re.compile(r"<\s*(call_function|status)\s*=\s*([A-Za-z_]\w*)\s*(?:\(([^()<>]*)\)\s*)?>")
_LEFTOVER = re.compile(r"call_function|<\s*status\b|status\s*=\s*end", re.IGNORECASE)


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SalesTurn:
    """A parsed sales turn: ``utterance`` is the spoken text with the markers removed."""

    utterance: str = ""
    tools: tuple[ToolCall, ...] = ()
    end: bool = False
    error: str | None = None  # set iff the turn is malformed


@dataclass(frozen=True)
class CustomerTurn:
    """A parsed customer turn (Table 16's output JSON), or ``error`` when it is invalid."""

    behavior: str = ""
    stage: str = ""
    willingness_before: float = 0.0
    willingness_after: float = 0.0
    willingness_delta: float = 0.0
    patience_before: float = 0.0
    patience_after: float = 0.0
    patience_delta: float = 0.0
    reply: str = ""
    error: str | None = None

    def after(self) -> dict[str, float]:
        return {s: getattr(self, f"{s}_after") for s in SCORES}


def _parse_args(name: str, raw: str | None) -> dict[str, str] | str:
    """``key=value, ...`` (values may be quoted) -> dict, or an error string."""
    pairs = [part.partition("=") for part in (raw or "").split(",") if part.strip()]
    args = {k.strip(): v.strip().strip("'\"").strip() for k, eq, v in pairs if eq}
    if len(args) != len(pairs) or not all(args.values()) or tuple(args) != TOOL_ARGS[name]:
        expected = ", ".join(f"{a}=..." for a in TOOL_ARGS[name]) or "no arguments"
        return f"{name} takes {expected}, got {raw!r}"
    return args


def parse_sales_turn(text: str) -> SalesTurn:
    """Parse a Table-15 sales turn. Errors: an unknown tool or status, bad tool arguments, the same tool twice in
    the turn, a marker-like fragment that is not a well-formed marker, or an empty turn."""
    tools: list[ToolCall] = []
    end = False
    for m in _MARKER.finditer(text):
        kind, name, raw_args = m.groups()
        if kind == "status":
            if name != "end" or raw_args is not None:
                return SalesTurn(error=f"unknown status marker {m.group(0)!r} (only <status=end>)")
            end = True
            continue
        if name not in TOOLS:
            return SalesTurn(error=f"unknown call_function {name!r} (tools: {', '.join(TOOLS)})")
        if any(t.name == name for t in tools):
            return SalesTurn(error=f"{name} called twice in one turn")
        args = _parse_args(name, raw_args)
        if isinstance(args, str):
            return SalesTurn(error=args)
        tools.append(ToolCall(name, args))
    rest = _MARKER.sub(" ", text)
    if _LEFTOVER.search(rest):
        return SalesTurn(error="malformed marker (expected <call_function=NAME> / <call_function=NAME(k=v)> / "
                         "<status=end>)")  # fmt: skip
    utterance = " ".join(rest.split())
    if not utterance and not tools and not end:
        return SalesTurn(error="empty turn")
    return SalesTurn(utterance=utterance, tools=tuple(tools), end=end)


def reused_tool(turn: SalesTurn, earlier: Iterable[ToolCall]) -> str | None:
    """The first tool of ``turn`` already called earlier in the call (each tool at most once per call), or None."""
    used = {c.name for c in earlier}
    return next((t.name for t in turn.tools if t.name in used), None)


def _load_object(text: str) -> dict | str:
    """Exactly one JSON object (optionally in one markdown fence), or an error string (:mod:`marti_ibrl.safeparse`:
    too long a number or too deep a nesting is invalid JSON)."""
    body = unfence(text)
    try:
        obj, end = raw_decode(body)
    except json.JSONDecodeError as e:
        return f"invalid JSON: {e.msg}"
    if body[end:].strip():
        return "text after the JSON object (exactly one JSON object per turn)"
    return obj if isinstance(obj, dict) else "the turn must be a JSON object"


def parse_customer_turn(
    text: str,
    expected_before: dict[str, float] | None = None,
    *,
    wechat_agreed: bool | None = None,
    contact_sent: bool | None = None,
) -> CustomerTurn:
    """Parse and validate a Table-16 customer turn.

    ``expected_before``: the environment's current ``{"willingness": w, "patience": p}``, which ``*_before`` must
    equal. ``wechat_agreed``: whether an earlier turn was ``AgreeWeChat`` (Table 16, rule 5: ``ConfirmAdded``,
    ``IgnoreRequest`` and ``RejectRequest`` need it). ``contact_sent``: whether the sales agent has issued a contact
    tool call (``ConfirmAdded`` needs one: there is nothing to confirm otherwise). ``None`` skips a check.
    """
    obj = _load_object(text)
    if isinstance(obj, str):
        return CustomerTurn(error=obj)
    missing = [k for k in KEYS if k not in obj]
    if missing:
        return CustomerTurn(error=f"missing keys: {', '.join(missing)}")
    for key in ("behavior", "stage", "reply"):
        if not isinstance(obj[key], str):
            return CustomerTurn(error=f"{key} must be a string")
    if obj["behavior"] not in BEHAVIORS:
        return CustomerTurn(error=f"unknown behavior {obj['behavior']!r}")
    if obj["stage"] not in STAGES:
        return CustomerTurn(error=f"unknown stage {obj['stage']!r} (one of {', '.join(STAGES)})")
    if not obj["reply"].strip():
        return CustomerTurn(error="empty reply")
    not_numbers = [k for k in KEYS[2:-1] if isinstance(obj[k], bool) or not isinstance(obj[k], (int, float))]
    if not_numbers:
        return CustomerTurn(error=f"{not_numbers[0]} must be a number")
    values = {k: float(obj[k]) for k in KEYS[2:-1]}
    lo, hi = DELTA_RANGE
    for s in SCORES:
        before, after, delta = (values[f"{s}_{k}"] for k in ("before", "after", "delta"))
        if not (0.0 <= before <= 1.0 and 0.0 <= after <= 1.0):
            return CustomerTurn(error=f"{s} scores must lie in [0, 1]")
        if not lo - 1e-9 <= delta <= hi + 1e-9:
            return CustomerTurn(error=f"{s}_delta {delta} outside [{lo}, {hi}]")
        if abs(after - min(1.0, max(0.0, before + delta))) > TOLERANCE:
            return CustomerTurn(error=f"{s}_after {after} != clip({s}_before {before} + {s}_delta {delta})")
        if expected_before is not None and abs(before - expected_before[s]) > TOLERANCE:
            return CustomerTurn(error=f"{s}_before {before} != the current {s} {expected_before[s]}")
    behavior = obj["behavior"]
    if wechat_agreed is False and behavior in AFTER_AGREEMENT:
        return CustomerTurn(error=f"{behavior} is only available after AgreeWeChat")
    if contact_sent is False and behavior == "ConfirmAdded":
        return CustomerTurn(error="ConfirmAdded before the sales agent sent a contact request")
    return CustomerTurn(behavior=behavior, stage=obj["stage"], reply=obj["reply"].strip(), **values)


def format_customer_turn(behavior: str, stage: str, reply: str, before: dict, delta: dict | None = None) -> str:
    """A consistent Table-16 JSON turn: ``after = clip(before + delta)`` (deltas default to 0)."""
    delta = delta or {}
    obj: dict[str, object] = {"behavior": behavior, "stage": stage}
    for s in SCORES:
        d = delta.get(s, 0.0)
        obj |= {f"{s}_before": before[s], f"{s}_after": round(min(1.0, max(0.0, before[s] + d)), 4), f"{s}_delta": d}
    obj["reply"] = reply
    return json.dumps(obj, ensure_ascii=False)
