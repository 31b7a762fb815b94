"""Tables and report.md from a synthetic eval directory whose numbers are known by construction."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from marti_ibrl.envs.dond import generate_scenarios
from marti_ibrl.eval.evaluator import episode_id
from marti_ibrl.eval.report import load_pairs, write_report, write_tables

ROLES = ["agent1", "agent2"]
N = 60
SCENARIOS = generate_scenarios(N, 11)
# (policy, counterpart, kind): agreements out of N when the policy opened / answered
DESIGN = {
    ("A", "in-system", "in-system"): (54, 48),
    ("A", "self", "self-play"): (30, 30),
    ("A", "hardliner", "held-out"): (18, 18),
    ("A", "tit_for_tat", "held-out"): (24, 36),
    ("B", "in-system", "in-system"): (48, 48),
    ("B", "self", "self-play"): (36, 42),
    ("B", "hardliner", "held-out"): (48, 48),
    ("B", "tit_for_tat", "held-out"): (42, 42),
}
FAULTY = ("A", "tit_for_tat")  # per seat, 3 of its no-deal episodes failed and 6 malformed


def first_best_split(scenario) -> dict[str, list[int]]:
    """Every item type to the role valuing it more (agent1 on ties): the first-best allocation."""
    a1 = [c if v1 >= v2 else 0 for c, v1, v2 in zip(scenario.counts, *scenario.values)]
    return {"agent1": a1, "agent2": [c - a for c, a in zip(scenario.counts, a1)]}


def own_share(scenario, role: str) -> float:
    i = ROLES.index(role)
    alloc = first_best_split(scenario)[role]
    top = sum(c * v for c, v in zip(scenario.counts, scenario.values[i]))
    return sum(a * v for a, v in zip(alloc, scenario.values[i])) / top


def make_pair(policy: str, counterpart: str, opened: int, answered: int, draw: str | None = None) -> list[dict]:
    """Exactly ``opened`` / ``answered`` deals among the N scenarios per seat, on scenarios drawn independently
    per (policy, counterpart, seat) (or the ``draw`` policy's: then the deals of the fewer are among those of the
    more); a no-deal scenario's rank decides whether the faulty pair failed there."""
    rank = {
        seat: dict(zip(random.Random(f"{draw or policy}/{counterpart}/{seat}").sample(range(N), N), range(N)))
        for seat in ("opened", "answered")
    }
    episodes = []
    for si, sc in enumerate(SCENARIOS):
        seats = ROLES if si % 2 == 0 else ROLES[::-1]
        for seat, k in (("opened", opened), ("answered", answered)):
            role = seats[0] if seat == "opened" else seats[1]
            agreed = rank[seat][si] < k
            bad = (policy, counterpart) == FAULTY and not agreed
            alloc = first_best_split(sc) if agreed else {}
            utilities = {
                r: float(sum(a * v for a, v in zip(alloc[r], sc.values[i]))) if agreed else 0.0
                for i, r in enumerate(ROLES)
            }
            episodes.append(
                {
                    "episode_id": episode_id(sc.uid, role, 0),
                    "scenario_uid": sc.uid,
                    "scenario": sc.to_json(),
                    "roles": ROLES,
                    "policy": policy,
                    "counterpart": counterpart,
                    "policy_role": role,
                    "seats": seats,
                    "sample_index": 0,
                    "transcript": [],
                    "agreed": agreed,
                    "failed": bad and rank[seat][si] >= N - 3,
                    "malformed": bad and N - 9 <= rank[seat][si] < N - 3,
                    "utilities": utilities,
                    "allocations": alloc,
                }
            )
    return episodes


def build_eval_dir(root: Path, design: dict = DESIGN, draws: dict | None = None) -> Path:
    (root / "episodes").mkdir(parents=True)
    pairs = []
    for (policy, counterpart, kind), (opened, answered) in design.items():
        name = f"{policy}__{counterpart}.jsonl"
        eps = make_pair(policy, counterpart, opened, answered, (draws or {}).get(policy))
        (root / "episodes" / name).write_text("".join(json.dumps(e) + "\n" for e in eps))
        pairs.append({"policy": policy, "counterpart": counterpart, "kind": kind, "file": name})
    (root / "pairs.json").write_text(json.dumps(pairs))
    return root


def expected(policy: str, counterpart: str) -> dict[str, float]:
    """Seat-averaged agreement / own utility / joint value, computed by hand from the design."""
    kind = next(k for p, c, k in DESIGN if (p, c) == (policy, counterpart))
    eps = make_pair(policy, counterpart, *DESIGN[policy, counterpart, kind])
    seats = {
        s: [e for e in eps if (e["seats"][0] == e["policy_role"]) == (s == "opened")] for s in ("opened", "answered")
    }
    agreement, own = [], []
    for group in seats.values():
        agreement.append(sum(e["agreed"] for e in group) / len(group))
        deals = [e for e in group if e["agreed"]]
        sc = {s.uid: s for s in SCENARIOS}
        own.append(sum(own_share(sc[e["scenario_uid"]], e["policy_role"]) for e in deals) / len(deals))
    return {"agreement": sum(agreement) / 2, "own": sum(own) / 2, "joint": 1.0}


def held_out_mean(policy: str) -> float:
    return (expected(policy, "hardliner")["agreement"] + expected(policy, "tit_for_tat")["agreement"]) / 2


def table(md: str, heading: str) -> list[list[str]]:
    """The rows (header first) of the markdown table under ``### heading``."""
    block = md.split(f"### {heading}", 1)[1].split("\n\n", 2)[1]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines() if "---" not in line]


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory) -> Path:
    return build_eval_dir(tmp_path_factory.mktemp("eval"))


def test_design_is_what_it_says():
    assert expected("A", "hardliner")["agreement"] == pytest.approx(0.30)
    assert expected("A", "tit_for_tat")["agreement"] == pytest.approx(0.50)
    assert held_out_mean("A") == pytest.approx(0.40) and held_out_mean("B") == pytest.approx(0.75)
    assert 0.5 < expected("A", "in-system")["own"] < 1.0


def test_write_tables(eval_dir):
    text = write_tables(eval_dir)
    assert (eval_dir / "tables.md").read_text() == text
    assert "### cross-play" not in text  # no cross-play pairs, no table

    for kind, columns in (
        ("in-system", ["in-system"]),
        ("self-play", ["self"]),
        ("held-out", ["hardliner", "tit_for_tat"]),
    ):
        rows = table(text, kind)
        assert rows[0] == ["policy", *columns]
        for row in rows[1:]:
            cells = []
            for c in columns:
                x = expected(row[0], c)
                cells.append(f"{x['agreement']:.2f} / {x['own']:.2f} / {x['joint']:.2f}")
            assert row[1:] == cells, (kind, row)
        assert [r[0] for r in rows[1:]] == ["A", "B"]

    # Δmismatch = in-system − mean held-out agreement
    rows = table(text, "Δmismatch")
    assert rows[0] == ["policy", "in-system", "self-play", "held-out (mean)", "Δmismatch"]
    for row in rows[1:]:
        p = row[0]
        j_train, j_deploy = expected(p, "in-system")["agreement"], held_out_mean(p)
        want = [j_train, expected(p, "self")["agreement"], j_deploy, j_train - j_deploy]
        assert row[1:] == [f"{x:.2f}" for x in want]
    assert [r[-1] for r in rows[1:]] == ["0.45", "0.05"]  # A = 0.85 − 0.40, B = 0.80 − 0.75

    summary = json.loads((eval_dir / "summary.json").read_text())
    mm = {r["policy"]: r for r in summary["mismatch"]}
    assert mm["A"]["delta_mismatch"] == pytest.approx(0.45) and mm["B"]["delta_mismatch"] == pytest.approx(0.05)
    assert mm["A"]["held_out"] == pytest.approx(0.40) and mm["B"]["in_system"] == pytest.approx(0.80)
    assert mm["B"]["self_play"] == pytest.approx(0.65)
    assert all("episodes" not in p for p in summary["pairs"]) and len(summary["pairs"]) == len(DESIGN)

    # All pairs: counts, and the failed/malformed rates of the faulty pair (in every denominator)
    rows = {r[0]: r for r in table(text, "All pairs")[1:]}
    assert set(rows) == {f"{p} vs {c}" for p, c, _ in DESIGN}
    assert all(r[1] == str(2 * N) for r in rows.values())
    assert rows["A vs tit_for_tat"][-2:] == ["0.10", "0.05"]  # malformed 6/60, failed 3/60 per seat
    assert rows["A vs hardliner"][-2:] == ["0.00", "0.00"]


def test_seat_averaging_not_pooling(tmp_path):
    """With unequal seats (an eval still running), the table averages the two seats' rates."""
    root = build_eval_dir(tmp_path / "eval")
    f = root / "episodes" / "A__in-system.jsonl"
    eps = [json.loads(x) for x in f.read_text().splitlines()]
    answered = [e for e in eps if e["seats"][0] != e["policy_role"]]
    keep = answered[: N // 2]
    f.write_text("".join(json.dumps(e) + "\n" for e in eps if e["seats"][0] == e["policy_role"] or e in keep))
    rate_answered = sum(e["agreed"] for e in keep) / len(keep)
    pairs = {(p["policy"], p["counterpart"]): p for p in load_pairs(root)}
    s = pairs["A", "in-system"]["summary"]
    assert s["averaged"]["n"] == N + N // 2
    assert s["averaged"]["agreement"] == pytest.approx((54 / 60 + rate_answered) / 2)
    pooled = (54 + sum(e["agreed"] for e in keep)) / (N + N // 2)
    assert abs(s["averaged"]["agreement"] - pooled) > 0.01


def gee_rows(report: str, key: int = 0) -> dict[str, list[str]]:
    """The GEE table's rows by family (``key=0``) or by method (``key=1``)."""
    stats = report.split("## Statistics", 1)[1]
    lines = [x for x in stats.splitlines() if x.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == ["Family", "Method", "vs", "n", "OR [95% CI]", "p", "p_holm"]
    return {r[key]: r for r in ([c.strip() for c in x.strip("|").split("|")] for x in lines[2:])}


def test_report_from_eval_dir(eval_dir, tmp_path):
    path = write_report(eval_dir)  # the eval output directory itself
    assert path == eval_dir / "report.md"
    report = path.read_text()
    assert "## Training" not in report and "## Evaluation" in report
    assert f"up to {2 * N} episodes per pair" in report
    assert write_tables(eval_dir).strip() in report
    rows = gee_rows(report)
    assert set(rows) == {"hardliner", "tit_for_tat"}
    for counterpart, (a, b) in {"hardliner": (0.30, 0.80), "tit_for_tat": (0.50, 0.70)}.items():
        family, method, ref, n, ci, p, p_holm = rows[counterpart]
        assert (method, ref, n) == ("B", "A", str(2 * N))
        odds_ratio, low, high = map(float, re.fullmatch(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", ci).groups())
        # balanced clusters (every scenario: both policies, both seats): the GEE OR is the marginal one
        assert odds_ratio == pytest.approx((b / (1 - b)) / (a / (1 - a)), abs=0.006)
        assert 1 < low < odds_ratio < high
        assert p_holm.rstrip("*") == p  # one comparison per counterpart: Holm leaves p as it is
        assert p_holm.endswith("*")  # B is significantly better against both
    assert rows["hardliner"][5] == "<0.001"

    # the reference can be chosen: then A is worse than B
    rows = gee_rows(write_report(eval_dir, reference="B").read_text())
    assert rows["hardliner"][1:3] == ["A", "B"]
    assert float(rows["hardliner"][4].split()[0]) == pytest.approx((0.3 / 0.7) / (0.8 / 0.2), abs=0.006)


def test_report_holm_across_three_policies(tmp_path):
    """C and D vs A against one counterpart: Holm doubles the smaller p-value (C: 0.03 alone, 0.07 adjusted)."""
    design = {("A", "hardliner", "held-out"): (18, 18)}
    design |= {("C", "hardliner", "held-out"): (26, 26), ("D", "hardliner", "held-out"): (22, 22)}
    rows = gee_rows(write_report(build_eval_dir(tmp_path / "eval", design)).read_text(), key=1)
    assert set(rows) == {"C", "D"} and rows["C"][0] == rows["D"][0] == "hardliner"
    p_c, p_d = float(rows["C"][5]), float(rows["D"][5])
    holm_c, holm_d = rows["C"][6], rows["D"][6]
    assert 0.001 < p_c < 0.05 < p_d
    assert float(holm_c) == pytest.approx(2 * p_c, abs=0.0015) and float(holm_c) > 0.05
    assert not holm_c.endswith("*")  # significant alone, not after the correction
    assert float(holm_d) == pytest.approx(max(p_d, 2 * p_c), abs=0.0015)


def test_gee_clusters_by_scenario(tmp_path):
    """B's deals include all of A's (the same scenarios are the easy ones): clustered by scenario, the robust SE of
    the log odds ratio is far below the independent-episodes one, sqrt(1/a + 1/b + 1/c + 1/d)."""
    design = {("A", "hardliner", "held-out"): (18, 18), ("B", "hardliner", "held-out"): (30, 30)}
    report = write_report(build_eval_dir(tmp_path / "eval", design, draws={"B": "A"})).read_text()
    ci = gee_rows(report)["hardliner"][4]
    odds_ratio, low, high = map(float, re.fullmatch(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", ci).groups())
    assert odds_ratio == pytest.approx((0.5 / 0.5) / (0.3 / 0.7), abs=0.006)
    se = math.log(high / low) / (2 * 1.959964)
    assert se < 0.7 * math.sqrt(1 / 36 + 1 / 84 + 1 / 60 + 1 / 60)


def test_report_with_training_curves(eval_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    history = [
        {
            "iteration": k,
            "agent1/reward": 0.5 + 0.1 * k,
            "agent2/reward": 1.0 - 0.05 * k,
            "rollout/agreement": 0.2 * k,
            "rollout/malformed": 0.4 - 0.1 * k,
        }
        for k in (1, 2, 3, 4)
    ]
    (run / "trainer_state.json").write_text(json.dumps({"iteration": 4, "history": history}))

    report = write_report(run).read_text()  # training only
    assert "## Evaluation" not in report
    assert "4 iterations, roles agent1, agent2." in report
    assert "agent1 reward 0.900, agent2 reward 0.800, agreement 0.800, malformed 0.000." in report
    assert "![reward curves](figures/reward_curves.png)" in report
    png = run / "figures" / "reward_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    report = write_report(run, eval_dir=eval_dir).read_text()  # and an eval directory elsewhere
    assert report.index("## Training") < report.index("## Evaluation") < report.index("## Statistics")
    assert "![reward curves](figures/reward_curves.png)" in report and "| hardliner | B | A |" in report


def test_report_shows_what_they_said_in_the_first_and_last_iteration(tmp_path):
    from marti_ibrl.rollout import transcripts

    run = tmp_path / "run"
    run.mkdir()
    history = [{"iteration": k, "a/reward": 0.0, "b/reward": 0.0, "rollout/agreement": 0.0, "rollout/malformed": 0.0}
               for k in (1, 2, 3)]  # fmt: skip
    (run / "trainer_state.json").write_text(json.dumps({"iteration": 3, "history": history}))

    def said(k, text):
        return {"iteration": k, "scenario_uid": f"s{k}", "sample_index": 0, "seats": ["a", "b"],
                "policies": {"a": "current", "b": "current"}, "rewards": {"a": 1.0, "b": 0.0}, "agreed": False,
                "malformed": False, "fault_role": None, "reason": "", "utilities": {}, "truncated": False,
                "discarded": [], "turns": [{"role": "a", "text": text, "valid": True, "resamples": 0}]}  # fmt: skip

    transcripts.append(run, [said(1, "first words"), said(2, "middle"), said(3, "last words")])
    report = write_report(run).read_text()
    section = report.split("## What they said", 1)[1]
    assert "3 dialogues kept (iterations 1-3)" in section and f"marti-ibrl show {run}" in section
    assert "first words" in section and "last words" in section and "middle" not in section


def test_missing_directories(tmp_path, capsys):
    from marti_ibrl.cli import main

    with pytest.raises(FileNotFoundError, match="no such run directory"):
        write_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="nothing to report"):
        write_report(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="not an eval directory"):
        write_tables(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="not an eval directory"):
        load_pairs(tmp_path / "empty")
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "marti-ibrl report: error:" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "report.md").exists()


def test_cli_report(eval_dir, tmp_path, capsys):
    from marti_ibrl.cli import main

    run = tmp_path / "run"
    build_eval_dir(run / "eval")  # RUN_DIR/eval
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {run / 'report.md'}"
    assert "| hardliner | B | A |" in (run / "report.md").read_text()
    assert main(["report", str(eval_dir), "--reference", "B"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {eval_dir / 'report.md'}"
    assert "| hardliner | A | B |" in (eval_dir / "report.md").read_text()


def test_a_run_whose_game_does_not_load_here_says_so_in_one_line(eval_dir, tmp_path, capsys):
    """Issue 65: ``report RUN`` with the run's game off ``PYTHONPATH`` fell back to DoND's tables and failed in DoND's
    scenario parser ("a scenario needs 'counts' and 'values' ..."); its training curves need no game at all."""
    import shutil

    from marti_ibrl.cli import main

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text("env:\n  name: sealed_trade_not_here:SealedTrade\n")
    history = [{"iteration": k, "buyer/reward": 0.1 * k, "seller/reward": 0.0, "rollout/agreement": 0.0,
                "rollout/malformed": 0.0} for k in (1, 2)]  # fmt: skip
    (run / "trainer_state.json").write_text(json.dumps({"iteration": 2, "history": history}))
    assert main(["report", str(run)]) == 0  # training only: the game is not needed
    capsys.readouterr()
    for name in ("pairs.json", "episodes"):
        src = eval_dir / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, run / "eval" / name)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"marti-ibrl report: error: {run}: the run's environment sealed_trade_not_here:SealedTrade does not load here ("
    ), err
    assert "sealed_trade_not_here" in err[0].split("(", 1)[1] and "PYTHONPATH" in err[0]


def test_eval_and_diagnose_refresh_only_a_runs_own_report(tmp_path, monkeypatch) -> None:
    """``refresh_report`` (after ``eval --run RUN --out RUN/eval`` and ``diagnose RUN``, issue 65): RUN's report.md
    rewritten when the run wrote one, never made where there was none; a failure is a line, never fatal."""
    from marti_ibrl.eval import report

    assert report.refresh_report(tmp_path, "evaluation") is None and not (tmp_path / "report.md").exists()
    (tmp_path / "report.md").write_text("old")
    written = []
    monkeypatch.setattr(report, "write_report", lambda run: written.append(run) or tmp_path / "report.md")
    line = report.refresh_report(tmp_path, "evaluation")
    assert line == f"report: {tmp_path / 'report.md'} updated with the evaluation" and written == [tmp_path]

    def broken(run):
        raise ValueError("the run's environment x does not load\nhere")

    monkeypatch.setattr(report, "write_report", broken)
    assert report.refresh_report(str(tmp_path), "diagnostics of a") == (
        f"report not updated (ValueError: the run's environment x does not load here); marti-ibrl report {tmp_path}"
    )
