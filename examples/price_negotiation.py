"""A custom two-role environment: a buyer and a seller haggle over the price of one item.

Train it like any built-in domain (both roles, their own rewards, groups, masks and optimizers)::

    PYTHONPATH=examples marti-ibrl train --env.name price_negotiation:PriceNegotiation \
        --role1.pretrain BUYER_CKPT --role2.pretrain SELLER_CKPT ...

Each private value is seen by its owner only: the buyer knows how much the item is worth to them, the seller what
it cost. Every turn ends with one action: ``OFFER <price>``, ``ACCEPT`` (the other side's last offer) or ``WALK``.
A deal at price p pays the buyer (value - p) and the seller (p - cost), scaled to [-1, 1]; no deal pays 0; a turn
still malformed after the re-samples costs its speaker ``invalid_penalty``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from marti_ibrl.envs.base import Outcome, TurnResult

ACTION = re.compile(r"(?:OFFER\s+(\d{1,4})|ACCEPT|WALK)\s*$")
PROMPTS = {
    "buyer": "You are buying a {item}. It is worth {value} to you; pay as little as you can.",
    "seller": "You are selling a {item}. It cost you {cost}; sell for as much as you can.",
}
RULES = " End every message with OFFER <price>, ACCEPT (the other side's last offer) or WALK."


@dataclass(frozen=True)
class Item:
    uid: str
    item: str
    value: int  # the buyer's private value
    cost: int  # the seller's private cost


@dataclass
class State:
    scenario: Item
    seats: tuple[str, ...]
    turn: int = 0
    offers: dict[str, int] = field(default_factory=dict)  # each role's last offer
    price: int | None = None
    done: bool = False
    fault_role: str | None = None
    reason: str = ""


class PriceNegotiation:
    roles = ("buyer", "seller")

    def __init__(self, cfg):
        self.max_turns = 2 * cfg.max_rounds
        self.invalid_penalty = cfg.invalid_penalty
        self.num_scenarios = cfg.num_scenarios

    def training_scenarios(self, seed: int) -> list[tuple[str, Item]]:
        rng = random.Random(seed)
        items = []
        for i in range(self.num_scenarios):
            cost = rng.randint(10, 80)
            items.append(
                Item(f"item-{seed}-{i}", rng.choice(["bike", "lamp", "guitar"]), cost + rng.randint(5, 60), cost)
            )
        return [(s.uid, s) for s in items]

    def system_prompt(self, scenario: Item, role: str) -> str:
        return PROMPTS[role].format(item=scenario.item, value=scenario.value, cost=scenario.cost) + RULES

    def new_state(self, scenario: Item, seats) -> State:
        return State(scenario, tuple(seats))

    def current_role(self, state: State) -> str:
        return state.seats[state.turn % len(state.seats)]

    def step(self, state: State, role: str, text: str) -> TurnResult:
        match = ACTION.search(text.strip())
        other = next(r for r in self.roles if r != role)
        if match is None:
            return TurnResult(valid=False, done=False, reason="no OFFER <price> / ACCEPT / WALK at the end")
        if match.group(0).startswith("ACCEPT") and other not in state.offers:
            return TurnResult(valid=False, done=False, reason="nothing to accept yet")
        state.turn += 1
        if match.group(1) is not None:
            state.offers[role] = int(match.group(1))
        elif match.group(0).startswith("ACCEPT"):
            state.price, state.done, state.reason = state.offers[other], True, "deal"
        else:
            state.done, state.reason = True, "walked away"
        if not state.done and state.turn >= self.max_turns:
            state.done, state.reason = True, "turn limit"
        return TurnResult(valid=True, done=state.done, reason=state.reason)

    def finish_malformed(self, state: State, role: str) -> None:
        state.done, state.fault_role, state.reason = True, role, "malformed"

    def abort(self, state: State, reason: str) -> None:
        state.done, state.reason = True, reason

    def outcome(self, state: State) -> Outcome:
        s, deal = state.scenario, state.price is not None
        scale = max(s.value, s.cost, 1)
        utilities = {"buyer": (s.value - state.price) / scale, "seller": (state.price - s.cost) / scale} if deal else {}
        return Outcome(
            agreed=deal,
            malformed=state.fault_role is not None,
            utilities={r: utilities.get(r, 0.0) for r in self.roles},
            info={"price": state.price, "reason": state.reason, "fault_role": state.fault_role},
        )

    def reward(self, state: State, role: str) -> float:
        penalty = self.invalid_penalty if state.fault_role == role else 0.0
        return self.outcome(state).utilities[role] + penalty
