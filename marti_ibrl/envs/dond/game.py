"""The Deal-or-No-Deal environment (Lewis et al. 2017) with the paper's Table-17 turn protocol.

Rules implemented by :class:`DondEnv` (see also DESIGN.md §3):

* Seats alternate; a round is two turns, so a dialogue has at most ``2 * max_rounds`` turns; reaching the
  limit ends it without a deal.
* Invalid turns (``TurnResult(valid=False)``, state unchanged): malformed utterances (protocol.parse_utterance);
  a ``<try>``/``<selection>`` claiming more units of some item than exist; after the counterpart's
  ``<selection>``, anything but ``<selection>`` or ``<disagree>``.
* ``<selection>`` answered by ``<selection>`` ends the dialogue. It is a deal iff at least one ``<try>``
  occurred (Table 17, rule 6) and the two selections are complementary (every item fully allocated, Lewis et al.
  2017); otherwise no deal. ``<disagree>`` ends without a deal.
* Utility of a deal = Σ own units · own values; without a deal every role gets 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marti_ibrl.envs.base import Outcome, TurnResult
from marti_ibrl.envs.dond.prompts import role_prompt
from marti_ibrl.envs.dond.protocol import format_body, markers_only, parse_utterance
from marti_ibrl.envs.dond.scenarios import Alloc, DondScenario

# Reasons recorded in ``state.reason`` / ``outcome.info["reason"]``.
DEAL = "deal"
NO_TRY = "selection_without_try"
MISMATCH = "selections_not_complementary"
DISAGREE = "disagree"
TURN_LIMIT = "turn_limit"
MALFORMED = "malformed"

BOT_SPEECH = ("natural", "markers")
"""How scripted negotiators speak: ``natural`` (a sentence + the marker) or ``markers`` (the marker only)."""


def utility(alloc: Sequence[int], values: Sequence[int]) -> int:
    """Σ units · value: a role's score for the units it receives (Lewis et al. 2017; Table 17 "Reward")."""
    return sum(n * v for n, v in zip(alloc, values, strict=True))


def is_complementary(counts: Sequence[int], alloc_a: Sequence[int], alloc_b: Sequence[int]) -> bool:
    """True iff the two allocations together hand out every unit exactly once."""
    return len(alloc_a) == len(alloc_b) == len(counts) and all(
        a >= 0 and b >= 0 and a + b == c for a, b, c in zip(alloc_a, alloc_b, counts, strict=True)
    )


def exceeds(alloc: Sequence[int], counts: Sequence[int]) -> bool:
    """True iff ``alloc`` claims more units of some item than exist."""
    return any(n > c for n, c in zip(alloc, counts, strict=True))


def complement(counts: Sequence[int], alloc: Sequence[int]) -> Alloc:
    """The units left for the counterpart when one side receives ``alloc``."""
    c0, c1, c2 = (c - a for c, a in zip(counts, alloc, strict=True))
    return c0, c1, c2


@dataclass
class DondState:
    """The mutable, picklable state of one DoND dialogue."""

    scenario: DondScenario
    seats: tuple[str, ...]  # speaking order; seats[0] speaks first
    history: list[tuple[str, str]] = field(default_factory=list)  # valid turns as (role, text)
    n_turns: int = 0
    n_tries: int = 0  # number of <try> turns so far
    pending_selection: tuple[str, Alloc] | None = None  # (role, units) of an unanswered <selection>
    selections: dict[str, Alloc] = field(default_factory=dict)  # final selections, by role
    done: bool = False
    agreed: bool = False
    malformed: bool = False
    fault_role: str | None = None  # the role whose turn stayed malformed
    reason: str = ""  # how the dialogue ended

    @property
    def next_role(self) -> str:
        """The role whose turn it is."""
        return self.seats[self.n_turns % len(self.seats)]


class DondRules:
    """How a DoND dialogue ends and is scored, shared by the two- and three-party games: malformed
    endings, aborts, the outcome (utilities on a deal) and the rule reward. Subclasses provide ``roles``,
    ``invalid_penalty`` and ``step``; their states carry ``done/agreed/reason/malformed/fault_role/
    selections/n_turns/n_tries`` and ``next_role``."""

    roles: tuple[str, ...]
    invalid_penalty: float

    def __init__(
        self, roles: Sequence[str], max_rounds: int, invalid_penalty: float, prompt_style: str, bot_speech: str
    ) -> None:
        """Validated common settings; a round is one turn per role."""
        if len(set(roles)) != len(roles):
            raise ValueError(f"role names must be distinct, got {list(roles)}")
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        if prompt_style not in ("paper", "compact"):
            raise ValueError(f"prompt_style must be 'paper' or 'compact', got {prompt_style!r}")
        if bot_speech not in BOT_SPEECH:
            raise ValueError(f"bot_speech must be one of {BOT_SPEECH}, got {bot_speech!r}")
        self.roles = tuple(roles)
        self.max_rounds = max_rounds
        self.max_turns = len(self.roles) * max_rounds
        self.invalid_penalty = invalid_penalty
        self.prompt_style = prompt_style
        self.bot_speech = bot_speech

    def bot_utterance(self, text: str) -> str:
        """How a scripted negotiator's turn is spoken in this environment: as written (``natural``: a sentence
        plus the protocol marker) or as the marker alone (``markers``: short turns for tiny CPU models)."""
        return markers_only(text) if self.bot_speech == "markers" else text

    def _seats(self, scenario: DondScenario, seats: Sequence[str] | None) -> tuple[str, ...]:
        """The checked speaking order of a new dialogue (default: ``roles``)."""
        seats = tuple(self.roles if seats is None else seats)
        if sorted(seats) != sorted(self.roles):
            raise ValueError(f"seats {list(seats)} must be a permutation of roles {list(self.roles)}")
        if len(scenario.values) != len(self.roles):
            raise ValueError(f"scenario has {len(scenario.values)} value vectors for {len(self.roles)} roles")
        return seats

    def _check_turn(self, state: Any, role: str) -> None:
        """A turn is only taken in a live dialogue, by the role whose turn it is."""
        if state.done:
            raise ValueError("the dialogue is already over")
        if role != state.next_role:
            raise ValueError(f"it is {state.next_role!r}'s turn, not {role!r}'s")

    def finish_malformed(self, state: Any, role: str) -> None:
        """End without a deal because ``role``'s turn stayed malformed; ``role`` takes the invalid penalty."""
        self._index(role)
        if state.done:
            raise ValueError("the dialogue is already over")
        state.malformed = True
        state.fault_role = role
        self._end(state, agreed=False, reason=MALFORMED)

    def abort(self, state: Any, reason: str) -> None:
        """End without a deal for a reason outside the game (e.g. the context limit); nobody is at fault."""
        if not state.done:
            self._end(state, agreed=False, reason=reason)

    def outcome(self, state: Any) -> Outcome:
        """Agreement, utilities per role (0 without a deal) and details of a finished dialogue."""
        if not state.done:
            raise ValueError("the dialogue is not over yet")
        utilities: dict[str, float] = {}
        for i, role in enumerate(self.roles):
            alloc = state.selections.get(role)
            utilities[role] = float(utility(alloc, state.scenario.values[i])) if state.agreed and alloc else 0.0
        return Outcome(
            agreed=state.agreed,
            malformed=state.malformed,
            utilities=utilities,
            info={
                "allocations": {r: list(a) for r, a in state.selections.items()} if state.agreed else {},
                "selections": {r: list(a) for r, a in state.selections.items()},
                "n_turns": state.n_turns,
                "n_tries": state.n_tries,
                "reason": state.reason,
                "fault_role": state.fault_role,
            },
        )

    def reward(self, state: Any, role: str) -> float:
        """Utility on a deal, else 0; plus ``invalid_penalty`` for the role at fault in a malformed ending."""
        value = self.outcome(state).utilities[role]
        if state.malformed and state.fault_role == role:
            value += self.invalid_penalty
        return value

    def current_role(self, state: Any) -> str:
        """Whose turn it is (seats alternate)."""
        return state.next_role

    def _index(self, role: str) -> int:
        if role not in self.roles:
            raise ValueError(f"unknown role {role!r}; roles are {list(self.roles)}")
        return self.roles.index(role)

    @staticmethod
    def _end(state: Any, agreed: bool, reason: str) -> None:
        state.done = True
        state.agreed = agreed
        state.reason = reason


class DondEnv(DondRules):
    """Two-party Deal-or-No-Deal implementing :class:`marti_ibrl.envs.base.DialogueEnv`.

    ``scenario.values[i]`` is the private value vector of ``roles[i]``, independently of the seating order.
    """

    def __init__(
        self,
        roles: Sequence[str] = ("agent1", "agent2"),
        max_rounds: int = 10,
        invalid_penalty: float = -1.0,
        prompt_style: str = "paper",
        bot_speech: str = "natural",
        show_complement: bool = False,
    ) -> None:
        if len(roles) != 2:
            raise ValueError(f"DondEnv is a two-party game: expected 2 roles, got {len(roles)} ({list(roles)})")
        super().__init__(roles, max_rounds, invalid_penalty, prompt_style, bot_speech)
        self.show_complement = show_complement

    # -- DialogueEnv ---------------------------------------------------------------------------------------------

    def system_prompt(self, scenario: DondScenario, role: str) -> str:
        """The Table-17 role prompt with this role's private input."""
        return role_prompt(scenario, self._index(role), style=self.prompt_style)

    def counterpart_text(self, speaker: str, text: str, scenario: DondScenario) -> str:
        """How ``speaker``'s utterance is shown to the other role: as written, or with ``show_complement`` a
        ``<try>``/``<selection>`` followed by the units it leaves the listener, e.g. ``"<try> item0=1 item1=0
        item2=2 <try> (you get item0=0 item1=2 item2=0)"``. Accepting then means copying those numbers into one's
        own ``<selection>`` instead of subtracting: an observation aid for tiny models (the game is unchanged)."""
        if not self.show_complement:
            return text
        action = parse_utterance(text)
        if action.alloc is None or exceeds(action.alloc, scenario.counts):
            return text
        return f"{text} (you get {format_body(complement(scenario.counts, action.alloc))})"

    def new_state(self, scenario: DondScenario, seats: Sequence[str] | None = None) -> DondState:
        """A fresh dialogue; ``seats`` (default: ``roles``) is a permutation of the roles."""
        return DondState(scenario=scenario, seats=self._seats(scenario, seats))

    def step(self, state: DondState, role: str, text: str) -> TurnResult:
        """Apply ``role``'s utterance; an invalid one leaves ``state`` untouched."""
        self._check_turn(state, role)
        action = parse_utterance(text)
        if action.kind == "malformed":
            return TurnResult(valid=False, done=False, reason=f"malformed: {action.error}")
        if state.pending_selection is not None and action.kind not in ("selection", "disagree"):
            return TurnResult(valid=False, done=False, reason="after a <selection> only <selection> or <disagree>")
        if action.alloc is not None:
            counts = state.scenario.counts
            if exceeds(action.alloc, counts):
                return TurnResult(
                    valid=False, done=False, reason=f"allocation {action.alloc} exceeds the item counts {counts}"
                )

        # The turn is valid: from here on the state changes.
        state.history.append((role, text))
        state.n_turns += 1
        if action.kind == "try":
            state.n_tries += 1
        elif action.kind == "disagree":
            self._end(state, agreed=False, reason=DISAGREE)
        elif action.kind == "selection":
            assert action.alloc is not None
            if state.pending_selection is None:
                state.pending_selection = (role, action.alloc)
            else:
                first_role, first_alloc = state.pending_selection
                state.pending_selection = None
                state.selections = {first_role: first_alloc, role: action.alloc}
                if state.n_tries == 0:
                    self._end(state, agreed=False, reason=NO_TRY)
                elif is_complementary(state.scenario.counts, first_alloc, action.alloc):
                    self._end(state, agreed=True, reason=DEAL)
                else:
                    self._end(state, agreed=False, reason=MISMATCH)
        if not state.done and state.n_turns >= self.max_turns:
            self._end(state, agreed=False, reason=TURN_LIMIT)
        return TurnResult(valid=True, done=state.done, reason=state.reason)

    @staticmethod
    def _end(state: DondState, agreed: bool, reason: str) -> None:
        DondRules._end(state, agreed, reason)
        state.pending_selection = None
