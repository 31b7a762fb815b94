"""Scripted TeleSales calls (issue 64 item 1, ``marti_ibrl.envs.telesales.scripted``): every call is a transcript
``telesales sft`` accepts (replayed through the environment), the strategies end differently in the way their rules
say, and the calls are deterministic in the seed."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from marti_ibrl.envs.telesales import protocol
from marti_ibrl.envs.telesales.env import TeleSalesEnv
from marti_ibrl.envs.telesales.profiles import generate_profile
from marti_ibrl.envs.telesales.scripted import STRATEGIES, customer_turn, scripted_call, scripted_calls
from marti_ibrl.envs.telesales.transcripts import load_transcripts, role_records


@pytest.fixture(scope="module")
def calls():
    return scripted_calls(40, seed=3)


def test_every_call_is_a_transcript_sft_accepts(calls, tmp_path):
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(json.dumps({k: c[k] for k in ("call_id", "profile", "turns")}) + "\n" for c in calls))
    accepted = load_transcripts(path)  # strict: any refused turn raises
    assert [c["call_id"] for c in accepted.calls] == [c["call_id"] for c in calls] and len(calls) == 160
    env = TeleSalesEnv()
    for call in accepted.calls[:8]:
        sales, customer = role_records(call, "sales", env), role_records(call, "customer", env)
        assert sales[0]["messages"][1]["role"] == "assistant"  # the agent opens
        assert all(protocol.parse_customer_turn(m["content"]).error is None
                   for m in customer[0]["messages"] if m["role"] == "assistant")  # fmt: skip


def test_strategies_end_as_their_rules_say(calls):
    ends = {s: Counter(c["reason"] for c in calls if c["strategy"] == s) for s in STRATEGIES}
    added = {s: ends[s]["contact_added"] / 40 for s in STRATEGIES}
    # value before the ask earns the contact; an early or repeated push costs it (module doc)
    assert added["rapport"] >= 0.6 and added["product"] >= 0.6, ends
    assert added["early"] <= added["rapport"] - 0.3 and added["pushy"] <= added["rapport"] - 0.3, ends
    assert ends["pushy"]["hang_up"] >= 10 and ends["pushy"]["sales_end"] == 0, ends  # it never gives up
    for call in calls:
        markers = [t["text"] for t in call["turns"] if t["speaker"] == "sales" and "<call_function=" in t["text"]]
        if call["reason"] == "contact_added":
            assert markers, call["call_id"]  # nothing to confirm without a contact tool
        behaviors = [t["record"]["behavior"] for t in call["turns"] if t["speaker"] == "customer"]
        if "AgreeWeChat" in behaviors:
            assert not set(behaviors[: behaviors.index("AgreeWeChat")]) & set(protocol.AFTER_AGREEMENT)


def test_deterministic_in_the_seed():
    profile = generate_profile(5, 1, "train")
    a, b = scripted_call(profile, "rapport", 7, "x"), scripted_call(profile, "rapport", 7, "x")
    assert a == b
    others = {json.dumps(scripted_call(profile, "rapport", s, "x")["turns"]) for s in range(8)}
    assert len(others) > 1  # the wording varies with the seed


def test_the_customer_declines_a_push_before_it_is_willing_and_hangs_up_when_out_of_patience():
    profile = generate_profile(0, 0, "train")
    opening = [{"speaker": "sales", "text": "Hello. May I add you on WeChat right now?"}]
    first = customer_turn(profile, opening, random.Random(0))
    assert first["behavior"] in ("DeclineSoft", "DeclineHard") and first["willingness_delta"] < 0
    tired = {**first, "patience_after": 0.09, "behavior": "Hesitate"}
    turns = [*opening, {"speaker": "customer", "record": tired}, {"speaker": "sales", "text": "So, what do you think?"}]
    assert customer_turn(profile, turns, random.Random(0))["behavior"] == "HangUp"


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="n_profiles must be >= 1"):
        scripted_calls(0)
    with pytest.raises(ValueError, match="strategies must be some of"):
        scripted_calls(1, strategies=["charming"])


def test_the_strategies_are_the_generic_warm_starts_players():
    """``sft --env telesales`` and ``model tiny --env telesales`` play the same calls through the generic path
    (sft.data.scripted_records): every turn accepted by the env, one record per role, and the sales records of a
    strategy are its calls' sales turns."""
    from marti_ibrl.config import EnvConfig
    from marti_ibrl.envs import make_env
    from marti_ibrl.sft.data import scripted_records
    from marti_ibrl.sft.make import players_of

    env, train = make_env(EnvConfig(name="telesales", num_scenarios=16), 1)
    players = players_of(env, None, "telesales")
    assert list(players) == list(STRATEGIES)
    records = scripted_records(env, [s for _, s in train], players, 0)  # a refused turn would raise
    assert len(records) == 2 * 16
    sales = [m["content"] for r in records[::2] for m in r["messages"] if m["role"] == "assistant"]
    customer = [m["content"] for r in records[1::2] for m in r["messages"] if m["role"] == "assistant"]
    assert sum("<call_function=add_business_contact" in t for t in sales) > 0 and any(
        "<status=end>" in t for t in sales
    )
    assert all(json.loads(t)["behavior"] in protocol.BEHAVIORS for t in customer)
    pushy = [records[2 * i] for i in range(16) if i % 16 // 4 == 3]  # combinations (sales, customer): pushy's sales
    said = [m["content"] for r in pushy for m in r["messages"] if m["role"] == "assistant"]
    assert said and all("<status=end>" not in t for t in said)  # pushy never ends a call (its rules)
