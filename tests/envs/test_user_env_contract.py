"""An environment of your own that breaks its contract fails as your code (issue 63): one line naming
``module:Class``, the method, the exception and where in your file, before Ray where the check can be made there
(construction, scenarios, the first scenario's opening and one ``step``), and during training a raising ``step``
stops the run (``--env.step_errors stop``) instead of being scored as the policy's malformed turn."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from marti_ibrl.cli import main
from marti_ibrl.config.schema import EnvConfig
from marti_ibrl.envs import make_env
from marti_ibrl.envs.base import TurnResult
from marti_ibrl.envs.custom import CheckedEnv, UserCodeError
from marti_ibrl.rollout.runner import DialogueRunner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "examples" / "price_negotiation.py").read_text()
MODEL = str(ROOT / "recipes" / "dond" / "tiny-sft")  # any checkpoint: the env's checks come first


def _module(tmp_path: Path, monkeypatch, name: str, patch: str = "", body: str | None = None) -> str:
    """``name:PriceNegotiation``: the shipped example with ``patch`` appended to the class (methods that replace its
    own), importable from ``tmp_path``."""
    text = body if body is not None else EXAMPLE + "\n" + textwrap.dedent(patch)
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return f"{name}:PriceNegotiation"


BROKEN = {
    "init_raises": (
        "def _init(self, cfg): raise RuntimeError('no data dir')\nPriceNegotiation.__init__ = _init\n",
        r"__init__\(\) raised RuntimeError: no data dir \(.*init_raises\.py:\d+\)",
    ),
    "no_scenarios": (
        "PriceNegotiation.training_scenarios = lambda self, seed: []\n",
        r"training_scenarios\(42\) returned no scenarios",
    ),
    "scenarios_raise": (
        "def _s(self, seed): return {}['x']\nPriceNegotiation.training_scenarios = _s\n",
        r"training_scenarios\(42\) raised KeyError: 'x' \(.*scenarios_raise\.py:\d+\)",
    ),
    "step_dict": (
        "PriceNegotiation.step = lambda self, state, role, text: {'valid': True}\n",
        r"step\(\) returned dict \{'valid': True\}, not a marti_ibrl.envs.base.TurnResult",
    ),
    "step_raises": (
        "def _step(self, state, role, text): raise ZeroDivisionError('bad parse')\nPriceNegotiation.step = _step\n",
        r"step\(\) raised ZeroDivisionError: bad parse \(.*step_raises\.py:\d+\)",
    ),
    "role_unknown": (
        "PriceNegotiation.current_role = lambda self, state: 'auctioneer'\n",
        r"current_role\(\) returned str 'auctioneer', not one of its roles \['buyer', 'seller'\]",
    ),
    "syntax": (None, r"importing syntax raised SyntaxError: .* \(.*syntax\.py:3\)"),
    "huge_prompt": (  # before: 124 s to tokenize one, the check making no progress in 600 s and ignoring SIGTERM
        "PriceNegotiation.system_prompt = lambda self, scenario, role: 'x' * 10_000_000\n",
        r"buyer's system prompt for scenario \S+ is 10,000,000 characters, more than 32 per token of "
        r"--rollout.max_len 2048 \(65,536\): it cannot fit and was not tokenized",
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_contract_is_one_line_before_anything_starts(tmp_path, monkeypatch, capsys, name) -> None:
    patch, said = BROKEN[name]
    body = '"""x"""\nclass PriceNegotiation:\n    def broken(self:\n' if patch is None else None
    spec = _module(tmp_path, monkeypatch, name, patch or "", body)
    run = tmp_path / "run"
    flags = ["--env.name", spec, "--role1.pretrain", MODEL, "--role2.pretrain", MODEL, "--train.device", "cpu"]
    t0 = time.monotonic()
    assert main(["train", *flags, "--ckpt.path", str(run)]) == 2
    assert time.monotonic() - t0 < 60
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"marti-ibrl train: error: --env.name {spec}: "), err
    assert __import__("re").search(said, err), err
    assert not run.exists()  # before the run directory, Ray or any model


def test_a_step_that_raises_mid_run_stops_the_rollout_unless_the_user_says_malformed(tmp_path, monkeypatch) -> None:
    """The probe's one ``step`` passes; the raise comes on a later turn, in the runner, as in a real run."""
    patch = """
    _own_step = PriceNegotiation.step
    def _step(self, state, role, text):
        if state.turn >= 1:
            raise IndexError('turn two')
        return _own_step(self, state, role, text)
    PriceNegotiation.step = _step
    """
    spec = _module(tmp_path, monkeypatch, "late_raise", patch)
    env, scenarios = make_env(EnvConfig(name=spec, num_scenarios=2), 42)
    assert isinstance(env, CheckedEnv)
    state = env.new_state(scenarios[0][1], ["buyer", "seller"])
    assert isinstance(env.step(state, "buyer", "OFFER 10"), TurnResult)
    with pytest.raises(UserCodeError, match=r"step\(\) raised IndexError: turn two \(.*late_raise\.py:\d+\)"):
        env.step(state, "seller", "OFFER 20")
    runner = object.__new__(DialogueRunner)  # only its step guard: a built-in parser's raise is a malformed turn
    runner.env, runner._unreadable = env, set()
    traj = type("T", (), {"state": state, "scenario_uid": "u"})()
    with pytest.raises(UserCodeError):
        runner._step(traj, "seller", "OFFER 20")
    lenient, _ = make_env(EnvConfig(name=spec, num_scenarios=2, step_errors="malformed"), 42)
    runner.env = lenient
    result = runner._step(traj, "seller", "OFFER 20")
    assert not result.valid and "unreadable turn (IndexError: turn two)" in result.reason


def test_the_shipped_example_passes_the_contract(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))
    monkeypatch.delitem(sys.modules, "price_negotiation", raising=False)
    env, scenarios = make_env(EnvConfig(name="price_negotiation:PriceNegotiation", num_scenarios=3), 1)
    assert len(scenarios) == 3 and env.roles == ("buyer", "seller")


def test_the_checked_env_pickles_and_copies(monkeypatch) -> None:
    import copy
    import pickle

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.delitem(sys.modules, "price_negotiation", raising=False)
    env, _ = make_env(EnvConfig(name="price_negotiation:PriceNegotiation", num_scenarios=1), 1)
    for other in (pickle.loads(pickle.dumps(env)), copy.deepcopy(env)):
        assert isinstance(other, CheckedEnv) and other.roles == env.roles and other.max_turns == env.max_turns


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--env.name", "examples/my-env.py:Haggle", r"--env.name: expected module:Class \(Python names\), got"),
        ("--role1.reward_fn", "my rewards:score", r"--role1.reward_fn: expected module:function \(Python names\)"),
        (
            "--role1.reward_fn",
            "bad_reward:score",
            r"bad_reward:score: importing bad_reward raised SyntaxError: .*bad_reward\.py:1\)",
        ),
        (
            "--role1.reward_fn",
            "body_raises:score",
            r"importing body_raises raised KeyError: 'API_KEY' \(.*body_raises\.py:2\)",
        ),
    ],
)
def test_a_users_reward_or_env_name_is_checked_by_form_and_its_import_is_one_line(
    tmp_path, monkeypatch, capsys, flag, value, said
) -> None:
    (tmp_path / "bad_reward.py").write_text("def score(traj, role, scenario) return 1\n")
    (tmp_path / "body_raises.py").write_text("import os\nKEY = os.environ['API_KEY']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("API_KEY", raising=False)
    for name in ("bad_reward", "body_raises"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    run = tmp_path / "run"
    flags = [flag, value, "--role1.pretrain", MODEL, "--role2.pretrain", MODEL, "--train.device", "cpu"]
    assert main(["train", *flags, "--ckpt.path", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and __import__("re").search(said, err), err
    assert not run.exists()
