"""benchmarks/mini_table2_v2.py without training: its evaluation plays the pre-registered counterparts, and its
report computes the pre-registered outcome (family-weighted), the primary test's reading, the Holm family of seven,
and keeps the stopping rule (no outcome before every unit is kept), from synthetic episodes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from bench_loader import benchmark_fixture

bench = benchmark_fixture("mini_table2_v2")

SCENARIO = {"counts": [1, 1, 3], "values": [[4, 3, 1], [2, 2, 2]]}


def _episodes(policy: str, counterpart: str, n: int, rate: float) -> list[dict]:
    """``n`` scenarios × 2 seats; exactly round(rate·n) agreed in each seat (own utility 7 on a deal)."""
    out = []
    for role, other in (("agent1", "agent2"), ("agent2", "agent1")):
        for i in range(n):
            agreed = i < round(rate * n)
            out.append(
                {
                    "scenario_uid": f"s{i}",
                    "scenario": SCENARIO,
                    "roles": ["agent1", "agent2"],
                    "policy": policy,
                    "counterpart": counterpart,
                    "policy_role": role,
                    "seats": ["agent1", "agent2"],  # the policy opens in its agent1 seat, answers in agent2
                    "agreed": agreed,
                    "malformed": False,
                    "failed": False,
                    "utilities": {role: 7, other: 6} if agreed else {"agent1": 0, "agent2": 0},
                }
            )
    return out


def _keep_eval(keep: Path, seed: int, name: str, rates: dict[tuple[str, str], float], n: int = 20) -> None:
    pairs = [
        {"policy": name, "counterpart": c, "kind": kind, "episodes": _episodes(name, c, n, r)}
        for (c, kind), r in rates.items()
    ]
    path = keep / "eval" / f"seed{seed}" / f"{name}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps({"command": "?", "seconds": 1.0, "pairs": pairs}).encode()))


def _rates(bench, scripted: float, surface: float, learned: float, v1: float = 0.5, self_play: float = 0.8):
    rates = {(b, "held-out"): scripted for b in bench.SCRIPTED}
    rates |= {(b, "held-out"): surface for b in bench.PHRASED}
    rates |= {(m.name, "held-out"): learned for m in bench.PANEL}
    rates |= {(b, "held-out"): v1 for b in bench.V1_HELDOUT}
    return rates | {("self", "self-play"): self_play, ("in-system", "in-system"): 0.9}


def test_eval_command_plays_every_preregistered_counterpart(bench, tmp_path):
    from marti_ibrl.cli import build_parser
    from marti_ibrl.eval.dond.command import plan

    sft = tmp_path / "sft"
    sft.mkdir()
    table = bench.v1.arms(str(sft), "conceder")
    for arm in bench.ARMS:
        for role in ("agent1", "agent2"):
            (tmp_path / "runs" / arm / "seed3" / role / "hf").mkdir(parents=True)
        cmd = bench.eval_command(tmp_path, tmp_path / "keep", table, str(sft), 3, arm)
        policies, pairs = plan(build_parser().parse_args(cmd[3:]))
        held = [c.name for _, c, kind in pairs if kind == "held-out"]
        assert held == [*bench.V1_HELDOUT, *bench.SCRIPTED, *bench.PHRASED, *(m.name for m in bench.PANEL)]
        assert {c for f in bench.FAMILIES.values() for c in f} <= set(held)
        assert [k for _, _, k in pairs].count("self-play") == 1 and "in-system" in {k for _, _, k in pairs}
        assert cmd[cmd.index("-n") + 1] == "150" and cmd[cmd.index("--max-rounds") + 1] == "5"
    assert len(bench.PANEL) == 6 and len({m.seed for m in bench.PANEL}) == 6
    assert not {m.seed for m in bench.PANEL} & set(bench.SEEDS)  # no evaluated policy trained with a panel member


def test_primary_outcome_weights_the_three_families_equally(bench, tmp_path):
    _keep_eval(tmp_path, 0, "ibrl", _rates(bench, scripted=0.9, surface=0.3, learned=0.2))
    pairs = bench.load_pairs(tmp_path)
    assert bench.family_value(pairs, "ibrl", 0, "scripted") == pytest.approx(0.9)
    assert bench.family_value(pairs, "ibrl", 0, "learned") == pytest.approx(0.2)
    # (0.9 + 0.3 + 0.2) / 3, not the pooled (4·0.9 + 4·0.3 + 6·0.2) / 14 = 0.4286
    assert bench.primary_value(pairs, "ibrl", 0) == pytest.approx(1.4 / 3)
    assert bench.primary_value(pairs, "ibrl", 0, "expected_utility") == pytest.approx(
        0.7 * 1.4 / 3
    )  # own utility 7 of 10 on a deal
    assert bench.OUTCOMES["Δmismatch"](pairs, "ibrl", 0) == pytest.approx(0.9 - 1.4 / 3)
    assert bench.OUTCOMES["self-play agreement"](pairs, "ibrl", 0) == pytest.approx(0.8)
    assert bench.primary_value(pairs, "ibrl", 1) is None and bench.primary_value(pairs, "uni_pool", 0) is None


def _row(diff: float, lo: float, hi: float, p: float) -> dict:
    return {"diff": diff, "ci_low": lo, "ci_high": hi, "p_value": p}


def test_the_primary_reading_follows_the_plan(bench):
    # rows are uni_pool − ibrl: IB-RL ahead is a negative diff
    assert bench.reading(_row(-0.15, -0.25, -0.05, 0.01)).startswith("IB-RL beats the pool baseline")
    assert bench.reading(_row(0.15, 0.05, 0.25, 0.01)).startswith("The pool baseline beats IB-RL")
    tie = bench.reading(_row(0.02, -0.06, 0.09, 0.4))
    assert tie.startswith("No difference detected") and "smaller than 10 points" in tie
    assert "smaller than 10" not in bench.reading(_row(0.02, -0.15, 0.2, 0.8))


def _complete_keep(bench, keep: Path) -> None:
    """Every evaluation of the plan, synthetic: IB-RL 10 points ahead of uni_pool on every family."""
    for seed in bench.SEEDS:
        wobble = (seed % 3 - 1) * 0.03
        for arm, base in (("ibrl", 0.7), ("uni_pool", 0.6), ("uni_sft", 0.5)):
            level = base + wobble
            _keep_eval(keep, seed, arm, _rates(bench, level, level - 0.1, level + 0.05, self_play=level + 0.1))
    _keep_eval(keep, 0, "sft", _rates(bench, 0.4, 0.1, 0.4))
    (keep / "times.json").write_text(json.dumps({"sft": 3600.0}))


def test_report_tests_what_was_registered(bench, tmp_path):
    keep = tmp_path / "keep"
    _complete_keep(bench, keep)
    pairs = bench.load_pairs(keep)
    primary = bench.welch(pairs, "held-out-v2 agreement", "uni_pool")
    assert primary["runs"] == primary["ref_runs"] == 10
    assert -primary["diff"] == pytest.approx(0.10) and primary["p_value"] < 0.01
    table, rows = bench.secondary_table(pairs)
    assert len(rows) == len(bench.SECONDARY) == 7 and table.count("\n") == 8
    from statsmodels.stats.multitest import multipletests

    expected = multipletests([r["p_value"] for r in rows], method="holm")[1]
    assert [r["p_holm"] for r in rows] == pytest.approx(list(expected))
    text = bench.write_report(keep, tmp_path / "v2.md")
    assert "**IB-RL beats the pool baseline" in text and "Δ = IB-RL − uni_pool = +10.0 points" in text
    assert (tmp_path / "v2_runs.png").stat().st_size > 10_000
    assert (tmp_path / "v2_matrix.png").stat().st_size > 10_000 and "![agreement by counterpart](v2_matrix.png)" in text
    assert "| sft |" in text  # the SFT init is a reference row of the exploratory tables
    goals = [line for line in text.splitlines() if "(goal ≥" in line]
    assert len(goals) == 4  # held-out vs uni_pool (primary) and vs uni_sft; self-play vs both (Holm)
    assert goals[0].startswith("- held-out-v2 agreement, IB-RL vs uni_pool") and "primary test, p = " in goals[0]
    assert goals[0].endswith("**met**.")  # +10 points ≥ +5, p < .01
    assert "## Scenario-clustered GEE (exploratory)" in text
    assert "| ibrl | 0.84±0.04 | 0.89±0.05 | 0.68±0.07 |" in text  # v1 quoted, as v1's report has it
    assert "Runs per arm (v1 seeds): ibrl 5, uni_bot 5, shared_reward 3, joint_norm 3, no_stabilization 3" in text
    assert text.rstrip().endswith(bench.deviations()) and "## Deviations from the plan" in text
    assert "\n## Report" not in text and "\n### Report" in text  # the file's sections sit under the report's


def test_goal_lines_judge_each_goal_on_its_registered_test(bench):
    def row(method, outcome, diff, p, p_holm=None):
        r = {"method": method, "outcome": outcome, "diff": diff, "ci_low": diff - 0.05, "ci_high": diff + 0.05}
        return r | {"ref_mean": 0.7, "mean": 0.7 + diff, "p_value": p, "p_holm": p_holm if p_holm is not None else p}

    primary = row("uni_pool", "held-out-v2 agreement", -0.06, 0.03)
    secondary = [
        row("uni_sft", "held-out-v2 agreement", -0.20, 0.001, 0.06),  # large, but not under .05 after Holm
        row("uni_pool", "self-play agreement", -0.10 + 1e-12, 0.001, 0.007),  # exactly +10 points, as counts give it
        row("uni_sft", "self-play agreement", -0.09, 0.001, 0.007),  # significant, below the +10 goal
        row("uni_pool", "Δmismatch", 0.3, 0.001, 0.007),  # no goal
    ]
    lines = bench.goal_lines(primary, secondary)
    assert [line.rsplit("**", 2)[-2] for line in lines] == ["met", "not met", "met", "not met"]
    assert "primary test, p = 0.03" in lines[0] and "Holm p over the seven secondary tests = 0.06" in lines[1]


def test_gee_table_fits_the_v2_families_only(bench, tmp_path):
    keep = tmp_path / "keep"
    _complete_keep(bench, keep)
    text = bench.gee_table(bench.load_pairs(keep))
    assert "**the three families pooled**" in text and "**per family**" in text
    assert "not estimable" not in text and "uni_pool" in text and "uni_sft" in text
    for family in bench.FAMILIES:
        assert f"| {family} |" in text


def test_no_outcome_before_every_unit_is_kept(bench, tmp_path, capsys):
    keep = tmp_path / "keep"
    _keep_eval(keep, 0, "ibrl", _rates(bench, 0.9, 0.3, 0.2))
    assert bench.main(["--stage", "report", "--keep", str(keep)]) == 1
    out = capsys.readouterr().out
    assert "1 of 67 units kept" in out and "not yet" in out
    assert "0.9" not in out and "agreement" not in out  # counts only
    assert not (tmp_path / "v2.md").exists()


def test_seeds_outside_the_plan_are_refused(bench):
    with pytest.raises(SystemExit, match="pre-registered seeds"):
        bench.main(["--stage", "status", "--seeds", "10"])


def test_reproducibility_says_per_arm_where_a_retrained_run_left_v1(bench, tmp_path):
    def keep_run(root: Path, arm: str, seed: int, curve: list[float | None]) -> None:
        path = root / "runs" / arm / f"seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rewards": {"agent1/reward": curve, "agent2/reward": curve}}))

    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    base = [5.0, 5.0, 6.0, 6.0, 6.0]
    for seed in range(5):
        keep_run(v1, "ibrl", seed, base)
        keep_run(v2, "ibrl", seed, base)  # identical
        keep_run(v1, "uni_sft", seed, base)
        # seed 0 identical; the others leave v1 at iteration `seed` (a None on both sides is not compared)
        keep_run(v2, "uni_sft", seed, base if seed == 0 else base[:seed] + [x + 1.0 for x in base[seed:]])
    keep_run(v1, "uni_pool", 0, [None, 5.0])
    keep_run(v2, "uni_pool", 0, [None, 7.0])
    text = bench.reproducibility(v2, v1)
    assert "`ibrl` identical in all 5 runs" in text
    assert "`uni_sft` identical in 1 of 5 runs, the others from iteration 1-4 on" in text
    assert "largest difference 1.00 points in one iteration, 0.80 in a run's mean reward" in text  # seed 1: 4 of 5
    assert "`uni_pool` different in its one run from iteration 1 on (largest difference 2.00 points" in text
    assert bench.reproducibility(tmp_path / "none", v1) == "Reproducibility: no retrained v1 run to compare."
