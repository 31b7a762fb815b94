"""DoND evaluation metrics of the paper's Table 2 (§5.2), computed from episode records; pure Python.

An *episode record* is one JSONL line of an eval run (:func:`marti_ibrl.eval.evaluator.episode_record`); these
functions read::

    {"scenario_uid": str, "scenario": {"counts": [c0, c1, c2], "values": [[...], [...]]},
     "roles": ["agent1", "agent2"], "policy_role": "agent1" | "agent2", "seats": [opener, other],
     "agreed": bool, "malformed": bool, "failed": bool,
     "utilities": {"agent1": float, "agent2": float}, "allocations": {...}}

``values[i]`` belongs to ``roles[i]``; ``policy_role`` is the seat role the evaluated policy played and
``seats[0]`` the role that opened. Per agreed episode:

* own utility = the policy's utility / its utility if it received every item (a unilateral maximum, generally
  not jointly acceptable);
* joint value = the agreed total utility / the first-best total utility over every allocation of the units.

Both are undefined (``None``) without a deal. Rates: agreement, malformed, failed. A failed episode (a counterpart
could not produce a turn) counts as no deal and stays in every denominator; it is never dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

__all__ = [
    "episode_metrics",
    "first_best",
    "max_own_utility",
    "mismatch",
    "policy_opened",
    "summarize",
    "summarize_seat_averaged",
]

RATE_KEYS = ("agreement", "own_utility", "joint_value", "expected_utility", "malformed", "failed")
"""The per-condition quantities of :func:`summarize` (besides the counts ``n`` and ``n_agreed``)."""


def _scenario(scenario_json: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    try:
        counts = tuple(int(c) for c in scenario_json["counts"])
        values = tuple(tuple(int(v) for v in vec) for vec in scenario_json["values"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"a scenario needs 'counts' and 'values' lists of ints, got {scenario_json!r} ({e})") from None
    if not values or any(len(vec) != len(counts) for vec in values):
        raise ValueError(f"every value vector needs one value per item type ({len(counts)}), got {scenario_json!r}")
    return counts, values


def max_own_utility(scenario_json: Mapping[str, Any], role_index: int) -> float:
    """Σ counts · values[role_index]: the role's utility if it received every item (10 in Lewis scenarios)."""
    counts, values = _scenario(scenario_json)
    if not 0 <= role_index < len(values):
        raise ValueError(f"role_index {role_index} out of range for {len(values)} value vectors")
    return float(sum(c * v for c, v in zip(counts, values[role_index], strict=True)))


@cache
def _first_best(counts: tuple[int, ...], values: tuple[tuple[int, ...], ...]) -> int:
    n_roles = len(values)
    # every way to hand out each item type's units among the roles, then every combination across item types
    per_item = [
        [split for split in itertools.product(range(count + 1), repeat=n_roles) if sum(split) == count]
        for count in counts
    ]
    best = 0
    for allocation in itertools.product(*per_item):  # allocation[j][i]: units of item j for role i
        total = sum(units[i] * values[i][j] for j, units in enumerate(allocation) for i in range(n_roles))
        best = max(best, total)
    return best


def first_best(scenario_json: Mapping[str, Any]) -> float:
    """The largest total utility Σ_roles u_role over every allocation of the item units, by enumeration."""
    counts, values = _scenario(scenario_json)
    return float(_first_best(counts, values))


def _field(ep: Mapping[str, Any], key: str) -> Any:
    if key not in ep:
        uid = ep.get("episode_id", ep.get("scenario_uid", "?"))
        raise ValueError(f"episode {uid!r} has no {key!r} field")
    return ep[key]


def policy_opened(ep: Mapping[str, Any]) -> bool:
    """Whether the evaluated policy spoke first (``seats[0] == policy_role``)."""
    seats = _field(ep, "seats")
    return bool(seats) and seats[0] == _field(ep, "policy_role")


def episode_metrics(ep: Mapping[str, Any]) -> dict[str, Any]:
    """``{"agreed", "own_utility", "joint_value", "malformed", "failed"}`` of one episode record.

    ``own_utility`` and ``joint_value`` are ``None`` without a deal; a failed episode is never a deal.
    """
    roles = list(_field(ep, "roles"))
    policy_role = _field(ep, "policy_role")
    if policy_role not in roles:
        raise ValueError(f"policy_role {policy_role!r} is not one of the roles {roles}")
    failed = bool(ep.get("failed", False))
    agreed = bool(_field(ep, "agreed")) and not failed
    own = joint = None
    if agreed:
        scenario = _field(ep, "scenario")
        utilities = _field(ep, "utilities")
        missing = [r for r in roles if r not in utilities]
        if missing:
            raise ValueError(f"agreed episode {ep.get('scenario_uid', '?')!r} has no utilities for {missing}")
        top, best = max_own_utility(scenario, roles.index(policy_role)), first_best(scenario)
        if top <= 0 or best <= 0:
            raise ValueError(f"scenario {ep.get('scenario_uid', '?')!r} is worth nothing to {policy_role}: {scenario}")
        own = float(utilities[policy_role]) / top
        joint = sum(float(utilities[r]) for r in roles) / best
    return {
        "agreed": agreed,
        "own_utility": own,
        "joint_value": joint,
        "malformed": bool(ep.get("malformed", False)),
        "failed": failed,
    }


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(episodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"n", "n_agreed", "agreement", "own_utility", "joint_value", "expected_utility", "malformed", "failed"}``.

    ``agreement``, ``malformed`` and ``failed`` are rates over all ``n`` episodes (failed ones count as no deal);
    ``own_utility`` and ``joint_value`` are means over the agreed episodes (``None`` if there are none);
    ``expected_utility`` = agreement × own_utility (0 when nothing was agreed). No episodes: ``n = 0``, rest ``None``.
    """
    rows = [episode_metrics(ep) for ep in episodes]
    n = len(rows)
    agreed = [r for r in rows if r["agreed"]]
    if n == 0:
        return {"n": 0, "n_agreed": 0, **dict.fromkeys(RATE_KEYS)}
    agreement = len(agreed) / n
    own = _mean([r["own_utility"] for r in agreed])
    return {
        "n": n,
        "n_agreed": len(agreed),
        "agreement": agreement,
        "own_utility": own,
        "joint_value": _mean([r["joint_value"] for r in agreed]),
        "expected_utility": agreement * own if own is not None else 0.0,
        "malformed": sum(r["malformed"] for r in rows) / n,
        "failed": sum(r["failed"] for r in rows) / n,
    }


def summarize_seat_averaged(episodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per seat and seat-averaged summaries (Table 2 is seat-averaged).

    Returns ``{"opened": summarize(episodes the policy opened), "answered": summarize(the others), "averaged":
    ...}``. Each quantity of ``"averaged"`` is the mean of the two seats' values (so ``expected_utility`` is the mean
    of the per-seat expected utilities), ``None`` where a seat has none; its ``n`` / ``n_agreed`` are the totals.
    """
    episodes = list(episodes)
    opened = summarize(ep for ep in episodes if policy_opened(ep))
    answered = summarize(ep for ep in episodes if not policy_opened(ep))
    averaged: dict[str, Any] = {"n": opened["n"] + answered["n"], "n_agreed": opened["n_agreed"] + answered["n_agreed"]}
    for key in RATE_KEYS:
        a, b = opened[key], answered[key]
        averaged[key] = None if a is None or b is None else (a + b) / 2
    return {"opened": opened, "answered": answered, "averaged": averaged}


def mismatch(j_train: float, j_deploy: float) -> float:
    """The static-counterpart mismatch Δ = J_train − J_deploy (paper Eq. 3): positive when the policy does worse
    against deployment counterparts than against its training counterpart."""
    return float(j_train) - float(j_deploy)
