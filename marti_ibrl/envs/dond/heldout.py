"""Held-out scripted DoND counterparts, for evaluation only (paper §5.2: held-out counterparts share nothing with
any training system).

Neither their strategies nor their code come from :mod:`marti_ibrl.envs.dond.bots` (the training bots); they
only share the game and protocol helpers. They speak the same Table-17 protocol and never produce an invalid
turn: every allocation stays within the counts, and after the partner's ``<selection>`` they answer only with the
complementary ``<selection>`` or ``<disagree>``. Only a partner turn that directly precedes theirs is answered;
chat turns are met with a (counter)offer.

The registry :data:`HELDOUT_BOTS`:

* ``hardliner`` (:class:`Hardliner`): demands its maximum, makes a single concession after two offers (to the
  cheapest allocation still worth ≥ 8 of its 10 points) and deals only at ≥ 8 points: it accepts or confirms
  nothing worth less and refuses a partner's final ``<selection>`` below that with ``<disagree>``.
* ``tit_for_tat`` (:class:`TitForTat`): opens with its maximum; afterwards its target moves by exactly as much as
  the partner's latest ``<try>`` improved (or worsened), *in the tit-for-tat bot's own values*, on the partner's
  previous ``<try>``, never below a reserve.
* ``slow_conceder`` / ``fast_conceder`` (:class:`TimeDependentConceder`): the time-dependent tactics of Faratin,
  Sierra & Jennings (1998), target(t) = max_u − (max_u − reserve)·(t/T)^(1/e) over its own turns t of the round
  limit (Boulware e = 0.2 holds out until the end; Conceder e = 3 gives in early).

  T = ``rounds`` − 1: 9 for the default 10-round limit; a game with another limit calibrates the bot to it
  (:func:`with_rounds`, applied by the player from the env's ``max_rounds``). Reserves: slow 5, fast 3, tit-for-tat 5.

Four *strategy-disjoint* families (mini Table 2 v2, ``benchmarks/results/mini_table2_v2_plan.md``), none of which
decides by an own-value threshold schedule as every training bot does:

* ``utility_search`` (:class:`UtilitySearch`): infers the partner's values from the partner's ``<try>``s (a posterior
  over every value vector with Σ count·value = 10, likelihood ∝ exp(β·u(kept share))), proposes the share best for
  itself whose expected value to the partner is ≥ a demand falling 6 → 3 over T.
* ``split_difference`` (:class:`SplitDifference`): meets in the middle, item by item, between its own last share and
  what the partner's last ``<try>`` left it.
* ``random_aspiration`` (:class:`RandomAspiration`): an aspiration drawn per dialogue from [5, 9], lowered by random
  steps in [0, 1.5] per own turn down to 3; offers a random share worth at least it.
* ``picky_then_fold`` (:class:`PickyThenFold`): demands its maximum (takes ≥ 9) for the first ⌈T/2⌉ own turns, then
  offers about half its maximum and takes anything worth ≥ 1.

A ``+phrased`` suffix (``heldout:utility_search+phrased``) makes any of them speak a short phrase around the markup
(:func:`phrase_around`, applied by the player after the env's ``bot_speech``): surface variation with the same moves.

All but the hardliner propose the allocation whose own value is closest to their current target (at or above it on
a tie), accept a ``<try>`` worth at least what they would propose themselves and confirm a final ``<selection>``
worth at least their reserve. A ``<selection>`` before any ``<try>`` (which cannot make a deal) is refused.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cache, lru_cache
from typing import TYPE_CHECKING

from marti_ibrl.envs.dond.game import complement, utility
from marti_ibrl.envs.dond.protocol import DISAGREE, format_selection, format_try, parse_utterance
from marti_ibrl.envs.dond.scenarios import Alloc, DondScenario, value_vectors

if TYPE_CHECKING:  # the interface only; no training-bot code is used at run time
    from marti_ibrl.envs.dond.bots import ScriptedNegotiator

__all__ = [
    "HELDOUT_BOTS",
    "Hardliner",
    "TimeDependentConceder",
    "TitForTat",
    "PickyThenFold",
    "RandomAspiration",
    "SplitDifference",
    "UtilitySearch",
    "make_heldout_bot",
    "phrase_around",
    "with_rounds",
]

Transcript = Sequence[tuple[int, str]]  # (speaker role_index, text), valid turns only


# -- reading the transcript ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ledger:
    """What a held-out bot takes from the transcript."""

    own_turns: int  # turns this bot has spoken
    own_offers: tuple[Alloc, ...]  # its <try> allocations (its own units), oldest first
    partner_offers: tuple[Alloc, ...]  # the partner's <try> allocations (the partner's units), oldest first
    answer_to: str | None  # kind of the partner's turn right before this one ("try", "selection", "chat"), if any
    answer_alloc: Alloc | None  # the allocation in that turn (the partner's units)
    dealable: bool  # some <try> was made, so a pair of selections can close a deal (Table 17, rule 6)


_parse = lru_cache(maxsize=8192)(parse_utterance)  # turns repeat across dialogues (templates × allocations)


def _ledger(transcript: Transcript, me: int) -> _Ledger:
    own_turns = 0
    own_offers: list[Alloc] = []
    partner_offers: list[Alloc] = []
    kind: str | None = None
    alloc: Alloc | None = None
    for speaker, text in transcript:
        move = _parse(text)
        if speaker == me:
            own_turns += 1
            if move.kind == "try" and move.alloc is not None:
                own_offers.append(move.alloc)
        elif move.kind == "try" and move.alloc is not None:
            partner_offers.append(move.alloc)
    if transcript and transcript[-1][0] != me:
        last = _parse(transcript[-1][1])
        kind, alloc = last.kind, last.alloc
    return _Ledger(
        own_turns=own_turns,
        own_offers=tuple(own_offers),
        partner_offers=tuple(partner_offers),
        answer_to=kind,
        answer_alloc=alloc,
        dealable=bool(own_offers or partner_offers),
    )


@cache
def _splits(counts: Alloc) -> tuple[Alloc, ...]:
    """Every way to take units of the three items (one side's share), smallest shares first."""
    shares = [(a, b, c) for a in range(counts[0] + 1) for b in range(counts[1] + 1) for c in range(counts[2] + 1)]
    return tuple(sorted(shares, key=lambda s: (sum(s), s)))


@cache
def _priced(counts: Alloc, values: Alloc) -> tuple[tuple[Alloc, int], ...]:
    """Every share with its own value."""
    return tuple((share, utility(share, values)) for share in _splits(counts))


def _menu(scenario: DondScenario, me: int) -> tuple[tuple[Alloc, int], ...]:
    """Every share of ``scenario`` with its value to role ``me``, smallest shares first."""
    counts, values = scenario.counts, scenario.values[me]
    return _priced((counts[0], counts[1], counts[2]), (values[0], values[1], values[2]))


def _l1(a: Sequence[int], b: Sequence[int]) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


# -- phrasing --------------------------------------------------------------------------------------------------------


def _spell(share: Sequence[int]) -> str:
    """E.g. "2 of item0 plus 1 of item2"; "no items" for an empty share."""
    pieces = [f"{n} of item{k}" for k, n in enumerate(share) if n]
    return " plus ".join(pieces) if pieces else "no items"


@dataclass(frozen=True)
class _Voice:
    """Sentence templates of one held-out bot; ``{own}`` / ``{rest}`` are the speaker's and the partner's share."""

    propose: tuple[str, ...]
    accept: tuple[str, ...]
    confirm: tuple[str, ...]
    refuse: tuple[str, ...]


_FIRM = _Voice(
    propose=(
        "My terms are simple: {own} stays with me, {rest} goes to you.",
        "I need {own}. You may keep {rest}.",
        "Here is where I stand: I keep {own}, you keep {rest}.",
    ),
    accept=("That meets my terms.", "Acceptable. We have terms."),
    confirm=("Done.", "Settled then."),
    refuse=("That falls short of my terms. I walk away.", "Not enough for me, no agreement."),
)
_MIRROR = _Voice(
    propose=(
        "You moved, so I move: I keep {own} and you keep {rest}.",
        "Matching your step, my proposal is {own} for me and {rest} for you.",
        "Fair is fair: {own} on my side, {rest} on yours.",
    ),
    accept=("You've met me where I hoped. I'll take it.", "Good move, I'm in."),
    confirm=("Locked in.", "We have an agreement."),
    refuse=("I can't sign that one. Let's leave it.", "That's below what I can take, so I'm out."),
)
_PATIENT = _Voice(
    propose=(
        "Let us consider this split: I would hold {own}, and {rest} would be yours.",
        "Perhaps {own} for me and {rest} for you?",
        "Take your time, but I suggest {own} for me and {rest} for you.",
    ),
    accept=("Very well, I agree to that.", "Alright, that is agreeable."),
    confirm=("Then it is settled.", "Splendid, we have an understanding."),
    refuse=("I am afraid that does not work for me. No agreement.", "Regretfully, I must decline."),
)
_EAGER = _Voice(
    propose=(
        "Quick idea: {own} for me, {rest} for you!",
        "Let's wrap this up: I get {own}, you get {rest}.",
        "Easy split: {own} here, {rest} there.",
    ),
    accept=("Great, works for me!", "Perfect, let's go with that!"),
    confirm=("Awesome, done!", "Yes, deal done!"),
    refuse=("Oh, that one doesn't work for me at all. No deal.", "Sorry, can't do that one. No deal."),
)


# -- the negotiators -------------------------------------------------------------------------------------------------


class _HeldoutNegotiator:
    """One turn of a held-out bot: answer a final selection, take a good enough offer, else propose."""

    name: str
    voice: _Voice

    def propose(self, scenario: DondScenario, me: int, ledger: _Ledger) -> Alloc:
        """This bot's next ``<try>`` (its own units)."""
        raise NotImplementedError

    def takes(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int, proposal: Alloc) -> bool:
        """Whether to accept the partner's ``<try>`` worth ``gain`` (instead of proposing ``proposal``)."""
        raise NotImplementedError

    def signs(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int) -> bool:
        """Whether to confirm the partner's final ``<selection>`` worth ``gain``."""
        raise NotImplementedError

    def choose(self, scenario: DondScenario, me: int, ledger: _Ledger, rng: random.Random) -> Alloc:
        """This turn's proposal: :meth:`propose` (deterministic) unless a bot draws it from the turn's ``rng``."""
        return self.propose(scenario, me, ledger)

    def respond(self, scenario: DondScenario, role_index: int, history: Transcript, rng: random.Random) -> str:
        """The bot's next turn (protocol text): ``<selection>``, ``<disagree>`` or ``<try>``."""
        counts, values = scenario.counts, scenario.values[role_index]
        ledger = _ledger(history, role_index)
        if ledger.answer_to == "selection" and ledger.answer_alloc is not None:
            share = complement(counts, ledger.answer_alloc)
            if ledger.dealable and self.signs(scenario, role_index, ledger, utility(share, values)):
                return f"{rng.choice(self.voice.confirm)} {format_selection(share)}"
            return f"{rng.choice(self.voice.refuse)} {DISAGREE}"
        proposal = self.choose(scenario, role_index, ledger, rng)
        if ledger.answer_to == "try" and ledger.answer_alloc is not None:
            share = complement(counts, ledger.answer_alloc)
            if self.takes(scenario, role_index, ledger, utility(share, values), proposal):
                return f"{rng.choice(self.voice.accept)} {format_selection(share)}"
        sentence = rng.choice(self.voice.propose).format(
            own=_spell(proposal), rest=_spell(complement(counts, proposal))
        )
        return f"{sentence} {format_try(proposal)}"


def _closest(scenario: DondScenario, me: int, target: float, tiebreak: Callable[[Alloc], tuple[int, ...]]) -> Alloc:
    """The share whose own value is closest to ``target`` (at or above it on a tie), then by ``tiebreak``."""
    priced = _menu(scenario, me)
    best = min((abs(worth - target), worth < target) for _, worth in priced)
    return min((s for s, w in priced if (abs(w - target), w < target) == best), key=tiebreak)


@dataclass
class Hardliner(_HeldoutNegotiator):
    """Deals only at ≥ ``bar`` points; one concession after ``concede_after`` offers, never another."""

    name: str = "hardliner"
    bar: float = 8.0
    concede_after: int = 2
    voice: _Voice = field(default=_FIRM, repr=False)

    def propose(self, scenario: DondScenario, me: int, ledger: _Ledger) -> Alloc:
        priced = _menu(scenario, me)  # smallest shares first: ties keep the smaller
        if len(ledger.own_offers) < self.concede_after:  # its maximum, giving away what it does not value
            return max(priced, key=lambda sw: sw[1])[0]
        worthy = [sw for sw in priced if sw[1] >= self.bar]  # never empty: taking everything is worth the maximum
        return min(worthy, key=lambda sw: sw[1])[0]

    def takes(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= self.bar

    def signs(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int) -> bool:
        return gain >= self.bar


@dataclass
class TitForTat(_HeldoutNegotiator):
    """Mirrors the partner's concessions, measured in its own values, from its maximum down to ``reserve``."""

    name: str = "tit_for_tat"
    reserve: float = 5.0
    voice: _Voice = field(default=_MIRROR, repr=False)

    def target(self, scenario: DondScenario, me: int, ledger: _Ledger) -> float:
        """Own value aimed at: the maximum, moved by each step of the partner's offers (what it gave me more)."""
        counts, values = scenario.counts, scenario.values[me]
        top = float(utility(counts, values))
        aim = top
        offers = ledger.partner_offers
        for before, after in zip(offers, offers[1:]):
            step = utility(complement(counts, after), values) - utility(complement(counts, before), values)
            aim = min(top, max(self.reserve, aim - step))
        return aim

    def propose(self, scenario: DondScenario, me: int, ledger: _Ledger) -> Alloc:
        aim = self.target(scenario, me, ledger)
        last = ledger.own_offers[-1] if ledger.own_offers else scenario.counts
        return _closest(scenario, me, aim, lambda s: (_l1(s, last), *s))

    def takes(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= utility(proposal, scenario.values[me])

    def signs(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int) -> bool:
        return gain >= self.reserve


@dataclass
class TimeDependentConceder(_HeldoutNegotiator):
    """target(t) = max_u − (max_u − reserve)·(t/T)^(1/e), t = own turns so far, T = ``rounds`` − 1.

    Among the shares closest to the target it prefers the one leaving the partner what the partner last asked for.
    """

    name: str = "slow_conceder"
    e: float = 0.2
    reserve: float = 5.0
    rounds: int = 10
    voice: _Voice = field(default=_PATIENT, repr=False)

    def __post_init__(self) -> None:
        if self.e <= 0:
            raise ValueError(f"the concession exponent e must be > 0, got {self.e}")
        _check_rounds(self.rounds)

    def target(self, scenario: DondScenario, me: int, ledger: _Ledger) -> float:
        top = float(utility(scenario.counts, scenario.values[me]))
        progress = min(1.0, ledger.own_turns / max(1, self.rounds - 1))
        return top - (top - self.reserve) * progress ** (1.0 / self.e)

    def propose(self, scenario: DondScenario, me: int, ledger: _Ledger) -> Alloc:
        counts = scenario.counts
        asked = ledger.partner_offers[-1] if ledger.partner_offers else (0, 0, 0)

        def tiebreak(share: Alloc) -> tuple[int, ...]:
            return (_l1(complement(counts, share), asked), sum(share), *share)

        return _closest(scenario, me, self.target(scenario, me, ledger), tiebreak)

    def takes(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= utility(proposal, scenario.values[me])

    def signs(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int) -> bool:
        return gain >= self.reserve


def _horizon(rounds: int) -> int:
    """T = own turns after the first within a round limit of ``rounds`` (a round is one turn per role)."""
    return max(1, rounds - 1)


def _check_rounds(rounds: int) -> None:
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")


@dataclass
class UtilitySearch(_HeldoutNegotiator):
    """Model-based: a posterior over the partner's value vectors from its ``<try>``s; the own-best share whose
    expected partner value is ≥ demand(t) = start − (start − end)·min(1, t/T)."""

    name: str = "utility_search"
    beta: float = 1.0
    start_demand: float = 6.0
    end_demand: float = 3.0
    reserve: float = 3.0
    rounds: int = 10
    voice: _Voice = field(default=_PATIENT, repr=False)

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)

    def posterior(self, scenario: DondScenario, ledger: _Ledger) -> list[tuple[Alloc, float]]:
        """(partner value vector, probability): uniform prior, likelihood ∝ exp(β·u_v(share the partner kept))."""
        counts = scenario.counts
        vectors = value_vectors((counts[0], counts[1], counts[2]))
        logw = [self.beta * sum(utility(kept, v) for kept in ledger.partner_offers) for v in vectors]
        top = max(logw)
        w = [math.exp(x - top) for x in logw]
        z = sum(w)
        return [(v, x / z) for v, x in zip(vectors, w, strict=True)]

    def propose(self, scenario: DondScenario, me: int, ledger: _Ledger) -> Alloc:
        counts = scenario.counts
        post = self.posterior(scenario, ledger)
        progress = min(1.0, ledger.own_turns / _horizon(self.rounds))
        demand = self.start_demand - (self.start_demand - self.end_demand) * progress

        def theirs(share: Alloc) -> float:
            rest = complement(counts, share)
            return sum(p * utility(rest, v) for v, p in post)

        # giving everything away is worth 10 to any partner, so the feasible set is never empty
        feasible = [(s, w, theirs(s)) for s, w in _menu(scenario, me) if theirs(s) >= demand - 1e-9]
        return max(feasible, key=lambda swt: (swt[1], swt[2], tuple(-x for x in swt[0])))[0]

    def takes(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= utility(proposal, scenario.values[me])

    def signs(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int) -> bool:
        return gain >= self.reserve


@dataclass
class SplitDifference(_HeldoutNegotiator):
    """Meets in the middle: item by item, the midpoint (rounded in its own favour) between its own last share and
    what the partner's last ``<try>`` left it; opens with every unit it values."""

    name: str = "split_difference"
    slack: float = 1.0
    reserve: float = 3.0
    voice: _Voice = field(default=_MIRROR, repr=False)

    def propose(self, scenario: DondScenario, me: int, ledger: _Ledger) -> Alloc:
        counts, values = scenario.counts, scenario.values[me]
        own = ledger.own_offers[-1] if ledger.own_offers else tuple(c if v > 0 else 0 for c, v in zip(counts, values))
        if not ledger.partner_offers:
            return (own[0], own[1], own[2])
        left = complement(counts, ledger.partner_offers[-1])
        mid = tuple(math.ceil((a + b) / 2) for a, b in zip(own, left, strict=True))
        return (mid[0], mid[1], mid[2])

    def takes(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= utility(proposal, scenario.values[me]) - self.slack

    def signs(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int) -> bool:
        return gain >= self.reserve


@dataclass
class RandomAspiration(_HeldoutNegotiator):
    """An aspiration drawn per dialogue from [low, high], lowered by a random step in [0, max_step] per own turn down
    to ``floor``; offers a random share worth at least it, takes and confirms what reaches it.

    The per-dialogue draws come from a generator seeded by the scenario and the seat (the bot reads the transcript
    afresh each turn, so its dialogue-level randomness must be recomputable); the choice among the shares uses the
    turn's own generator."""

    name: str = "random_aspiration"
    low: float = 5.0
    high: float = 9.0
    max_step: float = 1.5
    floor: float = 3.0
    rounds: int = 10
    voice: _Voice = field(default=_EAGER, repr=False)

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)

    def aspiration(self, scenario: DondScenario, me: int, ledger: _Ledger) -> float:
        draw = random.Random(f"{self.name}/{scenario.uid}/{scenario.counts}/{scenario.values}/{me}")
        level = draw.uniform(self.low, self.high)
        steps = [draw.uniform(0.0, self.max_step) for _ in range(self.rounds)]
        return max(self.floor, level - sum(steps[: ledger.own_turns]))

    def propose(self, scenario: DondScenario, me: int, ledger: _Ledger) -> Alloc:
        raise NotImplementedError("RandomAspiration's proposal is random: see choose")

    def takes(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= self.aspiration(scenario, me, ledger)

    def signs(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int) -> bool:
        return gain >= self.aspiration(scenario, me, ledger)

    def choose(self, scenario: DondScenario, me: int, ledger: _Ledger, rng: random.Random) -> Alloc:
        aim = self.aspiration(scenario, me, ledger)
        worthy = [s for s, w in _menu(scenario, me) if w >= aim]  # never empty: aim ≤ 9 < 10 = taking everything
        return rng.choice(worthy)


@dataclass
class PickyThenFold(_HeldoutNegotiator):
    """Deadline-driven: its maximum (takes only ≥ ``picky_bar``) for the first ⌈T/2⌉ own turns, then the share
    closest to half its maximum, taking anything worth ≥ ``fold_bar``."""

    name: str = "picky_then_fold"
    picky_bar: float = 9.0
    fold_bar: float = 1.0
    rounds: int = 10
    voice: _Voice = field(default=_FIRM, repr=False)

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)

    def folded(self, ledger: _Ledger) -> bool:
        return ledger.own_turns >= math.ceil(_horizon(self.rounds) / 2)

    def propose(self, scenario: DondScenario, me: int, ledger: _Ledger) -> Alloc:
        priced = _menu(scenario, me)
        top = max(w for _, w in priced)
        if not self.folded(ledger):
            return max(priced, key=lambda sw: sw[1])[0]
        return _closest(scenario, me, top / 2, lambda s: (sum(s), *s))

    def takes(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= (self.fold_bar if self.folded(ledger) else self.picky_bar)

    def signs(self, scenario: DondScenario, me: int, ledger: _Ledger, gain: int) -> bool:
        return gain >= (self.fold_bar if self.folded(ledger) else self.picky_bar)


HELDOUT_BOTS: dict[str, Callable[[], ScriptedNegotiator]] = {
    "hardliner": lambda: Hardliner(name="hardliner", bar=8.0, concede_after=2),
    "tit_for_tat": lambda: TitForTat(name="tit_for_tat", reserve=5.0),
    "slow_conceder": lambda: TimeDependentConceder(name="slow_conceder", e=0.2, reserve=5.0, voice=_PATIENT),
    "fast_conceder": lambda: TimeDependentConceder(name="fast_conceder", e=3.0, reserve=3.0, voice=_EAGER),
    "utility_search": lambda: UtilitySearch(name="utility_search"),
    "split_difference": lambda: SplitDifference(name="split_difference"),
    "random_aspiration": lambda: RandomAspiration(name="random_aspiration"),
    "picky_then_fold": lambda: PickyThenFold(name="picky_then_fold"),
}
"""Held-out scripted counterparts by name; for evaluation only (config refuses them as training counterparts)."""


def make_heldout_bot(name: str, rounds: int | None = None) -> ScriptedNegotiator:
    """A fresh bot from :data:`HELDOUT_BOTS`, calibrated to a round limit of ``rounds`` when given."""
    if name not in HELDOUT_BOTS:
        raise ValueError(f"unknown held-out bot {name!r}; known: {sorted(HELDOUT_BOTS)}")
    bot = HELDOUT_BOTS[name]()
    return bot if rounds is None else with_rounds(bot, rounds)


def with_rounds(bot: ScriptedNegotiator, rounds: int) -> ScriptedNegotiator:
    """``bot`` calibrated to a game of ``rounds`` rounds (T = ``rounds`` − 1 own turns after its first): a copy
    for a time-dependent bot (one with a ``rounds`` field), ``bot`` itself otherwise. A bot parameterised for
    10 rounds in a 5-round game would never reach its reserve (the slow conceder would move by (4/9)^5 ≈ 2%)."""
    _check_rounds(rounds)
    timed = any(f.name == "rounds" for f in fields(bot)) if hasattr(bot, "__dataclass_fields__") else False
    return replace(bot, rounds=rounds) if timed and bot.rounds != rounds else bot  # type: ignore[type-var]


SURFACES = ("phrased",)
"""Surface variants of a held-out bot (``NAME+SURFACE``): the same moves, other words around the markup."""

OPENERS = ("okay, ", "well, ", "hmm, ", "look, ", "fine. ")
CLOSERS = (" deal?", " ok?", " thanks.", "")


def phrase_around(text: str, rng: random.Random) -> str:
    """``text`` with a short phrase before and maybe after it (surface variation; parses the same as ``text``).

    Short on purpose: the tiny models' byte-level BPE spells words outside the protocol character by character
    (an opener is 5 tokens, a closer 2-4, a marker-only ``<try>`` 17)."""
    return f"{rng.choice(OPENERS)}{text}{rng.choice(CLOSERS)}"


def split_surface(name: str) -> tuple[str, str | None]:
    """``"utility_search+phrased"`` → ``("utility_search", "phrased")``; a plain name → ``(name, None)``."""
    base, plus, surface = name.partition("+")
    if not plus:
        return name, None
    if surface not in SURFACES:
        raise ValueError(f"unknown surface {surface!r} in {name!r}; known: {', '.join(SURFACES)}")
    return base, surface
