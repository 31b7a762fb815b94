"""``benchmarks/demo_seeds.py``'s bookkeeping (issue 62): the seeds come from the seed rule, tuning seeds are kept
apart from the acceptance seeds, the floor has both windows, and a kept unit of another recipe is refused."""

from __future__ import annotations

import json

import pytest
from bench_loader import benchmark_fixture

bench = benchmark_fixture("demo_seeds")


def _history(agree: list[float], malformed: float = 0.0) -> list[dict]:
    return [
        {"iteration": i + 1, "rollout/agreement": a, "rollout/malformed": malformed}
        | {f"agent{r}/{c}": 0.0 for r in (1, 2) for c in ("reward", "malformed", "attempts_malformed")}
        for i, a in enumerate(agree)
    ]


@pytest.fixture()
def ds(bench, tmp_path, monkeypatch):
    """The benchmark with its results and recipe under ``tmp_path`` and a ``run_seed`` that records its seeds."""
    recipe = tmp_path / "tiny-cpu.yaml"
    recipe.write_text("train: {iterations: 40}\n")
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bench, "UNITS", tmp_path / "results" / "demo_seeds")
    monkeypatch.setattr(bench, "RECIPE", recipe)
    ran = []

    def run_seed(seed, out):
        ran.append(seed)
        agree = [0.05] * 10 + [0.2] * 20 + [0.4] * 10
        return {"seed": seed, "commit": "abc", "recipe": bench.recipe_digest(), "command": "x",
                "ibrl_seconds": 300.0, "wall_seconds": 320.0, "load_average": 3.0, "roles": ["agent1", "agent2"],
                "history": _history(agree)}  # fmt: skip

    monkeypatch.setattr(bench, "run_seed", run_seed)
    bench.ran, bench.recipe = ran, recipe
    return bench


def test_the_default_seeds_are_the_seed_rules_acceptance_seeds(bench) -> None:
    units = __import__("units")  # benchmarks/units.py, on the path while the benchmark loads
    assert bench.SEEDS == units.DEMO_SEEDS == tuple(range(1010, 1020))  # the second block: the recipe changed
    assert all(s < units.TUNING_BELOW for s in units.TUNED_ON["demo"])
    assert min(bench.SEEDS) >= units.TUNING_BELOW and min(units.PATH_SEEDS) >= units.TUNING_BELOW


def test_the_floor_needs_both_windows(bench) -> None:
    unit = {"seed": 1000, "ibrl_seconds": 300.0, "load_average": 3.0, "roles": ["agent1", "agent2"]}
    # last 3 gains .35 over the first 3, but the first 10 -> last 10 gain is only .07: a late spike, not learning
    agree = [0.05] * 37 + [0.4] * 3
    s = bench.summary(unit | {"history": _history(agree)})
    assert s["gain"] == pytest.approx(0.35) and s["gain10"] == pytest.approx(0.105)
    assert s["missed"] == ["gain 10"] and not s["meets_floor"]
    good = bench.summary(unit | {"history": _history([0.05] * 10 + [0.2] * 20 + [0.4] * 10)})
    assert good["meets_floor"], good["missed"]
    slow = bench.summary(unit | {"ibrl_seconds": 480.0, "history": _history([0.05] * 10 + [0.2] * 20 + [0.4] * 10)})
    assert slow["missed"] == ["time"]


def test_tuning_seeds_are_reported_apart_and_never_counted(ds, tmp_path) -> None:
    out = str(tmp_path / "runs")
    assert ds.main(["--out", out, "--seeds", "1000", "1001", "7"]) == 0
    assert ds.ran == [1000, 1001, 7]
    text = (ds.RESULTS / "demo_seeds.md").read_text()
    assert "**2 of 2 acceptance seeds meet the floor (10 fixed" in text
    acceptance, tuning = text.split("Tuning seeds, the same recipe")
    assert "| 1000 |" in acceptance and "| 7 |" not in acceptance and "| 7 |" in tuning
    assert "tuned on seeds 42, 1, 2, 3, 4, 7, 11" in text


def test_a_kept_unit_of_another_recipe_is_refused_not_reused(ds, tmp_path) -> None:
    out = str(tmp_path / "runs")
    ds.main(["--out", out, "--seeds", "1000"])
    unit = ds.UNITS / "seed1000.json"
    before = unit.read_text()
    ds.recipe.write_text("train: {iterations: 50}\n")
    with pytest.raises(SystemExit, match="ran another recipe"):
        ds.main(["--out", out, "--seeds", "1000"])
    assert unit.read_text() == before and ds.ran == [1000]  # nothing overwritten, nothing run
    # the report counts only the current recipe's units and lists the other one as superseded
    ds.main(["--out", out, "--seeds", "1001"])
    text = (ds.RESULTS / "demo_seeds.md").read_text()
    assert "**1 of 1 acceptance seeds" in text and "Runs of earlier recipes" in text
    assert json.loads(unit.read_text())["recipe"] in text


def test_a_kept_unit_of_another_warm_start_is_refused_too(ds, tmp_path, monkeypatch) -> None:
    """The recipe's digest covers the warm start's weights: the same YAML from another warm start is another recipe."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"one")
    monkeypatch.setattr(ds, "WARM_START", weights)
    out = str(tmp_path / "runs")
    ds.main(["--out", out, "--seeds", "1010"])
    weights.write_bytes(b"two")
    with pytest.raises(SystemExit, match="ran another recipe"):
        ds.main(["--out", out, "--seeds", "1010"])
    assert ds.ran == [1010]
