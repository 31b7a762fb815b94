"""``load_config``: defaults < ``--config FILE.yaml`` < dotted flags; every error is a ConfigError naming its flag."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fake_model import fake_checkpoint

from marti_ibrl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ckpt(tmp_path: Path) -> str:
    return str(fake_checkpoint(tmp_path / "ckpt"))


@pytest.fixture
def base(ckpt: str) -> list[str]:
    """The smallest valid command line: both roles' checkpoints."""
    return ["--role1.pretrain", ckpt, "--role2.pretrain", ckpt]


def test_defaults(base: list[str], ckpt: str) -> None:
    cfg = load_config(base)
    assert [r.name for r in cfg.roles] == ["agent1", "agent2"]
    for role in cfg.roles:
        assert role.pretrain == ckpt
        assert role.lr == 1e-6
        assert role.update_every == 1
        assert role.kl_coef == 0.02
        assert role.eps_clip == 0.2
        assert role.advantage_estimator == "group_norm"
        assert role.reward_fn is None
    assert cfg.env.name == "dond"
    assert (cfg.env.max_rounds, cfg.env.invalid_penalty, cfg.env.max_resamples) == (10, -1.0, 2)
    assert cfg.env.prompt_style == "paper"
    assert (cfg.rollout.n_samples_per_prompt, cfg.rollout.batch_size) == (4, 16)
    assert (cfg.rollout.max_new_tokens, cfg.rollout.max_len) == (48, 2048)
    assert (cfg.train.iterations, cfg.train.micro_batch_size, cfg.train.seed) == (10, 8, 42)
    assert cfg.ckpt.path == "runs/ibrl"


def test_role_flags_land_in_their_role(base: list[str]) -> None:
    cfg = load_config([*base, "--role1.lr", "1e-6", "--role2.update_every", "2", "--role2.lr", "1e-7"])
    agent1, agent2 = cfg.roles
    assert (agent1.name, agent1.lr, agent1.update_every) == ("agent1", 1e-6, 1)
    assert (agent2.name, agent2.lr, agent2.update_every) == ("agent2", 1e-7, 2)


def test_flag_syntaxes(base: list[str]) -> None:
    cfg = load_config([*base, "--rollout.n-samples-per-prompt=8", "--ds.gradient_checkpointing", "--train.seed", "7"])
    assert cfg.rollout.n_samples_per_prompt == 8
    assert cfg.ds.gradient_checkpointing is True
    assert cfg.train.seed == 7


def test_yaml_file_then_flags_override(tmp_path: Path, ckpt: str) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            rollout:
              n_samples_per_prompt: 8
              batch_size: 4
            train:
              iterations: 3
            role1:
              pretrain: {ckpt}
              lr: 2.0e-6
            role2:
              pretrain: {ckpt}
              update_every: 3
            """
        )
    )
    cfg = load_config(["--config", str(path)])
    assert (cfg.rollout.n_samples_per_prompt, cfg.rollout.batch_size, cfg.train.iterations) == (8, 4, 3)
    assert [(r.name, r.lr, r.update_every) for r in cfg.roles] == [("agent1", 2e-6, 1), ("agent2", 1e-6, 3)]

    cfg = load_config(["--rollout.n_samples_per_prompt", "2", "--config", str(path), "--role2.update_every", "1"])
    assert (cfg.rollout.n_samples_per_prompt, cfg.rollout.batch_size) == (2, 4)  # flag wins, file value kept
    assert [(r.lr, r.update_every) for r in cfg.roles] == [(2e-6, 1), (1e-6, 1)]


def test_yaml_roles_as_a_list(tmp_path: Path, ckpt: str) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"roles:\n  - {{pretrain: {ckpt}, lr: 0.5}}\n  - {{pretrain: {ckpt}, kl_coef: 0.0}}\n")
    cfg = load_config(["--config", str(path)])
    assert [(r.name, r.lr, r.kl_coef) for r in cfg.roles] == [("agent1", 0.5, 0.02), ("agent2", 1e-6, 0.0)]


@pytest.mark.parametrize(
    ("yaml_text", "match"),
    [
        ("rollout:\n  n_samples_per_prompt: abc\n", "could not be converted"),
        ("rollout:\n  nope: 1\n", "nope"),
        ("roles: [{}, {}, {}]\n", "3 roles given"),
        # a section that is not a mapping says so (it said ": None"), as does a file that is not one
        ("train: 5\n", r": train must be a mapping of train\.\* settings \(key: value lines\), got 5$"),
        ("rollout: [1, 2]\n", r": rollout must be a mapping of rollout\.\* settings .*, got \[1, 2\]$"),
        ("role1: 5\n", r": role1 must be a mapping of role1\.\* settings .*, got 5$"),
        ("roles: 5\n", r": roles must be a list of mappings \(- pretrain: PATH \.\.\.\), got 5$"),
        ("- 1\n", r": expected a mapping of sections \(env:, train:, \.\.\.\), got a list$"),
        ("5\n", r": not a YAML mapping of sections \(Invalid loaded object type: int\)$"),
        ("train: {iterations: 2\n", r": not a YAML mapping of sections \(did not find expected ',' or '}', line 2 "),
    ],
)
def test_yaml_errors_name_the_file(tmp_path: Path, base: list[str], yaml_text: str, match: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=match) as err:
        load_config(["--config", str(path), *base])
    assert str(err.value).startswith("--config")
    assert "\n" not in str(err.value)


def test_an_empty_section_in_a_yaml_file_sets_nothing(tmp_path: Path, base: list[str]) -> None:
    path = tmp_path / "empty-train.yaml"
    path.write_text("train:\nrollout:\n  batch_size: 3\n")
    cfg = load_config(["--config", str(path), *base])
    assert (cfg.train.iterations, cfg.rollout.batch_size) == (10, 3)


def test_missing_config_file(base: list[str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^--config: no such file"):
        load_config(["--config", str(tmp_path / "absent.yaml"), *base])
    with pytest.raises(ConfigError, match="^--config: expected a YAML file path"):
        load_config([*base, "--config"])


@pytest.mark.parametrize(
    ("flags", "prefix", "why"),
    [
        (["--rollout.n_samples_per_prompt", "1"], "--rollout.n_samples_per_prompt: ", "G >= 2"),
        (["--role2.lr", "-1"], "--role2.lr: ", "must be > 0"),
        (["--role1.pretrain", "/nonexistent"], "--role1.pretrain: ", "not a directory: /nonexistent"),
        (["--role3.lr", "1"], "--role3.lr: ", "role1..role2"),
        (["--rollout.nope", "1"], "--rollout.nope: ", "Key 'nope' not in 'RolloutConfig'"),
        (["--nosection.key", "1"], "--nosection.key: ", "not in 'Config'"),
        (["--train.iterations", "abc"], "--train.iterations: ", "'abc'"),
        (["--train.iterations", "0"], "--train.iterations: ", ">= 1"),
        (["--ds.param_dtype", "fp8"], "--ds.param_dtype: ", "bf16, fp16 or fp32"),
        (["--role1.reward_fn", "nomodule:fn"], "--role1.reward_fn: ", "No module named 'nomodule'"),
        (["--role2.reward_fn", "nocolon"], "--role2.reward_fn: ", "module:function"),
        (["--role1.reward_fn", "marti_ibrl.rewards:env_reward"], "--role1.reward_fn: ", "trajectory, role, scenario"),
        (["--role1.advantage_estimator", "gae"], "--role1.advantage_estimator: ", "group_norm"),
        (["--role2.eps_clip", "1.5"], "--role2.eps_clip: ", "(0, 1)"),
        (["--env.prompt_style", "fancy"], "--env.prompt_style: ", "paper or compact"),
        (["--env.name", "chess"], "--env.name: ", "unknown environment"),
        (["--env.name", "dond3", "--env.show_complement", "true"], "--env.show_complement: ", "two-party dond"),
        (["--rollout.max_len", "48"], "--rollout.max_len: ", "max_new_tokens"),
        (["--train.micro_batch_size", "0"], "--train.micro_batch_size: ", ">= 1"),
        (["--env.num_scenarios", "0"], "--env.num_scenarios: ", "must be >= 1 (training scenarios to generate), got 0"),
        (["--ckpt.overwrite", "--ckpt.load_enable", "true"], "--ckpt.overwrite: ", "resume the run, or start over"),
        (["--ray.connect_timeout", "0"], "--ray.connect_timeout: ", "must be > 0 seconds, got 0"),
        (["--ray.start_timeout", "-1"], "--ray.start_timeout: ", "must be > 0 seconds, got -1"),
        (["--train.max_staleness", "2"], "--train.max_staleness: ", "one rollout is in flight at a time"),
        (["--train.async_rollout", "true", "--train.colocate", "role"], "--train.async_rollout: ", "colocated engines"),
        (["positional"], "unexpected argument 'positional'", ""),
    ],
)
def test_each_error_names_its_flag(base: list[str], flags: list[str], prefix: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config([*base, *flags])
    msg = str(err.value)
    assert msg.startswith(prefix), msg
    assert why in msg
    assert "\n" not in msg  # one line, no OmegaConf full_key/object_type dump


def test_micro_batch_need_not_divide_the_samples(base: list[str]) -> None:
    """Padding deals any sample count in whole micro-batches (marti_ibrl.algorithm.batching): no divisibility rule."""
    cfg = load_config(
        [*base, "--rollout.batch_size", "3", "--rollout.n_samples_per_prompt", "2", "--train.micro_batch_size", "4"]
    )
    assert (cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt, cfg.train.micro_batch_size) == (6, 4)


def test_missing_pretrain_is_named_as_a_flag(ckpt: str) -> None:
    with pytest.raises(
        ConfigError, match=r"^--role2\.pretrain: a checkpoint path is required \(or --role2\.frozen"
    ) as err:
        load_config(["--role1.pretrain", ckpt])
    assert "\n" not in str(err.value)


def test_valid_custom_reward_fn(base: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rewards_for_cfg_test.py").write_text(
        "def fn(trajectory, role, scenario):\n    return 1.0\n\ndef bad(trajectory):\n    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config([*base, "--role2.reward_fn", "my_rewards_for_cfg_test:fn"])
    assert cfg.roles[1].reward_fn == "my_rewards_for_cfg_test:fn"
    with pytest.raises(ConfigError, match=r"^--role1\.reward_fn: .*must accept \(trajectory, role, scenario\)"):
        load_config([*base, "--role1.reward_fn", "my_rewards_for_cfg_test:bad"])
    with pytest.raises(ConfigError, match=r"^--role1\.reward_fn: .*missing"):
        load_config([*base, "--role1.reward_fn", "my_rewards_for_cfg_test:missing"])


@pytest.fixture
def telesales(ckpt: str) -> list[str]:
    return ["--env.name", "telesales", "--role1.pretrain", ckpt, "--role2.pretrain", ckpt]


def test_telesales_roles_judge_and_rewards(telesales: list[str], ckpt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from marti_ibrl.rewards import reward_spec

    judge = ["--judge.base_url", "http://127.0.0.1:9/v1", "--judge.model", "deepseek", "--judge.api_key_env", "JK"]
    monkeypatch.setenv("JK", "secret")
    cfg = load_config([*telesales, *judge, "--env.lang", "zh", "--judge.max_concurrency", "4"])
    assert [r.name for r in cfg.roles] == ["sales", "customer"]
    assert [reward_spec("telesales", r) for r in cfg.roles] == ["judge", "judge"]  # the paper's default (§5.1)
    assert (cfg.judge.model, cfg.judge.max_concurrency, cfg.env.lang) == ("deepseek", 4, "zh")
    assert cfg.judge.structured == "auto"  # structured outputs where the endpoint takes them (marti_ibrl.llm)
    assert cfg.judge.max_new_tokens is None  # the endpoint's own cap
    assert load_config([*telesales, *judge, "--judge.max_new_tokens", "512"]).judge.max_new_tokens == 512
    with pytest.raises(ConfigError, match=r"^--judge.max_new_tokens: must be >= 1 .*got 0"):
        load_config([*telesales, *judge, "--judge.max_new_tokens", "0"])
    for value in ("off", "on"):  # words, though YAML would read them as booleans
        assert load_config([*telesales, *judge, "--judge.structured", value]).judge.structured == value
        assert load_config([*telesales, *judge, f"--judge.structured={value}"]).judge.structured == value
    # the rule reward needs no endpoint; a frozen role's reward is only logged, so it defaults to the rule
    cfg = load_config([*telesales, "--role1.reward_fn", "rule", "--role2.reward_fn", "rule"])
    assert [r.reward_fn for r in cfg.roles] == ["rule", "rule"]
    cfg = load_config(["--env.name", "telesales", "--role1.pretrain", ckpt, "--role1.reward_fn", "rule",
                       "--role2.frozen", f"checkpoint:{ckpt}"])  # fmt: skip
    assert reward_spec("telesales", cfg.roles[1]) == "rule"


def test_judge_structured_in_a_config_file(telesales: list[str], tmp_path: Path) -> None:
    judge = ["--judge.base_url", "http://127.0.0.1:9/v1", "--judge.model", "m"]
    path = tmp_path / "judge.yaml"
    path.write_text('judge:\n  structured: "off"\n')
    assert load_config(["--config", str(path), *telesales, *judge]).judge.structured == "off"
    path.write_text("judge:\n  structured: off\n")  # a YAML boolean
    with pytest.raises(ConfigError, match=r"^--judge.structured: .*got 'False' \(YAML reads on/off as booleans"):
        load_config(["--config", str(path), *telesales, *judge])


@pytest.mark.parametrize(
    ("flags", "prefix", "why"),
    [
        ([], "--judge.base_url: ", "sales's reward comes from the LLM judge (§5.1)"),
        (["--judge.base_url", "http://h/v1"], "--judge.model: ", "--role1.reward_fn rule"),
        (["--judge.base_url", "h:8000", "--judge.model", "m"], "--judge.base_url: ", "http:// or https://"),
        (["--role1.reward_fn", "rule", "--role2.reward_fn", "judge", "--judge.base_url", "http://h/v1",
          "--judge.model", "m", "--judge.api_key_env", "NO_SUCH_KEY_VAR"], "--judge.api_key_env: ", "NO_SUCH_KEY_VAR"),
        (["--judge.base_url", "http://h/v1", "--judge.model", "m", "--judge.structured", "yes"],
         "--judge.structured: ", "must be one of auto, on, off, got 'yes'"),
        (["--role1.reward_fn", "rule", "--role2.reward_fn", "rules"], "--role2.reward_fn: ", "rule, judge or module"),
        (["--role1.reward_fn", "rule", "--role2.reward_fn", "rule", "--env.lang", "fr"], "--env.lang: ", "'fr'"),
    ],
)  # fmt: skip
def test_telesales_errors_name_their_flag(telesales: list[str], flags: list[str], prefix: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config([*telesales, *flags])
    assert str(err.value).startswith(prefix) and why in str(err.value), str(err.value)


def test_judge_rewards_are_for_judged_envs(base: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"^--role1\.reward_fn: judge rewards exist for telesales, not dond"):
        load_config([*base, "--role1.reward_fn", "judge"])


def _cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    return res, time.perf_counter() - start


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rollout.n_samples_per_prompt", "1"], "--rollout.n_samples_per_prompt: GRPO groups need G >= 2 (Eq. 4)"),
        (["--train.iterations", "abc"], "--train.iterations: Value 'abc' of type 'str' could not be converted"),
    ],
)
def test_cli_config_error_exits_2_with_one_line(ckpt: str, flags: list[str], message: str) -> None:
    res, seconds = _cli("-m", "marti_ibrl.cli", "train", *flags, "--role1.pretrain", ckpt, "--role2.pretrain", ckpt)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"marti-ibrl train: error: {message}")
    assert seconds < 5, f"a config error took {seconds:.1f}s: something heavy was imported or started"


def test_cli_config_error_starts_no_ray_and_imports_no_torch(ckpt: str) -> None:
    code = (
        "import sys; from marti_ibrl.cli import main; "
        f"rc = main(['train', '--rollout.n_samples_per_prompt', '1', '--role1.pretrain', {ckpt!r}, "
        f"'--role2.pretrain', {ckpt!r}]); "
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'torch', 'openrlhf', 'deepspeed'}); "
        "print(rc, heavy)"
    )
    res, _ = _cli("-c", code)
    assert res.stdout.strip() == "2 []", res.stdout + res.stderr


def test_cli_cuda_without_cuda_is_one_line_before_ray(tmp_path: Path, ckpt: str) -> None:
    """``--train.device cuda`` where torch sees no CUDA device: exit 2, one line naming the flag, no traceback,
    nothing written, no Ray started."""
    run = tmp_path / "run"
    code = (
        "import sys; from marti_ibrl.cli import main; "
        f"rc = main(['train', '--train.device', 'cuda', '--role1.pretrain', {ckpt!r}, '--role2.pretrain', {ckpt!r}, "
        f"'--ckpt.path', {str(run)!r}]); "
        "import ray; print(rc, ray.is_initialized())"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert res.stdout.strip() == "2 False", res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    # importing torch may print a third-party warning (e.g. pynvml's deprecation): two lines, not ours
    lines = re.sub(r"(?m)^\S+:\d+: \w*Warning: .*\n(?:  .*\n)?", "", res.stderr).strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("marti-ibrl train: error: --train.device: cuda, but torch ("), lines[0]
    assert lines[0].endswith("sees no CUDA device here; use cpu (or auto) on this machine"), lines[0]
    assert not run.exists()


def test_demo_cuda_without_cuda_fails_before_the_sft_step(tmp_path: Path, monkeypatch, capsys) -> None:
    """The demo's recipe asks for cuda where there is none: one line, exit 2, before the (slow) SFT warm start."""
    import torch

    from marti_ibrl.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = tmp_path / "cuda.yaml"
    recipe.write_text("train:\n  device: cuda\n")
    assert main(["demo", "--config", str(recipe), "--out", str(tmp_path / "demo")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not (tmp_path / "demo").exists()
    assert err.splitlines() == [
        f"marti-ibrl demo: error: --train.device: cuda, but torch ({torch.__version__}, "
        f"{'CUDA ' + torch.version.cuda if torch.version.cuda else 'a CPU-only build'}) sees no CUDA device here; "
        f"use cpu (or auto) on this machine (set in {recipe})"
    ]


def test_train_fails_early_when_no_first_prompt_fits_max_len(tmp_path: Path, monkeypatch, capsys) -> None:
    """System prompts leaving no room for --rollout.max_new_tokens under --rollout.max_len: one line naming
    --rollout.max_len with the prompt's size and the cap it needs, before Ray starts or the run dir is written."""
    from transformers import AutoTokenizer

    from marti_ibrl.cli import main
    from marti_ibrl.envs import make_env
    from marti_ibrl.rollout.render import RoleView
    from marti_ibrl.tiny import build_tiny_dond_model
    from marti_ibrl.training import checks, startup

    model = build_tiny_dond_model(tmp_path / "tiny")
    monkeypatch.setattr(startup, "init_ray", lambda *a: pytest.fail("Ray started before the prompt check"))
    run = tmp_path / "run"
    flags = ["--role1.pretrain", model, "--role2.pretrain", model, "--env.prompt_style", "compact"]
    flags += ["--rollout.max_new_tokens", "16", "--train.device", "cpu", "--ckpt.path", str(run)]
    cfg = load_config(flags)
    env, scenarios = make_env(cfg.env, cfg.train.seed)
    tok = AutoTokenizer.from_pretrained(model)
    sizes = {
        (uid, role): len(RoleView(tok, env.system_prompt(s, role)).generation_prompt())
        for uid, s in scenarios[: checks.PROMPT_CHECK_SCENARIOS]
        for role in env.roles
    }
    (uid, role), longest = max(sizes.items(), key=lambda x: x[1])
    short = longest + 16 - 1
    n_over = len({u for (u, _), n in sizes.items() if n + 16 > short})
    capsys.readouterr()  # the model build's progress bars
    assert main(["train", *flags, "--rollout.max_len", str(short)]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"marti-ibrl train: error: --rollout.max_len: {short} leaves no room for a first turn: {role}'s prompt for "
        f"scenario {uid} is {longest} tokens before --rollout.max_new_tokens 16 (prompts of {n_over} of the first "
        f"{checks.PROMPT_CHECK_SCENARIOS} scenarios do not fit); need --rollout.max_len >= {longest + 16}"
    ]
    assert not run.exists()
    checks.check_first_turns_fit(load_config([*flags, "--rollout.max_len", str(longest + 16)]), env, scenarios)


# -- opponent pools, ablations, frozen counterparts ------------------------------------------------------------------


def test_pool_and_ablation_defaults(base: list[str]) -> None:
    cfg = load_config(base)
    assert cfg.pool.probs == [0.7, 0.2, 0.1]
    assert (cfg.pool.size, cfg.pool.eviction, cfg.pool.snapshot_every) == (4, "oldest", 1)
    assert cfg.ablation == "none"
    assert [r.frozen for r in cfg.roles] == [[], []]


def test_pool_flags_are_applied(base: list[str]) -> None:
    cfg = load_config([*base, "--pool.probs", "[0.5,0.25,0.25]", "--pool.size", "2", "--pool.eviction", "random"])
    assert cfg.pool.probs == [0.5, 0.25, 0.25]
    assert (cfg.pool.size, cfg.pool.eviction) == (2, "random")
    assert load_config([*base, "--pool.probs", "[1.0,0,0]"]).pool.probs == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--pool.probs", "[0.5,0.5]"], "expected 3 values [p_both, p_role1..p_role2]"),
        (["--pool.probs", "[0.4,0.3,0.2,0.1]"], "expected 3 values"),
        (["--pool.probs", "[1.2,-0.1,-0.1]"], "probabilities must be >= 0"),
        (["--pool.probs", "[0.5,0.2,0.1]"], "must sum to 1, got 0.8"),
        (["--pool.size", "0"], "must be >= 1"),
        (
            ["--pool.size", "1"],
            "must be >= 2 with pool.snapshot_every 1: a pool of one then only ever holds the current",
        ),
        (["--pool.eviction", "lifo"], "must be oldest or random"),
        (["--pool.snapshot_every", "0"], "must be >= 1"),
        (["--pool.dtype", "fp16"], "must be bf16 or fp32"),
        (["--ablation", "bogus"], "must be one of ('none', 'shared_reward', 'joint_norm', 'no_stabilization')"),
    ],
)
def test_pool_and_ablation_errors_name_their_flag(base: list[str], flags: list[str], why: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config([*base, *flags])
    msg = str(err.value)
    assert msg.startswith(f"{flags[0]}: "), msg
    assert why in msg
    assert "\n" not in msg


@pytest.mark.parametrize("ablation", ["none", "shared_reward", "joint_norm", "no_stabilization"])
def test_every_ablation_is_accepted(base: list[str], ablation: str) -> None:
    assert load_config([*base, "--ablation", ablation]).ablation == ablation


def test_frozen_list_is_split_on_commas_and_needs_no_pretrain(ckpt: str) -> None:
    cfg = load_config(["--role1.pretrain", ckpt, "--role2.frozen", "bot:greedy,bot:fair"])
    agent1, agent2 = cfg.roles
    assert agent2.frozen == ["bot:greedy", "bot:fair"]
    assert agent2.pretrain is None
    assert agent1.frozen == [] and agent1.pretrain == ckpt
    # the default pool probs are accepted: with fewer than two trained roles the pools are unused
    assert cfg.pool.probs == [0.7, 0.2, 0.1]
    # brackets, spaces and the --flag=value form; empty items are dropped
    cfg = load_config(["--role1.pretrain", ckpt, "--role2.frozen=[bot:greedy, bot:fair,]"])
    assert cfg.roles[1].frozen == ["bot:greedy", "bot:fair"]


def test_frozen_specs_keep_colons_slashes_at_and_hash(ckpt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = "endpoint:qwen-72b@http://10.0.0.5:8000/v1#MY_KEY"
    with pytest.raises(ConfigError, match=r"^--role2\.frozen: environment variable MY_KEY is not set"):
        load_config(["--role1.pretrain", ckpt, "--role2.frozen", spec])
    monkeypatch.setenv("MY_KEY", "sk-test")
    cfg = load_config(["--role1.pretrain", ckpt, "--role2.frozen", f"{spec},checkpoint:{ckpt},bot:stubborn"])
    assert cfg.roles[1].frozen == [spec, f"checkpoint:{ckpt}", "bot:stubborn"]


def test_frozen_role1_with_a_trained_role2(ckpt: str) -> None:
    cfg = load_config(["--role1.frozen", "bot:conceder", "--role2.pretrain", ckpt])
    assert cfg.roles[0].frozen == ["bot:conceder"] and cfg.roles[0].pretrain is None


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("checkpoint:/nonexistent", "not a directory: /nonexistent"),
        ("nonsense", "bad player spec 'nonsense'"),
        ("bot:", "bad player spec 'bot:'"),
        ("telepathy:x", "unknown player kind 'telepathy'"),
        ("endpoint:model-without-url", "bad endpoint spec"),
        ("endpoint:m@http://h:8000/v1#1BAD", "bad API key environment variable name"),
        ("bot:nosuchbot", "unknown scripted bot 'nosuchbot'"),
    ],
)
def test_bad_frozen_specs_name_the_flag(ckpt: str, spec: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(["--role1.pretrain", ckpt, "--role2.frozen", spec])
    msg = str(err.value)
    assert msg.startswith("--role2.frozen: "), msg
    assert why in msg
    assert "\n" not in msg


def test_all_roles_frozen_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^--roles: every role is frozen: nothing to train$"):
        load_config(["--role1.frozen", "bot:greedy", "--role2.frozen", "bot:fair"])


def test_frozen_role_of_three_needs_a_zero_pool_prob(ckpt: str) -> None:
    flags = [
        "--env.name",
        "dond3",
        "--role1.pretrain",
        ckpt,
        "--role2.pretrain",
        ckpt,
        "--role3.frozen",
        f"checkpoint:{ckpt}",
    ]
    cfg = load_config([*flags, "--pool.probs", "[0.7,0.2,0.1,0]"])
    assert [r.name for r in cfg.roles] == ["agent1", "agent2", "agent3"]
    assert cfg.roles[2].frozen == [f"checkpoint:{ckpt}"]
    with pytest.raises(ConfigError, match=r"^--role3\.frozen: scripted bots play two-party dond, not dond3"):
        load_config([*flags[:-1], "bot:greedy", "--pool.probs", "[0.7,0.2,0.1,0]"])
    # two roles train, so pools are live: the frozen role3 has no pool and must get probability 0
    with pytest.raises(ConfigError, match=r"^--pool\.probs: role3 is frozen: it has no pool, so its entry \(index 3\)"):
        load_config([*flags, "--pool.probs", "[0.7,0.1,0.1,0.1]"])
    # the 2-role default has the wrong length for three roles
    with pytest.raises(ConfigError, match=r"^--pool\.probs: expected 4 values"):
        load_config(flags)


@pytest.mark.parametrize("frozen", ["heldout:hardliner", "bot:greedy,heldout:tit_for_tat", "heldout:nosuchbot"])
def test_heldout_bots_are_refused_as_training_counterparts(ckpt: str, frozen: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(["--role1.pretrain", ckpt, "--role2.frozen", frozen])
    msg = str(err.value)
    assert msg.startswith("--role2.frozen: heldout:"), msg
    assert msg.endswith("held-out counterparts are for evaluation only; training against them would leak them")
    assert "\n" not in msg
    with pytest.raises(ConfigError, match=r"^--role1\.frozen: heldout:slow_conceder: held-out counterparts are"):
        load_config(["--role1.frozen", "heldout:slow_conceder", "--role2.pretrain", ckpt])


def test_rollout_engine_choices_and_vllm_cpu_head_dim(tmp_path: Path, base: list[str]) -> None:
    """``--rollout.engine``: auto | vllm | hf; vLLM on CPU refuses, up front, a model whose heads are under 32 wide."""

    with pytest.raises(ConfigError, match=r"^--rollout.engine: must be one of \('auto', 'vllm', 'hf'\)$"):
        load_config([*base, "--rollout.engine", "sglang"])
    narrow, wide = tmp_path / "narrow", tmp_path / "wide"
    for d, heads in ((narrow, 4), (wide, 2)):
        fake_checkpoint(d, {"hidden_size": 64, "num_attention_heads": heads})
    flags = ["--rollout.engine", "vllm", "--train.device", "cpu", "--role2.pretrain", str(wide)]
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match="^--rollout.engine: vllm is not installed"):
            load_config([*base, *flags])
        return
    with pytest.raises(ConfigError, match=r"^--rollout.engine: vLLM on CPU needs head_dim >= 32; \S+narrow has 16"):
        load_config([*base, *flags, "--role1.pretrain", str(narrow)])
    assert load_config([*base, *flags, "--role1.pretrain", str(wide)]).rollout.engine == "vllm"


def _float_flags() -> list[str]:
    """Every float field of the schema as a flag: each section's, and each role's as ``role1.FIELD``."""
    from dataclasses import fields

    from marti_ibrl.config import Config, RoleConfig

    def floats(cls, prefix):
        hints = __import__("typing").get_type_hints(cls)
        for f in fields(cls):
            if hints[f.name] in (float, float | None):
                yield f"{prefix}{f.name}"
            elif hasattr(hints[f.name], "__dataclass_fields__"):
                yield from floats(hints[f.name], f"{prefix}{f.name}.")

    return [*floats(Config, ""), *floats(RoleConfig, "role1.")]


def test_every_float_field_is_checked() -> None:
    # the flags below are found from the schema, so a new float field is covered without being listed anywhere
    assert {"role1.lr", "role1.kl_coef", "env.invalid_penalty", "judge.timeout", "train.max_reward_failures"} <= set(
        _float_flags()
    )


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("flag", _float_flags())
def test_non_finite_floats_are_refused_by_name(base: list[str], flag: str, value: str) -> None:
    shown = {"inf": "inf", "-inf": "-inf", "nan": "nan"}[value]
    with pytest.raises(ConfigError, match=rf"^--{re.escape(flag)}: must be a finite number, got {shown}$"):
        load_config([*base, f"--{flag}", value])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--role2.kl_coef", "inf"], "--role2.kl_coef: must be a finite number, got inf"),
        (["--pool.probs", "[0.7,nan,0.1]"], "--pool.probs: must be a finite number, got nan"),
    ],
)
def test_non_finite_in_roles_and_lists(base: list[str], flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config([*base, *flags])
    assert str(e.value) == message


def test_non_finite_in_a_config_file(tmp_path: Path, base: list[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  invalid_penalty: .nan\nroles:\n  - lr: .inf\n")
    with pytest.raises(ConfigError, match=r"^--env\.invalid_penalty: must be a finite number, got nan$"):
        load_config(["--config", str(path), *base])


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("train.max_reward_failures", "1.5", "must be in [0, 1]"),
        ("train.max_reward_failures", "-0.1", "must be in [0, 1]"),
        ("train.max_skipped_updates", "0", "must be >= 1"),
        ("train.reward_timeout", "0", "must be > 0 seconds"),
        ("train.reward_timeout", "-1", "must be > 0 seconds"),
        ("train.reward_timeout", "inf", "must be a finite number, got inf"),
    ],
)
def test_failure_thresholds_are_checked(base: list[str], flag: str, value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"^--{re.escape(flag)}: {re.escape(why)}$"):
        load_config([*base, f"--{flag}", value])
    assert (load_config(base).train.max_reward_failures, load_config(base).train.max_skipped_updates) == (0.5, 3)


def test_the_any_game_cpu_recipe_loads_for_other_games_where_the_demos_is_refused(tmp_path, monkeypatch) -> None:
    """recipes/any/tiny-cpu.yaml: the demo's training settings for any game (issue 65); the DoND recipe's renderings
    are refused for another game, naming the flag, rather than accepted silently."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    monkeypatch.syspath_prepend(str(examples))
    root = examples.parent
    models = ["--role1.pretrain", "x", "--role2.pretrain", "x"]
    for game in ("split_coins:SplitCoins", "textarena:TicTacToe-v0"):
        cfg = load_config(
            ["--config", str(root / "recipes/any/tiny-cpu.yaml"), "--env.name", game, *models], assumed=[]
        )
        demo = load_config(["--config", str(root / "recipes/dond/tiny-cpu.yaml"), *models], assumed=[])
        assert (cfg.env.name, cfg.train.max_epochs, cfg.roles[1].update_every) == (game, 2, 2)
        assert [r.lr for r in cfg.roles] == [r.lr for r in demo.roles] and cfg.rollout.max_len == 2048
        with pytest.raises(ConfigError, match=r"^--env\.(prompt_style|bot_speech|show_complement): is for the "):
            load_config(["--config", str(root / "recipes/dond/tiny-cpu.yaml"), "--env.name", game, *models], assumed=[])
