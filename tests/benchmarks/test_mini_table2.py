"""benchmarks/mini_table2.py without training: its commands parse as `train`/`eval` parse them, and its report
computes the right tables, Δmismatch, cross-play matrix, GEE and goal verdicts from synthetic episodes."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from bench_loader import benchmark_fixture
from fake_model import fake_checkpoint

from marti_ibrl.config import load_config
from marti_ibrl.sft import RENDERING_KEYS

bench = benchmark_fixture("mini_table2")


def test_every_arm_is_a_valid_train_command(bench, tmp_path):
    sft = fake_checkpoint(tmp_path / "sft")
    table = bench.arms(str(sft), "conceder")
    assert set(table) == set(bench.FULL.arms)
    for name, arm in table.items():
        cmd = bench.train_command(arm, 3, tmp_path / "runs" / name, str(sft), 5)
        assert cmd[2:5] == ["marti_ibrl.cli", "train", "--config"]
        cfg = load_config(cmd[4:])  # exactly what `marti-ibrl train` does with these flags
        assert cfg.train.seed == 3 and cfg.train.iterations == 5 and cfg.env.bot_speech == "markers"
        agent1, agent2 = cfg.roles
        assert agent1.pretrain == str(sft) and not agent1.frozen
        if name.startswith("uni_"):
            assert agent2.frozen and agent2.pretrain is None
        else:
            assert not agent2.frozen and agent2.pretrain == str(sft)
        assert cfg.ablation == (name if name in ("shared_reward", "joint_norm", "no_stabilization") else "none")
    assert load_config(bench.train_command(table["uni_pool"], 0, tmp_path, str(sft), 1)[4:]).roles[1].frozen == [
        "bot:conceder",
        "bot:fair",
        "bot:greedy",
        "bot:stubborn",
    ]


def test_eval_commands_plan_the_right_pairs(bench, tmp_path):
    from marti_ibrl.cli import build_parser
    from marti_ibrl.eval.dond.command import plan

    sft = tmp_path / "sft"
    sft.mkdir()
    profile = bench.FULL  # every arm
    for arm in profile.arms:
        for role in ("agent1", "agent2"):
            (tmp_path / "runs" / arm / "seed0" / role / "hf").mkdir(parents=True)
    table = bench.arms(str(sft), "fair")
    kinds = {}
    for name in [*profile.arms, "sft"]:  # one evaluation per policy
        cmd = bench.eval_command(tmp_path, profile, table, str(sft), 0, name)
        assert cmd[cmd.index("--out") + 1] == str(tmp_path / "eval" / "seed0" / name)
        policies, pairs = plan(build_parser().parse_args(cmd[3:]))
        assert [p.name for p in policies] == [name]
        for p, c, kind in pairs:
            kinds.setdefault((p.name, kind), []).append(c.name)
    assert kinds[("uni_pool", "in-system")] == [f"in-system:{b}" for b in bench.TRAINING_BOTS]
    assert kinds[("uni_bot", "in-system")] == ["in-system"]
    assert ("sft", "in-system") not in kinds
    assert kinds[("ibrl", "held-out")] == list(bench.HELDOUT_BOTS)
    assert all(kinds[(a, "self-play")] == ["self"] for a in [*profile.arms, "sft"])
    _, cross = plan(build_parser().parse_args(bench.cross_command(tmp_path, profile, 0)[3:]))
    assert len(cross) == len(profile.arms) * (len(profile.arms) - 1)
    assert {k for _, _, k in cross} == {"cross-play"}


SCENARIO = {"counts": [1, 1, 3], "values": [[4, 3, 1], [2, 2, 2]]}


def _episodes(policy, counterpart, n, rate, rng):
    """``n`` scenarios × 2 seats; each episode agreed with probability ``rate`` (agent1 gets item0+item1)."""
    out = []
    for i in range(n):
        for role in ("agent1", "agent2"):
            agreed = rng.random() < rate
            other = "agent2" if role == "agent1" else "agent1"
            out.append(
                {
                    "scenario_uid": f"s{i}",
                    "scenario": SCENARIO,
                    "roles": ["agent1", "agent2"],
                    "policy": policy,
                    "counterpart": counterpart,
                    "policy_role": role,
                    "seats": [role, other] if i % 2 else [other, role],
                    "agreed": agreed,
                    "malformed": not agreed and rng.random() < 0.1,
                    "failed": False,
                    "utilities": {"agent1": 7, "agent2": 6} if agreed else {"agent1": 0, "agent2": 0},
                }
            )
    return out


def _keep_eval(keep: Path, seed: int, name: str, rates: dict[tuple[str, str, str], float], n: int) -> None:
    """A kept evaluation (what :func:`eval_unit` writes) of synthetic episodes."""
    rng = random.Random(f"{seed}-{name}")
    pairs = [
        {
            "policy": policy,
            "counterpart": counterpart,
            "kind": kind,
            "episodes": _episodes(policy, counterpart, n, r, rng),
        }
        for (policy, counterpart, kind), r in rates.items()
    ]
    path = keep / "eval" / f"seed{seed}" / f"{name}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps({"command": "?", "seconds": 1.0, "pairs": pairs}).encode()))


def test_results_tables_gee_and_goals(bench, tmp_path):
    profile = bench.replace(bench.QUICK, seeds=(0, 1), arms=("ibrl", "uni_sft", "uni_bot"))
    held = {"ibrl": 0.7, "uni_sft": 0.45, "uni_bot": 0.3}
    selfplay = {"ibrl": 0.8, "uni_sft": 0.4, "uni_bot": 0.75}
    for seed in (0, 1):
        cross = {}
        for arm in profile.arms:
            main = {(arm, "in-system", "in-system"): 0.9, (arm, "self", "self-play"): selfplay[arm]}
            main |= {(arm, b, "held-out"): held[arm] for b in bench.HELDOUT_BOTS}
            _keep_eval(tmp_path, seed, arm, main, n=150)
            for other in profile.arms:
                if other != arm:
                    cross[(arm, f"policy:{other}", "cross-play")] = 0.5
        if seed == 0:  # seed 1's arms "trained on different machines": no cross-play
            _keep_eval(tmp_path, seed, "cross", cross, n=40)
    results = tmp_path / "results" / "mini.md"
    meta = {"command": "python benchmarks/mini_table2.py", "wall_time": "1 min", "date": "d", "machine": "m"}
    text = bench.write_results(tmp_path, profile, results, meta)
    assert results.read_text() == text
    assert "Whole run: 0.0 h of compute" in text and "not recorded: sft, train ibrl/seed0, eval seed0/ibrl" in text
    assert "Seeds with cross-play: 0; without (arms trained on different machines, or not yet): 1." in text

    pairs = bench.load_results(tmp_path, profile.seeds)
    _, numbers = bench.mismatch_table(pairs, profile.arms)
    for arm in profile.arms:  # sampled rates land near the true ones; Δ = in-system − held-out
        assert numbers[arm]["held_out"] == pytest.approx(held[arm], abs=0.05)
        assert numbers[arm]["self_play"] == pytest.approx(selfplay[arm], abs=0.07)
        assert numbers[arm]["delta"] == pytest.approx(numbers[arm]["in_system"] - numbers[arm]["held_out"])
    ib = bench.per_arm(pairs, "ibrl", "held-out")
    assert set(ib) == {0, 1} and all(s["n"] == 4 * 150 * 2 for s in ib.values())  # four bots pooled, both seats
    assert ib[0]["own_utility"] == pytest.approx((7 / 10 + 6 / 10) / 2, abs=0.02)  # agent1 gets 7 of 10, agent2 6/10

    # secondary, the GEE: ibrl's held-out agreement is far above both unilateral arms; seed enters as a fixed effect
    _, verdicts = bench.gee_tests(pairs)
    for arm in ("uni_sft", "uni_bot"):
        row = verdicts["held-out"][arm]
        assert row["odds_ratio"] < 0.6 and row["p_holm"] < 1e-6
    assert "seed fixed effects" in text
    # primary, over training runs: 2 runs per arm, Welch's t-test of the per-run values
    _, runs = bench.run_level_tests(pairs, profile.arms)
    held_rows = bench.run_values(pairs, "held-out", "agreement", profile.arms)
    assert [(r["method"], r["seed"]) for r in held_rows] == [(a, s) for a in profile.arms for s in (0, 1)]
    row = runs[("held-out", "agreement")]["uni_sft"]
    ib_runs = [r["value"] for r in held_rows if r["method"] == "ibrl"]
    sft_runs = [r["value"] for r in held_rows if r["method"] == "uni_sft"]
    assert row["runs"] == row["ref_runs"] == 2
    assert row["diff"] == pytest.approx(sum(sft_runs) / 2 - sum(ib_runs) / 2)
    assert row["ci_low"] < row["diff"] < row["ci_high"] < 0  # uni_sft below ibrl by ~25 points
    eu = runs[("held-out", "expected_utility")]["uni_sft"]  # agreement x own utility (.65 over agreed episodes)
    assert eu["diff"] == pytest.approx(row["diff"] * 0.65, abs=0.02)
    assert "## Primary statistics: training runs vs ibrl" in text and "**self-play expected utility**" in text
    lines = bench.goals(numbers, runs, verdicts)
    assert "best single-counterpart arm (uni_sft)" in lines[0]  # best held-out single-counterpart arm (.45)
    assert f"Holm p = {row['p_holm']:.3g}" in lines[0] and "Secondary, scenario-clustered GEE: Holm p = " in lines[0]
    assert ("**met**" in lines[0]) == (row["p_holm"] < 0.05)  # judged on the run-level test, whatever the GEE says
    gains = [(numbers["ibrl"]["held_out_by_seed"][k] - numbers["uni_sft"]["held_out_by_seed"][k]) * 100 for k in (0, 1)]
    assert f"Per seed: 0: {gains[0]:+.1f}, 1: {gains[1]:+.1f} points." in lines[0]
    assert 20 < gains[0] < 30 and 20 < gains[1] < 30  # .70 vs .45 on each seed
    assert "Self-play agreement, best single-counterpart arm (uni_bot)" in lines[1]  # .75 > .40
    assert "**not met**" in lines[1]  # +5 points < +10
    assert (results.parent / "mini_runs.png").stat().st_size > 1000  # the per-run figure
    assert "![held-out agreement per run](mini_runs.png)" in text
    assert "Rollout engine: no training run recorded in training" in text
    matrix = text.split("## Cross-play")[1].split("##")[0]
    diagonal = f"{numbers['ibrl']['self_play']:.2f}"
    assert f"| ibrl | {diagonal} | 0.5" in matrix or f"| ibrl | {diagonal} | 0.4" in matrix  # cross-play ≈ .5
    assert "![reward curves]" not in text  # no training runs under tmp_path: no figure claimed


def test_run_level_holm_is_within_table2_arms_and_within_ablations(bench, tmp_path):
    import pandas as pd

    from marti_ibrl.eval.stats import runs_vs_reference

    arms = ("ibrl", "uni_sft", "uni_bot", "joint_norm")
    assert bench.holm_families(arms[1:]) == [["uni_sft", "uni_bot"], ["joint_norm"]]
    assert bench.holm_families(["uni_pool"]) == [["uni_pool"]]  # no empty family
    rates = {"ibrl": (0.7, 0.85), "uni_sft": (0.4, 0.55), "uni_bot": (0.2, 0.45), "joint_norm": (0.65, 0.45)}
    for seed in (0, 1):
        for arm in arms:
            _keep_eval(tmp_path, seed, arm, {(arm, b, "held-out"): rates[arm][seed] for b in bench.HELDOUT_BOTS}, n=30)
    pairs = bench.load_results(tmp_path, (0, 1))
    _, verdicts = bench.run_level_tests(pairs, arms)
    got = verdicts[("held-out", "agreement")]
    rows = pd.DataFrame(bench.run_values(pairs, "held-out", "agreement", arms))
    table2 = runs_vs_reference(rows[rows["method"].isin(["ibrl", "uni_sft", "uni_bot"])], "ibrl")
    for r in table2.to_dict("records"):  # Holm over the two Table 2 arms only: the ablation is not in their family
        assert got[r["method"]]["p_holm"] == pytest.approx(r["p_holm"])
    assert got["joint_norm"]["p_holm"] == pytest.approx(got["joint_norm"]["p_value"])  # a family of one
    assert all(v["p_holm_all"] >= v["p_holm"] for v in got.values())  # the stricter, all-arm correction
    assert got["uni_sft"]["p_holm_all"] > got["uni_sft"]["p_holm"] or got["uni_sft"]["p_holm_all"] == 1.0


def test_t_interval_is_the_95_percent_student_interval(bench):
    mean, half = bench.t_interval([0.2, 0.4, 0.6])  # sd 0.2, t(0.975, 2) = 4.303
    assert mean == pytest.approx(0.4) and half == pytest.approx(4.3027 * 0.2 / 3**0.5, rel=1e-4)
    assert bench.t_interval([0.7]) == (0.7, None)  # one run: a point, no interval


def test_every_invocation_of_a_unit_is_in_the_attempts_ledger(bench, tmp_path):
    """A failed (or stopped) invocation's seconds are recorded as well as a finishing one's: killed and resumed units
    cost more than times.json holds."""
    import sys

    bench.record_attempt(tmp_path, "train ibrl/seed0", 30.0, "stopped")
    with pytest.raises(RuntimeError, match="failed"):
        bench._run([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "log", (tmp_path, "eval seed0/ibrl"))
    bench._run([sys.executable, "-c", "pass"], tmp_path / "log", (tmp_path, "eval seed0/ibrl"))
    rows = [json.loads(x) for x in (tmp_path / bench.ATTEMPTS).read_text().splitlines()]
    assert [(r["unit"], r["ended"]) for r in rows] == [
        ("train ibrl/seed0", "stopped"),
        ("eval seed0/ibrl", "failed"),
        ("eval seed0/ibrl", "ok"),
    ]
    tried, lost = bench.attempt_hours(tmp_path)
    assert tried >= lost >= 30 / 3600 and tried == pytest.approx(sum(r["seconds"] for r in rows) / 3600)


def _fake_run(ran: list):
    """Stands in for ``_run``: a training run writes its state and final policy, an evaluation its episodes."""

    def run(cmd, log, attempt=None):
        if cmd[3] == "train":
            path = Path(cmd[cmd.index("--ckpt.path") + 1])
            n = int(cmd[cmd.index("--train.iterations") + 1])
            (path / "agent1" / "hf").mkdir(parents=True)
            (path / "agent1" / "hf" / "config.json").write_text("{}")
            history = [{"iteration": i, "agent1/reward": i / n, "agent2/reward": None} for i in range(1, n + 1)]
            (path / "trainer_state.json").write_text(json.dumps({"iteration": n, "history": history}))
            (path / "topology.json").write_text(json.dumps({"trained": {"agent1": {"engine_kind": "hf"}}}))
            ran.append(f"train {path.parent.name}/{path.name}")
            return 600.0
        out = Path(cmd[cmd.index("--out") + 1])
        (out / "episodes").mkdir(parents=True, exist_ok=True)
        name = cmd[cmd.index("--policy") + 1].split("=")[0]
        episodes = _episodes(name, "heldout:hardliner", 3, 0.5, random.Random(0))
        episodes[0]["transcript"] = [{"role": "agent1", "text": "a long dialogue"}]
        (out / "episodes" / "x.jsonl").write_text("\n".join(json.dumps(e) for e in episodes) + "\n")
        pairs = [{"policy": name, "counterpart": "heldout:hardliner", "kind": "held-out", "file": "x.jsonl"}]
        (out / "pairs.json").write_text(json.dumps(pairs))
        ran.append(f"eval {out.parent.name}/{out.name}")
        return 60.0

    return run


def test_every_finished_unit_is_kept_and_a_new_machine_redoes_none_of_it(bench, tmp_path, monkeypatch):
    profile = bench.replace(bench.QUICK, seeds=(0, 1), arms=("ibrl", "uni_sft"), iterations=3)
    out, keep, sft = tmp_path / "out", tmp_path / "keep", str(tmp_path / "out" / "sft")
    table = bench.arms(sft, "conceder")
    ran = []
    monkeypatch.setattr(bench, "_run", _fake_run(ran))
    bench.run_seed(out, keep, profile, table, sft, 0)
    assert ran[:4] == ["train ibrl/seed0", "eval seed0/ibrl", "train uni_sft/seed0", "eval seed0/uni_sft"]
    assert ran[4:] == ["eval seed0/sft", "eval seed0/cross"]
    kept = json.loads(gzip.decompress((keep / "eval" / "seed0" / "ibrl.json.gz").read_bytes()))
    assert kept["command"].startswith("-m marti_ibrl.cli eval --seed 0") and str(out) not in kept["command"]
    assert "--policy ibrl={OUT}/runs/ibrl/seed0/agent1/hf" in kept["command"]
    (pair,) = kept["pairs"]
    assert len(pair["episodes"]) == 6 and "transcript" not in pair["episodes"][0]  # thin: no dialogue text
    assert pair["episodes"][0]["utilities"] and pair["kind"] == "held-out"
    record = json.loads((keep / "runs" / "ibrl" / "seed0.json").read_text())
    assert record["rewards"]["agent1/reward"] == [1 / 3, 2 / 3, 1.0] and record["engines"] == {"agent1": "hf"}

    # another clone, then a new machine with OUT gone (KEEP came with the repository): nothing kept runs again
    ran.clear()
    for elsewhere in (tmp_path / "clone", tmp_path / "new-machine"):
        if elsewhere.name == "clone":
            out.rename(elsewhere)
        moved_sft = str(elsewhere / "sft")
        bench.run_seed(elsewhere, keep, profile, bench.arms(moved_sft, "conceder"), moved_sft, 0)
        assert ran == []  # commands are compared with OUT and SFT as placeholders
    # seed 1: ibrl is trained and evaluated here, then this machine is lost before uni_sft
    bench.run_seed(out, keep, bench.replace(profile, arms=("ibrl",)), table, sft, 1)
    assert ran == ["train ibrl/seed1", "eval seed1/ibrl", "eval seed1/sft"]
    ran.clear()
    out = tmp_path / "third-machine"
    bench.run_seed(out, keep, profile, bench.arms(str(out / "sft"), "conceder"), str(out / "sft"), 1)
    assert ran == ["train uni_sft/seed1", "eval seed1/uni_sft"]  # ibrl seed 1's checkpoint is gone: no cross-play
    assert not (keep / "eval" / "seed1" / "cross.json.gz").exists()

    ledger = json.loads((keep / bench.TIMES).read_text())
    assert ledger["train ibrl/seed0"] == 600.0 and ledger["eval seed0/cross"] == 60.0
    line, listing = bench.compute_time(keep, profile)
    assert line.startswith(f"{(4 * 600 + 8 * 60) / 3600:.1f} h of compute")  # 4 runs, 4 + 2 sft + 1 cross evals
    assert "not recorded: sft, eval seed1/cross" in line
    assert "- eval seed0/cross: 60 s" in listing and "- eval seed1/cross: –" in listing
    pairs = bench.load_results(keep, profile.seeds)
    assert {(p["seed"], p["policy"]) for p in pairs} == {(s, a) for s in (0, 1) for a in ("ibrl", "uni_sft", "sft")}
    assert all(p["summary"]["averaged"]["n"] == 6 for p in pairs)
    assert bench.engine_note(keep, profile).startswith("Rollout engine: hf (4 trained roles)")

    # an evaluated run whose training record was lost (a .gitignore rule once dropped them): trained again, same
    # seed, for its curves; its kept evaluation stands
    (keep / "runs" / "uni_sft" / "seed1.json").unlink()
    ran.clear()
    out = tmp_path / "fourth-machine"
    bench.run_seed(out, keep, profile, bench.arms(str(out / "sft"), "conceder"), str(out / "sft"), 1)
    assert ran == ["train uni_sft/seed1"]
    assert json.loads((keep / "runs" / "uni_sft" / "seed1.json").read_text())["iterations"] == 3


def test_the_sft_init_is_kept_and_taken_from_the_keep(bench, tmp_path):
    env = bench.recipe_env()
    data_env = {k: env[k] for k in RENDERING_KEYS}
    sft, keep = tmp_path / "sft", tmp_path / "keep"
    sft.mkdir()
    (sft / "model.safetensors").write_bytes(b"weights")
    (sft / "ds_state").mkdir()  # not a model file: not kept
    (sft / "sft.log").write_text("the training log: not kept")
    record = {"env": data_env, "dialogues": bench.QUICK.sft_dialogues, "epochs": bench.QUICK.sft_epochs}
    (sft / bench.SFT_RECORD).write_text(json.dumps(record))
    assert bench.stage_sft(sft, bench.QUICK, keep) == record
    assert sorted(f.name for f in (keep / "sft").iterdir()) == [bench.SFT_RECORD, "model.safetensors"]
    fresh = tmp_path / "new-machine" / "sft"
    assert bench.stage_sft(fresh, bench.QUICK, keep) == record  # copied, not trained
    assert (fresh / "model.safetensors").read_bytes() == b"weights"


def test_goal_not_met_when_ibrl_is_worse(bench):
    numbers = {
        "ibrl": {"held_out": 0.40, "self_play": 0.5, "in_system": 0.9, "delta": 0.5},
        "uni_bot": {"held_out": 0.42, "self_play": 0.45, "in_system": 0.95, "delta": 0.53},
    }
    verdicts = {"held-out": {"uni_bot": {"p_holm": 0.5}}}
    lines = bench.goals(numbers, verdicts)
    assert "-2.0 points" in lines[0] and "not met" in lines[0]
    assert "+5.0 points" in lines[1] and "not met" in lines[1]


def test_recipe_env_reaches_eval_and_a_stale_sft_init_is_refused(bench, tmp_path):
    from marti_ibrl.cli import build_parser

    env = bench.recipe_env()
    assert env["show_complement"] is True and env["bot_speech"] == "markers"
    main_cmd = bench.eval_command(tmp_path, bench.QUICK, bench.arms("sft", "fair"), "sft", 0, "ibrl")
    args = build_parser().parse_args(main_cmd[3:])
    assert args.show_complement and args.bot_speech == "markers" and args.prompt_style == env["prompt_style"]
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "mini_table2_sft.json").write_text(json.dumps({"env": {**env, "show_complement": False}}))
    with pytest.raises(SystemExit, match="pass a new --sft-dir"):
        bench.stage_sft(sft, bench.QUICK)


def test_ablations_train_on_their_own_seeds_and_each_seed_evaluates_its_arms(bench, tmp_path):
    profile = bench.FULL
    assert profile.seeds == (0, 1, 2, 3, 4) and profile.ablation_seeds == (0, 1, 2)
    assert bench.arms_of(profile, 2) == profile.arms
    assert bench.arms_of(profile, 4) == ("ibrl", "uni_sft", "uni_bot", "uni_pool")
    cross = bench.cross_command(tmp_path, profile, 4)
    named = [cross[i + 1].split("=")[0] for i, x in enumerate(cross) if x == "--policy"]
    assert named == ["ibrl", "uni_sft", "uni_bot", "uni_pool"]
    line, _ = bench.compute_time(tmp_path, profile)
    assert "(SFT, 29 training runs and the evaluations" in line  # 4 arms x 5 seeds + 3 ablations x 3 seeds


def test_git_tracks_every_kind_of_kept_record(bench):
    """What the full run keeps is committed with the repository (a new machine has nothing else): no ignore rule may
    swallow a kept file (a bare ``runs/`` rule once ignored ``KEEP/runs/ARM/seedS.json``, the reward curves)."""
    import subprocess

    root = Path(bench.ROOT)
    keep = Path(bench.KEEP).relative_to(root)
    kinds = [keep / bench.TIMES, keep / "sft" / "model.safetensors", keep / "runs" / "ibrl" / "seed0.json"]
    kinds += [keep / "eval" / "seed0" / "ibrl.json.gz"]
    check = subprocess.run(["git", "check-ignore", *map(str, kinds)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 1 and not check.stdout, f"ignored by git: {check.stdout}"  # 1: none is ignored
