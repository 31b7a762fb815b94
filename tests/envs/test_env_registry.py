"""The environment registry (marti_ibrl/envs/registry.py): the built-in specs, unknown names, ``module:Class`` envs
resolved through the same registry, default rewards, and no env-name string dispatch anywhere else in the package."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest
from fake_model import fake_checkpoint

from marti_ibrl.config import ConfigError, EnvConfig, env_roles, load_config
from marti_ibrl.envs import make_env, registry
from marti_ibrl.envs.registry import EnvSpec, UnknownEnvironment
from marti_ibrl.reward_types import JUDGE, RULE

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "marti_ibrl"
EXAMPLES = ROOT / "examples"
BUILTIN = {"dond": ("agent1", "agent2"), "dond3": ("agent1", "agent2", "agent3"), "telesales": ("sales", "customer")}


def test_builtin_names_and_roles() -> None:
    assert registry.names()[:3] == list(BUILTIN)
    for name, roles in BUILTIN.items():
        spec = registry.get(name)
        assert spec.name == name and spec.roles == roles and env_roles(name) == roles


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownEnvironment) as err:
        registry.get("chess")
    assert "unknown environment 'chess'" in str(err.value)
    assert all(name in str(err.value) for name in BUILTIN) and "module:Class" in str(err.value)
    with pytest.raises(ConfigError) as err:
        env_roles("chess")
    assert str(err.value).startswith("--env.name: unknown environment 'chess'") and "dond, dond3, telesales" in str(
        err.value
    )
    with pytest.raises(ValueError, match="unknown environment 'chess'"):
        make_env(EnvConfig(name="chess"), seed=0)


def test_default_rewards_and_judges() -> None:
    from marti_ibrl.rewards import default_reward

    assert registry.get("telesales").default_reward == JUDGE and registry.get("telesales").judges is not None
    for name in ("dond", "dond3"):
        assert registry.get(name).default_reward == RULE and registry.get(name).judges is None
        assert default_reward(name) == RULE
    assert default_reward("telesales") == JUDGE


def test_factories_build_each_builtin_env() -> None:
    for name, roles in BUILTIN.items():
        env, scenarios = make_env(EnvConfig(name=name, num_scenarios=3, max_rounds=2), seed=1)
        assert tuple(env.roles) == roles and len(scenarios) == 3 and len({uid for uid, _ in scenarios}) == 3


def test_custom_class_resolves_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    name = "price_negotiation:PriceNegotiation"
    try:
        spec = registry.get(name)
        assert spec.roles == ("buyer", "seller") and spec.default_reward == RULE and spec.judges is None
        assert name in registry.names() and registry.get(name).roles == spec.roles
        assert env_roles(name) == ("buyer", "seller")
        env, scenarios = make_env(EnvConfig(name=name, max_rounds=2, num_scenarios=4), seed=3)
        assert env.roles == ("buyer", "seller") and len(scenarios) == 4
    finally:
        sys.modules.pop("price_negotiation", None)
    with pytest.raises(ImportError):
        registry.get("no_such_module_here:Env")


def test_register_refuses_a_taken_name_and_bad_specs() -> None:
    def factory(cfg, seed):
        raise AssertionError("not built")

    with pytest.raises(ValueError, match="already registered"):
        registry.register(EnvSpec(name="dond", roles=("a", "b"), factory=factory))
    with pytest.raises(ValueError, match="at least two distinct"):
        EnvSpec(name="solo", roles=("a",), factory=factory)
    with pytest.raises(ValueError, match="needs judges"):
        EnvSpec(name="judged", roles=("a", "b"), factory=factory, default_reward=JUDGE)


def test_env_checks_go_through_the_specs(tmp_path: Path) -> None:
    ckpt = str(fake_checkpoint(tmp_path / "ckpt"))
    base = ["--role1.pretrain", ckpt, "--role2.pretrain", ckpt]
    with pytest.raises(ConfigError, match=r"^--env\.lang: TeleSales prompts exist in"):
        load_config([*base, "--env.name", "telesales", "--env.lang", "xx", "--role1.reward_fn", "rule",
                     "--role2.reward_fn", "rule"])  # fmt: skip
    load_config([*base, "--env.lang", "xx"])  # DoND reads no --env.lang
    with pytest.raises(ConfigError, match=r"^--env\.show_complement: is for the two-party dond; telesales does not "):
        load_config([*base, "--env.name", "telesales", "--env.show_complement", "true"])
    # DoND's renderings mean nothing to another game: refused (issue 65), not accepted silently
    both = "two-party dond or three-party dond3"
    with pytest.raises(
        ConfigError, match=rf"^--env\.prompt_style: is for the {both}; telesales .*\(leave it at paper\)$"
    ):
        load_config([*base, "--env.name", "telesales", "--env.prompt_style", "compact"])
    with pytest.raises(ConfigError, match=rf"^--env\.bot_speech: is for the {both}; textarena:TicTacToe-v0 does not"):
        load_config(["--env.name", "textarena:TicTacToe-v0", "--env.bot_speech", "markers", *base])
    load_config([*base, "--env.name", "dond3", "--env.prompt_style", "compact", "--env.bot_speech", "markers",
                 "--role3.pretrain", ckpt, "--pool.probs", "[0.7,0.1,0.1,0.1]"])  # fmt: skip
    load_config([*base, "--env.name", "telesales", "--env.prompt_style", "paper", "--role1.reward_fn", "rule",
                 "--role2.reward_fn", "rule"])  # fmt: skip  # the default changes nothing: accepted
    with pytest.raises(ConfigError, match=r"^--role2\.frozen: scripted bots play two-party dond, not dond3$"):
        load_config(["--env.name", "dond3", "--role1.pretrain", ckpt, "--role2.frozen", "bot:fair"])
    with pytest.raises(ConfigError, match=r"^--role2\.frozen: unknown scripted bot 'nope'; known bots: \["):
        load_config(["--role1.pretrain", ckpt, "--role2.frozen", "bot:nope"])
    with pytest.raises(ConfigError, match=r"^--role1\.reward_fn: judge rewards exist for telesales, not dond$"):
        load_config([*base, "--role1.reward_fn", "judge"])


def test_cli_subcommands_come_from_the_specs() -> None:
    from marti_ibrl.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {"dond", "telesales", "sft"} <= set(sub.choices)  # sft: any game's warm start (commands/sft.py)
    added = argparse.ArgumentParser().add_subparsers()
    registry.get("telesales").commands(added)
    assert set(added.choices) == {"telesales"}


def test_play_offers_the_envs_whose_spec_has_a_play_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """``marti-ibrl play --env`` reads the registry: DoND and TeleSales have games, dond3 has none; a spec registered
    with a ``play`` hook is offered and its game is the one ``play`` builds."""
    from types import SimpleNamespace

    from marti_ibrl.commands.people import build_game, playable_envs

    assert playable_envs() == ["dond", "telesales"]
    built = []
    spec = EnvSpec(name="haggle", roles=("a", "b"), factory=lambda cfg, seed: (None, []),
                   play=lambda args, seat, name: built.append((seat(), name)) or "the game")  # fmt: skip
    monkeypatch.setattr(registry, "_SPECS", {**registry._SPECS})  # registered for this test only
    monkeypatch.setattr("marti_ibrl.people.seat.make_seat", lambda policy, sampling, seed: f"seat of {policy}")
    registry.register(spec)
    assert playable_envs() == ["dond", "telesales", "haggle"]
    args = SimpleNamespace(env="haggle", policy="bot:greedy", name=None, num_scenarios=3, temperature=1.0, top_p=1.0,
                           max_new_tokens=8, seed=0)  # fmt: skip
    assert build_game(args) == "the game"
    assert built == [("seat of bot:greedy", "greedy")]


def test_diagnose_takes_any_two_role_env_with_two_checkpoints_or_says_how_to_save_them(tmp_path: Path) -> None:
    from marti_ibrl.config import to_yaml
    from marti_ibrl.eval.diagnose import diagnosable, diagnose

    assert diagnosable("dond", ["agent1", "agent2"]) is registry.get("dond")
    assert diagnosable("telesales", ["sales", "customer"]) is registry.get("telesales")  # roles not interchangeable
    with pytest.raises(ValueError, match=r"against the other one: dond3 has 3 roles"):
        diagnosable("dond3", ["agent1", "agent2", "agent3"])
    ckpt = str(fake_checkpoint(tmp_path / "ckpt"))
    cfg = load_config(["--env.name", "telesales", "--role1.pretrain", ckpt, "--role2.pretrain",
                       ckpt, "--role1.reward_fn", "rule", "--role2.reward_fn", "rule"])  # fmt: skip
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    fake_checkpoint(tmp_path / "sales" / "ckpt" / "global_step4_hf")  # one checkpoint: the demo's case
    with pytest.raises(FileNotFoundError, match=r"1 global_stepK_hf checkpoint\(s\), diagnose compares 2 or more: "
                       r"train with --ckpt.save_steps K"):  # fmt: skip
        diagnose(tmp_path, "sales", 2, None, 0, None, engines=None)


ENV_NAME = r"""["'](?:dond|dond3|telesales)["']"""
COMPARISON = re.compile(
    rf"(?:==|!=|\bis\s+not\b|\bis\b|\bnot\s+in\b|\bin\b)\s*[(\[{{]?\s*{ENV_NAME}"  # x == "dond", x in ("telesales",)
    rf"|{ENV_NAME}\s*(?:==|!=|\bnot\s+in\b|\bin\b)"  # "dond" == x, "dond" in names
    rf"|\bcase\s+{ENV_NAME}"  # match/case
)
ALLOWED = {"envs/registry.py", "entries/dond.py", "entries/telesales.py"}


def test_no_env_name_string_dispatch_outside_the_registry() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ALLOWED:
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if COMPARISON.search(line):
                offenders.append(f"marti_ibrl/{rel}:{lineno}: {line.strip()}")
    assert not offenders, "dispatch on the env's registry spec instead:\n" + "\n".join(offenders)


def test_the_dispatch_pattern_catches_what_it_should() -> None:
    caught = ['if cfg.env.name == "dond":', "if name != 'telesales'", 'JUDGED = name in ("telesales",)',
              'if "dond3" == env_name:', 'case "dond":', "x = name in ['dond', 'dond3']"]  # fmt: skip
    missed = ['name: str = "dond"', 'sub.add_parser("telesales", help="...")', 'choices=["dond"]']
    assert all(COMPARISON.search(line) for line in caught)
    assert not any(COMPARISON.search(line) for line in missed)
