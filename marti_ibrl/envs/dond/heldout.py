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
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from marti_ibrl.envs.dond.game import complement, utility
from marti_ibrl.envs.dond.negotiation import (
    EAGER,
    FIRM,
    MIRROR,
    PATIENT,
    HeldoutNegotiator,
    Ledger,
    Voice,
    closest,
    l1,
    menu,
)
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


@dataclass
class Hardliner(HeldoutNegotiator):
    """Deals only at ≥ ``bar`` points; one concession after ``concede_after`` offers, never another."""

    name: str = "hardliner"
    bar: float = 8.0
    concede_after: int = 2
    voice: Voice = field(default=FIRM, repr=False)

    def propose(self, scenario: DondScenario, me: int, ledger: Ledger) -> Alloc:
        priced = menu(scenario, me)  # smallest shares first: ties keep the smaller
        if len(ledger.own_offers) < self.concede_after:  # its maximum, giving away what it does not value
            return max(priced, key=lambda sw: sw[1])[0]
        worthy = [sw for sw in priced if sw[1] >= self.bar]  # never empty: taking everything is worth the maximum
        return min(worthy, key=lambda sw: sw[1])[0]

    def takes(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= self.bar

    def signs(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int) -> bool:
        return gain >= self.bar


@dataclass
class TitForTat(HeldoutNegotiator):
    """Mirrors the partner's concessions, measured in its own values, from its maximum down to ``reserve``."""

    name: str = "tit_for_tat"
    reserve: float = 5.0
    voice: Voice = field(default=MIRROR, repr=False)

    def target(self, scenario: DondScenario, me: int, ledger: Ledger) -> float:
        """Own value aimed at: the maximum, moved by each step of the partner's offers (what it gave me more)."""
        counts, values = scenario.counts, scenario.values[me]
        top = float(utility(counts, values))
        aim = top
        offers = ledger.partner_offers
        for before, after in zip(offers, offers[1:]):
            step = utility(complement(counts, after), values) - utility(complement(counts, before), values)
            aim = min(top, max(self.reserve, aim - step))
        return aim

    def propose(self, scenario: DondScenario, me: int, ledger: Ledger) -> Alloc:
        aim = self.target(scenario, me, ledger)
        last = ledger.own_offers[-1] if ledger.own_offers else scenario.counts
        return closest(scenario, me, aim, lambda s: (l1(s, last), *s))

    def takes(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= utility(proposal, scenario.values[me])

    def signs(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int) -> bool:
        return gain >= self.reserve


@dataclass
class TimeDependentConceder(HeldoutNegotiator):
    """target(t) = max_u − (max_u − reserve)·(t/T)^(1/e), t = own turns so far, T = ``rounds`` − 1.

    Among the shares closest to the target it prefers the one leaving the partner what the partner last asked for.
    """

    name: str = "slow_conceder"
    e: float = 0.2
    reserve: float = 5.0
    rounds: int = 10
    voice: Voice = field(default=PATIENT, repr=False)

    def __post_init__(self) -> None:
        if self.e <= 0:
            raise ValueError(f"the concession exponent e must be > 0, got {self.e}")
        _check_rounds(self.rounds)

    def target(self, scenario: DondScenario, me: int, ledger: Ledger) -> float:
        top = float(utility(scenario.counts, scenario.values[me]))
        progress = min(1.0, ledger.own_turns / max(1, self.rounds - 1))
        return top - (top - self.reserve) * progress ** (1.0 / self.e)

    def propose(self, scenario: DondScenario, me: int, ledger: Ledger) -> Alloc:
        counts = scenario.counts
        asked = ledger.partner_offers[-1] if ledger.partner_offers else (0, 0, 0)

        def tiebreak(share: Alloc) -> tuple[int, ...]:
            return (l1(complement(counts, share), asked), sum(share), *share)

        return closest(scenario, me, self.target(scenario, me, ledger), tiebreak)

    def takes(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= utility(proposal, scenario.values[me])

    def signs(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int) -> bool:
        return gain >= self.reserve


def _horizon(rounds: int) -> int:
    """T = own turns after the first within a round limit of ``rounds`` (a round is one turn per role)."""
    return max(1, rounds - 1)


def _check_rounds(rounds: int) -> None:
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")


@dataclass
class UtilitySearch(HeldoutNegotiator):
    """Model-based: a posterior over the partner's value vectors from its ``<try>``s; the own-best share whose
    expected partner value is ≥ demand(t) = start − (start − end)·min(1, t/T)."""

    name: str = "utility_search"
    beta: float = 1.0
    start_demand: float = 6.0
    end_demand: float = 3.0
    reserve: float = 3.0
    rounds: int = 10
    voice: Voice = field(default=PATIENT, repr=False)

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)

    def posterior(self, scenario: DondScenario, ledger: Ledger) -> list[tuple[Alloc, float]]:
        """(partner value vector, probability): uniform prior, likelihood ∝ exp(β·u_v(share the partner kept))."""
        counts = scenario.counts
        vectors = value_vectors((counts[0], counts[1], counts[2]))
        logw = [self.beta * sum(utility(kept, v) for kept in ledger.partner_offers) for v in vectors]
        top = max(logw)
        w = [math.exp(x - top) for x in logw]
        z = sum(w)
        return [(v, x / z) for v, x in zip(vectors, w, strict=True)]

    def propose(self, scenario: DondScenario, me: int, ledger: Ledger) -> Alloc:
        counts = scenario.counts
        post = self.posterior(scenario, ledger)
        progress = min(1.0, ledger.own_turns / _horizon(self.rounds))
        demand = self.start_demand - (self.start_demand - self.end_demand) * progress

        def theirs(share: Alloc) -> float:
            rest = complement(counts, share)
            return sum(p * utility(rest, v) for v, p in post)

        # giving everything away is worth 10 to any partner, so the feasible set is never empty
        feasible = [(s, w, theirs(s)) for s, w in menu(scenario, me) if theirs(s) >= demand - 1e-9]
        return max(feasible, key=lambda swt: (swt[1], swt[2], tuple(-x for x in swt[0])))[0]

    def takes(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= utility(proposal, scenario.values[me])

    def signs(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int) -> bool:
        return gain >= self.reserve


@dataclass
class SplitDifference(HeldoutNegotiator):
    """Meets in the middle: item by item, the midpoint (rounded in its own favour) between its own last share and
    what the partner's last ``<try>`` left it; opens with every unit it values."""

    name: str = "split_difference"
    slack: float = 1.0
    reserve: float = 3.0
    voice: Voice = field(default=MIRROR, repr=False)

    def propose(self, scenario: DondScenario, me: int, ledger: Ledger) -> Alloc:
        counts, values = scenario.counts, scenario.values[me]
        own = ledger.own_offers[-1] if ledger.own_offers else tuple(c if v > 0 else 0 for c, v in zip(counts, values))
        if not ledger.partner_offers:
            return (own[0], own[1], own[2])
        left = complement(counts, ledger.partner_offers[-1])
        mid = tuple(math.ceil((a + b) / 2) for a, b in zip(own, left, strict=True))
        return (mid[0], mid[1], mid[2])

    def takes(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= utility(proposal, scenario.values[me]) - self.slack

    def signs(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int) -> bool:
        return gain >= self.reserve


@dataclass
class RandomAspiration(HeldoutNegotiator):
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
    voice: Voice = field(default=EAGER, repr=False)

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)

    def aspiration(self, scenario: DondScenario, me: int, ledger: Ledger) -> float:
        draw = random.Random(f"{self.name}/{scenario.uid}/{scenario.counts}/{scenario.values}/{me}")
        level = draw.uniform(self.low, self.high)
        steps = [draw.uniform(0.0, self.max_step) for _ in range(self.rounds)]
        return max(self.floor, level - sum(steps[: ledger.own_turns]))

    def propose(self, scenario: DondScenario, me: int, ledger: Ledger) -> Alloc:
        raise NotImplementedError("RandomAspiration's proposal is random: see choose")

    def takes(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= self.aspiration(scenario, me, ledger)

    def signs(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int) -> bool:
        return gain >= self.aspiration(scenario, me, ledger)

    def choose(self, scenario: DondScenario, me: int, ledger: Ledger, rng: random.Random) -> Alloc:
        aim = self.aspiration(scenario, me, ledger)
        worthy = [s for s, w in menu(scenario, me) if w >= aim]  # never empty: aim ≤ 9 < 10 = taking everything
        return rng.choice(worthy)


@dataclass
class PickyThenFold(HeldoutNegotiator):
    """Deadline-driven: its maximum (takes only ≥ ``picky_bar``) for the first ⌈T/2⌉ own turns, then the share
    closest to half its maximum, taking anything worth ≥ ``fold_bar``."""

    name: str = "picky_then_fold"
    picky_bar: float = 9.0
    fold_bar: float = 1.0
    rounds: int = 10
    voice: Voice = field(default=FIRM, repr=False)

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)

    def folded(self, ledger: Ledger) -> bool:
        return ledger.own_turns >= math.ceil(_horizon(self.rounds) / 2)

    def propose(self, scenario: DondScenario, me: int, ledger: Ledger) -> Alloc:
        priced = menu(scenario, me)
        top = max(w for _, w in priced)
        if not self.folded(ledger):
            return max(priced, key=lambda sw: sw[1])[0]
        return closest(scenario, me, top / 2, lambda s: (sum(s), *s))

    def takes(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int, proposal: Alloc) -> bool:
        return gain >= (self.fold_bar if self.folded(ledger) else self.picky_bar)

    def signs(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int) -> bool:
        return gain >= (self.fold_bar if self.folded(ledger) else self.picky_bar)


HELDOUT_BOTS: dict[str, Callable[[], ScriptedNegotiator]] = {
    "hardliner": lambda: Hardliner(name="hardliner", bar=8.0, concede_after=2),
    "tit_for_tat": lambda: TitForTat(name="tit_for_tat", reserve=5.0),
    "slow_conceder": lambda: TimeDependentConceder(name="slow_conceder", e=0.2, reserve=5.0, voice=PATIENT),
    "fast_conceder": lambda: TimeDependentConceder(name="fast_conceder", e=3.0, reserve=3.0, voice=EAGER),
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
