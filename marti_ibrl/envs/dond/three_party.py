"""Three-party Deal-or-No-Deal ("dond3"): three roles split one pool of items; proof that nothing hard-codes 2 roles.

Game: the DoND item pool (3 item types, 5-7 units, every type ≥ 1 unit) and one private value vector per role
(non-negative ints, Σ count·value = 10). Seats are a permutation of the three roles and speak round-robin; a round
is three turns, so a dialogue has at most ``3 * max_rounds`` turns (reaching the limit: no deal).

Protocol: every turn is free text followed by exactly ONE marker, which ends the utterance (only whitespace after
the marker's body):

* proposal of a full three-way split, every role exactly once (any order), numbers = units of item0 item1 item2::

      I need the books. <try> agent1: 1 0 2 | agent2: 0 1 0 | agent3: 1 0 1

* final confirmation, the units the SPEAKER takes for itself::

      Agreed. <selection> 1 0 2

* ending without a deal::

      This is going nowhere. <disagree>

Rules: invalid turns (``TurnResult(valid=False)``, state unchanged) are turns without exactly one opening marker,
a bad body, a ``<try>`` whose split does not add up to the counts, a ``<selection>`` claiming more units than exist,
and, once any role has made a ``<selection>``, anything but ``<selection>`` or ``<disagree>``. When all three roles
have selected (three consecutive turns), it is a deal iff at least one ``<try>`` occurred (as in 2-party DoND) and
the three selections add up exactly to the counts; otherwise no deal. Rewards and outcome info follow
:class:`~marti_ibrl.envs.dond.game.DondEnv`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from marti_ibrl.envs.base import TurnResult
from marti_ibrl.envs.dond.game import DEAL, DISAGREE, MISMATCH, NO_TRY, TURN_LIMIT, DondRules, exceeds
from marti_ibrl.envs.dond.prompts import lewis_input, parsed_input
from marti_ibrl.envs.dond.protocol import _MARKER
from marti_ibrl.envs.dond.scenarios import (
    TOTAL_WEIGHTS,
    Alloc,
    DondScenario,
    _weighted_choice,
    valid_count_vectors,
    value_vectors,
)
from marti_ibrl.safeparse import too_long

ROLES3 = ("agent1", "agent2", "agent3")
_UNITS = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s*$")
_PART = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:(.*)$")


@dataclass(frozen=True)
class ThreePartyAction:
    """One parsed turn: a full split (``try``), the speaker's own units (``selection``), or no deal."""

    kind: Literal["try", "selection", "disagree", "malformed"]
    alloc: Alloc | None = None  # the speaker's units, for "selection"
    split: dict[str, Alloc] | None = None  # units per role, for "try"
    error: str = ""


def _units(body: str) -> Alloc | None:
    m = _UNITS.match(body)
    if m is None or too_long(*m.groups()):  # a number too long to read is a bad body
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def parse_three_party(text: str, roles: Sequence[str] = ROLES3) -> ThreePartyAction:
    """Parse one turn of the three-party protocol (module docstring); role names of a ``<try>`` must be ``roles``."""
    markers = list(_MARKER.finditer(text or ""))
    if len(markers) != 1 or markers[0].group(1):
        return ThreePartyAction("malformed", error=f"need exactly one opening marker, found {len(markers)} marker(s)")
    kind, body = markers[0].group(2).lower(), text[markers[0].end() :]
    if kind == "disagree":
        if body.strip():
            return ThreePartyAction("malformed", error="nothing may follow <disagree>")
        return ThreePartyAction("disagree")
    if kind == "selection":
        alloc = _units(body)
        if alloc is None:
            return ThreePartyAction("malformed", error="<selection> must end the turn as '<selection> N N N'")
        return ThreePartyAction("selection", alloc=alloc)
    split: dict[str, Alloc] = {}
    for part in body.split("|"):
        m = _PART.match(part)
        alloc = None if m is None else _units(m.group(2))
        if m is None or alloc is None or m.group(1) in split:
            return ThreePartyAction("malformed", error="<try> must end the turn as '<try> ROLE: N N N | ...'")
        split[m.group(1)] = alloc
    if sorted(split) != sorted(roles):
        return ThreePartyAction("malformed", error=f"<try> must name each of {list(roles)} exactly once")
    return ThreePartyAction("try", split=split)


def _totals(allocs: Iterable[Alloc]) -> list[int]:
    """Units handed out per item type."""
    rows = list(allocs)
    return [sum(a[j] for a in rows) for j in range(3)]


def format_three_party_try(split: Mapping[str, Alloc]) -> str:
    """``<try> agent1: a b c | agent2: a b c | agent3: a b c`` (roles in the mapping's order)."""
    return "<try> " + " | ".join(f"{role}: {a[0]} {a[1]} {a[2]}" for role, a in split.items())


def format_three_party_selection(alloc: Alloc) -> str:
    """``<selection> a b c``: the units the speaker takes."""
    return f"<selection> {alloc[0]} {alloc[1]} {alloc[2]}"


def generate_three_party_scenarios(n: int, seed: int) -> list[DondScenario]:
    """``n`` reproducible scenarios (uids ``f"tp-{seed}-{i}"``): DoND counts and three value vectors (Σ = 10 each).

    Counts are drawn like the 2-party generator (total 5/6/7 with the Lewis marginals, then a count vector with
    every type in 1..4); each role's values uniformly among all vectors with Σ count·value = 10, redrawn until
    every item type is worth > 0 to at least one role.
    """
    rng = random.Random(seed)
    out: list[DondScenario] = []
    for i in range(n):
        counts = rng.choice(valid_count_vectors(_weighted_choice(rng, TOTAL_WEIGHTS)))
        while True:
            values = tuple(rng.choice(value_vectors(counts)) for _ in range(3))
            if all(any(v[j] > 0 for v in values) for j in range(3)):
                break
        out.append(DondScenario(counts=counts, values=values, uid=f"tp-{seed}-{i}"))
    return out


PAPER_TEMPLATE = """\
You are {role}, one of three participants ({roles}) in a Deal-or-No-Deal negotiation: together you split one \
pool of items.

Private input.
<input> {your_input} </input>
{parsed_input}
The private input is count0 value0 count1 value1 count2 value2 for the item types item0, item1 and item2. The \
other participants have their own private values, which you never see.

Reward.
Your score is n0*value0 + n1*value1 + n2*value2, where nj is the number of units of itemj you receive. Only \
your own score counts. No deal scores 0 for everyone, so a moderate deal beats no deal.

Protocol. Each turn is one short negotiation sentence that ends with exactly one of these markers:
1. A proposal of a complete split, naming every participant once; the numbers are units of item0 item1 item2 \
and must add up to the counts: {try_example}
2. A final confirmation of the units you take for yourself: <selection> N N N
3. Ending without a deal: <disagree>
Nothing may follow the marker. After anyone's <selection>, only <selection> or <disagree> are allowed. A deal \
needs at least one <try> and three <selection> turns, one per participant, that add up exactly to the counts; \
otherwise nobody scores. Messages of the others are shown as "name: text". Generate only your own next turn."""

COMPACT_TEMPLATE = """\
You are {role}; you split items with {others}. Your input: <input> {your_input} </input> ({parsed_input}). \
Score: your units times your values; no deal scores 0. End each turn with exactly one of:
offer a split: {try_example}
accept, taking N N N yourself: <selection> N N N
quit: <disagree>"""


@dataclass
class ThreePartyState:
    """The mutable, picklable state of one three-party dialogue."""

    scenario: DondScenario
    seats: tuple[str, ...]
    history: list[tuple[str, str]] = field(default_factory=list)  # valid turns as (role, text)
    n_turns: int = 0
    n_tries: int = 0
    selections: dict[str, Alloc] = field(default_factory=dict)  # selections so far, by role
    done: bool = False
    agreed: bool = False
    malformed: bool = False
    fault_role: str | None = None
    reason: str = ""

    @property
    def next_role(self) -> str:
        return self.seats[self.n_turns % len(self.seats)]


class ThreePartyDondEnv(DondRules):
    """Three-party DoND implementing :class:`marti_ibrl.envs.base.DialogueEnv`; ``values[i]`` belongs to ``roles[i]``."""

    def __init__(
        self,
        roles: Sequence[str] = ROLES3,
        max_rounds: int = 10,
        invalid_penalty: float = -1.0,
        prompt_style: str = "paper",
        bot_speech: str = "natural",
    ) -> None:
        if len(roles) != 3 or len(set(roles)) != 3:
            raise ValueError(f"ThreePartyDondEnv needs 3 distinct roles, got {list(roles)}")
        super().__init__(roles, max_rounds, invalid_penalty, prompt_style, bot_speech)

    def system_prompt(self, scenario: DondScenario, role: str) -> str:
        """The role's private input and the three-party protocol, in the configured style."""
        i = self._index(role)
        fields = {
            "role": role,
            "roles": ", ".join(self.roles),
            "others": " and ".join(r for r in self.roles if r != role),
            "your_input": lewis_input(scenario, i),
            "try_example": "<try> " + " | ".join(f"{r}: N N N" for r in self.roles),
        }
        if self.prompt_style == "compact":
            pairs = zip(scenario.counts, scenario.values[i], strict=True)
            parsed = ", ".join(f"item{j}: {c} worth {v}" for j, (c, v) in enumerate(pairs))
            return COMPACT_TEMPLATE.format(parsed_input=parsed, **fields)
        return PAPER_TEMPLATE.format(parsed_input=parsed_input(scenario, i), **fields)

    def counterpart_text(self, speaker: str, text: str, scenario: DondScenario) -> str:
        """How ``speaker``'s utterance is shown to the other roles (the same for every scenario)."""
        return f"{speaker}: {text}"

    def new_state(self, scenario: DondScenario, seats: Sequence[str] | None = None) -> ThreePartyState:
        """A fresh dialogue; ``seats`` (default: ``roles``) is a permutation of the roles."""
        return ThreePartyState(scenario=scenario, seats=self._seats(scenario, seats))

    def step(self, state: ThreePartyState, role: str, text: str) -> TurnResult:
        """Apply ``role``'s utterance; an invalid one leaves ``state`` untouched."""
        self._check_turn(state, role)
        action = parse_three_party(text, self.roles)
        counts = state.scenario.counts
        if action.kind == "malformed":
            return TurnResult(valid=False, done=False, reason=f"malformed: {action.error}")
        if state.selections and action.kind not in ("selection", "disagree"):
            return TurnResult(valid=False, done=False, reason="after a <selection> only <selection> or <disagree>")
        if action.split is not None and _totals(action.split.values()) != list(counts):
            return TurnResult(valid=False, done=False, reason=f"the <try> split does not add up to the counts {counts}")
        if action.alloc is not None and exceeds(action.alloc, counts):
            return TurnResult(valid=False, done=False, reason=f"selection {action.alloc} exceeds the counts {counts}")

        # The turn is valid: from here on the state changes.
        state.history.append((role, text))
        state.n_turns += 1
        if action.kind == "try":
            state.n_tries += 1
        elif action.kind == "disagree":
            self._end(state, agreed=False, reason=DISAGREE)
        else:
            assert action.alloc is not None
            state.selections[role] = action.alloc
            if len(state.selections) == len(self.roles):
                complete = _totals(state.selections.values()) == list(counts)
                if state.n_tries == 0:
                    self._end(state, agreed=False, reason=NO_TRY)
                else:
                    self._end(state, agreed=complete, reason=DEAL if complete else MISMATCH)
        if not state.done and state.n_turns >= self.max_turns:
            self._end(state, agreed=False, reason=TURN_LIMIT)
        return TurnResult(valid=True, done=state.done, reason=state.reason)
