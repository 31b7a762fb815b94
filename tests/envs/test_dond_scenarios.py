"""DoND scenario generator (Lewis et al. 2017 rules and train-split distribution) and the Lewis file format."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from marti_ibrl.envs.dond.scenarios import (
    DondScenario,
    generate_scenarios,
    load_lewis_file,
    overlap,
    parse_lewis_line,
    rule_violations,
    valid_count_vectors,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dond_lewis_sample.txt"
N = 10_000


@pytest.fixture(scope="module")
def sample() -> list[DondScenario]:
    return generate_scenarios(N, seed=1234)


def test_every_sample_obeys_every_rule(sample: list[DondScenario]) -> None:
    for s in sample:
        c = s.counts
        assert len(c) == 3 and all(1 <= x <= 4 for x in c), s
        assert 5 <= sum(c) <= 7, s
        assert len(s.values) == 2, s
        for vals in s.values:
            assert all(isinstance(v, int) and v >= 0 for v in vals), s
            assert sum(x * v for x, v in zip(c, vals, strict=True)) == 10, s
            assert sum(v == 0 for v in vals) <= 2, s
        va, vb = s.values
        assert not any(a == 0 and b == 0 for a, b in zip(va, vb, strict=True)), s
        assert any(a > 0 and b > 0 for a, b in zip(va, vb, strict=True)), s
        assert rule_violations(s) == []


def test_distribution_matches_train_split(sample: list[DondScenario]) -> None:
    totals = Counter(sum(s.counts) for s in sample)
    for total, target in {5: 0.41, 6: 0.40, 7: 0.20}.items():
        assert abs(totals[total] / N - target) < 0.03, (total, totals[total] / N)
    overlaps = Counter(overlap(*s.values) for s in sample)
    for k, target in {1: 0.50, 2: 0.43, 3: 0.08}.items():
        assert abs(overlaps[k] / N - target) < 0.03, (k, overlaps[k] / N)
    # both roles are drawn symmetrically: a value vector is as likely for role 0 as for role 1
    zeros = [sum(v == 0 for v in s.values[i]) for s in sample for i in (0, 1)]
    assert abs(sum(zeros[0::2]) - sum(zeros[1::2])) / N < 0.05


def test_all_28_count_vectors_occur(sample: list[DondScenario]) -> None:
    assert len(valid_count_vectors()) == 28
    assert {s.counts for s in sample} == set(valid_count_vectors())


def test_rule_violations_detects_bad_scenarios() -> None:
    assert rule_violations(DondScenario((1, 4, 1), ((4, 1, 2), (0, 2, 2)))) == []
    assert rule_violations(DondScenario((1, 1, 1), ((4, 3, 3), (4, 3, 3))))  # 3 items only
    assert rule_violations(DondScenario((1, 4, 1), ((4, 1, 1), (0, 2, 2))))  # sums to 9
    assert rule_violations(DondScenario((1, 4, 1), ((10, 0, 0), (0, 2, 2))))  # no type valued by both
    assert rule_violations(DondScenario((2, 2, 1), ((0, 0, 10), (5, 0, 0))))  # item1 worth 0 to both


def test_reproducible_by_seed() -> None:
    assert generate_scenarios(50, seed=7) == generate_scenarios(50, seed=7)
    assert generate_scenarios(50, seed=7) != generate_scenarios(50, seed=8)
    scenarios = generate_scenarios(3, seed=7)
    assert [s.uid for s in scenarios] == ["gen-7-0", "gen-7-1", "gen-7-2"]


def test_json_round_trip() -> None:
    for s in generate_scenarios(20, seed=3):
        obj = json.loads(json.dumps(s.to_json()))
        assert set(obj) == {"counts", "values"}
        assert DondScenario.from_json(obj, uid=s.uid) == s


def test_parse_lewis_line_agreed() -> None:
    line = FIXTURE.read_text().splitlines()[0]
    r = parse_lewis_line(line)
    assert r.counts == (1, 4, 1)
    assert r.values == (4, 1, 2)
    assert r.partner_values == (0, 2, 2)
    assert r.dialogue.startswith("THEM: i would like 4 hats") and r.dialogue.endswith("THEM: <selection>")
    assert r.output_tokens == ("item0=1", "item1=0", "item2=1", "item0=0", "item1=4", "item2=0")
    assert r.agreed
    assert r.own_picks == (1, 0, 1)
    assert r.partner_picks == (0, 4, 0)
    assert r.to_scenario("x").values == ((4, 1, 2), (0, 2, 2))


def test_parse_lewis_line_no_deal() -> None:
    lines = FIXTURE.read_text().splitlines()
    for i in (4, 6, 7):
        r = parse_lewis_line(lines[i])
        assert not r.agreed and r.own_picks is None and r.partner_picks is None
        assert len(r.output_tokens) == 6


@pytest.mark.parametrize(
    "line, message",
    [
        ("garbage", "is not"),
        (
            "<input> 1 4 4 1 1 </input> <dialogue> x </dialogue> <output> <disagree> <disagree> <disagree> "
            "<disagree> <disagree> <disagree> </output> <partner_input> 1 0 4 2 1 2 </partner_input>",
            "six",
        ),
        (
            "<input> 1 4 4 1 1 2 </input> <dialogue> x </dialogue> <output> <disagree> <disagree> <disagree> "
            "<disagree> <disagree> <disagree> </output> <partner_input> 2 0 4 2 1 2 </partner_input>",
            "differ",
        ),
        (
            "<input> 1 4 4 1 1 2 </input> <dialogue> x </dialogue> <output> item0=1 item1=0 item2=1 "
            "<disagree> <disagree> <disagree> </output> <partner_input> 1 0 4 2 1 2 </partner_input>",
            "mixes",
        ),
        (
            "<input> 1 4 4 1 1 2 </input> <dialogue> x </dialogue> <output> item0=1 item2=0 item1=1 "
            "item0=0 item1=4 item2=0 </output> <partner_input> 1 0 4 2 1 2 </partner_input>",
            "item1=N",
        ),
        (
            "<input> 1 4 4 1 1 2 </input> <dialogue> x </dialogue> <output> item0=1 item1=0 "
            "</output> <partner_input> 1 0 4 2 1 2 </partner_input>",
            "six tokens",
        ),
    ],
)
def test_parse_lewis_line_errors(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_lewis_line(line)


def test_load_lewis_file(tmp_path: Path) -> None:
    scenarios = load_lewis_file(FIXTURE)
    assert len(scenarios) == 8
    assert scenarios[0].uid == "dond_lewis_sample.txt:1"
    assert scenarios[1].uid == "dond_lewis_sample.txt:2"
    # both perspectives of a dialogue are kept, with the values swapped
    assert scenarios[0].values == tuple(reversed(scenarios[1].values))
    assert all(rule_violations(s) == [] for s in scenarios)

    bad = tmp_path / "bad.txt"
    bad.write_text(FIXTURE.read_text() + "not a lewis line\n")
    with pytest.raises(ValueError, match="bad.txt:9"):
        load_lewis_file(bad)
