"""Examples are real: the fairness reward plugs in through the same loader the trainer uses; the custom price
negotiation environment plays by its rules and trains for one IB-RL iteration through the same trainer."""

import sys
import zlib
from pathlib import Path

import pytest

from marti_ibrl.envs.base import Outcome
from marti_ibrl.rewards import load_reward_fn
from marti_ibrl.rollout.dialogue import Trajectory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_fair_reward_example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    fn = load_reward_fn("fair_reward:fair_share")
    traj = Trajectory("s1", None, ["agent1", "agent2"], {"agent1": "current", "agent2": "current"})
    traj.outcome = Outcome(agreed=True, malformed=False, utilities={"agent1": 8.0, "agent2": 2.0})
    assert fn(traj, "agent1", None) == 8.0 - 0.5 * 6.0
    assert fn(traj, "agent2", None) == 2.0 - 0.5 * 6.0
    traj.outcome = Outcome(agreed=False, malformed=False, utilities={"agent1": 0.0, "agent2": 0.0})
    assert fn(traj, "agent1", None) == 0.0
    sys.modules.pop("fair_reward", None)


def test_the_custom_reward_of_training_md_runs_on_any_games_roles():
    """Issue 65: docs/training.md's example hard-coded DoND's role names (a KeyError: 'agent1' on another game)."""
    import re

    text = (ROOT / "docs" / "training.md").read_text()
    section = text[text.index("## Custom rewards") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    space: dict = {}
    exec(compile(code, "docs/training.md", "exec"), space)
    for roles in (("agent1", "agent2"), ("proposer", "responder"), ("a", "b", "c")):
        traj = Trajectory("s1", None, list(roles), {r: "current" for r in roles})
        utilities = {r: float(i + 1) for i, r in enumerate(roles)}
        traj.outcome = Outcome(agreed=True, malformed=False, utilities=utilities)
        got = space["fair_share"](traj, roles[0], None)
        others = list(utilities.values())[1:]
        assert got == 1.0 - 0.5 * abs(1.0 - sum(others) / len(others)), roles


# -- examples/price_negotiation.py: a custom two-role environment through --env.name module:Class ------------------


@pytest.fixture
def price_env(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from marti_ibrl.config import EnvConfig
    from marti_ibrl.envs import make_env

    yield make_env(EnvConfig(name="price_negotiation:PriceNegotiation", max_rounds=2, num_scenarios=5), seed=3)
    sys.modules.pop("price_negotiation", None)


def _play(env, scenario, seats, texts):
    state = env.new_state(scenario, seats)
    results = []
    for text in texts:
        role = env.current_role(state)
        results.append(env.step(state, role, text))
        if not results[-1].valid:
            env.finish_malformed(state, role)
    return state, results


def test_price_negotiation_rules_and_rewards(price_env):
    env, scenarios = price_env
    assert env.roles == ("buyer", "seller") and len(scenarios) == 5 and scenarios[0][0] == "item-3-0"
    item = scenarios[0][1]
    assert f"worth {item.value}" in env.system_prompt(item, "buyer") and str(item.value) not in env.system_prompt(
        item, "seller"
    ).replace(str(item.cost), "")
    state, results = _play(env, item, ("seller", "buyer"), ["I want 90. OFFER 90", "Too much. OFFER 40", "ACCEPT"])
    assert [r.valid for r in results] == [True, True, True] and state.done and state.price == 40
    scale = max(item.value, item.cost)
    assert env.reward(state, "buyer") == pytest.approx((item.value - 40) / scale)
    assert env.reward(state, "seller") == pytest.approx((40 - item.cost) / scale)
    # accepting with nothing on the table, or no action, is malformed: the speaker pays the penalty
    state, results = _play(env, item, ("buyer", "seller"), ["ACCEPT"])
    assert not results[0].valid and state.fault_role == "buyer"
    assert env.reward(state, "buyer") == -1.0 and env.reward(state, "seller") == 0.0
    state, _ = _play(env, item, ("buyer", "seller"), ["OFFER 10", "OFFER 99", "OFFER 20", "OFFER 90"])
    assert state.done and state.reason == "turn limit" and not env.outcome(state).agreed


def test_custom_env_errors_name_the_flag(tmp_path, monkeypatch):
    from marti_ibrl.config import ConfigError, load_config

    (tmp_path / "broken_envs.py").write_text("class NoRoles:\n    pass\n\nclass Partial:\n    roles = ('a', 'b')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "no_such_module:Env": "No module named 'no_such_module'",
        "broken_envs:NoRoles": "needs a class attribute `roles`",
        "broken_envs:Partial": "missing methods system_prompt, new_state",
        "broken_envs:Missing": "has no attribute 'Missing'",
    }
    for name, why in cases.items():
        with pytest.raises(ConfigError) as err:
            load_config(["--env.name", name, "--role1.pretrain", str(tmp_path), "--role2.pretrain", str(tmp_path)])
        assert str(err.value).startswith("--env.name: ") and why in str(err.value), str(err.value)
    sys.modules.pop("broken_envs", None)


@pytest.mark.slow
def test_price_negotiation_trains_one_iteration(tmp_path, monkeypatch):
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.tiny import build_tiny_model
    from marti_ibrl.trainer import IBRLTrainer

    monkeypatch.syspath_prepend(str(EXAMPLES))
    from price_negotiation import PROMPTS, RULES

    corpus = [
        p.format(item=i, value=v, cost=v) + RULES for p in PROMPTS.values() for i in ("bike", "lamp") for v in (9, 42)
    ]
    corpus += [f"I can do {p}. OFFER {p}" for p in range(0, 120, 7)] + ["ACCEPT", "Deal. ACCEPT", "No. WALK"]
    model = build_tiny_model(tmp_path / "tiny", corpus, vocab_size=400)
    cfg = load_config(
        [
            *("--env.name", "price_negotiation:PriceNegotiation", "--env.max_rounds", "2", "--env.num_scenarios", "8"),
            *("--role1.pretrain", model, "--role2.pretrain", model, "--role1.reward_fn", "test_examples:text_hash"),
            *("--role2.reward_fn", "test_examples:text_hash", "--role1.kl_coef", "0", "--role2.kl_coef", "0"),
            *("--pool.probs", "[1.0,0,0]"),  # no reference models, no pool engines: fewer processes to start
            # G = 4: openers alternate within a group, so each role opens (and surely acts) in two of its four calls
            *("--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "4", "--rollout.max_new_tokens", "8"),
            *("--rollout.max_len", "256", "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2"),
            *("--train.iterations", "1", "--ckpt.path", str(tmp_path / "run")),
        ]
    )
    history = IBRLTrainer(cfg).fit()
    ray.shutdown()
    m = history[0]
    assert m["buyer/updated"] == 1.0 and m["seller/updated"] == 1.0
    assert m["buyer/adv_abs_mean"] > 0 and m["seller/adv_abs_mean"] > 0
    assert m["buyer/groups"] == m["buyer/informative_groups"] == 1.0  # one scenario; text_hash tells texts apart
    assert (tmp_path / "run" / "buyer" / "ckpt").is_dir() and (tmp_path / "run" / "seller" / "ckpt").is_dir()

    # ... and is evaluated with the project's command: each policy in the role it trained, against the other
    from marti_ibrl.cli import main

    run, out = tmp_path / "run", tmp_path / "eval"
    argv = ["eval", "--run", str(run), "--policy", f"buyer={run}/buyer/hf", "--policy", f"seller={run}/seller/hf"]
    assert main([*argv, "--cross-play", "-n", "3", "--engine", "hf", "--out", str(out)]) == 0
    ray.shutdown()
    import json

    pairs = {(p["policy"], p["counterpart"]): p for p in json.loads((out / "summary.json").read_text())}
    assert set(pairs) == {("buyer", "policy:seller"), ("seller", "policy:buyer")}
    buyer = pairs["buyer", "policy:seller"]["summary"]["roles"]
    assert list(buyer) == ["buyer"] and buyer["buyer"]["n"] == 3  # each of the 3 scenarios once, as the buyer
    seller = pairs["seller", "policy:buyer"]["summary"]["roles"]["seller"]
    # the seller's games are the buyer's seen from the other seat (mirrored, not played again): the same rewards
    assert seller["reward"] == pytest.approx(buyer["buyer"]["counterpart_reward"])
    assert "| buyer | buyer |" in (out / "tables.md").read_text()
    sys.modules.pop("price_negotiation", None)


def text_hash(trajectory, role, scenario) -> float:
    """A toy reward in [0, 1) that differs between any two different texts of the role (an untrained model's turns
    are all malformed, so the rule reward would tie every rollout and give zero advantages)."""
    return zlib.crc32("".join(t.text for t in trajectory.turns if t.role == role).encode()) / 2**32


def test_eval_against_endpoint_example_command(tmp_path, monkeypatch, capsys):
    """The command it builds (run against a real local endpoint in test_eval_cli); a bad checkpoint fails fast."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from eval_against_endpoint import eval_argv, main

    argv = eval_argv("ckpt", "m@http://h/v1#K", "out", 5, extra=["--max-rounds", "2"])
    assert argv == ["eval", "--policy", "policy=ckpt", "--counterpart", "heldout:hardliner", "--counterpart",
                    "ep=endpoint:m@http://h/v1#K", "--self-play", "-n", "5", "--max-rounds", "2", "--out", "out"]  # fmt: skip
    code = main(["--checkpoint", str(tmp_path / "nope"), "--endpoint", "m@http://127.0.0.1:9/v1", "--out",
                 str(tmp_path / "o"), "-n", "2", "--", "--max-rounds", "2"])  # fmt: skip
    assert code == 2 and "nope" in capsys.readouterr().err
    sys.modules.pop("eval_against_endpoint", None)


# -- examples/python_api.py: the documented Python API (docs/python-api.md) -------------------------------------------


@pytest.mark.slow
def test_the_python_api_example_trains_and_reports(tmp_path):
    import subprocess

    root = EXAMPLES.parent
    cmd = [sys.executable, str(EXAMPLES / "python_api.py"), "--model", str(root / "recipes" / "dond" / "tiny-sft")]
    done = subprocess.run([*cmd, "--out", str(tmp_path / "run"), "--iterations", "2"], cwd=root, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "roles ['agent1', 'agent2'], lr [0.001, 0.001], seed 42" in lines
    assert [line.split(":")[0] for line in lines if line.startswith("iteration ")] == ["iteration 1", "iteration 2"]
    assert lines[-1].startswith("first 1 -> last 1 iterations: agreement ")
    assert (tmp_path / "run" / "trainer_state.json").exists()
    bad = subprocess.run([*cmd, "--out", str(tmp_path / "run"), "--iterations", "0"], cwd=root, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1].startswith("python_api: --train.iterations")


# -- examples/split_coins.py: docs/environments.md's minimal game, trained, evaluated and diagnosed ------------------


@pytest.mark.slow
def test_split_coins_trains_then_is_evaluated_and_diagnosed(tmp_path, monkeypatch, capsys):
    """The new-game path of docs/environments.md, end to end with the project's commands: ``model tiny`` (a base model
    with the game's own tokenizer), ``sft`` by its default settings (a warm start from the scripted players' dialogues
    that plays >= 90% valid turns), ``train`` from ``recipes/any/tiny-cpu.yaml`` (2 iterations, a checkpoint after
    each), ``eval --run`` (each policy in its role, against the other), ``diagnose`` (each checkpoint against the other
    role's start and its same-step partner), ``show`` and ``report``; ``report`` with the game off the path is one
    line (issue 65)."""
    import json

    import ray

    from marti_ibrl.cli import main

    monkeypatch.syspath_prepend(str(EXAMPLES))
    here = Path(__file__).resolve().parent  # this module (its reward function) and the tests' helpers, for workers too
    monkeypatch.setenv("PYTHONPATH", f"{EXAMPLES}:{here}:{here.parent}")  # as a user runs it
    base = str(tmp_path / "tiny")  # a base model for the game (docs/environments.md: `model tiny`)
    assert main(["model", "tiny", "--env", "split_coins:SplitCoins", "--out", base, "--dialogues", "96"]) == 0
    model = str(tmp_path / "sft")  # the warm start from the game's scripted players, by default settings
    sft = ["sft", "--env", "split_coins:SplitCoins", "--pretrain", base, "--out", model, "--dialogues", "1000"]
    assert main(sft) == 0
    made = json.loads((tmp_path / "sft" / "sft_record.json").read_text())
    assert made["records"] == 2 * 1000 and made["settings"]["players"] == ["fair", "stingy"]
    assert made["settings"]["sft"]["lr"] == 7e-3  # a tiny model's default
    assert made["loss"][1] < made["loss"][0] and made["valid_turns"]["sft"] >= 0.9 > made["valid_turns"]["base"], made
    run = tmp_path / "run"
    train = [
        *("train", "--config", str(EXAMPLES.parent / "recipes" / "any" / "tiny-cpu.yaml")),  # the any-game recipe
        *("--env.name", "split_coins:SplitCoins", "--role1.pretrain", model, "--role2.pretrain", model),
        *("--role1.reward_fn", "test_examples:text_hash", "--role2.reward_fn", "test_examples:text_hash"),
        *("--role1.kl_coef", "0", "--role2.kl_coef", "0", "--pool.probs", "[1.0,0,0]"),
        *("--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "6"),
        *("--rollout.max_len", "256", "--rollout.micro_batch_size", "4", "--train.micro_batch_size", "4"),
        *("--train.iterations", "2", "--ckpt.save_steps", "1", "--ckpt.path", str(run)),
    ]
    assert main(train) == 0
    ray.shutdown()
    out = run / "eval"
    evaluate = ["eval", "--run", str(run), "--policy", f"p={run}/proposer/hf", "--policy", f"r={run}/responder/hf"]
    capsys.readouterr()
    assert main([*evaluate, "--cross-play", "-n", "4", "--engine", "hf", "--out", str(out)]) == 0
    ray.shutdown()
    assert f"report: {run / 'report.md'} updated with the evaluation" in capsys.readouterr().out
    assert "| p | proposer |" in (run / "report.md").read_text().split("## Evaluation")[1]  # no `report` needed
    pairs = {(p["policy"], p["counterpart"]): p["summary"] for p in json.loads((out / "summary.json").read_text())}
    assert set(pairs) == {("p", "policy:r"), ("r", "policy:p")}
    proposer = pairs["p", "policy:r"]["roles"]
    assert list(proposer) == ["proposer"] and proposer["proposer"]["n"] == 4
    ends = proposer["proposer"]["reasons"]
    assert sum(ends.values()) == 4 and set(ends) <= {"accept", "reject", "malformed"}, ends  # SplitCoins.step's reasons
    responder = pairs["r", "policy:p"]["roles"]["responder"]
    assert responder["reward"] == pytest.approx(proposer["proposer"]["counterpart_reward"])  # the same games
    assert "| p | proposer |" in (out / "tables.md").read_text()

    assert main(["diagnose", str(run), "--role", "proposer", "-n", "3"]) == 0
    ray.shutdown()
    assert "updated with the diagnostics of proposer" in capsys.readouterr().out
    points = json.loads((run / "diagnostics" / "proposer.json").read_text())["points"]
    assert [p["checkpoint"] for p in points] == [1, 2] and all(p["n"] == 3 for p in points)
    assert all(0.0 <= p["fixed"] <= 1.0 and 0.0 <= p["in_system"] <= 1.0 for p in points)
    capsys.readouterr()
    assert main(["show", str(run)]) == 0
    assert "proposer" in capsys.readouterr().out
    assert main(["report", str(run)]) == 0  # training, what they said, the diagnostics, the rewards tables
    report = (run / "report.md").read_text()
    assert report.index("## Training") < report.index("## What they said") < report.index("## Evaluation")
    assert "| p | proposer |" in report.split("## Evaluation")[1]
    sys.modules.pop("split_coins", None)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(EXAMPLES)])  # the game off the path
    capsys.readouterr()
    assert main(["report", str(run)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the run's environment split_coins:SplitCoins does not load here" in err[0], err
    assert "PYTHONPATH" in err[0] and (run / "report.md").read_text() == report  # nothing overwritten


def test_environments_page_shows_the_minimal_game_as_it_is_and_short():
    """docs/environments.md's example is examples/split_coins.py verbatim (the file the slow test trains), <= 60 lines."""
    code = (EXAMPLES / "split_coins.py").read_text()
    page = (EXAMPLES.parent / "docs" / "environments.md").read_text()
    shown = page.split("## The smallest game", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert shown == code and len(code.splitlines()) <= 60
