"""Vehicle TeleSales customer profiles (paper §5.1-5.2 and Appendix D: Tables 5, 6, 7, 14, 15, 16).

*Training* profiles (§5.1, Table 5) have 28 attributes in six groups and carry every customer-prompt field of
Table 16 plus the lead fields of the training sales prompt (Table 15). *Evaluation* profiles (§5.2, Table 6) have
40 attributes in eight groups: they add structured concerns, speech-profile fields and the initial
willingness/trust/patience, and use Appendix D's JSON layout (``case_control``, ``user_profile``,
``agent_info.known_customer_info``, ``runtime_state.initial_state``, ``generation_meta``).

Construction follows Appendix D ("Profile Construction"): every field is drawn from the pools below, then
cross-field consistency correction (:func:`fix_family`, :func:`fix_needs`, :func:`fix_budget`,
:func:`fix_timeline`, :func:`fix_contact_channels`), then the initial state (fields + small noise) and the
ex-post difficulty score. Profile ``i`` draws from ``random.Random(f"{seed}/{split}/{i}")``: it does not depend on
how many profiles are generated, and a fixed seed and :data:`CODE_VERSION` give the same batch.

The paper prints the schema captions but not their rows. Field names come from Table 16 (customer prompt), Table 10
(sales prompt's known customer info) and Appendix D's story-compilation prompt; the remaining fields are ours and
are listed in :data:`TRAIN_GROUPS` / :data:`EVAL_GROUPS`. Money (``budget_range``, ``listing_price_k``) is in
thousand RMB.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Iterable
from typing import IO, Any

CODE_VERSION = "telesales-profiles/1"
"""Recorded in ``generation_meta``; bump it whenever pools or rules change (same seed + version = same batch)."""
SPLITS = ("train", "eval")
MAX_TURNS = 20
"""Turn limit recorded in ``case_control`` (§5.1: 'a fixed turn limit'; the paper does not print its value)."""

# ---- schema: group -> field names (Table 5: 28 attributes / 6 groups; Table 6: 40 attributes / 8 groups) ----
TRAIN_GROUPS: dict[str, tuple[str, ...]] = {
    "identity": ("name", "gender", "age", "occupation", "city", "family_situation", "background"),
    "lead": ("vehicle", "car_city", "budget", "purchase_timeline", "vehicle_info", "phone_number"),  # Table 15
    "contact": ("wechat_id", "wechat_privacy", "primary_wechat", "can_add_wechat", "alternate_phone"),
    "needs": ("usage_scenario", "primary_needs", "intent_level", "intent_description"),
    "persona": ("personality", "concerns", "speaking_style"),
    "call": ("call_environment", "signal_quality", "lead_memory"),
}
EVAL_GROUPS: dict[str, tuple[str, ...]] = {
    "case_control": ("sample_id", "max_turns", "difficulty", "difficulty_score", "hard_factors"),
    "known_customer_info": (  # Table 10's inputs: the only fields the sales agent sees
        "target_car", "car_city", "budget_range", "purchase_timeline", "car_info", "phone_number", "phone_tail"
    ),
    "identity": ("name", "gender", "age", "occupation", "family_situation", "co_decision_maker"),
    "purchase": (
        "city", "same_city", "purchase_experience", "usage_scenario", "primary_needs", "intent_level", "lead_memory"
    ),
    "contact": ("wechat_privacy", "primary_wechat", "can_add_wechat", "alternate_phone"),
    "concerns": ("concerns", "price_sensitivity"),  # structured concerns: [{category, detail, priority}]
    "speech": ("personality", "speaking_style", "disfluency", "signal_quality", "call_environment", "comprehension"),
    "initial_state": ("willingness", "trust", "patience"),
}  # fmt: skip
EVAL_PATHS: dict[str, tuple[str, ...]] = {
    "case_control": ("case_control",),
    "known_customer_info": ("agent_info", "known_customer_info"),
    **{g: ("user_profile", g) for g in ("identity", "purchase", "contact", "concerns", "speech")},
    "initial_state": ("runtime_state", "initial_state"),
}
"""Where each evaluation group lives in Appendix D's nested JSON."""
TRAIN_ALIASES = {"vehicle": "target_car", "budget": "budget_range", "vehicle_info": "car_info"}
"""Training (Table 15/16) name -> internal (Table 10) name of the same lead field."""

# ---- field pools (plain data) ----
SURNAMES = ("Zhang", "Wang", "Li", "Liu", "Chen", "Yang", "Zhao", "Huang", "Zhou", "Wu", "Xu", "Sun", "Ma", "Hu")
GIVEN_NAMES = {
    "male": ("Wei", "Lei", "Qiang", "Yang", "Jie", "Fan", "Peng", "Tao", "Bin", "Hao", "Jun", "Ming"),
    "female": ("Fang", "Na", "Min", "Ying", "Jing", "Li", "Xue", "Mei", "Yan", "Qian", "Hui", "Lin"),
}
OCCUPATIONS = {  # occupation -> (min age, max age)
    "express courier": (21, 45), "software engineer": (23, 45), "primary school teacher": (24, 58),
    "nurse": (22, 55), "small business owner": (28, 60), "sales manager": (26, 50), "factory technician": (20, 55),
    "civil servant": (24, 60), "doctor": (28, 60), "graduate student": (22, 28), "ride-hailing driver": (25, 55),
    "retired engineer": (56, 68), "freelance designer": (22, 40), "accountant": (23, 55), "real-estate agent": (22, 45),
}  # fmt: skip
CITIES = (
    "Beijing", "Shanghai", "Guangzhou", "Shenzhen", "Hangzhou", "Chengdu", "Wuhan", "Nanjing", "Xi'an", "Chongqing",
    "Suzhou", "Tianjin", "Changsha", "Zhengzhou", "Qingdao", "Hefei", "Foshan", "Kunming",
)  # fmt: skip
FAMILIES = {  # family situation -> (min age, max age, has children, co-decision makers it allows)
    "single, lives alone": (20, 70, False, ("self",)),
    "single, lives with parents": (20, 38, False, ("self", "parents")),
    "in a relationship": (20, 45, False, ("self", "partner")),
    "married, no children": (23, 70, False, ("spouse", "self, informs spouse")),
    "married with a young child": (25, 48, True, ("spouse",)),
    "married with school-age children": (32, 58, True, ("spouse", "self, informs spouse")),
    "married with grown-up children": (46, 70, True, ("spouse", "grown-up children")),
    "divorced, raising a child": (30, 55, True, ("self", "parents")),
}
USAGES = {  # usage scenario -> needs children in the household
    "daily commute": False, "school run and family errands": True, "weekend family outings": True,
    "long-distance road trips": False, "visiting parents in the hometown": False, "client visits for work": False,
    "city errands and shopping": False, "side job as a ride-hailing driver": False,
}  # fmt: skip
ELECTRIFIED = ("electric", "extended-range", "plug-in hybrid")
VEHICLES = {  # target car -> (body, energy, listing price band in k RMB)
    "compact gasoline hatchback": ("hatchback", "gasoline", (40, 80)),
    "compact electric hatchback": ("hatchback", "electric", (50, 90)),
    "compact gasoline sedan": ("sedan", "gasoline", (60, 110)),
    "mid-size gasoline sedan": ("sedan", "gasoline", (100, 180)),
    "hybrid mid-size sedan": ("sedan", "hybrid", (120, 200)),
    "electric sedan": ("sedan", "electric", (130, 230)),
    "compact gasoline SUV": ("compact SUV", "gasoline", (80, 140)),
    "plug-in hybrid SUV": ("SUV", "plug-in hybrid", (150, 220)),
    "extended-range SUV": ("SUV", "extended-range", (200, 260)),
    "seven-seat gasoline SUV": ("7-seat SUV", "gasoline", (160, 260)),
    "gasoline MPV": ("MPV", "gasoline", (150, 250)),
    "electric MPV": ("MPV", "electric", (220, 330)),
}
NEEDS = {  # primary need -> (bodies it fits, energies it fits); None = any
    "space": (("SUV", "7-seat SUV", "MPV"), None),
    "seven seats": (("7-seat SUV", "MPV"), None),
    "easy parking": (("hatchback", "sedan", "compact SUV"), None),
    "low running cost": (None, (*ELECTRIFIED, "hybrid")),
    "long electric range": (None, ELECTRIFIED),
    "safety": (None, None), "reliability": (None, None), "comfort": (None, None),
    "smart cockpit features": (None, None), "resale value": (None, None),
}  # fmt: skip
CONCERNS = {  # category -> (requirement: None | "electrified" | "cross_city", details)
    "warranty coverage": (None, ("whether normal maintenance or out-of-town repairs are covered",
                                 "how long the platform warranty lasts and what it excludes")),
    "mileage authenticity": (None, ("whether wear matches the odometer", "whether it had heavy or commercial use")),
    "accident and flood history": (None, ("whether there was a major accident", "whether the car was ever flooded")),
    "price and fees": (None, ("the out-the-door total including fees", "whether the listed price is negotiable")),
    "financing and subsidies": (None, ("full payment vs. installments", "which subsidies still apply")),
    "battery health": ("electrified", ("remaining battery capacity", "whether the battery warranty transfers")),
    "cross-city transfer": ("cross_city", ("whether the car can be registered locally", "delivery time and cost")),
    "privacy and follow-up calls": (None, ("being called repeatedly afterwards", "how the phone number is used")),
    "scam risk": (None, ("whether the call really comes from the platform", "being asked for a deposit early")),
}  # fmt: skip
TIMELINES = {  # purchase timeline -> days (None: no plan)
    "within a week": 7, "within two weeks": 14, "within a month": 30, "within three months": 90,
    "within half a year": 180, "no fixed plan": None,
}  # fmt: skip
INTENT_WEIGHTS = {"accidental": 0.12, "casual": 0.28, "interested": 0.42, "urgent": 0.18}
INTENT_TIMELINES = {  # the timelines each intent level allows (Table 16 intent definitions)
    "urgent": ("within a week", "within two weeks"),
    "interested": ("within a month", "within three months"),
    "casual": ("within half a year", "no fixed plan"),
    "accidental": ("no fixed plan",),
}
INTENT_DESCRIPTIONS = {  # Table 16, paraphrased
    "accidental": "did not intentionally submit the lead; almost no purchase intention",
    "casual": "browsed casually; no near-term purchase plan",
    "interested": "actively comparing vehicles; may buy in the medium term",
    "urgent": "intends to buy soon; prefers direct, efficient answers",
}
PERSONALITIES = ("friendly", "skeptical", "impatient", "analytical", "passive")  # Table 8 behaviour calibration
SPEAKING_STYLES = ("colloquial and a bit rambling", "short and direct", "polite and formal", "talkative",
                   "hesitant, with long pauses")  # fmt: skip
DISFLUENCIES = ("none", "occasional filler words", "frequent filler words and restarts")
SIGNALS = ("good", "mediocre", "poor")
CALL_ENVIRONMENTS = {  # call environment -> busyness in [0, 1]
    "at home, relaxed": 0.0, "on a lunch break": 0.3, "walking outdoors": 0.4, "commuting on the subway": 0.5,
    "in a noisy restaurant": 0.6, "at work, between tasks": 0.7, "on a delivery route": 0.9, "driving": 1.0,
}  # fmt: skip
COMPREHENSION = ("knows used-car terms well", "knows the basics",
                 "unfamiliar with used-car warranty, financing and subsidy rules")  # fmt: skip
EXPERIENCES = ("first car purchase", "has bought a new car before", "has bought a used car before",
               "trading in the current car")  # fmt: skip
LEAD_TYPES = ("trade-in valuation", "price inquiry", "test-drive booking", "saved listing", "loan pre-check")
LEAD_MEMORIES = ("remembers the lead and the listing", "remembers the action but not the listing",
                 "does not remember submitting a lead")  # fmt: skip
PRIVACY = ("searchable by phone number", "friend requests need verification", "not searchable by phone number")
PRIMARY_WECHAT = ("this number", "another number")  # the number the customer's main WeChat account is bound to
BUDGET_TIERS = ((50, 80), (80, 120), (100, 150), (120, 180), (150, 200), (200, 250), (250, 300), (300, 350))


def _phone(rng: random.Random) -> str:
    return "1" + rng.choice("3578") + "".join(rng.choice("0123456789") for _ in range(9))


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def sample_fields(rng: random.Random) -> dict[str, Any]:
    """Every field drawn from its pool, before correction (internal names, as in :data:`EVAL_GROUPS`). Only two
    draws are conditioned: lead memory on intent (an accidental lead is mostly forgotten), and the car is in the
    customer's city with probability 0.7."""
    gender = rng.choice(("male", "female"))
    occupation = rng.choice(list(OCCUPATIONS))
    city = rng.choice(CITIES)
    car = rng.choice(list(VEHICLES))
    body, energy, (lo, hi) = VEHICLES[car]
    intent = _pick(rng, INTENT_WEIGHTS)
    memory_weights = (0.1, 0.2, 0.7) if intent == "accidental" else (0.45, 0.4, 0.15)
    year = rng.randint(2016, 2023)
    primary = rng.choices(PRIMARY_WECHAT, weights=(0.8, 0.2))[0]
    return {
        "name": f"{rng.choice(SURNAMES)} {rng.choice(GIVEN_NAMES[gender])}",
        "gender": gender,
        "age": rng.randint(*OCCUPATIONS[occupation]),
        "occupation": occupation,
        "family_situation": rng.choice(list(FAMILIES)),
        "co_decision_maker": rng.choice(("self", "partner", "spouse", "parents")),
        "city": city,
        "car_city": city if rng.random() < 0.7 else rng.choice(CITIES),
        "purchase_experience": rng.choice(EXPERIENCES),
        "comprehension": rng.choice(COMPREHENSION),
        "target_car": car,
        "car_info": {
            "body": body,
            "energy": energy,
            "year": year,
            "mileage_km": (2025 - year) * rng.randint(6, 20) * 1000,
            "listing_price_k": rng.randint(lo, hi),
            "lead_type": rng.choice(LEAD_TYPES),
            "lead_days_ago": rng.randint(1, 30),
        },
        "budget_range": list(rng.choice(BUDGET_TIERS)),
        "purchase_timeline": rng.choice(list(TIMELINES)),
        "usage_scenario": rng.choice(list(USAGES)),
        "primary_needs": rng.sample(list(NEEDS), rng.randint(2, 3)),
        "intent_level": intent,
        "lead_memory": rng.choices(LEAD_MEMORIES, weights=memory_weights)[0],
        "concerns": [
            {"category": c, "detail": rng.choice(CONCERNS[c][1]), "priority": i + 1}
            for i, c in enumerate(rng.sample(list(CONCERNS), rng.choices((1, 2, 3, 4), weights=(2, 4, 3, 1))[0]))
        ],
        "price_sensitivity": rng.choice(("low", "medium", "high")),
        "personality": rng.choice(PERSONALITIES),
        "speaking_style": rng.choice(SPEAKING_STYLES),
        "disfluency": rng.choice(DISFLUENCIES),
        "signal_quality": rng.choices(SIGNALS, weights=(5, 3, 2))[0],
        "call_environment": rng.choice(list(CALL_ENVIRONMENTS)),
        "phone_number": _phone(rng),
        "wechat_id": "wxid_" + "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(10)),
        "wechat_privacy": rng.choices(PRIVACY, weights=(6, 2.5, 1.5))[0],
        "primary_wechat": primary,
        "alternate_phone": _phone(rng) if rng.random() < 0.3 else None,
    }


# ---- cross-field consistency correction (Appendix D: family, needs, budget, timeline, contact channels) ----
def fix_family(p: dict[str, Any], rng: random.Random) -> None:
    """The family situation fits the age, the co-decision maker fits the family, and a family-only usage
    scenario (school run, family outings) appears only in a household with children."""
    lo, hi, _, _ = FAMILIES[p["family_situation"]]
    if not lo <= p["age"] <= hi:
        p["family_situation"] = rng.choice([f for f, (a, b, _, _) in FAMILIES.items() if a <= p["age"] <= b])
    _, _, children, deciders = FAMILIES[p["family_situation"]]
    if p["co_decision_maker"] not in deciders:
        p["co_decision_maker"] = rng.choice(deciders)
    if USAGES[p["usage_scenario"]] and not children:
        p["usage_scenario"] = rng.choice([u for u, family in USAGES.items() if not family])


def need_fits(need: str, body: str, energy: str) -> bool:
    """Whether a primary need fits a car body and energy (:data:`NEEDS`)."""
    bodies, energies = NEEDS[need]
    return (bodies is None or body in bodies) and (energies is None or energy in energies)


def fix_needs(p: dict[str, Any], rng: random.Random) -> None:
    """Two or three primary needs, each fitting the target car's body and energy (no 'seven seats' for a
    hatchback, no 'long electric range' for a gasoline car); a household with children always lists 'safety'.
    Concerns likewise fit the situation: 'battery health' only for an electrified car, 'cross-city transfer' only
    across cities."""
    body, energy = p["car_info"]["body"], p["car_info"]["energy"]
    needs = [n for n in p["primary_needs"] if need_fits(n, body, energy)]
    spare = [n for n in NEEDS if n not in needs and need_fits(n, body, energy)]
    rng.shuffle(spare)
    needs += spare[: max(0, 2 - len(needs))]
    if FAMILIES[p["family_situation"]][2] and "safety" not in needs:
        needs[-1] = "safety"
    p["primary_needs"] = needs
    ok = {None, *(("electrified",) if energy in ELECTRIFIED else ()), *(("cross_city",) if not p["same_city"] else ())}
    kept = [c for c in p["concerns"] if CONCERNS[c["category"]][0] in ok]
    if not kept:
        category = rng.choice([c for c, (req, _) in CONCERNS.items() if req is None])
        kept = [{"category": category, "detail": rng.choice(CONCERNS[category][1])}]
    p["concerns"] = [{**c, "priority": i + 1} for i, c in enumerate(kept)]


def fix_budget(p: dict[str, Any], rng: random.Random) -> None:
    """The budget range [low, high] (k RMB, multiples of 10) contains the target car's listing price, which lies in
    the model's price band: an out-of-range budget window is moved, keeping its width, to cover the price."""
    low, high = p["budget_range"]
    price = p["car_info"]["listing_price_k"]
    if not low <= price <= high:
        width = high - low
        low = max(10, price // 10 * 10 - 10 * rng.randrange(width // 10))
        p["budget_range"] = [low, low + width]


def fix_timeline(p: dict[str, Any], rng: random.Random) -> None:
    """The purchase timeline matches the intent level (:data:`INTENT_TIMELINES`): urgent <-> within two weeks,
    interested -> one to three months, casual -> half a year or no plan, accidental -> no plan."""
    if p["purchase_timeline"] not in INTENT_TIMELINES[p["intent_level"]]:
        p["purchase_timeline"] = rng.choice(INTENT_TIMELINES[p["intent_level"]])


def fix_contact_channels(p: dict[str, Any], rng: random.Random) -> None:
    """Contact channels are hard constraints (Appendix D, Table 8). The current number can add the business
    contact iff the main WeChat is bound to it and it is searchable by phone number. A main WeChat on another
    number means that number is the (searchable) ``alternate_phone``; with the main WeChat on this number there is
    no alternate, so a number that cannot add leaves either the alternate phone or, when search is blocked, only
    the SMS invitation (Table 15's ``send_contact_invitation``)."""
    if p["primary_wechat"] == "another number":
        while p["alternate_phone"] in (None, p["phone_number"]):
            p["alternate_phone"] = _phone(rng)
        if p["wechat_privacy"] == "not searchable by phone number":
            p["wechat_privacy"] = rng.choice(PRIVACY[:2])
    else:
        p["alternate_phone"] = None
    p["can_add_wechat"] = p["primary_wechat"] == "this number" and p["wechat_privacy"] != PRIVACY[2]


CORRECTIONS = (fix_family, fix_needs, fix_budget, fix_timeline, fix_contact_channels)


# ---- initial state (Appendix D: willingness 0.11/0.406/0.79, trust 0.24/0.524/0.82, patience 0.17/0.543/0.89) ----
STATE_BASE = {"willingness": 0.38, "trust": 0.485, "patience": 0.56}
STATE_EFFECTS: dict[str, dict[str, dict[Any, float]]] = {  # field -> value -> additive effect per state
    "willingness": {
        "intent_level": {"accidental": -0.15, "casual": -0.07, "interested": 0.04, "urgent": 0.22},
        "lead_memory": dict(zip(LEAD_MEMORIES, (0.05, 0.0, -0.04), strict=True)),
        "personality": {"friendly": 0.06, "skeptical": -0.03, "impatient": -0.02, "analytical": 0.0, "passive": -0.03},
        "price_sensitivity": {"low": 0.03, "medium": 0.0, "high": -0.03},
        "same_city": {True: 0.02, False: -0.03},
    },
    "trust": {
        "personality": {"friendly": 0.15, "skeptical": -0.12, "impatient": -0.02, "analytical": -0.04, "passive": 0.04},
        "lead_memory": dict(zip(LEAD_MEMORIES, (0.07, 0.0, -0.07), strict=True)),
        "purchase_experience": dict(zip(EXPERIENCES, (-0.02, 0.0, 0.03, 0.02), strict=True)),
        "intent_level": {"accidental": -0.04, "casual": -0.01, "interested": 0.02, "urgent": 0.03},
    },
    "patience": {
        "personality": {"friendly": 0.10, "skeptical": 0.0, "impatient": -0.20, "analytical": 0.06, "passive": 0.02},
        "call_environment": {env: 0.10 - 0.24 * busy for env, busy in CALL_ENVIRONMENTS.items()},
        "intent_level": {"accidental": -0.06, "casual": -0.02, "interested": 0.02, "urgent": 0.04},
        "signal_quality": {"good": 0.02, "mediocre": 0.0, "poor": -0.04},
    },
}
STATE_NOISE = 0.05
"""Half-width of the uniform noise added to each state score before clipping to [0.05, 0.95]."""


def initial_state(p: dict[str, Any], rng: random.Random) -> dict[str, float]:
    """``runtime_state.initial_state``: base + Σ field effects (:data:`STATE_EFFECTS`) + U(±0.05), clipped, 2 d.p."""
    state = {}
    for name, effects in STATE_EFFECTS.items():
        x = STATE_BASE[name] + sum(table[p[field]] for field, table in effects.items())
        state[name] = round(min(0.95, max(0.05, x + rng.uniform(-STATE_NOISE, STATE_NOISE))), 2)
    return state


# ---- ex-post difficulty (Appendix D: 'scored for difficulty after construction'; Table 14: 'medium (45.72)') ----
DIFFICULTY_WEIGHTS = {  # hard factor -> weight; score = Σ weight · factor, factor in [0, 1], so score in [0, 100]
    "low intent": 18, "resistant personality": 12, "forgotten lead": 8, "no phone-number add path": 8,
    "cross-city": 6, "many concerns": 8, "poor call conditions": 8, "low initial state": 32,
}  # fmt: skip
DIFFICULTY_LEVELS = {  # hard factor -> field value -> factor in [0, 1] (higher = harder)
    "low intent": {"urgent": 0.0, "interested": 0.3, "casual": 0.7, "accidental": 1.0},
    "resistant personality": {"friendly": 0.0, "analytical": 0.4, "passive": 0.6, "skeptical": 0.8, "impatient": 1.0},
    "forgotten lead": dict(zip(LEAD_MEMORIES, (0.0, 0.5, 1.0), strict=True)),
}
DIFFICULTY_THRESHOLDS = (33.0, 50.0)
"""score < 33: easy; < 50: medium; else hard (seed 0, 500 eval profiles: about 1/5, 1/2, 1/4). Table 14's example
fields (friendly, interested, same-city, w/t/p 0.51/0.57/0.70, ...) score 33.35 here: medium, as in the paper."""


def difficulty_factors(p: dict[str, Any]) -> dict[str, float]:
    """Each hard factor in [0, 1] from the (flat) fields; every one is monotone in the field it reads."""
    contact = 0.0 if p["can_add_wechat"] else (0.5 if p["alternate_phone"] else 1.0)
    conditions = (SIGNALS.index(p["signal_quality"]) / 2 + CALL_ENVIRONMENTS[p["call_environment"]]) / 2
    return {
        "low intent": DIFFICULTY_LEVELS["low intent"][p["intent_level"]],
        "resistant personality": DIFFICULTY_LEVELS["resistant personality"][p["personality"]],
        "forgotten lead": DIFFICULTY_LEVELS["forgotten lead"][p["lead_memory"]],
        "no phone-number add path": contact,
        "cross-city": 0.0 if p["same_city"] else 1.0,
        "many concerns": min(1.0, (len(p["concerns"]) - 1) / 3),
        "poor call conditions": conditions,
        "low initial state": 1.0 - (p["willingness"] + p["trust"] + p["patience"]) / 3,
    }


def difficulty(p: dict[str, Any]) -> tuple[str, float, list[str]]:
    """(label, score, hard factors): score = Σ DIFFICULTY_WEIGHTS[k] · factor_k (2 d.p.); a factor >= 0.6 is 'hard'."""
    factors = difficulty_factors(p)
    score = round(sum(DIFFICULTY_WEIGHTS[k] * v for k, v in factors.items()), 2)
    label = "easy" if score < DIFFICULTY_THRESHOLDS[0] else "medium" if score < DIFFICULTY_THRESHOLDS[1] else "hard"
    return label, score, [k for k, v in factors.items() if v >= 0.6]


# ---- generation and layout ----
def generate_profile(index: int, seed: int = 0, split: str = "eval") -> dict[str, Any]:
    """Profile ``index`` of a batch: pools -> corrections -> state -> difficulty -> Table 5/6 layout."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    rng = random.Random(f"{seed}/{split}/{index}")
    p = sample_fields(rng)
    p["same_city"] = p["city"] == p["car_city"]
    for fix in CORRECTIONS:
        fix(p, rng)
    p["phone_tail"] = p["phone_number"][-4:]
    p["intent_description"] = INTENT_DESCRIPTIONS[p["intent_level"]]
    p["background"] = f"{p['purchase_experience']}; {p['comprehension']}"
    p["sample_id"] = f"ts-{split}-{seed}-{index:05d}"
    p["max_turns"] = MAX_TURNS
    p.update(initial_state(p, rng))
    p["difficulty"], p["difficulty_score"], p["hard_factors"] = difficulty(p)
    meta = {"seed": seed, "split": split, "index": index, "code_version": CODE_VERSION}
    if split == "train":
        groups = {g: {f: _train_value(p, f) for f in fields} for g, fields in TRAIN_GROUPS.items()}
        return {"sample_id": p["sample_id"], **groups, "generation_meta": meta}
    profile: dict[str, Any] = {"case_control": {}, "user_profile": {}, "agent_info": {}, "runtime_state": {}}
    for group, fields in EVAL_GROUPS.items():
        *parents, leaf = EVAL_PATHS[group]
        node = profile
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = {f: p[f] for f in fields}
    profile["generation_meta"] = meta
    return profile


def _train_value(p: dict[str, Any], field: str) -> Any:
    if field == "concerns":  # Table 16 lists concerns as plain categories; the structured form is eval-only
        return [c["category"] for c in p["concerns"]]
    return p[TRAIN_ALIASES.get(field, field)]


def generate_profiles(n: int, seed: int = 0, split: str = "eval") -> list[dict[str, Any]]:
    """Profiles 0..n-1 of the batch (``seed``, ``split``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1 (got {n})")
    return [generate_profile(i, seed, split) for i in range(n)]


def write_jsonl(profiles: Iterable[dict[str, Any]], fp: IO[str]) -> None:
    for profile in profiles:
        fp.write(json.dumps(profile, ensure_ascii=False) + "\n")


def profile_id(profile: dict[str, Any]) -> str:
    """A profile's ``sample_id`` (top level for training profiles, in ``case_control`` for evaluation ones)."""
    return profile["sample_id"] if "sample_id" in profile else profile["case_control"]["sample_id"]


def read_jsonl(path: str | os.PathLike[str], split: str) -> list[dict[str, Any]]:
    """Profiles of ``split`` from a JSONL file (``marti-ibrl telesales profiles`` or your own in the same layout).

    Every line is checked before anything is used: a JSON object of that split with every group and field of
    :data:`TRAIN_GROUPS` / :data:`EVAL_GROUPS` and a unique ``sample_id``. ``ValueError`` names ``path:line``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    profiles, seen = [], {}
    try:
        with open(path, encoding="utf-8") as fp:
            lines = fp.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"{path}: cannot read it as text ({why})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            profile = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from None
        got = profile.get("generation_meta", {}).get("split") if isinstance(profile, dict) else None
        if got != split:
            raise ValueError(f"{where}: expected a profile of split {split!r}, got generation_meta.split {got!r}")
        try:
            groups, uid = attributes(profile), profile_id(profile)
        except (KeyError, TypeError) as e:
            raise ValueError(
                f"{where}: missing {e} (layout of `marti-ibrl telesales profiles --split {split}`)"
            ) from None
        schema = TRAIN_GROUPS if split == "train" else EVAL_GROUPS
        missing = [f"{g}.{f}" for g, fields in schema.items() for f in fields if f not in groups[g]]
        if missing:
            raise ValueError(f"{where}: missing fields {', '.join(missing)}")
        if uid in seen:
            raise ValueError(f"{where}: sample_id {uid!r} repeats line {seen[uid]}")
        seen[uid] = n
        profiles.append(profile)
    if not profiles:
        raise ValueError(f"{path}: no profiles")
    return profiles


# ---- views ----
def attributes(profile: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """group -> {field: value} of a generated profile (the Table 5 / Table 6 attributes, without metadata)."""
    if profile["generation_meta"]["split"] == "train":
        return {g: profile[g] for g in TRAIN_GROUPS}
    out = {}
    for group, path in EVAL_PATHS.items():
        node = profile
        for key in path:
            node = node[key]
        out[group] = node
    return out


def flat_fields(profile: dict[str, Any]) -> dict[str, Any]:
    """All attributes of a profile in one dict (e.g. to fill Table 16's ``{field}`` slots)."""
    return {f: v for group in attributes(profile).values() for f, v in group.items()}


def sales_view(profile: dict[str, Any]) -> dict[str, Any]:
    """What the sales agent may see: the lead fields only (Appendix D 'Information visibility'; Tables 10, 15)."""
    group = "lead" if profile["generation_meta"]["split"] == "train" else "known_customer_info"
    return copy.deepcopy(attributes(profile)[group])


def customer_view(profile: dict[str, Any]) -> dict[str, Any]:
    """What the customer simulator conditions on: everything except ``case_control`` and ``generation_meta``."""
    return copy.deepcopy(
        {k: v for k, v in profile.items() if k not in ("sample_id", "case_control", "generation_meta")}
    )
