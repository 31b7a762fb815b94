"""The TeleSales held-out evaluation call (paper §5.2 and Appendix D): a frozen sales agent against the user simulator
on an *evaluation* profile (Table 6), as a :class:`~marti_ibrl.envs.base.DialogueEnv` the
:class:`~marti_ibrl.rollout.runner.DialogueRunner` plays like any other (turn-batched, ``fixed_seats``).

Scenario: an :class:`EvalCase`, the evaluation profile with its compiled story (Table 8 output,
:class:`~.outputs.StoryCache`). Seats: ``sales`` opens, then ``customer`` (:data:`SEATS`, as in training).

* **Sales seat**, two kinds (``sales_mode``):

  - ``"checkpoint"``: a trained policy sees exactly its training format: the Table 15 system prompt over the lead
    fields (:func:`training_sales_prompt`) and, as the other side's turns, the customer's spoken ``reply`` only
    (:meth:`TeleSalesEvalEnv.counterpart_text`). Its turn is free text with Table 15's markers
    (:func:`~marti_ibrl.envs.telesales.protocol.parse_sales_turn`); a malformed turn is re-sampled by the runner
    and then ends the call as ``malformed`` (no success), as in training.
  - ``"prompted"``: a frontier baseline gets the Table 10 prompt
    (:func:`~marti_ibrl.envs.telesales.prompts.sales_eval_prompt`) and answers with Table 10's JSON
    (``thinking_content``, ``agent_action``, ``agent_message``; :func:`~.outputs.validate_sales_turn`). The turn's
    text in the transcript is that JSON; what is *said* is ``agent_message``.

  In both, each contact tool may be used once per call (a second use is an invalid turn) and ``<status=end>`` ends
  the call (``agent_end``).
* **Customer seat**: the user simulator (:class:`~.agents.UserSimulator`), one Table 9 JSON turn per reply
  (:func:`~.outputs.validate_simulator_turn` with the scores before the turn, via :meth:`check_customer`). The
  environment applies the Table 11 rubric itself: the new willingness/trust/patience are
  :func:`~.rubric.apply_rubric` of the fired codes (summed, clipped to [0, 1]); the simulator's own numbers
  only have to agree within :data:`~marti_ibrl.envs.telesales.protocol.TOLERANCE`. Intents and dialogue actions
  are kept in ``state.trace``.
  Our rule on top of Table 9: ``ConfirmAdded`` is accepted only after the agent issued a contact tool (Table 9's
  rendering says so: "use it only after the agent has actually sent the contact invitation or entry"). The
  simulator's request carries these rules as a JSON schema (:meth:`TeleSalesEvalEnv.customer_schema`, without
  ``ConfirmAdded`` before a contact tool); its reply is checked all the same.
* **Endings** (§5.2): the outcome is read from the simulator's action labels (:func:`~.outputs.call_outcome`):
  ``success`` (``ConfirmAdded``) and ``hang_up`` (``HangUp``) end the call; so do the agent's ``<status=end>``
  (``agent_end``) and the turn limit (``turn_limit``: ``2 * case_control.max_turns`` turns, both roles counted,
  unless ``max_turns`` overrides it). Endings outside the rules: ``malformed`` (the sales agent's fault),
  ``context_limit`` (a checkpoint's context is full) and ``counterpart_failure`` (a turn could not be produced after
  the client's retries; players say why with :meth:`TeleSalesEvalEnv.fail`). A prompted sales agent whose replies
  stay invalid after its client's retries (``bad_output``) is the policy's own failure, so that ends as
  ``malformed``, not as a counterpart failure.

Ours, not the paper's: the ``case_control.max_turns`` reading, the ConfirmAdded precondition, the JSON-as-transcript
record of prompted turns, and what each side hears (tool markers as the bracketed notes of
``prompts.PHRASES``, the customer's ``reply`` only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from marti_ibrl.envs.base import Outcome, TurnResult
from marti_ibrl.envs.telesales.env import TeleSalesEnv, check_turn, record_turn
from marti_ibrl.envs.telesales.profiles import TRAIN_ALIASES, TRAIN_GROUPS, sales_view
from marti_ibrl.envs.telesales.prompts import sales_eval_prompt, sales_prompt
from marti_ibrl.envs.telesales.protocol import ToolCall, parse_sales_turn, reused_tool
from marti_ibrl.eval.telesales.outputs import (
    DIALOGUE_ACTIONS,
    SUCCESS_ACTION,
    SimulatorTurn,
    Story,
    call_outcome,
    simulator_prompt,
    simulator_turn_schema,
    validate_sales_turn,
    validate_simulator_turn,
)
from marti_ibrl.eval.telesales.rubric import SCORES, apply_rubric
from marti_ibrl.reply_schema import ReplySchema

SEATS = ("sales", "customer")
SALES_MODES = ("checkpoint", "prompted")
SUCCESS, HANG_UP, AGENT_END, TURN_LIMIT, MALFORMED = "success", "hang_up", "agent_end", "turn_limit", "malformed"
RULE_ENDINGS = (SUCCESS, HANG_UP, AGENT_END, TURN_LIMIT)
"""Endings by the rules of the call (module doc); others (malformed, context_limit, counterpart_failure) are not."""


@dataclass(frozen=True)
class EvalCase:
    """One evaluation profile (Appendix D layout, ``split == "eval"``) and its compiled story."""

    profile: dict
    story: Story

    def __post_init__(self) -> None:
        split = self.profile.get("generation_meta", {}).get("split") if isinstance(self.profile, dict) else None
        if split != "eval":
            raise ValueError(f"the held-out evaluation plays evaluation profiles (Table 6), got split {split!r}")

    @property
    def uid(self) -> str:
        return self.profile["case_control"]["sample_id"]


@dataclass
class EvalCallState:
    """The mutable state of one evaluation call."""

    case: EvalCase
    max_turns: int
    initial: dict[str, float]  # willingness / trust / patience before the first customer turn
    scores: dict[str, float]  # current scores (after the last customer turn)
    n_turns: int = 0
    trace: list[SimulatorTurn] = field(default_factory=list)  # customer turns, scores as the env computed them
    tool_calls: list[tuple[int, ToolCall]] = field(default_factory=list)  # (turn index, call)
    agent_actions: list[str] = field(default_factory=list)  # Table 10 agent_action per sales turn (prompted only)
    history: list[tuple[str, str]] = field(default_factory=list)  # applied turns (role, text)
    failure: dict[str, str] | None = None  # why a player could not produce a turn ({"role", "kind", "detail"})
    done: bool = False
    success: bool = False
    malformed: bool = False
    reason: str = ""

    @property
    def next_role(self) -> str:
        return SEATS[self.n_turns % 2]

    def actions(self) -> list[str]:
        return [t.action for t in self.trace]


def training_sales_prompt(profile: dict, lang: str = "en", service: Mapping[str, str] | None = None) -> str:
    """Table 15, the prompt a checkpoint was trained with, over an evaluation profile's lead fields: the lead is handed
    to :func:`~marti_ibrl.envs.telesales.prompts.sales_prompt` under its training field names
    (:data:`~marti_ibrl.envs.telesales.profiles.TRAIN_ALIASES`)."""
    lead = sales_view(profile)
    as_training: dict[str, Any] = {group: {} for group in TRAIN_GROUPS}
    as_training["lead"] = {f: lead[TRAIN_ALIASES.get(f, f)] for f in TRAIN_GROUPS["lead"]}
    as_training["generation_meta"] = {"split": "train"}
    return sales_prompt(as_training, lang, service)


class TeleSalesEvalEnv:
    """The held-out evaluation call (module doc). ``sales_mode``: ``"checkpoint"`` (Table 15 format) or
    ``"prompted"`` (Table 10 JSON). ``max_turns`` overrides ``2 * case_control.max_turns`` (both roles' turns)."""

    roles = SEATS
    fixed_seats = SEATS  # the sales agent opens every call

    def __init__(
        self,
        sales_mode: str = "checkpoint",
        lang: str = "en",
        service: Mapping[str, str] | None = None,
        max_turns: int | None = None,
    ) -> None:
        if sales_mode not in SALES_MODES:
            raise ValueError(f"unknown sales_mode {sales_mode!r} (one of {', '.join(SALES_MODES)})")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.sales_mode, self.lang, self.max_turns = sales_mode, lang, max_turns
        self.service = dict(service or {})
        self._training = TeleSalesEnv(lang=lang)  # its counterpart_text: tool markers as notes, as in training

    # -- prompts and views ---------------------------------------------------------------------------------------

    def system_prompt(self, case: EvalCase, role: str) -> str:
        """Sales: Table 15 (checkpoint) or Table 10 (prompted), lead fields only. Customer: Table 9 with the initial
        state (the simulator renders it again every turn with the state trace, :meth:`simulator_prompt`)."""
        if role == "sales":
            if self.sales_mode == "checkpoint":
                return training_sales_prompt(case.profile, self.lang, self.service)
            return sales_eval_prompt(case.profile, self.lang, self.service)
        if role == "customer":
            return simulator_prompt(case.profile, case.story, (), self.lang)
        raise ValueError(f"unknown role {role!r}; roles are {list(SEATS)}")

    def simulator_prompt(self, state: EvalCallState) -> str:
        """Table 9 for the next customer turn: story, profile and the state trace so far."""
        return simulator_prompt(state.case.profile, state.case.story, state.trace, self.lang)

    def spoken(self, role: str, text: str) -> str:
        """What ``role`` said aloud in a transcript turn: the sales utterance with its markers (``agent_message`` of a
        prompted turn), the customer's ``reply``; the text itself when it does not parse. The post-dialogue audit
        reads these (Table 12: tool markers are normal, the simulator's labels and scores are not evidence)."""
        try:
            if role == "customer":
                return validate_simulator_turn(text).reply
            if self.sales_mode == "prompted":
                return validate_sales_turn(text).agent_message
        except ValueError:
            return text
        return text

    def counterpart_text(self, speaker: str, text: str, case: Any = None) -> str:
        """How ``speaker``'s turn reaches the other side: the customer's ``reply`` only; the agent's spoken words
        with tool and end markers as bracketed notes (as in training)."""
        if speaker not in SEATS:
            raise ValueError(f"unknown role {speaker!r}; roles are {list(SEATS)}")
        said = self.spoken(speaker, text)
        return said if speaker == "customer" else self._training.counterpart_text("sales", said, None)

    # -- turn checks (shared by the players, which validate before answering, and by step) -----------------------

    def parse_sales(self, state: EvalCallState, raw: str | Mapping[str, Any]) -> tuple[Any, str | None]:
        """(markers parsed, Table 10 ``agent_action`` or None) of a sales turn, or ``ValueError``: a malformed turn
        in the seat's format, or a contact tool already used in this call."""
        if self.sales_mode == "prompted":
            turn = validate_sales_turn(raw)
            parsed, action = turn.turn, turn.agent_action
        else:
            if not isinstance(raw, str):
                raise ValueError("a checkpoint's sales turn is text")
            parsed, action = parse_sales_turn(raw), None
            if parsed.error:
                raise ValueError(f"sales turn: {parsed.error}")
        again = reused_tool(parsed, (c for _, c in state.tool_calls))
        if again:
            raise ValueError(f"sales turn: {again} was already used in this call (each tool at most once)")
        return parsed, action

    def check_customer(self, state: EvalCallState, raw: str | Mapping[str, Any]) -> SimulatorTurn:
        """A valid Table 9 turn for the current scores (``ValueError`` otherwise), with the scores replaced by the
        rubric's exact values (:func:`~.rubric.apply_rubric`)."""
        turn = validate_simulator_turn(raw, before=state.scores)
        if turn.action == SUCCESS_ACTION and not state.tool_calls:
            raise ValueError(f"simulator turn: {SUCCESS_ACTION} before the agent sent a contact invitation or entry")
        return replace(turn, **apply_rubric(state.scores, turn.rubric_hits))

    def customer_schema(self, state: EvalCallState) -> ReplySchema:
        """The JSON schema of the Table 9 turns :meth:`check_customer` can accept now
        (:func:`~.outputs.simulator_turn_schema`): ``ConfirmAdded`` only once the agent has used a contact tool."""
        allowed = DIALOGUE_ACTIONS if state.tool_calls else tuple(a for a in DIALOGUE_ACTIONS if a != SUCCESS_ACTION)
        return simulator_turn_schema(allowed)

    # -- DialogueEnv ---------------------------------------------------------------------------------------------

    def new_state(self, case: EvalCase, seats: Sequence[str] | None = None) -> EvalCallState:
        if tuple(seats or SEATS) != SEATS:
            raise ValueError(f"TeleSales seats must be {list(SEATS)} (the sales agent opens), got {list(seats or ())}")
        initial = {s: float(case.profile["runtime_state"]["initial_state"][s]) for s in SCORES}
        limit = self.max_turns or 2 * int(case.profile["case_control"]["max_turns"])
        return EvalCallState(case=case, max_turns=limit, initial=dict(initial), scores=dict(initial))

    def current_role(self, state: EvalCallState) -> str:
        return state.next_role

    def step(self, state: EvalCallState, role: str, text: str) -> TurnResult:
        """Apply one turn; an invalid one changes nothing."""
        check_turn(state, role)
        if role == "customer":
            try:
                turn = self.check_customer(state, text)
            except ValueError as e:
                return TurnResult(valid=False, done=False, reason=f"malformed: {e}")
            state.trace.append(turn)
            state.scores = turn.state()
            label = call_outcome(state.actions())
            self._record(state, role, text, label if label in (SUCCESS, HANG_UP) else None)
            return TurnResult(valid=True, done=state.done, reason=state.reason)
        try:
            parsed, action = self.parse_sales(state, text)
        except ValueError as e:
            return TurnResult(valid=False, done=False, reason=f"malformed: {e}")
        state.tool_calls += [(state.n_turns, t) for t in parsed.tools]
        if action is not None:
            state.agent_actions.append(action)
        self._record(state, role, text, AGENT_END if parsed.end else None)
        return TurnResult(valid=True, done=state.done, reason=state.reason)

    def fail(self, state: EvalCallState, role: str, kind: str, detail: str) -> None:
        """A player could not produce ``role``'s turn (it then returns ``None``; the runner calls :meth:`abort`)."""
        state.failure = {"role": role, "kind": kind, "detail": detail}

    def finish_malformed(self, state: EvalCallState, role: str) -> None:
        """``role``'s turn stayed invalid after the runner's re-samples: the sales agent's fault ends the call as
        malformed; an invalid simulator turn (its player validates first, so this is unexpected) as a failure."""
        check_turn(state, role)
        if role == "sales":
            state.malformed = True
            self._end(state, MALFORMED)
        else:
            self.fail(state, role, "bad_output", "the simulator turn stayed invalid after the re-samples")
            self._end(state, "counterpart_failure")

    def abort(self, state: EvalCallState, reason: str) -> None:
        """End without success for a reason outside the call (context limit, a player's failure). A prompted sales
        agent that kept answering invalid JSON (``bad_output``) is counted as malformed, not as a failure."""
        if state.done:
            return
        if state.failure is None and reason == "counterpart_failure":
            self.fail(state, state.next_role, "no_reply", "the player returned no turn")
        if state.failure and state.failure["role"] == "sales" and state.failure["kind"] == "bad_output":
            state.malformed, reason = True, MALFORMED
        self._end(state, reason)

    def outcome(self, state: EvalCallState) -> Outcome:
        """``agreed``: a successful contact add. ``info["outcome"]`` is :func:`~.outputs.call_outcome`'s label for
        calls that ended by the rules, else ``None``."""
        if not state.done:
            raise ValueError("the call is not over yet")
        label = call_outcome(state.actions(), state.reason == AGENT_END) if state.reason in RULE_ENDINGS else None
        return Outcome(
            agreed=state.success,
            malformed=state.malformed,
            utilities={"sales": float(state.success), "customer": 0.0},
            info={
                "reason": state.reason,
                "outcome": label,
                "n_turns": state.n_turns,
                "initial": dict(state.initial),
                "final": dict(state.scores),
                "failure": dict(state.failure) if state.failure else None,
                "tool_calls": [{"turn": i, "name": c.name, "args": dict(c.args)} for i, c in state.tool_calls],
                "agent_actions": list(state.agent_actions),
                "trace": [
                    {"rubric_hits": list(t.rubric_hits), **t.state(), "intent": t.intent, "action": t.action}
                    for t in state.trace
                ],
            },
        )

    def reward(self, state: EvalCallState, role: str) -> float:
        """1.0 for the sales agent on a successful add, else 0.0 (evaluation has no training reward)."""
        if role not in SEATS:
            raise ValueError(f"unknown role {role!r}; roles are {list(SEATS)}")
        return self.outcome(state).utilities[role]

    # -- helpers -------------------------------------------------------------------------------------------------

    def _record(self, state: EvalCallState, role: str, text: str, end: str | None) -> None:
        if why := record_turn(state, role, text, end, state.max_turns):
            self._end(state, why)

    @staticmethod
    def _end(state: EvalCallState, reason: str) -> None:
        state.done, state.reason, state.success = True, reason, reason == SUCCESS


def simulator_turn_json(turn: SimulatorTurn) -> str:
    """A Table 9 turn as the JSON text the transcript keeps (the customer's turn text)."""
    obj = {"rubric_hits": list(turn.rubric_hits), **turn.state(), "intent": turn.intent, "action": turn.action}
    return json.dumps({**obj, "reply": turn.reply}, ensure_ascii=False)
