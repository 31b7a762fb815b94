"""What every held-out DoND counterpart (:mod:`marti_ibrl.envs.dond.heldout`) reasons with: the transcript read into
a :class:`Ledger` (what each side offered, what the turn must answer), the menu of shares with their worth, the
voices they speak in, and :class:`HeldoutNegotiator`, the turn every one of them takes (answer a final selection,
take a good enough offer, else propose). Nothing here comes from the training bots (:mod:`marti_ibrl.envs.dond.bots`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from marti_ibrl.envs.dond.game import complement, utility
from marti_ibrl.envs.dond.protocol import DISAGREE, format_selection, format_try, parse_utterance
from marti_ibrl.envs.dond.scenarios import Alloc, DondScenario

Transcript = Sequence[tuple[int, str]]  # (speaker role_index, text), valid turns only


# -- reading the transcript ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ledger:
    """What a held-out bot takes from the transcript."""

    own_turns: int  # turns this bot has spoken
    own_offers: tuple[Alloc, ...]  # its <try> allocations (its own units), oldest first
    partner_offers: tuple[Alloc, ...]  # the partner's <try> allocations (the partner's units), oldest first
    answer_to: str | None  # kind of the partner's turn right before this one ("try", "selection", "chat"), if any
    answer_alloc: Alloc | None  # the allocation in that turn (the partner's units)
    dealable: bool  # some <try> was made, so a pair of selections can close a deal (Table 17, rule 6)


_parse = lru_cache(maxsize=8192)(parse_utterance)  # turns repeat across dialogues (templates × allocations)


def read_ledger(transcript: Transcript, me: int) -> Ledger:
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
    return Ledger(
        own_turns=own_turns,
        own_offers=tuple(own_offers),
        partner_offers=tuple(partner_offers),
        answer_to=kind,
        answer_alloc=alloc,
        dealable=bool(own_offers or partner_offers),
    )


@cache
def splits(counts: Alloc) -> tuple[Alloc, ...]:
    """Every way to take units of the three items (one side's share), smallest shares first."""
    shares = [(a, b, c) for a in range(counts[0] + 1) for b in range(counts[1] + 1) for c in range(counts[2] + 1)]
    return tuple(sorted(shares, key=lambda s: (sum(s), s)))


@cache
def priced(counts: Alloc, values: Alloc) -> tuple[tuple[Alloc, int], ...]:
    """Every share with its own value."""
    return tuple((share, utility(share, values)) for share in splits(counts))


def menu(scenario: DondScenario, me: int) -> tuple[tuple[Alloc, int], ...]:
    """Every share of ``scenario`` with its value to role ``me``, smallest shares first."""
    counts, values = scenario.counts, scenario.values[me]
    return priced((counts[0], counts[1], counts[2]), (values[0], values[1], values[2]))


def l1(a: Sequence[int], b: Sequence[int]) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


# -- phrasing --------------------------------------------------------------------------------------------------------


def spell(share: Sequence[int]) -> str:
    """E.g. "2 of item0 plus 1 of item2"; "no items" for an empty share."""
    pieces = [f"{n} of item{k}" for k, n in enumerate(share) if n]
    return " plus ".join(pieces) if pieces else "no items"


@dataclass(frozen=True)
class Voice:
    """Sentence templates of one held-out bot; ``{own}`` / ``{rest}`` are the speaker's and the partner's share."""

    propose: tuple[str, ...]
    accept: tuple[str, ...]
    confirm: tuple[str, ...]
    refuse: tuple[str, ...]


FIRM = Voice(
    propose=(
        "My terms are simple: {own} stays with me, {rest} goes to you.",
        "I need {own}. You may keep {rest}.",
        "Here is where I stand: I keep {own}, you keep {rest}.",
    ),
    accept=("That meets my terms.", "Acceptable. We have terms."),
    confirm=("Done.", "Settled then."),
    refuse=("That falls short of my terms. I walk away.", "Not enough for me, no agreement."),
)
MIRROR = Voice(
    propose=(
        "You moved, so I move: I keep {own} and you keep {rest}.",
        "Matching your step, my proposal is {own} for me and {rest} for you.",
        "Fair is fair: {own} on my side, {rest} on yours.",
    ),
    accept=("You've met me where I hoped. I'll take it.", "Good move, I'm in."),
    confirm=("Locked in.", "We have an agreement."),
    refuse=("I can't sign that one. Let's leave it.", "That's below what I can take, so I'm out."),
)
PATIENT = Voice(
    propose=(
        "Let us consider this split: I would hold {own}, and {rest} would be yours.",
        "Perhaps {own} for me and {rest} for you?",
        "Take your time, but I suggest {own} for me and {rest} for you.",
    ),
    accept=("Very well, I agree to that.", "Alright, that is agreeable."),
    confirm=("Then it is settled.", "Splendid, we have an understanding."),
    refuse=("I am afraid that does not work for me. No agreement.", "Regretfully, I must decline."),
)
EAGER = Voice(
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


class HeldoutNegotiator:
    """One turn of a held-out bot: answer a final selection, take a good enough offer, else propose."""

    name: str
    voice: Voice

    def propose(self, scenario: DondScenario, me: int, ledger: Ledger) -> Alloc:
        """This bot's next ``<try>`` (its own units)."""
        raise NotImplementedError

    def takes(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int, proposal: Alloc) -> bool:
        """Whether to accept the partner's ``<try>`` worth ``gain`` (instead of proposing ``proposal``)."""
        raise NotImplementedError

    def signs(self, scenario: DondScenario, me: int, ledger: Ledger, gain: int) -> bool:
        """Whether to confirm the partner's final ``<selection>`` worth ``gain``."""
        raise NotImplementedError

    def choose(self, scenario: DondScenario, me: int, ledger: Ledger, rng: random.Random) -> Alloc:
        """This turn's proposal: :meth:`propose` (deterministic) unless a bot draws it from the turn's ``rng``."""
        return self.propose(scenario, me, ledger)

    def respond(self, scenario: DondScenario, role_index: int, history: Transcript, rng: random.Random) -> str:
        """The bot's next turn (protocol text): ``<selection>``, ``<disagree>`` or ``<try>``."""
        counts, values = scenario.counts, scenario.values[role_index]
        ledger = read_ledger(history, role_index)
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
        sentence = rng.choice(self.voice.propose).format(own=spell(proposal), rest=spell(complement(counts, proposal)))
        return f"{sentence} {format_try(proposal)}"


def closest(scenario: DondScenario, me: int, target: float, tiebreak: Callable[[Alloc], tuple[int, ...]]) -> Alloc:
    """The share whose own value is closest to ``target`` (at or above it on a tie), then by ``tiebreak``."""
    priced = menu(scenario, me)
    best = min((abs(worth - target), worth < target) for _, worth in priced)
    return min((s for s, w in priced if (abs(w - target), w < target) == best), key=tiebreak)
