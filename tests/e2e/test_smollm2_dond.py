"""benchmarks/smollm2_dond.py without a model: its commands parse as `train`/`eval` parse them, its run checks read
the sync digests right, and its report renders from a kept record."""

from __future__ import annotations

import json

import pytest
from bench_loader import benchmark_fixture
from fake_model import fake_checkpoint

from marti_ibrl.config import load_config

bench = benchmark_fixture("smollm2_dond")


def test_train_command_is_the_recipe_resumable_and_sync_checked(bench, tmp_path):
    sft = fake_checkpoint(tmp_path / "sft")
    cmd = bench.train_command(tmp_path, bench.FULL, str(sft))
    assert cmd[2:5] == ["marti_ibrl.cli", "train", "--config"]
    cfg = load_config(cmd[4:])  # exactly what `marti-ibrl train` does with these flags
    assert cfg.train.iterations == 20 and cfg.train.check_sync and cfg.ckpt.load_enable
    assert cfg.ckpt.save_steps == bench.SAVE_STEPS == 4  # committed every 4 iterations: a killed run resumes there
    assert cfg.rollout.engine == "vllm" and cfg.env.bot_speech == "natural" and cfg.env.prompt_style == "compact"
    assert [r.pretrain for r in cfg.roles] == [str(sft), str(sft)]  # both roles from one checkpoint, two stacks
    assert [r.update_every for r in cfg.roles] == [1, 2] and cfg.pool.probs == [0.7, 0.2, 0.1]


def test_eval_commands_play_self_the_heldout_bots_and_in_system(bench, tmp_path):
    from marti_ibrl.cli import build_parser
    from marti_ibrl.eval.dond.command import plan

    for name in ("sft", "agent1", "agent2"):
        (tmp_path / name).mkdir()
    cmd = bench.eval_command(tmp_path, bench.FULL, "sft", str(tmp_path / "sft"), None)
    args = build_parser().parse_args(cmd[3:])
    assert (args.engine, args.num_scenarios, args.show_complement, args.max_rounds) == ("vllm", 40, True, 4)
    _, pairs = plan(args)
    assert sorted((c.name, kind) for _, c, kind in pairs) == sorted(
        [("self", "self-play")] + [(b, "held-out") for b in bench.HELDOUT]
    )
    cmd = bench.eval_command(
        tmp_path, bench.QUICK, "ibrl", str(tmp_path / "agent1"), f"checkpoint:{tmp_path / 'agent2'}"
    )
    _, pairs = plan(build_parser().parse_args(cmd[3:]))
    assert ("in-system", "in-system") in {(c.name, kind) for _, c, kind in pairs}


def _sync(run, lines):
    (run / "sync_checks.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _history(run, rows):
    (run / "trainer_state.json").write_text(json.dumps({"iteration": len(rows), "history": rows}))


def test_run_checks(bench, tmp_path):
    rows = [
        {"iteration": 1, "agent1/updated": 1.0, "agent1/adv_abs_mean": 0.0, "agent2/updated": 0.0},
        {"iteration": 2, "agent1/updated": 1.0, "agent1/adv_abs_mean": 0.7, "agent2/updated": 1.0},
    ]
    _history(tmp_path, rows)
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    _sync(tmp_path, [
        {"iteration": 0, "role": "agent1", "actor": a, "engines": [a]},
        {"iteration": 0, "role": "agent2", "actor": a, "engines": [a]},
        {"iteration": 1, "role": "agent1", "actor": a, "engines": [a]},
        {"iteration": 2, "role": "agent1", "actor": b, "engines": [b]},
        {"iteration": 2, "role": "agent2", "actor": a, "engines": [c]},  # (the run would have stopped here)
    ])  # fmt: skip
    checks = bench.run_checks(tmp_path)
    assert checks["agent1"] == {
        "updated": 2,
        "with_signal": 1,
        "weights_changed": True,
        "engines_synced": 3,
        "checks": 3,
    }
    assert checks["agent2"] == {
        "updated": 1,
        "with_signal": 0,
        "weights_changed": False,
        "engines_synced": 1,
        "checks": 2,
    }
    rows[1]["agent2/adv_abs_mean"] = 0.2  # a role that learned something, and its weights stayed: an error
    _history(tmp_path, rows)
    with pytest.raises(RuntimeError, match="agent2 updated with non-zero advantages but its weights did not change"):
        bench.run_checks(tmp_path)


def test_report_renders_from_the_kept_record(bench, tmp_path):
    pair = lambda kind, c, agree: {  # noqa: E731
        "kind": kind, "counterpart": c,
        "summary": {"averaged": {"agreement": agree, "own_utility": 0.5, "malformed": 0.1, "expected_utility": agree / 2}},
    }  # fmt: skip
    summary = {
        "pairs": [pair("self-play", "self", 0.4)] + [pair("held-out", f"heldout:{b}", 0.2) for b in bench.HELDOUT]
    }
    data = {
        "args": "--out runs/x",
        "date": "2026-12-02",
        "profile": {"iterations": 3, "eval_scenarios": 40},
        "ledger": {"sft": 600.0, "train": 1200.0},
        "validity": {"sft": {"protocol": 0.5, "truncated": 0.1, "n": 40}},
        "eval": {"sft": summary},
        "curves": {
            "iteration": [1, 2, 3],
            "agent1/reward": [0.1, None, 0.3],
            "rollout/agreement": [0.0, 0.5, 1.0],
            "rollout/malformed": [0.2, 0.1, 0.0],
        },  # fmt: skip
        "checks": {
            "agent1": {"updated": 3, "with_signal": 2, "weights_changed": True, "engines_synced": 4, "checks": 4}
        },
    }
    results = tmp_path / "r.md"
    bench.report(results, data)
    text = results.read_text()
    assert "Compute: **30.0 min** in all" in text
    assert "| sft | 50.0% | 10.0% | 40 |" in text
    assert "| sft | – | 0.40 / 0.50 / 0.10 | 0.20 / 0.50 / 0.10 |" in text
    assert "agent1/reward 0.200 → 0.200" in text and "rollout/agreement 0.500 → 0.500" in text
    assert results.with_suffix(".png").stat().st_size > 10_000
    (tmp_path / "r.json").write_text(json.dumps({**data, "notes": "Read this."}))
    bench.report(results)  # --report-only: from the .json, notes kept
    assert "Read this." in results.read_text()
