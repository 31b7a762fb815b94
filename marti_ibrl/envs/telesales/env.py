"""The Vehicle TeleSales environment for bilateral training (paper §5.1; Appendix E, Tables 15 and 16).

A sales agent calls a customer (a *training* profile, ``split="train"``) to get the business WeChat contact added.
Turn protocols: :mod:`.protocol`. ``sales`` (Table 15) always opens: seats must be :data:`SEATS` (``fixed_seats``: the
runner does not rotate the opener as it does for symmetric games); each tool at most
once per call (a second use in a later turn is invalid). ``customer`` (Table 16) answers with one JSON object whose
``*_before`` equals the current willingness/patience (the previous ``*_after``; first: :func:`initial_scores`).

Invalid turns leave the game unchanged (only ``state.rejected`` keeps a rejected customer attempt); the runner
re-samples them (``max_resamples``). A sales turn still
invalid after that ends the call as malformed (``invalid_penalty`` for the sales agent). A customer turn still
invalid gets a **fallback** instead (:meth:`TeleSalesEnv.finish_malformed`): behavior ``Hesitate``, stage
unchanged, both deltas 0, and as reply the reply of the rejected attempt when its JSON is well formed on its own
(:func:`visible_reply`), else the fallback reply (``prompts.PHRASES``); ``state.fallbacks`` counts them and the call goes on.

The call ends on ``ConfirmAdded`` (success), ``HangUp``, the sales ``<status=end>`` or after ``max_turns`` turns
(both roles' turns counted). **Success rule:** ``ConfirmAdded`` is a valid customer turn only after an earlier
``AgreeWeChat`` turn (Table 16, rule 5) *and* after the sales agent issued at least one of the two contact tools
(there is nothing to confirm otherwise); a valid ``ConfirmAdded`` ends the call as a success. ``IgnoreRequest``
and ``RejectRequest`` need the verbal agreement only and do not end the call.

What each role sees (:meth:`TeleSalesEnv.counterpart_text`): the customer, the sales utterance with its markers as
bracketed notes ("[The agent sent a WeChat friend request to 138...]"); the sales agent, only the customer's
``reply``, never the scored JSON. The system prompt is rendered once per dialogue (initial state) and
``counterpart_text`` is stateless, so the customer reads its current scores from its own previous JSON turn, an
assistant message of its view (Table 16: "previous structured customer outputs as assistant messages"). After a
fallback its view holds the rejected attempt instead (the runner appends it); the fallback's zero deltas keep the
scores at the last valid turn's ``*_after``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marti_ibrl.envs.base import Outcome, TurnResult
from marti_ibrl.envs.telesales import protocol
from marti_ibrl.envs.telesales.profiles import MAX_TURNS, STATE_BASE, STATE_EFFECTS, flat_fields
from marti_ibrl.envs.telesales.prompts import customer_prompt, phrase, sales_prompt

SEATS = ("sales", "customer")
"""The only speaking order: the sales agent opens the call."""
# Reasons recorded in ``state.reason`` / ``outcome.info["reason"]``.
SUCCESS = "contact_added"
HANG_UP = "hang_up"
SALES_END = "sales_end"
TURN_LIMIT = "turn_limit"
MALFORMED = "malformed"
FALLBACK_BEHAVIOR = "Hesitate"
FALLBACK_REPLY = phrase("fallback_reply")
"""The fallback's reply in English; ``prompts.PHRASES`` has it per language."""


def initial_scores(profile: dict) -> dict[str, float]:
    """Willingness and patience before the first customer turn.

    Evaluation profiles carry them (``runtime_state.initial_state``). Training profiles do not (Table 5); there
    they follow the evaluation formula of :func:`profiles.initial_state` without its noise: base + the field
    effects the training fields allow (``same_city`` from city vs. car city, ``purchase_experience`` from the
    background; the missing ``price_sensitivity`` counts as neutral), clipped to [0.05, 0.95], 2 decimals.
    """
    p = flat_fields(profile)
    if all(s in p for s in protocol.SCORES):
        return {s: float(p[s]) for s in protocol.SCORES}
    p.setdefault("same_city", p.get("city") == p.get("car_city"))
    p.setdefault("purchase_experience", str(p.get("background", "")).split(";")[0])
    scores = {}
    for s in protocol.SCORES:
        x = STATE_BASE[s] + sum(table.get(p.get(f), 0.0) for f, table in STATE_EFFECTS[s].items())
        scores[s] = round(min(0.95, max(0.05, x)), 2)
    return scores


def visible_reply(text: str, lang: str = "en") -> str:
    """What the sales agent hears of a customer turn: its ``reply`` when the JSON is well formed on its own (every
    check of :func:`protocol.parse_customer_turn` that needs no dialogue state), else the fallback reply in
    ``lang``."""
    turn = protocol.parse_customer_turn(text)
    return phrase("fallback_reply", lang) if turn.error else turn.reply


@dataclass
class TeleSalesState:
    """The mutable, picklable state of one call."""

    profile: dict
    seats: tuple[str, ...]
    initial: dict[str, float]  # willingness/patience before the first customer turn
    scores: dict[str, float]  # current willingness/patience (the last customer turn's *_after)
    stage: str = "opening"
    n_turns: int = 0
    wechat_agreed: bool = False  # an AgreeWeChat turn was seen
    tool_calls: list[tuple[int, protocol.ToolCall]] = field(default_factory=list)  # (turn index, call)
    behaviors: list[str] = field(default_factory=list)  # the customer's behavior per turn (fallbacks included)
    history: list[tuple[str, str]] = field(default_factory=list)  # applied turns (role, text); fallbacks as JSON
    fallbacks: int = 0  # customer turns replaced by the fallback
    rejected: str | None = None  # the last rejected customer attempt (source of the fallback's reply)
    done: bool = False
    success: bool = False
    malformed: bool = False
    fault_role: str | None = None
    reason: str = ""

    @property
    def next_role(self) -> str:
        return self.seats[self.n_turns % len(self.seats)]


class TeleSalesEnv:
    """Two-role TeleSales implementing :class:`marti_ibrl.envs.base.DialogueEnv` (module doc: rules, visibility).

    ``max_turns`` counts both roles' turns (default: ``2 * profiles.MAX_TURNS``, i.e. 20 exchanges; §5.1 does
    not print the paper's limit). ``lang`` picks the prompt templates; ``service`` overrides the sales agent's
    identity (:data:`prompts.DEFAULT_SERVICE` keys).
    """

    roles = SEATS
    fixed_seats = SEATS  # DialogueRunner plays every call in this order (no rotation of openers)

    def __init__(
        self,
        max_turns: int = 2 * MAX_TURNS,
        invalid_penalty: float = -1.0,
        lang: str = "en",
        service: Mapping[str, str] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.invalid_penalty = invalid_penalty
        self.lang = lang
        self.service = dict(service or {})

    # -- DialogueEnv ---------------------------------------------------------------------------------------------

    def system_prompt(self, scenario: dict, role: str) -> str:
        """Table 15 (lead fields only) for the sales agent; Table 16 (full profile + initial state) for the
        customer."""
        _check_profile(scenario)
        if role == "sales":
            return sales_prompt(scenario, self.lang, self.service)
        if role == "customer":
            return customer_prompt(scenario, initial_scores(scenario), self.lang)
        raise ValueError(f"unknown role {role!r}; roles are {list(self.roles)}")

    def counterpart_text(self, speaker: str, text: str, scenario: dict) -> str:
        """How ``speaker``'s turn is shown to the other role (module doc). A malformed sales turn is shown as
        written (the call ends right after it); a malformed customer turn as :func:`visible_reply` shows it."""
        if speaker == "customer":
            return visible_reply(text, self.lang)
        if speaker != "sales":
            raise ValueError(f"unknown role {speaker!r}; roles are {list(self.roles)}")
        turn = protocol.parse_sales_turn(text)
        if turn.error:
            return text
        notes = [phrase(f"note:{t.name}", self.lang, **t.args) for t in turn.tools]
        notes += [phrase("note:end", self.lang)] if turn.end else []
        return " ".join([turn.utterance, *notes]).strip()

    def new_state(self, scenario: dict, seats: Sequence[str] | None = None) -> TeleSalesState:
        """A fresh call; ``seats`` must be ``("sales", "customer")`` (the default)."""
        _check_profile(scenario)
        seats = tuple(SEATS if seats is None else seats)
        if seats != SEATS:
            raise ValueError(
                f"TeleSales seats must be {list(SEATS)} (the sales agent opens the call), got {list(seats)}; "
                "the sales agent opens every call"
            )
        scores = initial_scores(scenario)
        return TeleSalesState(profile=scenario, seats=seats, initial=dict(scores), scores=dict(scores))

    def current_role(self, state: TeleSalesState) -> str:
        return state.next_role

    def step(self, state: TeleSalesState, role: str, text: str) -> TurnResult:
        """Apply one turn; an invalid one changes nothing but ``state.rejected`` (the fallback's reply source)."""
        check_turn(state, role)
        if role == "customer":
            agreed, sent = state.wechat_agreed, bool(state.tool_calls)
            turn = protocol.parse_customer_turn(text, state.scores, wechat_agreed=agreed, contact_sent=sent)
            if turn.error:
                state.rejected = text
                return TurnResult(valid=False, done=False, reason=f"malformed: {turn.error}")
            self._apply_customer(state, turn, text)
            return TurnResult(valid=True, done=state.done, reason=state.reason)
        sales = protocol.parse_sales_turn(text)
        if sales.error:
            return TurnResult(valid=False, done=False, reason=f"malformed: {sales.error}")
        again = protocol.reused_tool(sales, (c for _, c in state.tool_calls))
        if again:
            return TurnResult(valid=False, done=False, reason=f"{again} was already used in this call")
        state.tool_calls += [(state.n_turns, t) for t in sales.tools]
        self._record(state, role, text, SALES_END if sales.end else None)
        return TurnResult(valid=True, done=state.done, reason=state.reason)

    def finish_malformed(self, state: TeleSalesState, role: str) -> None:
        """``role``'s turn stayed invalid after the re-samples (the runner has already appended the last attempt to
        both views). Sales: the call ends as malformed. Customer: the fallback turn (module doc) is applied, counted
        in ``state.fallbacks``, and the call goes on unless that reaches ``max_turns``."""
        check_turn(state, role)
        if role == "sales":
            state.malformed = True
            state.fault_role = role
            self._end(state, MALFORMED)
            return
        reply = visible_reply(state.rejected or "", self.lang)
        text = protocol.format_customer_turn(FALLBACK_BEHAVIOR, state.stage, reply, state.scores)
        state.fallbacks += 1
        self._apply_customer(state, protocol.parse_customer_turn(text), text)

    def abort(self, state: TeleSalesState, reason: str) -> None:
        """End without success for a reason outside the call (e.g. the context limit)."""
        if not state.done:
            self._end(state, reason)

    def outcome(self, state: TeleSalesState) -> Outcome:
        """``agreed`` = the contact was added; utilities: sales 1/0, customer 0 (it has no task utility)."""
        if not state.done:
            raise ValueError("the call is not over yet")
        return Outcome(
            agreed=state.success,
            malformed=state.malformed,
            utilities={"sales": float(state.success), "customer": 0.0},
            info={
                "reason": state.reason,
                "n_turns": state.n_turns,
                "fallbacks": state.fallbacks,
                "fault_role": state.fault_role,
                "stage": state.stage,
                "wechat_agreed": state.wechat_agreed,
                "initial": dict(state.initial),
                **{s: state.scores[s] for s in protocol.SCORES},
                "behaviors": list(state.behaviors),
                "tool_calls": [{"turn": i, "name": c.name, "args": dict(c.args)} for i, c in state.tool_calls],
            },
        )

    def reward(self, state: TeleSalesState, role: str) -> float:
        """The rule-based episode outcome only: sales 1.0 on success else 0.0 (plus ``invalid_penalty`` when its
        malformed turn ended the call); customer 0.0. The paper's TeleSales rewards come from LLM judges
        (§5.1 "Task-Specific Rewards": outcome-oriented sales, realism-oriented customer); they plug in later
        through the config's ``reward_fn``."""
        if role not in self.roles:
            raise ValueError(f"unknown role {role!r}; roles are {list(self.roles)}")
        value = self.outcome(state).utilities[role]
        return value + (self.invalid_penalty if state.malformed and state.fault_role == role else 0.0)

    # -- helpers -------------------------------------------------------------------------------------------------

    def _apply_customer(self, state: TeleSalesState, turn: protocol.CustomerTurn, text: str) -> None:
        state.scores = turn.after()
        state.stage = turn.stage
        state.behaviors.append(turn.behavior)
        state.rejected = None
        state.wechat_agreed |= turn.behavior == "AgreeWeChat"
        end = {"ConfirmAdded": SUCCESS, "HangUp": HANG_UP}.get(turn.behavior)  # ConfirmAdded: validated upstream
        state.success = end == SUCCESS
        self._record(state, "customer", text, end)

    def _record(self, state: TeleSalesState, role: str, text: str, end: str | None) -> None:
        """Append an applied turn; end the call with ``end`` or, failing that, at the turn limit."""
        if why := record_turn(state, role, text, end, self.max_turns):
            self._end(state, why)

    @staticmethod
    def _end(state: TeleSalesState, reason: str) -> None:
        state.done = True
        state.reason = reason


def record_turn(state: Any, role: str, text: str, end: str | None, max_turns: int) -> str | None:
    """The call bookkeeping both TeleSales envs share (training's and the evaluation's): an applied turn appended to
    ``state.history`` and counted; the reason the call ends with (``end``, else :data:`TURN_LIMIT` once ``max_turns``
    turns are played), or None while it goes on."""
    state.history.append((role, text))
    state.n_turns += 1
    return end or (TURN_LIMIT if state.n_turns >= max_turns else None)


def check_turn(state: Any, role: str) -> None:
    """Refuse a turn after the end of the call or out of order (``state``: ``done`` and ``next_role``)."""
    if state.done:
        raise ValueError("the call is already over")
    if role != state.next_role:
        raise ValueError(f"it is {state.next_role!r}'s turn, not {role!r}'s")


def _check_profile(profile: Any) -> None:
    split = profile.get("generation_meta", {}).get("split") if isinstance(profile, dict) else None
    if split != "train":
        raise ValueError(f"TeleSalesEnv plays training profiles (Tables 5, 15, 16), got split {split!r}")
