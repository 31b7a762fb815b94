"""TeleSales profiles (paper Appendix D, Tables 5, 6, 14-16): schema counts, determinism, consistency rules,
visibility, initial-state ranges, difficulty, and the ``marti-ibrl telesales profiles`` CLI."""

from __future__ import annotations

import io
import json
import statistics
from pathlib import Path

import pytest

from marti_ibrl.cli import main
from marti_ibrl.envs.telesales import profiles as P


@pytest.fixture(scope="module")
def eval_500() -> list[dict]:
    return P.generate_profiles(500, seed=0, split="eval")


@pytest.fixture(scope="module")
def train_500() -> list[dict]:
    return P.generate_profiles(500, seed=0, split="train")


@pytest.fixture(scope="module")
def flat_500(eval_500: list[dict]) -> list[dict]:
    return [P.flat_fields(p) for p in eval_500]


def _jsonl(n: int, seed: int, split: str) -> str:
    buf = io.StringIO()
    P.write_jsonl(P.generate_profiles(n, seed, split), buf)
    return buf.getvalue()


# ---- determinism ----
@pytest.mark.parametrize("split", P.SPLITS)
def test_same_seed_same_bytes_and_prefix_stable(split: str) -> None:
    assert _jsonl(20, 7, split) == _jsonl(20, 7, split)
    small, large = P.generate_profiles(5, 7, split), P.generate_profiles(50, 7, split)
    assert large[:5] == small
    assert P.generate_profile(3, 7, split) == small[3]
    assert _jsonl(20, 8, split) != _jsonl(20, 7, split)
    assert small[0]["generation_meta"] == {"seed": 7, "split": split, "index": 0, "code_version": P.CODE_VERSION}


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="split"):
        P.generate_profile(0, 0, "test")
    with pytest.raises(ValueError, match="n must be"):
        P.generate_profiles(0)


# ---- schema (Table 5: 28 / 6, Table 6: 40 / 8) ----
def test_schema_counts() -> None:
    assert len(P.TRAIN_GROUPS) == 6 and sum(map(len, P.TRAIN_GROUPS.values())) == 28
    assert len(P.EVAL_GROUPS) == 8 and sum(map(len, P.EVAL_GROUPS.values())) == 40
    for groups in (P.TRAIN_GROUPS, P.EVAL_GROUPS):
        fields = [f for fs in groups.values() for f in fs]
        assert len(fields) == len(set(fields))
    table16 = (  # Table 16's customer-prompt fields
        "name", "age", "occupation", "city", "family_situation", "background", "phone_number", "wechat_id",
        "wechat_privacy", "primary_wechat", "vehicle", "budget", "usage_scenario", "primary_needs", "intent_level",
        "intent_description", "personality", "concerns", "speaking_style", "call_environment", "signal_quality",
    )  # fmt: skip
    assert set(table16) <= {f for fs in P.TRAIN_GROUPS.values() for f in fs}


def test_generated_keys_match_schema(eval_500: list[dict], train_500: list[dict]) -> None:
    for p in eval_500[:50]:
        assert list(p) == ["case_control", "user_profile", "agent_info", "runtime_state", "generation_meta"]
        attrs = P.attributes(p)
        assert {g: tuple(v) for g, v in attrs.items()} == P.EVAL_GROUPS
        assert len(P.flat_fields(p)) == 40
    for p in train_500[:50]:
        assert set(p) == {"sample_id", "generation_meta", *P.TRAIN_GROUPS}
        assert {g: tuple(v) for g, v in P.attributes(p).items()} == P.TRAIN_GROUPS
        assert len(P.flat_fields(p)) == 28
        assert p["needs"]["intent_level"] in ("accidental", "casual", "interested", "urgent")
        assert all(isinstance(c, str) for c in p["persona"]["concerns"])


# ---- consistency corrections (Appendix D: family, needs, budget, timeline, contact channels) ----
def _all_flat(eval_500: list[dict], train_500: list[dict]) -> list[dict]:
    out = [P.flat_fields(p) for p in eval_500]
    for p in train_500:
        f = P.flat_fields(p)
        out.append({**f, **{P.TRAIN_ALIASES[k]: f[k] for k in P.TRAIN_ALIASES}})
    return out


def test_family_rule(eval_500: list[dict], train_500: list[dict]) -> None:
    for f in _all_flat(eval_500, train_500):
        lo, hi, children, deciders = P.FAMILIES[f["family_situation"]]
        assert lo <= f["age"] <= hi, f
        if not children:
            assert not P.USAGES[f["usage_scenario"]], f
        if "co_decision_maker" in f:
            assert f["co_decision_maker"] in deciders, f


def test_needs_rule(eval_500: list[dict], train_500: list[dict]) -> None:
    for f in _all_flat(eval_500, train_500):
        body, energy = f["car_info"]["body"], f["car_info"]["energy"]
        assert 2 <= len(f["primary_needs"]) <= 3 and len(set(f["primary_needs"])) == len(f["primary_needs"])
        for need in f["primary_needs"]:
            assert P.need_fits(need, body, energy), (need, body, energy)
        if P.FAMILIES[f["family_situation"]][2]:
            assert "safety" in f["primary_needs"], f
        categories = [c if isinstance(c, str) else c["category"] for c in f["concerns"]]
        assert categories
        assert "battery health" not in categories or energy in P.ELECTRIFIED
        assert "cross-city transfer" not in categories or f["car_city"] != f["city"]


def test_structured_concerns(flat_500: list[dict]) -> None:
    for f in flat_500:
        assert [c["priority"] for c in f["concerns"]] == list(range(1, len(f["concerns"]) + 1))
        for c in f["concerns"]:
            assert c["detail"] in P.CONCERNS[c["category"]][1]


def test_budget_rule(eval_500: list[dict], train_500: list[dict]) -> None:
    for f in _all_flat(eval_500, train_500):
        low, high = f["budget_range"]
        price = f["car_info"]["listing_price_k"]
        band_lo, band_hi = P.VEHICLES[f["target_car"]][2]
        assert band_lo <= price <= band_hi
        assert 10 <= low <= price <= high and low % 10 == 0 and high % 10 == 0, f


def test_timeline_rule(eval_500: list[dict], train_500: list[dict]) -> None:
    for f in _all_flat(eval_500, train_500):
        days = P.TIMELINES[f["purchase_timeline"]]
        assert f["purchase_timeline"] in P.INTENT_TIMELINES[f["intent_level"]]
        assert (f["intent_level"] == "urgent") == (days is not None and days <= 14), f
        if f["intent_level"] == "accidental":
            assert days is None


def test_contact_rule(eval_500: list[dict], train_500: list[dict]) -> None:
    flats = _all_flat(eval_500, train_500)
    for f in flats:
        can = f["primary_wechat"] == "this number" and f["wechat_privacy"] != "not searchable by phone number"
        assert f["can_add_wechat"] == can, f
        if f["primary_wechat"] == "another number":
            alt = f["alternate_phone"]
            assert alt and alt != f["phone_number"] and len(alt) == 11 and alt.isdigit(), f
            assert f["wechat_privacy"] != "not searchable by phone number"
        else:
            assert f["alternate_phone"] is None
        if not f["can_add_wechat"] and f["alternate_phone"] is None:  # the SMS invitation is the only path
            assert f["wechat_privacy"] == "not searchable by phone number"
    # every path occurs, so the rules above are exercised
    assert {(f["can_add_wechat"], f["alternate_phone"] is None) for f in flats} == {
        (True, True),
        (False, True),
        (False, False),
    }


def test_corrections_do_fix_violations() -> None:
    """Each rule fires on a hand-made violation (so the generator's compliance is not an accident)."""
    import random

    rng = random.Random(0)
    p = P.sample_fields(rng)
    p.update(
        age=24, family_situation="married with school-age children", usage_scenario="school run and family errands"
    )
    P.fix_family(p, rng)
    assert P.FAMILIES[p["family_situation"]][0] <= 24 and not (
        P.USAGES[p["usage_scenario"]] and not P.FAMILIES[p["family_situation"]][2]
    )
    p.update(intent_level="urgent", purchase_timeline="no fixed plan")
    P.fix_timeline(p, rng)
    assert p["purchase_timeline"] in ("within a week", "within two weeks")
    p["car_info"]["listing_price_k"], p["budget_range"] = 237, [50, 80]
    P.fix_budget(p, rng)
    assert p["budget_range"][0] <= 237 <= p["budget_range"][1] and p["budget_range"][1] - p["budget_range"][0] == 30
    p.update(primary_wechat="another number", alternate_phone=None, wechat_privacy="not searchable by phone number")
    P.fix_contact_channels(p, rng)
    assert p["alternate_phone"] and not p["can_add_wechat"] and p["wechat_privacy"] != "not searchable by phone number"


def test_derived_fields(flat_500: list[dict]) -> None:
    for f in flat_500:
        assert f["same_city"] == (f["city"] == f["car_city"])
        assert f["phone_tail"] == f["phone_number"][-4:] and len(f["phone_number"]) == 11
        assert f["max_turns"] == P.MAX_TURNS


# ---- visibility (Appendix D: the sales agent sees only lead fields) ----
def test_sales_view_is_lead_fields_only(eval_500: list[dict], train_500: list[dict]) -> None:
    hidden = {"concerns", "personality", "willingness", "trust", "patience", "intent_level", "difficulty", "story"}
    for p in eval_500[:20]:
        view = P.sales_view(p)
        assert set(view) == set(P.EVAL_GROUPS["known_customer_info"])
        assert not hidden & set(view)
        blob = json.dumps(view)
        assert p["user_profile"]["speech"]["personality"] not in blob and "willingness" not in blob
        view["budget_range"].append(0)  # a copy: mutating it leaves the profile alone
        assert len(p["agent_info"]["known_customer_info"]["budget_range"]) == 2
    for p in train_500[:20]:
        assert set(P.sales_view(p)) == set(P.TRAIN_GROUPS["lead"])


def test_customer_view(eval_500: list[dict], train_500: list[dict]) -> None:
    view = P.customer_view(eval_500[0])
    assert set(view) == {"user_profile", "agent_info", "runtime_state"}
    assert set(P.customer_view(train_500[0])) == set(P.TRAIN_GROUPS)


# ---- initial state (Appendix D: willingness 0.11/0.406/0.79, trust 0.24/0.524/0.82, patience 0.17/0.543/0.89) ----
@pytest.mark.parametrize(
    "name,paper",
    [("willingness", (0.11, 0.406, 0.79)), ("trust", (0.24, 0.524, 0.82)), ("patience", (0.17, 0.543, 0.89))],
)
def test_initial_state_near_paper(flat_500: list[dict], name: str, paper: tuple[float, float, float]) -> None:
    xs = [f[name] for f in flat_500]
    assert abs(min(xs) - paper[0]) <= 0.08 and abs(max(xs) - paper[2]) <= 0.08, (min(xs), max(xs))
    assert abs(statistics.mean(xs) - paper[1]) <= 0.03, statistics.mean(xs)
    assert len(set(xs)) > 20  # noise and fields both matter


def test_initial_state_follows_fields(flat_500: list[dict]) -> None:
    def mean(key: str, field: str, value: str) -> float:
        return statistics.mean(f[key] for f in flat_500 if f[field] == value)

    assert mean("willingness", "intent_level", "urgent") > mean("willingness", "intent_level", "accidental") + 0.2
    assert mean("trust", "personality", "friendly") > mean("trust", "personality", "skeptical") + 0.15
    assert mean("patience", "personality", "friendly") > mean("patience", "personality", "impatient") + 0.15


# ---- ex-post difficulty ----
def test_difficulty_recorded_and_labelled(flat_500: list[dict]) -> None:
    labels = set()
    for f in flat_500:
        label, score, hard = P.difficulty(f)
        assert (f["difficulty"], f["difficulty_score"], f["hard_factors"]) == (label, score, hard)
        assert 0 <= score <= 100
        lo, hi = P.DIFFICULTY_THRESHOLDS
        assert label == ("easy" if score < lo else "medium" if score < hi else "hard")
        labels.add(label)
    assert labels == {"easy", "medium", "hard"}


HARDER = [  # (field, easier value, harder value) for each documented hard factor
    ("intent_level", "urgent", "accidental"),
    ("intent_level", "interested", "casual"),
    ("personality", "friendly", "impatient"),
    ("personality", "analytical", "skeptical"),
    ("lead_memory", P.LEAD_MEMORIES[0], P.LEAD_MEMORIES[2]),
    ("same_city", True, False),
    ("signal_quality", "good", "poor"),
    ("call_environment", "at home, relaxed", "driving"),
    ("willingness", 0.7, 0.2),
    ("trust", 0.7, 0.2),
    ("patience", 0.7, 0.2),
]


@pytest.mark.parametrize("field,easy,hard", HARDER)
def test_difficulty_monotone(flat_500: list[dict], field: str, easy: object, hard: object) -> None:
    for f in flat_500[:50]:
        assert P.difficulty({**f, field: hard})[1] > P.difficulty({**f, field: easy})[1]


def test_difficulty_monotone_contact_and_concerns(flat_500: list[dict]) -> None:
    f = flat_500[0]
    phone = {**f, "can_add_wechat": True, "alternate_phone": None}
    alt = {**f, "can_add_wechat": False, "alternate_phone": "13800000000"}
    sms = {**f, "can_add_wechat": False, "alternate_phone": None}
    assert P.difficulty(phone)[1] < P.difficulty(alt)[1] < P.difficulty(sms)[1]
    scores = [P.difficulty({**f, "concerns": [{}] * k})[1] for k in (1, 2, 3, 4)]
    assert scores == sorted(scores) and len(set(scores)) == 4
    assert (
        "no phone-number add path" in P.difficulty(sms)[2] and "no phone-number add path" not in P.difficulty(phone)[2]
    )


# ---- CLI ----
def test_cli_writes_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    assert main(["telesales", "profiles", "--split", "eval", "-n", "12", "--seed", "3", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == _jsonl(12, 3, "eval")
    assert main(["telesales", "profiles", "--split", "train", "-n", "2", "--seed", "3", "--out", str(out)]) == 2
    assert out.read_text(encoding="utf-8") == _jsonl(12, 3, "eval")  # not replaced without --overwrite
    assert main(["telesales", "profiles", "--split", "train", "-n", "2", "--seed", "3", "--out", str(out),
                 "--overwrite"]) == 0  # fmt: skip
    assert [json.loads(line)["sample_id"] for line in out.read_text().splitlines()] == [
        "ts-train-3-00000",
        "ts-train-3-00001",
    ]


def test_cli_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["telesales", "profiles", "--split", "train", "-n", "3", "--seed", "1"]) == 0
    assert capsys.readouterr().out == _jsonl(3, 1, "train")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--split", "test"], "unknown split 'test'"),
        (["-n", "0"], "argument -n: expected a number in 1..1000000, got 0"),
        (["--out", "/nonexistent-dir/x.jsonl"], "cannot write /nonexistent-dir/x.jsonl"),
    ],
)
def test_cli_errors(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["telesales", "profiles", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("split", P.SPLITS)
def test_read_jsonl_round_trip_and_training_scenarios(tmp_path: Path, split: str) -> None:
    from marti_ibrl.config import EnvConfig
    from marti_ibrl.envs import make_env

    profiles = P.generate_profiles(3, seed=5, split=split)
    path = tmp_path / "profiles.jsonl"
    with path.open("w") as f:
        P.write_jsonl(profiles, f)
    assert P.read_jsonl(path, split) == profiles
    assert [P.profile_id(p) for p in profiles] == [f"ts-{split}-5-0000{i}" for i in range(3)]
    if split == "train":  # the file becomes the training scenarios, keyed by sample_id (the GRPO groups)
        env, scenarios = make_env(EnvConfig(name="telesales", data=str(path), max_rounds=7), seed=0)
        assert [uid for uid, _ in scenarios] == ["ts-train-5-00000", "ts-train-5-00001", "ts-train-5-00002"]
        assert env.max_turns == 14 and scenarios[1][1] == profiles[1]
        _, generated = make_env(EnvConfig(name="telesales", num_scenarios=4), seed=5)
        assert [p for _, p in generated] == P.generate_profiles(4, seed=5, split="train")


def test_read_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    train = P.generate_profiles(2, seed=0, split="train")
    no_phone = json.loads(json.dumps(train[1]))
    del no_phone["lead"]["phone_number"]
    cases = {
        "wrong split": ([P.generate_profile(0, 0, "eval")], ":1: expected a profile of split 'train', got"),
        "not json": (["{oops"], ":1: not JSON"),
        "missing field": ([train[0], no_phone], ":2: missing fields lead.phone_number"),
        "duplicate": ([train[0], train[0]], ":2: sample_id 'ts-train-0-00000' repeats line 1"),
        "empty": ([], ": no profiles"),
    }
    for name, (rows, message) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.jsonl"
        path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
        with pytest.raises(ValueError) as err:
            P.read_jsonl(path, "train")
        assert str(err.value).startswith(str(path)) and message in str(err.value), (name, str(err.value))
