"""``marti-ibrl eval`` of any environment (marti_ibrl/eval/generic.py): the summaries from episode records, the role
a policy plays, the pairs; the command end to end is in tests/package/test_examples.py (the price negotiation example, trained
then evaluated)."""

from types import SimpleNamespace

import pytest

from marti_ibrl.eval.episodes import Named
from marti_ibrl.eval.generic import mean_ci, plan, policy_roles, summarize, summarize_role, tables_markdown

ROLES = ("buyer", "seller")


def _ep(role, mine, theirs, agreed=False, malformed=False, fault=None, reason=""):
    other = "seller" if role == "buyer" else "buyer"
    return {
        "policy_role": role,
        "rewards": {role: mine, other: theirs},
        "agreed": agreed,
        "malformed": malformed,
        "fault_role": fault,
        "failed": False,
        "truncated": False,
        "reason": reason,
    }


def test_mean_ci_is_statsmodels_t_interval():
    m, lo, hi = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5
    # t(0.975, 3) = 3.182; s = 1.291; half-width = 3.182 * 1.291 / 2
    assert lo == pytest.approx(2.5 - 2.054, abs=1e-3) and hi == pytest.approx(2.5 + 2.054, abs=1e-3)
    assert mean_ci([]) == (None, None, None) and mean_ci([0.5]) == (0.5, None, None)
    assert mean_ci([0.5, 0.5]) == (0.5, 0.5, 0.5)


def test_summarize_role_counts_each_ending_and_whose_turn_failed():
    eps = [
        _ep("buyer", 1.0, 0.5, agreed=True, reason="accepted"),
        _ep("buyer", -1.0, 0.0, malformed=True, fault="buyer", reason="malformed"),
        _ep("buyer", 0.0, -1.0, malformed=True, fault="seller", reason="malformed"),
        _ep("buyer", 0.0, 0.0, reason="turn limit"),
        _ep("seller", 9.0, 9.0),  # another role: not counted
    ]
    s = summarize_role(eps, "buyer")
    assert s["n"] == 4 and s["reward"] == 0.0 and s["counterpart_reward"] == pytest.approx(-0.125)
    assert (s["agreed"], s["malformed"], s["malformed_by_policy"], s["failed"]) == (1, 2, 1, 0)
    assert s["agreed_rate"] == 0.25 and s["malformed_rate"] == 0.5 and s["malformed_by_policy_rate"] == 0.25
    assert s["reasons"] == {"malformed": 2, "accepted": 1, "turn limit": 1}
    assert s["reward_ci"][0] < 0.0 < s["reward_ci"][1]


def test_summarize_averages_over_seats_only_where_roles_are_interchangeable():
    eps = [_ep("buyer", 1.0, 0.0, agreed=True), _ep("buyer", 1.0, 0.0), _ep("seller", 0.0, 1.0)]
    apart = summarize(eps, ROLES, interchangeable=False)
    assert "averaged" not in apart and apart["roles"]["buyer"]["reward"] == 1.0
    both = summarize(eps, ROLES, interchangeable=True)["averaged"]
    assert both["n"] == 3 and both["reward"] == 0.5 and both["agreed_rate"] == 0.25  # (1/2 + 0/1) / 2
    one_seat = summarize(eps[:2], ROLES, interchangeable=True)
    assert "averaged" not in one_seat and list(one_seat["roles"]) == ["buyer"]


def test_tables_have_a_row_per_role_played_and_a_column_per_counterpart():
    eps = [_ep("buyer", 1.0, 0.0, agreed=True), _ep("buyer", 0.5, 0.0)]
    pairs = [
        {"policy": "p", "counterpart": c, "kind": "held-out", "summary": summarize(eps, ROLES, False)}
        for c in ("q", "r")
    ]
    text = tables_markdown(pairs, ROLES)
    assert "## held-out" in text and "| policy | role | q | r |" in text
    assert "| p | buyer | 0.75 [" in text and "agreed 0.50" in text and "seller" not in text.split("## held-out")[1]


def test_a_policy_plays_the_role_its_path_names_or_every_role_when_interchangeable(tmp_path):
    run = tmp_path / "run"
    buyer = Named("b", f"checkpoint:{run / 'buyer' / 'hf'}")
    assert policy_roles(buyer, ROLES, interchangeable=False) == ("buyer",)
    loose = Named("x", f"checkpoint:{tmp_path / 'model'}")
    assert policy_roles(loose, ROLES, interchangeable=True) == ROLES
    assert policy_roles(loose, ROLES, interchangeable=False, chosen="seller") == ("seller",)
    with pytest.raises(ValueError, match=r"which role does it play\? .*--policy-role x=ROLE"):
        policy_roles(loose, ROLES, interchangeable=False)


def _args(tmp_path, **kw):
    base = dict(policy=[], policy_role=[], in_system=[], counterpart=[], self_play=False, cross_play=False)
    base |= dict(batch=8, num_engines=1, num_scenarios=4)
    return SimpleNamespace(**(base | kw))


def test_plan_pairs_policies_of_different_roles_and_refuses_what_cannot_be_played(tmp_path):
    for role in ROLES:
        (tmp_path / "run" / role / "hf").mkdir(parents=True)
    spec = SimpleNamespace(name="haggle", roles=ROLES, interchangeable_roles=False)
    b, s = f"b={tmp_path / 'run' / 'buyer' / 'hf'}", f"s={tmp_path / 'run' / 'seller' / 'hf'}"
    policies, pairs, roles_of = plan(_args(tmp_path, policy=[b, s], cross_play=True), spec)
    assert roles_of == {"b": ("buyer",), "s": ("seller",)}
    assert [(p.name, c.name, kind) for p, c, kind in pairs] == [
        ("b", "policy:s", "cross-play"),
        ("s", "policy:b", "cross-play"),
    ]
    with pytest.raises(ValueError, match="--self-play: haggle's roles"):
        plan(_args(tmp_path, policy=[b], self_play=True), spec)
    with pytest.raises(ValueError, match="haggle has no scripted players"):
        plan(_args(tmp_path, policy=[b], counterpart=["bot:greedy"]), spec)
    b2 = f"b2={tmp_path / 'run' / 'buyer' / 'hf'}"
    with pytest.raises(ValueError, match="the policies all play the same role"):
        plan(_args(tmp_path, policy=[b, b2], cross_play=True), spec)


def test_episode_records_take_any_scenario_object():
    from dataclasses import dataclass

    from marti_ibrl.eval.evaluator import scenario_json

    @dataclass(frozen=True)
    class Item:
        uid: str
        value: int

    class Opaque:
        def __repr__(self):
            return "Opaque()"

    assert scenario_json(Item("x", 3)) == {"uid": "x", "value": 3}
    assert scenario_json(7) == 7 and scenario_json({"pot": 5}) == {"pot": 5} and scenario_json(Opaque()) == "Opaque()"
