"""``benchmarks/learning_paths.py``'s bookkeeping: a kept unit is reused only for the flags and warm start it ran with,
and ``--pilot`` keeps a candidate warm start's units apart from the report (issue 49, item 3)."""

from __future__ import annotations

import json

import pytest
from bench_loader import benchmark_fixture

bench = benchmark_fixture("learning_paths")


@pytest.fixture()
def lp(bench, tmp_path, monkeypatch):
    """The benchmark with its results under ``tmp_path`` and a ``run_unit`` that records what it was asked to run."""
    warm = tmp_path / "recipes" / "tiny-sft"
    cand = tmp_path / "cand" / "global_step1500_hf"
    for d in (warm, cand):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bench, "UNITS", tmp_path / "results" / "learning_paths")
    monkeypatch.setattr(bench, "WARM_START", warm)
    ran = []

    def run_unit(path, seed, out, warm_start=warm):
        ran.append((path, seed, warm_start.name))
        cmd = bench.command(path, seed, out / f"{path}-s{seed}", warm_start)
        agree = [0.05] * 3 + [0.1] * 34 + [0.35] * 3
        history = [
            {"iteration": i + 1, "rollout/agreement": a, "rollout/malformed": 0.0, "seconds": 1.0}
            | {f"agent{r}/{c}": 0.0 for r in (1, 2) for c in bench.PER_ROLE}
            for i, a in enumerate(agree)
        ]
        return {"path": path, "seed": seed, "commit": "abc", "command": " ".join(cmd[1:]), "wall_seconds": 40.0,
                "load_average": 2.0, "roles": ["agent1", "agent2"], "history": history}  # fmt: skip

    monkeypatch.setattr(bench, "run_unit", run_unit)
    bench.ran, bench.cand = ran, cand
    return bench


def test_a_pilot_runs_from_its_warm_start_keeps_its_units_apart_and_leaves_the_report_alone(lp, tmp_path) -> None:
    out = str(tmp_path / "runs")
    assert lp.main(["--out", out, "--paths", "hf", "--seeds", "2", "3", "--pilot", str(lp.cand)]) == 0
    assert lp.ran == [("hf", 2, "global_step1500_hf"), ("hf", 3, "global_step1500_hf")]
    assert sorted(p.name for p in (lp.UNITS / "pilot").iterdir()) == ["hf-s2.json", "hf-s3.json"]
    assert not (lp.RESULTS / "learning_paths.md").exists() and not list(lp.UNITS.glob("*.json"))
    kept = json.loads((lp.UNITS / "pilot" / "hf-s2.json").read_text())
    assert f"--role1.pretrain {lp.cand}" in kept["command"] and lp.summary(kept)["agreement_gain"] == pytest.approx(0.3)
    lp.main(["--out", out, "--paths", "hf", "--seeds", "2", "--pilot", str(lp.cand)])  # kept: not run again
    assert len(lp.ran) == 2


def test_a_kept_unit_of_another_warm_start_is_refused_not_reused(lp, tmp_path) -> None:
    out = str(tmp_path / "runs")
    lp.main(["--out", out, "--paths", "hf", "--seeds", "42"])
    assert "hf" in (lp.RESULTS / "learning_paths.md").read_text() and lp.ran == [("hf", 42, "tiny-sft")]
    unit = lp.UNITS / "hf-s42.json"
    # the same unit, as if made from the candidate: the benchmark's warm start would no longer be the one it ran
    text = unit.read_text().replace(str(lp.WARM_START), str(lp.cand))
    unit.write_text(text)
    with pytest.raises(SystemExit, match="another warm start than tiny-sft"):
        lp.main(["--out", out, "--paths", "hf", "--seeds", "42"])
    assert unit.read_text() == text and len(lp.ran) == 1  # nothing overwritten, nothing run
    lp.main(["--out", out, "--paths", "hf", "--seeds", "42", "--rerun"])
    assert len(lp.ran) == 2 and str(lp.WARM_START) in unit.read_text()


def test_no_warm_start_is_one_line(lp, tmp_path) -> None:
    with pytest.raises(SystemExit, match="no warm start in .*nowhere"):
        lp.main(["--out", str(tmp_path / "runs"), "--pilot", str(tmp_path / "nowhere")])


def test_identical_runs_are_named_so_a_hidden_curve_is_not_a_missing_one(bench) -> None:
    h = [{"iteration": 1, "rollout/agreement": 0.1, "seconds": 3.0}, {"iteration": 2, "rollout/agreement": 0.2}]
    hf, colo = {"path": "hf", "seed": 1, "history": h}, {"path": "colocate_all", "seed": 1, "history": h}
    slower = {**colo, "history": [h[0] | {"seconds": 9.0}, h[1]]}  # times differ: still the same run
    other = {**colo, "seed": 42}
    assert bench.same_runs([hf, colo])[0].endswith(": colocate_all seed 1 = hf.")
    assert bench.same_runs([hf, slower]) and bench.same_runs([hf, other]) == []
    moved = {**colo, "history": [h[0], h[1] | {"rollout/agreement": 0.25}]}
    assert bench.same_runs([hf, moved]) == []


def test_a_unit_kept_from_the_warm_starts_earlier_name_is_its_own(lp, tmp_path) -> None:
    """recipes/dond/tiny-sft-vllm became recipes/dond/tiny-sft (the same files): units run from it stay valid."""
    out = str(tmp_path / "runs")
    lp.main(["--out", out, "--paths", "hf", "--seeds", "42"])
    unit = lp.UNITS / "hf-s42.json"
    unit.write_text(unit.read_text().replace(str(lp.WARM_START), str(lp.WARM_START.with_name("tiny-sft-vllm"))))
    lp.main(["--out", out, "--paths", "hf", "--seeds", "42"])
    assert len(lp.ran) == 1  # kept, not refused and not run again
