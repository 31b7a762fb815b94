"""DoND evaluation metrics (paper Table 2): own utility, joint value vs first-best, rates, seat averaging, mismatch."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from marti_ibrl.envs.dond import DondEnv, generate_scenarios, make_bot, play_dialogue, utility
from marti_ibrl.envs.dond.three_party import generate_three_party_scenarios
from marti_ibrl.eval.dond.metrics import (
    episode_metrics,
    first_best,
    max_own_utility,
    mismatch,
    policy_opened,
    summarize,
    summarize_seat_averaged,
)

ROLES = ["agent1", "agent2"]
# counts (1, 2, 3); agent1 values item2 (2 > 0) and little else, agent2 values item0 and item1 (4 > 2, 3 > 1).
# First-best: agent2 takes every item0 and item1 (4 + 2·3 = 10), agent1 every item2 (3·2 = 6): 16 — not an even
# split (agent2 gets 10, agent1 6), and each side takes everything of the item types it gets.
SCENARIO = {"counts": [1, 2, 3], "values": [[2, 1, 2], [4, 3, 0]]}


def _ep(
    alloc1: list[int] | None,
    policy_role: str = "agent1",
    opener: str = "agent1",
    scenario: dict[str, Any] = SCENARIO,
    failed: bool = False,
    malformed: bool = False,
    uid: str = "s0",
) -> dict[str, Any]:
    """An episode record; ``alloc1`` is agent1's share of an agreed deal (``None``: no deal)."""
    counts, values = scenario["counts"], scenario["values"]
    agreed = alloc1 is not None
    allocations: dict[str, list[int]] = {}
    utilities = {"agent1": 0.0, "agent2": 0.0}
    if agreed:
        alloc2 = [c - a for c, a in zip(counts, alloc1)]
        allocations = {"agent1": list(alloc1), "agent2": alloc2}
        utilities = {"agent1": float(utility(alloc1, values[0])), "agent2": float(utility(alloc2, values[1]))}
    return {
        "scenario_uid": uid,
        "scenario": scenario,
        "roles": ROLES,
        "policy_role": policy_role,
        "seats": [opener, "agent2" if opener == "agent1" else "agent1"],
        "agreed": agreed,
        "malformed": malformed,
        "failed": failed,
        "utilities": utilities,
        "allocations": allocations,
    }


def test_max_own_utility_and_first_best_by_hand():
    assert max_own_utility(SCENARIO, 0) == 10.0 == max_own_utility(SCENARIO, 1)
    assert max_own_utility({"counts": [1, 1, 1], "values": [[1, 2, 3], [0, 0, 6]]}, 1) == 6.0
    assert first_best(SCENARIO) == 16.0
    # two roles valuing items identically: any allocation is first-best, total 10
    assert first_best({"counts": [2, 1, 2], "values": [[1, 4, 2], [1, 4, 2]]}) == 10.0
    with pytest.raises(ValueError, match="role_index 2 out of range"):
        max_own_utility(SCENARIO, 2)
    with pytest.raises(ValueError, match="one value per item type"):
        first_best({"counts": [1, 2, 3], "values": [[1, 2], [3, 4]]})


def test_first_best_is_each_unit_to_whoever_values_it_most():
    """Utilities are additive per unit, so the enumeration must equal Σ_j counts_j · max_i values_i[j]."""
    scenarios = [sc.to_json() for sc in generate_scenarios(60, 5)]
    scenarios += [sc.to_json() for sc in generate_three_party_scenarios(10, 5)]
    for sc in scenarios:
        closed = sum(c * max(vals[j] for vals in sc["values"]) for j, c in enumerate(sc["counts"]))
        assert first_best(sc) == closed
        if len(sc["values"]) == 2:  # and a plain two-party enumeration of agent1's shares agrees
            shares = itertools.product(*(range(c + 1) for c in sc["counts"]))
            brute = max(
                utility(s, sc["values"][0]) + utility([c - a for c, a in zip(sc["counts"], s)], sc["values"][1])
                for s in shares
            )
            assert first_best(sc) == brute


def test_episode_metrics_uneven_first_best():
    # agent1 (1,1,3) = 2+1+6 = 9, agent2 (0,1,0) = 3: joint 12/16
    m = episode_metrics(_ep([1, 1, 3]))
    assert m == {"agreed": True, "own_utility": 0.9, "joint_value": 0.75, "malformed": False, "failed": False}
    # the first-best allocation: agent1 (0,0,3) = 6, agent2 (1,2,0) = 10: joint value 1 though agent1 gets only 0.6
    m = episode_metrics(_ep([0, 0, 3]))
    assert m["joint_value"] == 1.0 and m["own_utility"] == 0.6
    # an item-by-item near-even split is far from first-best: agent1 (1,1,1) = 5, agent2 (0,1,2) = 3, 8 of 16
    m = episode_metrics(_ep([1, 1, 1], policy_role="agent2"))
    assert m["own_utility"] == 0.3 and m["joint_value"] == 0.5
    # no deal: utility terms are undefined
    m = episode_metrics(_ep(None, malformed=True))
    assert m == {"agreed": False, "own_utility": None, "joint_value": None, "malformed": True, "failed": False}


def test_failed_episode_is_no_deal_and_stays_in_the_denominator():
    episodes = [_ep([1, 1, 3]), _ep([0, 0, 3]), _ep(None), _ep(None, failed=True)]
    s = summarize(episodes)
    assert s["n"] == 4 and s["n_agreed"] == 2
    assert s["agreement"] == 0.5  # 2 / 4: the failed episode counts as no deal, not dropped (2 / 3)
    assert s["failed"] == 0.25 and s["malformed"] == 0.0
    assert s["own_utility"] == pytest.approx((0.9 + 0.6) / 2)
    assert s["joint_value"] == pytest.approx((0.75 + 1.0) / 2)
    assert s["expected_utility"] == pytest.approx(0.5 * 0.75)
    # a failed episode is never a deal, even if its record claims one
    bogus = _ep([1, 1, 3], failed=True)
    assert episode_metrics(bogus)["agreed"] is False and episode_metrics(bogus)["own_utility"] is None


def test_summarize_edge_cases():
    assert summarize([]) == {
        "n": 0,
        "n_agreed": 0,
        "agreement": None,
        "own_utility": None,
        "joint_value": None,
        "expected_utility": None,
        "malformed": None,
        "failed": None,
    }
    s = summarize([_ep(None), _ep(None, malformed=True)])
    assert s["agreement"] == 0.0 and s["own_utility"] is None and s["joint_value"] is None
    assert s["expected_utility"] == 0.0 and s["malformed"] == 0.5
    with pytest.raises(ValueError, match="has no 'agreed' field"):
        summarize([{k: v for k, v in _ep(None).items() if k != "agreed"}])
    with pytest.raises(ValueError, match="policy_role 'agent9' is not one of the roles"):
        episode_metrics(_ep(None, policy_role="agent9"))


def test_seat_averaging_with_unequal_seats():
    # the policy plays agent2 throughout; it opened 2 episodes (both deals) and answered 4 (one deal)
    opened = [
        _ep([0, 0, 3], policy_role="agent2", opener="agent2"),  # agent2 (1,2,0) = 10: own 1.0, joint 1.0
        _ep([1, 1, 3], policy_role="agent2", opener="agent2"),  # agent2 (0,1,0) = 3: own 0.3, joint 0.75
    ]
    answered = [
        _ep([0, 1, 3], policy_role="agent2", opener="agent1"),  # agent2 (1,1,0) = 7: own 0.7, joint 14/16
        _ep(None, policy_role="agent2", opener="agent1"),
        _ep(None, policy_role="agent2", opener="agent1", failed=True),
        _ep(None, policy_role="agent2", opener="agent1", malformed=True),
    ]
    assert all(policy_opened(ep) for ep in opened) and not any(policy_opened(ep) for ep in answered)
    out = summarize_seat_averaged(answered[:2] + opened + answered[2:])  # order does not matter
    assert out["opened"] == summarize(opened) and out["answered"] == summarize(answered)
    o, a, avg = out["opened"], out["answered"], out["averaged"]
    assert (o["agreement"], a["agreement"]) == (1.0, 0.25)
    assert o["own_utility"] == pytest.approx(0.65) and a["own_utility"] == pytest.approx(0.7)
    assert avg["n"] == 6 and avg["n_agreed"] == 3
    assert avg["agreement"] == pytest.approx(0.625)  # not the pooled 3 / 6
    assert avg["own_utility"] == pytest.approx(0.675)
    assert avg["joint_value"] == pytest.approx(((1.0 + 0.75) / 2 + 14 / 16) / 2)
    assert avg["expected_utility"] == pytest.approx((1.0 * 0.65 + 0.25 * 0.7) / 2)
    assert avg["failed"] == pytest.approx((0 + 0.25) / 2) and avg["malformed"] == pytest.approx((0 + 0.25) / 2)
    # a seat without deals leaves the averaged utility terms undefined, the rates still average
    lone = summarize_seat_averaged([*opened, answered[1]])
    assert lone["averaged"]["agreement"] == 0.5 and lone["averaged"]["own_utility"] is None


def test_mismatch():
    assert mismatch(0.897, 0.563) == pytest.approx(0.334)
    assert mismatch(0.7, 0.75) == pytest.approx(-0.05)  # no mismatch: the policy does better when deployed
    j_train = summarize_seat_averaged([_ep([1, 1, 3]), _ep([1, 1, 3], opener="agent2")])["averaged"]
    j_deploy = summarize_seat_averaged([_ep([1, 1, 3]), _ep(None, opener="agent2")])["averaged"]
    assert mismatch(j_train["expected_utility"], j_deploy["expected_utility"]) == pytest.approx(0.9 - 0.45)


def test_metrics_of_played_episodes():
    env = DondEnv()
    for i, sc in enumerate(generate_scenarios(40, 11)):
        seats = ROLES if i % 2 == 0 else ROLES[::-1]
        bots = {"agent1": make_bot("fair"), "agent2": make_bot("conceder")}
        state, outcome = play_dialogue(env, sc, bots, seed=i, seats=seats)
        ep = {
            "scenario_uid": sc.uid,
            "scenario": sc.to_json(),
            "roles": ROLES,
            "policy_role": "agent1",
            "seats": list(seats),
            "agreed": outcome.agreed,
            "malformed": outcome.malformed,
            "failed": False,
            "utilities": outcome.utilities,
            "allocations": outcome.info["allocations"],
        }
        m = episode_metrics(ep)
        assert policy_opened(ep) == (i % 2 == 0)
        if outcome.agreed:
            mine = outcome.info["allocations"]["agent1"]
            assert m["own_utility"] == utility(mine, sc.values[0]) / 10
            assert 0 < m["joint_value"] <= 1
        else:
            assert m["own_utility"] is None and m["joint_value"] is None
