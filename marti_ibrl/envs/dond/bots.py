"""Scripted DoND negotiators speaking the paper's Table-17 protocol.

They generate SFT dialogues and serve as frozen training counterparts. Every turn is one short sentence plus
exactly one marker: ``<try>`` to propose, ``<selection>`` of the complement to accept the partner's latest
``<try>`` or to confirm the partner's ``<selection>``, ``<disagree>`` to refuse a final selection. Bots never
produce invalid turns: their allocations stay within the counts, and after a partner's ``<selection>`` they only
select or disagree.

Two strategy families, parametrised into the registry :data:`TRAINING_BOTS`:

* :class:`ConcedingNegotiator` ("greedy", "stubborn", "conceder"): opens with every unit it values, then concedes
  its lowest-value remaining item a few units at a time; accepts an offer worth at least an acceptance threshold
  that decays with its own turns (or at least what its own next offer would give it).
* :class:`FairNegotiator` ("fair"): offers the allocation worth at least a decaying target to itself that leaves
  the partner the most units, weighting items the partner asked for in its latest ``<try>``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from marti_ibrl.envs.base import Outcome
from marti_ibrl.envs.dond.game import DondEnv, DondState, complement, utility
from marti_ibrl.envs.dond.protocol import DISAGREE, Action, format_selection, format_try, parse_utterance
from marti_ibrl.envs.dond.scenarios import Alloc, DondScenario

History = Sequence[tuple[int, str]]  # (speaker role_index, text)


class ScriptedNegotiator(Protocol):
    """A scripted DoND player: the next utterance of ``role_index`` given the dialogue so far."""

    name: str

    def respond(self, scenario: DondScenario, role_index: int, history: History, rng: random.Random) -> str:
        """The bot's next turn (protocol text)."""
        ...


_OFFER = (
    "How about I take {mine} and you get {theirs}?",
    "I'd like {mine}; you can have {theirs}.",
    "Let me propose: {mine} for me, {theirs} for you.",
)
_COUNTER = (
    "That doesn't work for me. How about I take {mine} and you get {theirs}?",
    "I can move a little: {mine} for me, {theirs} for you.",
    "Let's meet in between: I get {mine}, you get {theirs}.",
)
_ACCEPT = ("Deal, that works for me.", "Okay, I accept.", "Sounds fair, let's do it.")
_CONFIRM = ("Confirmed.", "Great, deal.", "Agreed.")
_REFUSE = ("Sorry, I can't accept that. No deal.", "That gives me too little. No deal.")


def describe(alloc: Sequence[int]) -> str:
    """Plain words for an allocation, e.g. "2 item0 and 1 item2" or "nothing"."""
    parts = [f"{n} item{j}" for j, n in enumerate(alloc) if n > 0]
    if not parts:
        return "nothing"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def all_allocations(counts: Sequence[int]) -> list[Alloc]:
    """Every allocation (units for one side) of the given counts, in lexicographic order."""
    return [(a, b, c) for a, b, c in itertools.product(*(range(n + 1) for n in counts))]


@dataclass(frozen=True)
class _View:
    """What a bot reads from the history: its own turn count and the partner's open moves."""

    own_turns: int
    own_tries: int
    any_try: bool
    partner_selection: Alloc | None  # the partner's last turn was this <selection>
    partner_try: Alloc | None  # the partner's latest <try> after the bot's own latest <try>


def _read(history: History, role_index: int) -> _View:
    own_turns = own_tries = 0
    any_try = False
    partner_try: Alloc | None = None
    partner_selection: Alloc | None = None
    for speaker, text in history:
        action: Action = parse_utterance(text)
        partner_selection = None
        if action.kind == "try":
            any_try = True
        if speaker == role_index:
            own_turns += 1
            if action.kind == "try":
                own_tries += 1
                partner_try = None
        elif action.kind == "try":
            partner_try = action.alloc
        elif action.kind == "selection":
            partner_selection = action.alloc
    return _View(own_turns, own_tries, any_try, partner_selection, partner_try)


class _Base:
    """Shared turn logic; subclasses choose the next offer."""

    name: str
    start_threshold: float
    decay: float
    floor: float

    def offer(self, scenario: DondScenario, role_index: int, view: _View) -> Alloc:
        raise NotImplementedError

    def threshold(self, own_turns: int) -> float:
        """Acceptance threshold after ``own_turns`` own turns: decays linearly down to ``floor``."""
        return max(self.floor, self.start_threshold - self.decay * own_turns)

    def respond(self, scenario: DondScenario, role_index: int, history: History, rng: random.Random) -> str:
        """Confirm/refuse a partner selection, accept a good enough ``<try>``, else make a (counter)offer."""
        counts, values = scenario.counts, scenario.values[role_index]
        view = _read(history, role_index)
        if view.partner_selection is not None:
            mine = complement(counts, view.partner_selection)
            if view.any_try and min(mine) >= 0 and utility(mine, values) >= self.floor:
                return f"{rng.choice(_CONFIRM)} {format_selection(mine)}"
            return f"{rng.choice(_REFUSE)} {DISAGREE}"
        proposal = self.offer(scenario, role_index, view)
        if view.partner_try is not None:
            offered = complement(counts, view.partner_try)
            bar = min(self.threshold(view.own_turns), utility(proposal, values))
            if utility(offered, values) >= bar:
                return f"{rng.choice(_ACCEPT)} {format_selection(offered)}"
        templates = _COUNTER if view.partner_try is not None else _OFFER
        text = rng.choice(templates).format(mine=describe(proposal), theirs=describe(complement(counts, proposal)))
        return f"{text} {format_try(proposal)}"


@dataclass
class ConcedingNegotiator(_Base):
    """Opens with all valued units; concedes ``step`` units of its lowest-value item every ``every`` offers.

    It never concedes below ``floor`` points and accepts offers worth ≥ ``threshold(own_turns)``.
    """

    name: str = "greedy"
    start_threshold: float = 8.0
    decay: float = 1.0
    floor: float = 5.0
    step: int = 1
    every: int = 1

    def offer(self, scenario: DondScenario, role_index: int, view: _View) -> Alloc:
        counts, values = scenario.counts, scenario.values[role_index]
        demand = [c if v > 0 else 0 for c, v in zip(counts, values, strict=True)]
        for _ in range(self.step * (view.own_tries // self.every)):
            held = [j for j in range(len(demand)) if demand[j] > 0]
            j = min(held, key=lambda k: (values[k], k))
            demand[j] -= 1
            if utility(demand, values) < self.floor:
                demand[j] += 1
                break
        return demand[0], demand[1], demand[2]


@dataclass
class FairNegotiator(_Base):
    """Offers the allocation worth ≥ ``threshold(own_tries)`` to itself that gives the partner the most.

    The partner's benefit is estimated as the units it receives, each item weighted by 1 + the share of that
    item the partner kept in its latest ``<try>`` (preferences inferred only from utterances, Table 17).
    """

    name: str = "fair"
    start_threshold: float = 7.0
    decay: float = 0.5
    floor: float = 5.0

    def offer(self, scenario: DondScenario, role_index: int, view: _View) -> Alloc:
        counts, values = scenario.counts, scenario.values[role_index]
        kept = view.partner_try or (0, 0, 0)
        weights = [1.0 + k / c for k, c in zip(kept, counts, strict=True)]
        target = self.threshold(view.own_tries)
        candidates = [a for a in all_allocations(counts) if utility(a, values) >= target]
        if not candidates:  # unreachable (taking everything is worth 10) but keeps the bot total
            return counts

        def key(a: Alloc) -> tuple[float, int]:
            given = complement(counts, a)
            return (sum(w * g for w, g in zip(weights, given, strict=True)), -utility(a, values))

        best = max(candidates, key=key)
        return best


TRAINING_BOTS: dict[str, Callable[[], ScriptedNegotiator]] = {
    "greedy": lambda: ConcedingNegotiator(name="greedy", start_threshold=8.0, decay=1.0, floor=5.0, step=1, every=1),
    "stubborn": lambda: ConcedingNegotiator(
        name="stubborn", start_threshold=9.0, decay=0.5, floor=6.0, step=1, every=2
    ),
    "conceder": lambda: ConcedingNegotiator(
        name="conceder", start_threshold=7.0, decay=1.5, floor=3.0, step=2, every=1
    ),
    "fair": lambda: FairNegotiator(name="fair", start_threshold=7.0, decay=0.5, floor=5.0),
}


def make_bot(name: str) -> ScriptedNegotiator:
    """A fresh bot from :data:`TRAINING_BOTS`."""
    if name not in TRAINING_BOTS:
        raise ValueError(f"unknown bot {name!r}; known: {sorted(TRAINING_BOTS)}")
    return TRAINING_BOTS[name]()


def scripted_players(env: DondEnv) -> dict[str, Callable[..., str]]:
    """The scripted negotiators (:data:`TRAINING_BOTS`) as the contract's players of ``env`` (``player(scenario, role,
    history, rng) -> text``, spoken as ``env.bot_utterance`` says): what ``marti-ibrl sft --env dond`` and the demo's
    warm start learn from (DoND's :class:`~marti_ibrl.envs.spec.EnvSpec` ``scripted_players``)."""
    roles = tuple(env.roles)

    def player(name: str) -> Callable[..., str]:
        bot = make_bot(name)  # stateless: every turn is computed from the history

        def turn(scenario: DondScenario, role: str, history: Sequence[tuple], rng: random.Random) -> str:
            said = [(roles.index(h[0]), h[1]) for h in history]
            return env.bot_utterance(bot.respond(scenario, roles.index(role), said, rng))

        return turn

    return {name: player(name) for name in sorted(TRAINING_BOTS)}


def play_dialogue(
    env: DondEnv,
    scenario: DondScenario,
    bots_by_role: Mapping[str, ScriptedNegotiator],
    seed: int,
    seats: Sequence[str] | None = None,
) -> tuple[DondState, Outcome]:
    """Play two bots against each other through ``env``; raise ``RuntimeError`` if a bot makes an invalid turn."""
    rng = random.Random(seed)
    state = env.new_state(scenario, seats if seats is not None else env.roles)
    while not state.done:
        role = env.current_role(state)
        index = env.roles.index(role)
        history = [(env.roles.index(r), t) for r, t in state.history]
        text = env.bot_utterance(bots_by_role[role].respond(scenario, index, history, rng))
        result = env.step(state, role, text)
        if not result.valid:
            raise RuntimeError(f"bot {bots_by_role[role].name!r} made an invalid turn {text!r}: {result.reason}")
    return state, env.outcome(state)
