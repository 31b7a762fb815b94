"""Scripted TeleSales calls: sales agents of four strategies and a rule-based customer, playing
calls in the format ``marti-ibrl telesales sft`` reads (docs/telesales.md, "Call transcripts"), so a tiny model can
be warm-started on both roles without an LLM or an API key.

* **Sales strategies** (:data:`STRATEGIES`), Table 15's markers exactly as a model should write them:
  ``rapport`` asks what matters to the customer and answers with value (the inspection report, the valuation, the
  warranty) before asking for WeChat; ``product`` talks about the vehicle first; ``early`` asks for WeChat in its
  opening line; ``pushy`` asks in every turn and never answers an objection. After an ``AgreeWeChat`` each sends
  ``add_business_contact`` to the lead's number (``send_contact_invitation`` when the customer says that number is not
  on WeChat); after a second refusal the first three end the call (``<status=end>``), ``pushy`` keeps asking.
* **The customer** (:func:`customer_turn`) reads only what the agent said (its words and markers), as the customer
  model does: value and questions about its needs raise willingness (more when they touch one of the persona's
  concerns), a contact push before the customer is willing lowers it and patience, every turn costs patience. It
  agrees to WeChat at willingness >= :data:`AGREE_AT`, declines softly above :data:`SOFT_AT`, else hard; hangs up when
  patience runs out; confirms an added contact when its profile can add WeChat (``contact.can_add_wechat``), else
  rejects it. Every turn is a valid Table 16 record: ``*_before`` the current scores, deltas in [-0.20, 0.15],
  ``after = clip(before + delta)``, rule 5 kept.

Hand-written rules, not a served model: what they teach is the two formats and that strategies end differently
(:func:`scripted_calls` plays each strategy on every profile it is given), not the paper's customer. Deterministic
in ``seed`` (the wording varies; the decisions follow the rules).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from marti_ibrl.envs.telesales import protocol
from marti_ibrl.envs.telesales.env import TeleSalesEnv, initial_scores
from marti_ibrl.envs.telesales.profiles import generate_profile

STRATEGIES = ("rapport", "product", "early", "pushy")
AGREE_AT = 0.5
"""The willingness (after the turn's change) at which the customer agrees to add WeChat when asked."""
SOFT_AT = 0.3
"""Below :data:`AGREE_AT` and at or above this, an ask is declined softly; below it, hard."""
HANG_UP_AT = 0.08
"""Patience (after the turn's change) at or below which the customer hangs up."""

_ASK = re.compile(r"wechat|add you", re.IGNORECASE)
_VALUE = re.compile(r"report|valuation|inspection|warranty|price|financing|subsid|history|condition", re.IGNORECASE)
_NEED = re.compile(r"\b(what|which|how)\b[^?]*\?", re.IGNORECASE)

_SALES_LINES = {
    "open": ["Hello, this is Li Na from the car platform.", "Hi, Li Na here, calling from the used-car platform."],
    "lead": ["You looked at the {vehicle} in {car_city} recently.", "I'm calling about the {vehicle} you viewed."],
    "need": ["What matters most to you in your next car?", "How do you plan to use the car, mostly?"],
    "value": [
        "Its inspection report is clean, and the listing price is {listing_price_k}k.",
        "It comes with a one-year warranty, and I can send you the full inspection report.",
        "We can do the valuation of your current car for free, and financing is available.",
    ],
    "concern": ["I understand the concern: every car has a third-party inspection report and a warranty."],
    "ask": [
        "May I add you on WeChat to send you the inspection report?",
        "Could I add you on WeChat? I'll send the details there.",
    ],
    "add": ["Great, I've just sent a WeChat friend request to your number."],
    "invite": ["No problem, I've sent you a text message with my WeChat link."],
    "wait": ["Take your time; the request is there whenever you're ready."],
    "bye": ["I understand, thank you for your time. Have a good day."],
}
_CUSTOMER_LINES = {
    "Greeting": ["Hello? Yes, who is this?", "Hi, yes, I'm listening."],
    "AskQuestion": ["What's the mileage on it?", "Is the price negotiable?", "How old is the car exactly?"],
    "ExpressConcern": ["I'm worried about {concern}.", "To be honest, {concern} is what bothers me."],
    "Hesitate": ["Hmm, I'm not sure yet.", "Let me think about it."],
    "RequestValue": ["Can you tell me more about the car's condition?", "What would I get by talking to you?"],
    "PartialAgree": ["That does sound useful.", "Okay, that helps."],
    "AgreeWeChat": ["Okay, add me with this number.", "Fine, you can add me on WeChat."],
    "DeclineSoft": ["Maybe later, I'm busy right now.", "I'd rather not add anyone just yet."],
    "DeclineHard": ["No, I don't want to be added.", "Please don't contact me on WeChat."],
    "HangUp": ["Sorry, I have to go.", "I'm not interested, goodbye."],
    "ConfirmAdded": ["Got it, I accepted your request.", "Yes, I see it, added."],
    "RejectRequest": ["This number isn't on WeChat, actually.", "That request didn't come through to my WeChat."],
    "IgnoreRequest": ["I'll look at it later."],
}
_STAGE = {
    "Greeting": "opening", "AskQuestion": "exploration", "RequestValue": "exploration", "Hesitate": "exploration",
    "PartialAgree": "decision", "ExpressConcern": "objection", "DeclineSoft": "objection",
    "DeclineHard": "objection", "HangUp": "decision", "AgreeWeChat": "wechat_pending",
    "ConfirmAdded": "wechat_pending", "RejectRequest": "wechat_pending", "IgnoreRequest": "wechat_pending",
}  # fmt: skip


def _line(kind: str, rng: random.Random, table: Mapping[str, Sequence[str]], **fields: Any) -> str:
    return rng.choice(table[kind]).format(**fields)


def _customer_records(turns: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [t["record"] for t in turns if t["speaker"] == "customer"]


def sales_turn(
    strategy: str, profile: Mapping[str, Any], turns: Sequence[Mapping[str, Any]], rng: random.Random
) -> str:
    """The next sales turn of ``strategy`` given the call so far (``turns`` as a transcript holds them)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown sales strategy {strategy!r}; strategies are {list(STRATEGIES)}")
    lead = profile["lead"]
    fields = {"vehicle": lead["vehicle"], "car_city": lead["car_city"], **lead["vehicle_info"]}
    said = _customer_records(turns)
    last = said[-1]["behavior"] if said else None
    sent = any("<call_function=" in t.get("text", "") for t in turns if t["speaker"] == "sales")
    asks = sum(bool(_ASK.search(t.get("text", ""))) for t in turns if t["speaker"] == "sales")
    refusals = sum(r["behavior"] in ("DeclineSoft", "DeclineHard") for r in said)

    def say(*kinds: str) -> str:
        return " ".join(_line(k, rng, _SALES_LINES, **fields) for k in kinds)

    if last == "RejectRequest":
        return say("invite") + " <call_function=send_contact_invitation>"
    if any(r["behavior"] == "AgreeWeChat" for r in said):
        if not sent:
            return say("add") + f" <call_function=add_business_contact(phone_number={lead['phone_number']})>"
        return say("wait")
    if not turns:
        return say("open", "lead", "ask") if strategy in ("early", "pushy") else say("open", "lead", "need")
    if strategy == "pushy":
        return say("ask")
    if refusals >= 2 or (last == "DeclineHard" and asks >= 2):
        return say("bye") + " <status=end>"
    if last == "ExpressConcern":
        return say("concern")
    ready = {"rapport": 3, "product": 2, "early": 2}[strategy]  # the agent's own turns before it asks (again)
    own = sum(t["speaker"] == "sales" for t in turns)
    if own >= ready and (asks == 0 or last in ("PartialAgree", "AskQuestion", "RequestValue")):
        return say("value", "ask") if strategy != "rapport" or asks else say("ask")
    return say("value") if strategy != "rapport" or own > 1 else say("need")


def customer_turn(profile: Mapping[str, Any], turns: Sequence[Mapping[str, Any]], rng: random.Random) -> dict[str, Any]:
    """The customer's next Table 16 record given the call so far (the last turn being the agent's), by the rules of
    the module doc."""
    said = _customer_records(turns)
    scores = said[-1] if said else {f"{s}_after": v for s, v in initial_scores(dict(profile)).items()}
    w, p = scores["willingness_after"], scores["patience_after"]
    text = turns[-1]["text"]
    sales = protocol.parse_sales_turn(text)
    agreed = any(r["behavior"] == "AgreeWeChat" for r in said)
    concerns = list(profile["persona"]["concerns"])
    dw, dp = 0.0, -0.03
    if sales.tools and agreed:
        can = profile["contact"]["can_add_wechat"]
        behavior = "ConfirmAdded" if can or sales.tools[0].name == "send_contact_invitation" else "RejectRequest"
        dw = 0.05 if behavior == "ConfirmAdded" else 0.0
    elif agreed:
        behavior = "IgnoreRequest" if rng.random() < 0.5 else "Hesitate"
    elif _ASK.search(text) or sales.tools:
        pushed = sum(bool(_ASK.search(t.get("text", ""))) for t in turns[:-1] if t["speaker"] == "sales")
        dw -= 0.06 * pushed + (0.06 if len(said) < 2 and w < AGREE_AT else 0.0)
        dp -= 0.05 * pushed
        dw += 0.05 if _VALUE.search(text) else 0.0
        after = w + dw
        behavior = "AgreeWeChat" if after >= AGREE_AT else "DeclineSoft" if after >= SOFT_AT else "DeclineHard"
    elif _VALUE.search(text):
        touched = any(word in text.lower() for c in concerns for word in c.lower().split() if len(word) > 4)
        dw += 0.08 + (0.04 if touched else 0.0)
        behavior = "PartialAgree" if w + dw >= AGREE_AT else rng.choice(("AskQuestion", "RequestValue"))
    elif _NEED.search(text):
        dw += 0.04
        behavior = "Greeting" if not said else rng.choice(("AskQuestion", "ExpressConcern"))
    else:
        dw -= 0.02
        behavior = "Greeting" if not said else "Hesitate"
    lo, hi = protocol.DELTA_RANGE
    dw, dp = round(min(hi, max(lo, dw)), 2), round(min(hi, max(lo, dp)), 2)
    if p + dp <= HANG_UP_AT and behavior not in ("ConfirmAdded", "AgreeWeChat"):
        behavior = "HangUp"
    stage = "wechat_pending" if agreed else _STAGE[behavior]
    reply = _line(behavior, rng, _CUSTOMER_LINES, concern=rng.choice(concerns) if concerns else "the price")
    record: dict[str, Any] = {"behavior": behavior, "stage": stage}
    for s, before, d in (("willingness", w, dw), ("patience", p, dp)):
        record |= {f"{s}_before": before, f"{s}_after": round(min(1.0, max(0.0, before + d)), 2), f"{s}_delta": d}
    return {**record, "reply": reply}


def scripted_call(
    profile: Mapping[str, Any], strategy: str, seed: int, call_id: str, env: TeleSalesEnv | None = None
) -> dict[str, Any]:
    """One call of ``strategy`` with the rule-based customer on ``profile`` (a training profile), played through
    ``env`` to its end: a transcript ``{"call_id", "profile", "turns", "strategy", "reason"}``. A turn the
    environment refuses is a ``RuntimeError`` (a bug here, never a call to keep)."""
    env = env or TeleSalesEnv()
    rng = random.Random(f"{seed}:{call_id}")
    state = env.new_state(dict(profile))
    turns: list[dict[str, Any]] = []
    while not state.done:
        if env.current_role(state) == "sales":
            turn: dict[str, Any] = {"speaker": "sales", "text": sales_turn(strategy, profile, turns, rng)}
            result = env.step(state, "sales", turn["text"])
        else:
            record = customer_turn(profile, turns, rng)
            turn = {"speaker": "customer", "record": record}
            result = env.step(state, "customer", protocol.format_customer_turn(
                record["behavior"], record["stage"], record["reply"],
                {s: record[f"{s}_before"] for s in protocol.SCORES},
                {s: record[f"{s}_delta"] for s in protocol.SCORES},
            ))  # fmt: skip
        if not result.valid:
            raise RuntimeError(f"{call_id}: the scripted {turn['speaker']} made a refused turn ({result.reason})")
        turns.append(turn)
    return {"call_id": call_id, "profile": dict(profile), "turns": turns, "strategy": strategy, "reason": state.reason}


def scripted_calls(n_profiles: int, seed: int = 0, strategies: Sequence[str] = STRATEGIES) -> list[dict[str, Any]]:
    """Every strategy's call on each of ``n_profiles`` training profiles (``generate_profile(i, seed, "train")``), in
    profile order; ``call_id`` ``scripted-<seed>-<i>-<strategy>``."""
    if n_profiles < 1:
        raise ValueError(f"n_profiles must be >= 1, got {n_profiles}")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"strategies must be some of {list(STRATEGIES)}, got {list(strategies)}")
    from marti_ibrl.progress import bar

    env = TeleSalesEnv()
    return [
        scripted_call(generate_profile(i, seed, "train"), s, seed, f"scripted-{seed}-{i}-{s}", env)
        for i in bar(range(n_profiles), desc="scripted calls", unit="profile", disable=n_profiles < 500)
        for s in strategies
    ]


def scripted_players(env: Any) -> dict[str, Any]:
    """The strategies as players of the generic warm start (``marti-ibrl sft --env telesales``, ``model tiny --env
    telesales``; :func:`marti_ibrl.sft.data.scripted_records`): ``player(profile, role, history, rng) -> text``, the
    strategy's sales turn or the rule-based customer's Table 16 JSON turn, from the call so far as the env renders it
    (``history``: ``[(role, text), ...]``). Every player plays the same customer, so a call's sales strategy is its
    sales player's name."""
    import json

    def turns_of(history: Sequence[tuple]) -> list[dict[str, Any]]:
        return [
            {"speaker": "sales", "text": h[1]}
            if h[0] == "sales"
            else {"speaker": "customer", "record": json.loads(h[1])}
            for h in history
        ]

    def player(strategy: str):
        def play(profile: Mapping[str, Any], role: str, history: Sequence[tuple], rng: random.Random) -> str:
            turns = turns_of(history)
            if role == "sales":
                return sales_turn(strategy, profile, turns, rng)
            r = customer_turn(profile, turns, rng)
            before = {s: r[f"{s}_before"] for s in protocol.SCORES}
            return protocol.format_customer_turn(r["behavior"], r["stage"], r["reply"], before,
                                                 {s: r[f"{s}_delta"] for s in protocol.SCORES})  # fmt: skip

        return play

    return {s: player(s) for s in STRATEGIES}
