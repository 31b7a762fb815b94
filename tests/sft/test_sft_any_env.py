"""A warm start for any game (issue 52, item 4): an environment's scripted players' dialogues as SFT records
(``marti_ibrl.sft.data.scripted_records``) and ``marti-ibrl sft --env``'s refusals, each one line before any training.
Training itself: tests/package/test_examples.py::test_split_coins_trains_then_is_evaluated_and_diagnosed (slow)."""

import json
import random
import re
import sys
from pathlib import Path

import pytest

from marti_ibrl.cli import main
from marti_ibrl.config import EnvConfig
from marti_ibrl.envs import make_env
from marti_ibrl.sft.data import scripted_dialogue, scripted_records

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def coins(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield make_env(EnvConfig(name="split_coins:SplitCoins"), seed=0)
    sys.modules.pop("split_coins", None)


def test_every_combination_of_players_plays_in_the_envs_fixed_seats(coins) -> None:
    env, scenarios = coins
    pots = [pot for _, pot in scenarios[:8]]
    records = scripted_records(env, pots, env.scripted_players(), seed=0)
    assert len(records) == 16  # both roles speak in every dialogue
    said = [(r["messages"][0]["content"], [m["content"] for m in r["messages"][1:]]) for r in records]
    # dialogue i: (proposer, responder) = combination i mod 4 of (fair, stingy); records in env.roles order
    expected = []
    for i, pot in enumerate(pots):
        proposer, responder = [("fair", "fair"), ("fair", "stingy"), ("stingy", "fair"), ("stingy", "stingy")][i % 4]
        offer = f"OFFER {pot // 2}" if proposer == "fair" else "OFFER 1"
        answer = "ACCEPT" if responder == "fair" else "REJECT"
        expected += [[offer], [offer, answer]]
    assert [turns for _, turns in said] == expected
    assert all("You are the proposer" in p for p, _ in said[::2]) and all("responder" in p for p, _ in said[1::2])
    assert records == scripted_records(env, pots, env.scripted_players(), seed=0)  # deterministic


def test_a_scripted_player_that_breaks_the_rules_is_named(coins) -> None:
    env, scenarios = coins
    players = {"proposer": lambda pot, role, history, rng: "OFFER 999", "responder": env.scripted_players()["fair"]}
    with pytest.raises(RuntimeError, match="the scripted proposer made a turn the environment refuses"):
        scripted_dialogue(env, scenarios[0][1], players, env.roles, random.Random(0))


def test_rotating_seats_when_the_env_fixes_none() -> None:
    from marti_ibrl.envs.dond import TRAINING_BOTS, DondEnv, generate_scenarios
    from marti_ibrl.envs.dond.bots import scripted_players

    env = DondEnv(max_rounds=5, prompt_style="compact", bot_speech="markers")
    players = {n: p for n, p in scripted_players(env).items() if n in ("fair", "greedy")}
    assert sorted(scripted_players(env)) == sorted(TRAINING_BOTS)
    records = scripted_records(env, generate_scenarios(8, 1), players, seed=0)
    openers = [r["messages"][1]["role"] for r in records[::2]]  # agent1's record: does it open (assistant first)?
    assert openers == ["assistant", "user"] * 2 + ["user", "assistant"] * 2  # flips each dialogue, shifts per cycle


def _sft(tmp_path, *argv):
    from marti_ibrl.tiny import build_tiny_model

    model = tmp_path / "tiny"
    if not model.exists():
        build_tiny_model(model, ["OFFER 1 ACCEPT REJECT"], vocab_size=300)
    return main(["sft", "--pretrain", str(model), "--out", str(tmp_path / "sft"), *argv])


def _one_line(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.strip().splitlines() if "model shards" not in line]


def test_sft_refuses_bad_input_in_one_line_before_training(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    trained: list = []
    monkeypatch.setattr("marti_ibrl.sft.make.run_sft", lambda *a, **k: trained.append(a))
    cases = [
        (("--env", "price_negotiation:PriceNegotiation"), "has no scripted players to learn from"),
        (("--env", "split_coins:SplitCoins", "--players", "fair", "kind"), "no scripted player 'kind'; it has fair"),
        (("--env", "split_coins:SplitCoins", "--role1.lr", "1e-3"), "--role1.lr: only --env.KEY VALUE flags"),
        (("--env", "split_coins:SplitCoins", "--env.max_rounds", "x"), "--env.max_rounds"),
        (("--env", "nosuchmodule:Game"), "nosuchmodule"),
        (("--env", "dond", "--batch-size", "6", "--micro-batch-size", "4"), "not a multiple of --micro-batch-size"),
        (("--env", "dond", "--transcripts", "calls.jsonl"), "give one or the other"),
        (("--env", "split_coins:SplitCoins", "--max-len", "40"), "SFT records are longer than --max-len 40 tokens"),
        ((), "--env NAME is required"),
    ]
    for argv, why in cases:
        assert _sft(tmp_path, *argv) == 2, argv
        err = _one_line(capsys)
        assert len(err) == 1 and err[0].startswith("marti-ibrl sft: error: ") and why in err[0], (argv, err)
    assert main(["sft", "--env", "dond", "--pretrain", str(tmp_path / "none"), "--out", str(tmp_path / "sft")]) == 2
    assert "--pretrain " + str(tmp_path / "none") + ": not a Hugging Face model directory" in capsys.readouterr().err
    assert not trained and not (tmp_path / "sft").exists()
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.json").write_text("{}")
    assert _sft(tmp_path, "--env", "split_coins:SplitCoins") == 2
    assert "already holds a model" in capsys.readouterr().err
    assert json.loads((tmp_path / "sft" / "config.json").read_text()) == {}  # untouched
    sys.modules.pop("split_coins", None)


def test_records_longer_than_max_len_are_counted_with_the_longest_named(tmp_path, monkeypatch, capsys) -> None:
    """OpenRLHF's SFT drops or cuts a record over ``--max-len`` without a word (issue 65: every record of a TextArena
    game dropped, then OpenRLHF's own error about gradient-accumulation windows): refused before training instead."""
    from marti_ibrl.sft.make import too_long

    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr("marti_ibrl.sft.make.run_sft", lambda *a, **k: pytest.fail("trained"))
    model = tmp_path / "tiny"
    from marti_ibrl.tiny import build_tiny_model

    build_tiny_model(model, ["OFFER 1 ACCEPT REJECT"], vocab_size=300)
    env, scenarios = make_env(EnvConfig(name="split_coins:SplitCoins"), seed=0)
    records = scripted_records(env, [pot for _, pot in scenarios[:4]], env.scripted_players(), seed=0)
    long, longest = too_long(str(model), records, 10**6)
    assert long == 0 and longest > 40
    assert too_long(str(model), records, longest) == (0, longest)
    assert too_long(str(model), records, longest - 1)[0] >= 1
    assert _sft(tmp_path, "--env", "split_coins:SplitCoins", "--dialogues", "4", "--max-len", str(longest - 1)) == 2
    err = _one_line(capsys)
    assert len(err) == 1 and f"longer than --max-len {longest - 1} tokens" in err[0], err
    assert int(re.search(r"give --max-len (\d+) or more", err[0]).group(1)) >= longest  # (the CLI's own dialogues)
    assert not (tmp_path / "sft" / "sft_data.jsonl").exists()  # refused before anything was written
    sys.modules.pop("split_coins", None)


def test_a_warm_start_under_min_valid_fails_in_one_line_and_is_kept(tmp_path, monkeypatch, capsys) -> None:
    """A run of SFT that ends but learned nothing usable (issue 65: "exit 0, valid self-played turns 0% before, 0%
    after") exits 1 naming what to change; what it made stays where it is."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    made = {"valid_turns": {"base": 0.0, "sft": 0.12}}
    monkeypatch.setattr("marti_ibrl.sft.make.warm_start", lambda *a, **k: made)
    assert _sft(tmp_path, "--env", "split_coins:SplitCoins") == 1
    err = _one_line(capsys)
    assert len(err) == 1 and err[0].startswith(
        "marti-ibrl sft: error: the warm start plays 12% valid turns in self-play, under --min-valid 50%"
    ), err
    assert "--lr" in err[0] and str(tmp_path / "sft") in err[0]
    assert _sft(tmp_path, "--env", "split_coins:SplitCoins", "--min-valid", "0.1") == 0
    made["valid_turns"]["sft"] = 0.5
    assert _sft(tmp_path, "--env", "split_coins:SplitCoins") == 0  # the threshold itself passes
    sys.modules.pop("split_coins", None)


def test_a_check_the_base_model_already_passes_is_said_to_say_little(tmp_path, monkeypatch, capsys) -> None:
    """Issue 65: "100% valid before" for a game that accepts any text (TextArena's SimpleNegotiation) read as if the
    warm start were checked; now the line says the check says little there, and only there."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr("marti_ibrl.sft.make.run_sft", lambda *a, **k: None)
    monkeypatch.setattr("marti_ibrl.sft.make.sft_loss_curve", lambda out: [])
    rates = iter([1.0, 1.0, 0.0, 1.0])  # base, after; then a strict game's base, after
    monkeypatch.setattr("marti_ibrl.sft.make.valid_turns", lambda *a, **k: {"valid": next(rates), "ended": 1.0})
    assert _sft(tmp_path, "--env", "split_coins:SplitCoins", "--dialogues", "4") == 0
    said = capsys.readouterr().out
    assert "100% before, 100% after" in said and "the base already played 100%: split_coins:SplitCoins accepts" in said
    (tmp_path / "sft" / "sft_record.json").unlink()
    (tmp_path / "sft" / "sft_data.jsonl").unlink()
    assert _sft(tmp_path, "--env", "split_coins:SplitCoins", "--dialogues", "4") == 0
    said = capsys.readouterr().out
    assert "0% before, 100% after" in said and "says little" not in said
    sys.modules.pop("split_coins", None)
