"""The IB-RL trainer (paper Algorithm 1). :meth:`IBRLTrainer.iteration` is one iteration, top to bottom.

Exact resume: everything random on the driver is drawn from streams keyed by (seed, stream, iteration)
(:meth:`IBRLTrainer._rng`), the rollout engines sample with per-call seeds and each update reseeds the
actors, so iteration k depends only on the committed state before it: ``trainer_state.json``, the commit
record (:mod:`marti_ibrl.commit`), written atomically after every role's DeepSpeed checkpoint of that iteration;
on resume each role's DeepSpeed ``latest`` is pinned to the committed tag, so a checkpoint written half-way
(killed during a save) is never picked up.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean

import ray
from tqdm import tqdm

from marti_ibrl.algorithm import ablations
from marti_ibrl.algorithm.advantages import GroupSpread, group_key, group_spread, members, penalized_attempts
from marti_ibrl.algorithm.batching import RankSplit
from marti_ibrl.algorithm.pool import (
    BOTH,
    OpponentPool,
    Pairing,
    Snapshot,
    configurations,
    pairings,
    sample_configuration,
)
from marti_ibrl.algorithm.schedule import roles_due
from marti_ibrl.backend.args import engine_kind
from marti_ibrl.backend.cluster import init_ray, kill_actors, wait_for_cluster
from marti_ibrl.backend.finite import NonFiniteError
from marti_ibrl.backend.nodes import NodeLostError, NodeWatch, loss_message
from marti_ibrl.backend.stack import RoleStack, start_engines
from marti_ibrl.colocate import (
    CPU_EFFECT,
    Hybrid,
    device_memory_gib,
    placement_groups,
    sleep_summary,
    updates_together,
)
from marti_ibrl.commit import (
    STATE_FILE,
    Commit,
    RunDirError,
    clear_run,
    drop_rollouts,
    file_manifest,
    open_run_dir,
    pin_deepspeed_latest,
    read_rollout,
    write_rollout,
)
from marti_ibrl.config import Config, ConfigError, RoleConfig, to_yaml
from marti_ibrl.device import check_device_dtype, resolve_device
from marti_ibrl.envs import make_env
from marti_ibrl.outputs import OutputInUse, OutputLock, repair_jsonl
from marti_ibrl.phases import PHASES_FILE, PhaseLog
from marti_ibrl.placement import colocated, frozen_checkpoints, shares_engines, uses_pool
from marti_ibrl.progress import bar as progress_bar
from marti_ibrl.rewards import RoleRewards
from marti_ibrl.rollout import transcripts
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.rollout.render import role_experience
from marti_ibrl.rollout.runner import DialogueRunner, Policy, first_turns_overflowing
from marti_ibrl.topology import topology, write_topology

SYNC_CHECKS_FILE = "sync_checks.jsonl"  # --train.check_sync
APPEND_ONLY = (SYNC_CHECKS_FILE, PHASES_FILE, transcripts.TRANSCRIPTS_FILE)
"""The run's JSONL logs, appended as it goes (marti_ibrl.outputs.repair_jsonl before a run appends to them)."""


@dataclass
class Play:
    """One scenario as played in one pairing of Eq. 6: every seat's policy and the roles whose groups it feeds."""

    scenario: tuple[str, object]
    index: int  # the scenario's position in the batch (its seat rotation)
    policies: dict[str, Policy]
    learners: tuple[str, ...]
    pass_: int = 0  # the rollout pass (DialogueRunner.run): 0 for a pairing of current policies, then 1, 2, ...


@dataclass
class Rollout:
    """Iteration k's joint rollout (Alg. 1 lines 3-5): made by :meth:`IBRLTrainer.prepare` and
    :meth:`~IBRLTrainer.generate`, learnt from by :meth:`~IBRLTrainer.learn`. Under ``--train.async_rollout`` the
    rollout of k+1 is made while k learns, and the commit record of k holds it (:mod:`marti_ibrl.commit`)."""

    k: int
    scenarios: list[tuple[str, object]]
    configuration: str  # Eq. 6
    schedule: list[str]  # the roles due at k (§4.2)
    opponents: dict  # the rollout log's "opponents" and "pairings"
    versions: dict[str, int]  # each trained role's update count when seated: the version that generates
    plays: list[Play] | None = None  # (engine handles: dropped once generated)
    seconds: dict[str, float] = field(default_factory=dict)  # timing/sample, opponents, rollout
    trajectories: list[Trajectory] | None = None
    span: tuple[float, float] | None = None  # the generation's start and end (time.monotonic)


class ScenarioSampler:
    """Scenarios q for each iteration: a seeded shuffle of the training set, epoch after epoch."""

    def __init__(self, scenarios: Sequence[tuple[str, object]], seed: int):
        self.scenarios = list(scenarios)
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffled()

    def _shuffled(self) -> list[int]:
        order = list(range(len(self.scenarios)))
        random.Random(f"{self.seed}/{self.epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[tuple[str, object]]:
        out = []
        while len(out) < n:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffled()
            out.append(self.scenarios[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffled()


def report_reward_failures(k: int, trajectories: Sequence[Trajectory], roles: Sequence[str]) -> None:
    """One console line per role with dialogues whose reward could not be computed (left out of its groups)."""
    for r in roles:
        reasons = [t.reward_failures[r] for t in trajectories if r in t.reward_failures]
        if reasons:
            tqdm.write(
                f"iteration {k}: {len(reasons)} of {len(trajectories)} dialogues have no {r} reward and are left out "
                f"of its groups (first reason: {reasons[0]})"
            )


class TrainingStopped(RuntimeError):
    """The run stopped before the iteration named in the message trained or was saved; the last commit (the previous
    save) is intact and ``--ckpt.load_enable true`` resumes from it."""


def check_reward_failures(k: int, trajectories: Sequence[Trajectory], roles: Sequence[str], limit: float) -> None:
    """:class:`TrainingStopped` when more than ``limit`` (``--train.max_reward_failures``) of iteration k's dialogues
    have no reward for one of ``roles`` (the trained roles), naming the role, the reasons by kind and the first."""
    for r in roles:
        reasons = [t.reward_failures[r] for t in trajectories if r in t.reward_failures]
        if trajectories and len(reasons) / len(trajectories) > limit:
            kinds = Counter(reason.split(":")[0] for reason in reasons)
            raise TrainingStopped(
                f"--train.max_reward_failures {limit:g}: iteration {k}: {len(reasons)} of {len(trajectories)} dialogues "
                f"have no {r} reward ({', '.join(f'{n} {kind}' for kind, n in kinds.most_common())}; first: "
                f"{reasons[0]}); stopped before iteration {k} trained or saved anything"
            )


def stepped(status: dict) -> bool:
    """Whether a role's update moved its weights: some optimizer step of it was not skipped for a NaN/inf loss or
    gradient (``update/steps`` > ``update/skipped``, from :meth:`RolePolicyActorBase.fit`)."""
    return status.get("update/steps", 1.0) > status.get("update/skipped", 0.0)


def count_skipped_updates(k: int, status: dict[str, dict], in_a_row: dict[str, int], limit: int) -> None:
    """Per updated role: a console line when optimizer steps of its update were skipped (a NaN/inf loss or gradient;
    the weights did not move for them), and ``in_a_row[role]`` counted; :class:`TrainingStopped` when it reaches
    ``limit`` (``--train.max_skipped_updates``), before the iteration is saved."""
    for r, s in status.items():
        skipped = int(s.get("update/skipped", 0))
        in_a_row[r] = in_a_row.get(r, 0) + 1 if skipped else 0
        if not skipped:
            continue
        tqdm.write(
            f"iteration {k}: {r}: {skipped} of {int(s['update/steps'])} optimizer steps skipped for a NaN/inf loss or "
            f"gradient norm (weights unchanged by them; {in_a_row[r]} update(s) in a row)"
        )
        if in_a_row[r] >= limit:
            raise TrainingStopped(
                f"--train.max_skipped_updates {limit}: {r}'s last {in_a_row[r]} updates (to iteration {k}) had optimizer "
                f"steps skipped for a NaN/inf loss or gradient norm; stopped before iteration {k} was saved (lower its "
                "--roleN.lr, check its rewards)"
            )


@contextmanager
def startup_stage(what: str, quiet: bool = False):
    """One console line per start-up stage, with its seconds, as it ends (a job file shows where the first minute
    went: Ray, each role's processes, model loading, the first weight sync)."""
    start = time.perf_counter()
    yield
    if not quiet:
        print(f"[start-up] {what}: {time.perf_counter() - start:.1f}s", flush=True)


def warn_uninformative(
    k: int, spreads: dict[str, GroupSpread], in_a_row: dict[str, int], warned: set[str], limit: int
) -> None:
    """Per role due at k (``spreads``: its groups, :func:`marti_ibrl.algorithm.advantages.group_spread`): count its
    due iterations in a row with no informative group in ``in_a_row`` and, when that reaches ``limit``
    (``--train.warn_uninformative``; 0 never), warn once per run in one console line naming the role and the likely
    cause (``warned`` remembers who was warned)."""
    for r, spread in spreads.items():
        in_a_row[r] = 0 if spread.informative else in_a_row.get(r, 0) + 1
        if limit and in_a_row[r] >= limit and r not in warned:
            warned.add(r)
            tqdm.write(
                f"iteration {k}: warning: {r} has had no informative update for {in_a_row[r]} iterations in a row "
                f"(every advantage 0: {spread.cause}); it learns nothing from its rewards until its groups differ "
                "(docs/troubleshooting.md)"
            )


def snapshot_loads(plays: Sequence[Play]) -> dict[int, dict[str, str]]:
    """Per rollout pass, the snapshot file each role's engines must hold for it (:attr:`Policy.weights`: a colocated
    role's pool snapshot served by its own engines); empty when no play needs one."""
    loads: dict[int, dict[str, str]] = {}
    for play in plays:
        for role, policy in play.policies.items():
            if policy.weights is not None:
                loads.setdefault(play.pass_, {})[role] = policy.weights
    return loads


def role_samples(scored: Sequence[tuple[Trajectory, float]], role: str, max_len: int) -> list:
    """The role's OpenRLHF experiences: its own rendering and mask m_i, its training reward, group (role, q)."""
    samples = []
    for t, reward in scored:
        exp = role_experience(t.views[role], max_len, reward=reward, label=t.scenario_uid)
        exp.group_ids = [group_key(role, t.scenario_uid)]
        samples.append(exp)
    return samples


def training_scenarios(cfg: Config) -> tuple:
    """The environment and its training scenarios; a ConfigError naming ``--env.data`` (or ``--env.num_scenarios``)
    when the scenario file does not parse or there is nothing to train on."""
    try:
        env, scenarios = make_env(cfg.env, cfg.train.seed)
    except ValueError as e:  # the env's loaders name the file and line (UnicodeDecodeError: a binary file)
        if cfg.env.data is None:
            raise
        why = f"{cfg.env.data} is not a text file ({e.reason})" if isinstance(e, UnicodeDecodeError) else str(e)
        raise ConfigError(why if why.startswith("--env.data") else f"--env.data: {why}") from None
    if not scenarios:
        flag = f"--env.data: {cfg.env.data} holds" if cfg.env.data else "--env.num_scenarios: gives"
        raise ConfigError(f"{flag} no training scenarios")
    return env, scenarios


PROMPT_CHECK_SCENARIOS = 8
"""Training scenarios whose first prompts :func:`check_first_turns_fit` renders before Ray starts (cheap)."""


def check_first_turns_fit(cfg: Config, env, scenarios: Sequence[tuple[str, object]]) -> None:
    """A ConfigError naming ``--rollout.max_len`` when the first prompt of some role (its system prompt, before
    any turn) leaves no room for ``--rollout.max_new_tokens`` on one of the first :data:`PROMPT_CHECK_SCENARIOS`
    training scenarios. Such dialogues end as ``context_limit`` before anyone speaks (the runner's rule,
    :func:`marti_ibrl.rollout.runner.context_full`); prompts too long for the cap would lose most of the run.
    Every engine-served policy is checked with its own tokenizer: trained roles' and frozen checkpoints'."""
    paths = {r.name: ([] if r.frozen else [r.pretrain]) + frozen_checkpoints(r) for r in cfg.roles}
    flags = {
        p: f"--role{i}.{'frozen' if r.frozen else 'pretrain'}"
        for i, r in enumerate(cfg.roles, 1)
        for p in paths[r.name]
    }
    loaded = {p: checkpoint_tokenizer(p, flags[p]) for p in {p for ps in paths.values() for p in ps}}
    tokenizers = {role: [loaded[p] for p in ps] for role, ps in paths.items()}
    max_new, max_len = cfg.rollout.max_new_tokens, cfg.rollout.max_len
    over = first_turns_overflowing(env, scenarios[:PROMPT_CHECK_SCENARIOS], tokenizers, max_new, max_len)
    if over:
        uid, role, n = max(over, key=lambda x: x[2])
        raise ConfigError(
            f"--rollout.max_len: {max_len} leaves no room for a first turn: {role}'s prompt for scenario {uid} is "
            f"{n} tokens before --rollout.max_new_tokens {max_new} (prompts of {len({u for u, _, _ in over})} of the "
            f"first {min(len(scenarios), PROMPT_CHECK_SCENARIOS)} scenarios do not fit); "
            f"need --rollout.max_len >= {n + max_new}"
        )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def checkpoint_tokenizer(path: str, flag: str):
    """The tokenizer of the HF checkpoint ``path`` (given by ``flag``); a ConfigError naming the flag when ``path`` is
    no checkpoint (no ``config.json``) or its tokenizer does not load, before Ray or DeepSpeed would find out."""
    from transformers import AutoTokenizer

    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"{flag}: {path} is not a Hugging Face checkpoint (no config.json in it)")
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):  # transformers would make an empty one
        raise ConfigError(f"{flag}: {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:  # e.g. a slow tokenizer without sentencepiece / tiktoken installed
        why = " ".join(str(e).split())
        raise ConfigError(f"{flag}: the tokenizer of {path} does not load: {why[:300]}") from None
    if not tokenizer.chat_template:
        raise ConfigError(f"{flag}: the tokenizer of {path} has no chat template (every turn is rendered with it)")
    return tokenizer


class Timer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self.seconds[f"timing/{name}"] = time.perf_counter() - start


class IBRLTrainer:
    """One IB-RL run: :meth:`fit` runs iterations ``start_iteration..train.iterations`` (:meth:`iteration`), saving
    and committing as it goes. Start-up, in the order of the steps below: the run directory and its commit record
    (:mod:`marti_ibrl.commit`), every role's processes (Ray, DeepSpeed ranks, engines), the rollout (rewards,
    runner), the opponent pools, then the committed state when resuming."""

    run_lock: OutputLock | None = None  # held from the run directory's checks to the end of fit() or close()

    def __init__(self, cfg: Config):
        cfg = copy.deepcopy(cfg)  # the caller's config is never modified
        self.ablation = ablations.get(cfg.ablation)  # Table 3; its config changes are load_config's
        _, pending = self.ablation.resolve(cfg)
        if pending:  # a config built by hand, not by load_config: refused rather than run half-ablated
            raise ConfigError(
                f"--ablation {cfg.ablation} is not applied to this config ({'; '.join(pending)}): "
                "make it with marti_ibrl.config.load_config or ablations.resolve"
            )
        self.cfg = cfg
        device = resolve_device(cfg.train.device)  # ConfigErrors come before anything is written or started
        check_device_dtype(cfg.ds.param_dtype, device)
        self.env, scenarios = training_scenarios(cfg)
        check_first_turns_fit(cfg, self.env, scenarios)
        self.roles = [r.name for r in cfg.roles]  # every seat
        self.trained = [r.name for r in cfg.roles if not r.frozen]
        self.sampler = ScenarioSampler(scenarios, cfg.train.seed)
        commit = self._open_run_dir()
        try:
            self._start_processes(device, commit)
            self._start_rollout()
            self._start_pools()
        except BaseException:
            self.release_run_dir()  # a start that failed leaves the run directory free for the next attempt
            raise
        self.updates = {r: 0 for r in self.trained}  # each role's update count (schedule, snapshot versions)
        self.skipped_in_a_row: dict[str, int] = {}  # per role: its latest updates with NaN/inf steps skipped
        self.uninformative_in_a_row: dict[str, int] = {}  # per role: its latest due iterations with every Â = 0
        self.warned_uninformative: set[str] = set()
        self.start_iteration = 1
        self.history: list[dict] = []
        self.rollout_log: list[dict] = []  # per iteration: configuration, opponents, scenario order
        # --train.async_rollout: the next iteration's rollout (in flight, or made) and the thread that makes it
        self.ahead: Future | Rollout | None = None
        self.learn_span: tuple[float, float] | None = None  # the last learn's experiences and updates (overlap)
        self.rollouts = ThreadPoolExecutor(1, thread_name_prefix="rollout") if cfg.train.async_rollout else None
        if commit is not None:
            self._resume(commit)
        self.logger = self._make_logger()

    def _open_run_dir(self) -> Commit | None:
        """``--ckpt.path`` with the run's config; its last commit when resuming (``--ckpt.load_enable``). A directory
        that holds a run is refused unless resumed or ``--ckpt.overwrite`` (:func:`marti_ibrl.commit.open_run_dir`)."""
        cfg = self.cfg
        self.run_dir = Path(cfg.ckpt.path)
        commit = open_run_dir(
            self.run_dir, resume=cfg.ckpt.load_enable, overwrite=cfg.ckpt.overwrite, seed=cfg.train.seed
        )  # before anything is written: a refused start leaves the directory as it was
        if commit is not None and commit.ahead is not None and not cfg.train.async_rollout:
            raise RunDirError(
                f"--train.async_rollout: {self.run_dir} was trained with it and its commit holds the rollout of "
                f"iteration {commit.ahead['iteration']}, made before the commit: resume with --train.async_rollout true"
            )
        try:  # one writer per run directory (docs/reliability.md): a second run on it refuses, naming the first
            self.run_lock = OutputLock(self.run_dir, "--ckpt.path").acquire(wait=cfg.ckpt.lock_wait)
        except OutputInUse as e:
            raise RunDirError(str(e)) from None
        except OSError as e:
            raise RunDirError(f"--ckpt.path: {self.run_dir}: {e.strerror or e}") from None
        if commit is None and cfg.ckpt.load_enable:  # nothing committed: never load a half-written checkpoint
            print(f"--ckpt.load_enable: no {STATE_FILE} in {self.run_dir}, starting from iteration 1")
            cfg.ckpt.load_enable = False
        if cfg.ckpt.overwrite:
            deleted, kept = clear_run(self.run_dir, self.roles)
            if deleted:
                left = f"; left as they were: {', '.join(kept)}" if kept else ""
                print(f"--ckpt.overwrite: deleted the run in {self.run_dir} ({', '.join(deleted)}){left}", flush=True)
            cfg.ckpt.overwrite = False  # done: RUN/config.yaml reused as a --config must not delete this run
        for name in APPEND_ONLY:  # a line torn by a crash moved aside
            if said := repair_jsonl(self.run_dir / name):
                print(said, flush=True)
        if commit is None:  # transcripts of a run stopped before its first commit: its iterations are played anew
            transcripts.keep_until(self.run_dir, 0)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
        except OSError as e:
            raise RunDirError(f"--ckpt.path: {self.run_dir}: {e.strerror or e}") from None
        return commit

    def _start_processes(self, device: str, commit: Commit | None) -> None:
        """Ray, every trained role's stack (DeepSpeed ranks, reference, engines), the frozen roles' counterparts;
        ``RUN/topology.json``; the actors' models (loaded from the committed tag when resuming), then the engines
        synced to them."""
        cfg = self.cfg
        if cfg.ray.address:  # a cluster that does not answer: one line after --ray.connect_timeout, not Ray's retries
            wait_for_cluster(cfg.ray.address, cfg.ray.connect_timeout)
        with startup_stage(f"Ray ({cfg.ray.address or 'a local cluster'})"):
            init_ray(cfg, device)
        self.stacks = {}
        groups = placement_groups(cfg)  # --train.colocate role|all: the GPUs a role's processes share
        for r in cfg.roles:
            if not r.frozen:  # --rollout.share_engines: the first role's engines serve every LoRA role's adapters
                shared = next(iter(self.stacks.values())).engines if shares_engines(cfg, r) else None
                with startup_stage(f"{r.name}: engines and DeepSpeed rank processes placed"):
                    self.stacks[r.name] = RoleStack.start(cfg, r, device, engines=shared, shared_pg=groups.get(r.name))
        with startup_stage("frozen counterparts", quiet=not any(r.frozen for r in cfg.roles)):
            self.frozen = {r.name: self._frozen_policies(r, device) for r in cfg.roles if r.frozen}
        self.topology = topology(  # what actually runs: ranks, ZeRO stage, engines, reference, weight sync, nodes
            cfg,
            self.stacks,
            self.frozen,
            device,
            ray.nodes(),
            engine_kind(cfg.rollout.engine, device),
            placed={r: s.node_ids() for r, s in self.stacks.items()},  # which node each process runs on
        )
        kind = engine_kind(cfg.rollout.engine, device)
        self.topology["colocate"] = {"mode": cfg.train.colocate, "sleep": sleep_summary(cfg, device, kind)}
        write_topology(self.run_dir, self.topology)
        if commit is not None:
            actors = [Path(s.args.ckpt.path) / "_actor" for s in self.stacks.values()]
            pin_deepspeed_latest(self.run_dir, actors, commit.iteration)
        with startup_stage("models loaded: every role's DeepSpeed ranks and reference"):
            ray.get([ref for s in self.stacks.values() for ref in s.init_models(cfg.train.iterations)])
        # every phase change from here on: RUN/phases.jsonl (marti_ibrl/colocate.py)
        effect = CPU_EFFECT if colocated(cfg) and device != "cuda" else None
        together = updates_together(cfg, device_memory_gib(self.stacks) if device == "cuda" else None)
        self.hybrid = Hybrid(cfg, self.stacks, PhaseLog(self.run_dir, effect=effect), together)
        self.hybrid.record_start()
        # engines start from the actor's weights (as loaded, in its dtype), exactly as after any update
        updates = commit.updates if commit is not None else {}
        with startup_stage("engines synced to the actors' weights"):
            self.hybrid.sync(0, list(self.stacks), lambda r: self.stacks[r].sync_engines_async(updates.get(r, 0)))

    def _start_rollout(self) -> None:
        """R_i per role (rule, LLM judge or a user function) and the dialogue runner."""
        cfg = self.cfg
        self.rewards = RoleRewards(cfg, self.env)
        sampling = {
            "temperature": cfg.rollout.temperature,
            "top_p": cfg.rollout.top_p,
            "max_new_tokens": cfg.rollout.max_new_tokens,
        }
        self.runner = DialogueRunner(
            self.env,
            self.rewards.fns,
            sampling,
            cfg.rollout.max_len,
            cfg.env.max_resamples,
            reward_workers=max(4, cfg.judge.max_concurrency) if self.rewards.judges else 4,
        )

    def _start_pools(self) -> None:
        """Each trained role's opponent pool (Eq. 6), when pools are on."""
        cfg = self.cfg
        self.pools = {}
        if uses_pool(cfg):
            self.pools = {
                r: OpponentPool(
                    self.run_dir / "pool", r, cfg.pool.size, cfg.pool.eviction, adapters=self.stacks[r].lora
                )
                for r in self.trained
            }
        self.pool_loaded: dict[str, int] = {}  # role -> snapshot version its pool engines hold
        self.pending_snapshots: list[tuple[str, int, int, list]] = []  # (role, version, iteration, refs)
        self.committed_pool_files: dict[str, set[str]] = {r: set() for r in self.pools}

    def _rng(self, stream: str, k: int) -> random.Random:
        """The random stream ``stream`` of iteration k: a function of (seed, stream, k) only (exact resume)."""
        return random.Random(f"{self.cfg.train.seed}/{stream}/{k}")

    def _seed(self, stream: str, k: int) -> int:
        return self._rng(stream, k).getrandbits(31)

    def _frozen_policies(self, role: RoleConfig, device: str) -> list[Policy]:
        """A frozen role's counterparts (unilateral baselines): engines for checkpoints, text players otherwise."""
        from transformers import AutoTokenizer

        from marti_ibrl.rollout.players import make_player, parse_player_spec

        policies = []
        for i, spec in enumerate(role.frozen):
            parsed = parse_player_spec(spec)
            if parsed["kind"] == "checkpoint":
                seed = self.cfg.train.seed + 7000 + 100 * i
                engines = start_engines(self.cfg, role, parsed["path"], seed, device, role.num_engines)
                policies.append(Policy(f"frozen:{spec}", engines, AutoTokenizer.from_pretrained(parsed["path"])))
            else:
                if parsed["kind"] == "endpoint":
                    parsed["sampling"] = {
                        "temperature": self.cfg.rollout.temperature,
                        "top_p": self.cfg.rollout.top_p,
                        "max_new_tokens": self.cfg.rollout.max_new_tokens,
                    }
                elif parsed["kind"] == "bot":
                    parsed["seed"] = self.cfg.train.seed
                policies.append(Policy(f"frozen:{spec}", player=make_player(parsed)))
        assert len(frozen_checkpoints(role)) == sum(bool(p.engines) for p in policies)
        return policies

    # -- the iteration ------------------------------------------------------------------------------------------

    def iteration(self, k: int) -> dict[str, float]:
        """IB-RL iteration k (Alg. 1, lines 3-13): its joint rollout, then what each role learns from it."""
        return self.learn(k, self.generate(self.prepare(k)))

    def prepare(self, k: int) -> Rollout:
        """Alg. 1 lines 3-4: iteration k's scenarios q, Eq. 6's configuration, the roles due (§4.2) and who plays each
        seat, as the pools and update counts stand now (the policies' versions: the data's staleness later)."""
        cfg, timer = self.cfg, Timer()
        with timer("sample"):  # scenarios q and the opponent configuration of Eq. 6
            scenarios = self.sampler.next_batch(cfg.rollout.batch_size)
            configuration = self.sample_configuration(k)
            schedule = roles_due(k, {r.name: r.update_every for r in cfg.roles if not r.frozen})  # u_i(k), §4.2
        with timer("opponents"):  # per Eq. 6 pairing, who plays each seat: current, pool snapshot, frozen counterpart
            plays, opponents = self.seat_policies(k, configuration, scenarios, due=schedule)
        return Rollout(k, scenarios, configuration, schedule, opponents, dict(self.updates), plays, timer.seconds)

    def generate(self, rollout: Rollout) -> Rollout:
        """Alg. 1 line 5: the shared trajectories of ``rollout``'s plays, each role's rewards R_i(τ) scored as its
        dialogues finish (colocated: the engines awake). Thread-safe with :meth:`learn` (``--train.async_rollout``
        runs it beside the previous iteration's updates)."""
        cfg, k, plays = self.cfg, rollout.k, rollout.plays
        start = time.monotonic()
        with self.hybrid.generation(k):
            loads = snapshot_loads(plays)  # colocated: pool snapshots its own engines serve, per pass
            trajectories = self.runner.run(
                [p.scenario for p in plays],
                cfg.rollout.n_samples_per_prompt,
                [p.policies for p in plays],
                progress=True,
                seed=self._seed("rollout", k),
                rotation=[p.index for p in plays],  # both pairings of a scenario alternate openers alike
                passes=[p.pass_ for p in plays],  # each pairing batched and seeded apart: one after the other ...
                before_pass=(lambda n: self.hybrid.load_snapshots(k, loads.get(n, {}))) if loads else None,
            )  # ... when its snapshots are loaded into engines that serve current policies too
        g = cfg.rollout.n_samples_per_prompt
        for i, t in enumerate(trajectories):  # (request order: play by play, G samples each)
            t.learners = plays[i // g].learners
        rollout.span = (start, time.monotonic())
        rollout.seconds["timing/rollout"] = rollout.span[1] - start
        rollout.trajectories, rollout.plays = trajectories, None  # (plays hold engine handles: not kept)
        return rollout

    def learn(self, k: int, rollout: Rollout, before_sync=None) -> dict[str, float]:
        """Alg. 1 lines 6-13 on ``rollout``: memberships and rewards (Eq. 4), each due role's experiences and update
        (Eq. 5), the weight syncs of the roles that moved (after ``before_sync()``: the engines' rollout in flight)
        and their pool snapshots."""
        cfg, timer = self.cfg, Timer()
        timer.seconds.update(rollout.seconds)
        trajectories, configuration, schedule = rollout.trajectories, rollout.configuration, rollout.schedule
        start = time.monotonic()
        with timer("snapshot_wait"):  # the previous iteration's exports ran alongside the rollout
            self.finish_snapshots()
        scored = self.training_rewards(trajectories)  # Eq. 4 membership; R_i (or an ablation's reward)
        report_reward_failures(k, trajectories, self.roles)  # e.g. a failed judgement: out of that role's groups
        check_reward_failures(k, trajectories, self.trained, cfg.train.max_reward_failures)
        learning = [r for r in schedule if scored[r]]  # due, and with group members: something to learn from
        spreads = {r: group_spread(scored[r]) for r in self.trained}  # groups whose rewards differ: Â ≠ 0 somewhere
        warn_uninformative(
            k,
            {r: spreads[r] for r in learning},
            self.uninformative_in_a_row,
            self.warned_uninformative,
            cfg.train.warn_uninformative,
        )
        with timer("experience"), ThreadPoolExecutor(max(1, len(learning))) as pool:  # per-role masks m_i, Eq. 4
            precomputed = self.ablation.joint_baseline  # advantages already made over every role (Table 3)
            samples = {r: role_samples(scored[r], r, cfg.rollout.max_len) for r in learning}
            with self.hybrid.log.phases([(k, r, "actor", "experience") for r in learning]):  # π, π_ref log-probs
                built = pool.map(lambda r: self.stacks[r].make_experiences(samples[r], precomputed), learning)
                experiences = dict(zip(learning, built))
        with timer("update"):  # Eq. 5, each role's own optimizer; roles that are not due do not step
            # every sample once per epoch on one rank; zero-weight padding fills the ranks' micro-batches;
            # colocated: each role's DeepSpeed states reloaded for its update and offloaded after it
            status, splits = self.hybrid.update(
                k, learning, lambda r: self.stacks[r].fit_async(experiences[r], seed=self._seed(f"update/{r}", k))
            )
            count_skipped_updates(k, status, self.skipped_in_a_row, cfg.train.max_skipped_updates)
            updated = [r for r in status if stepped(status[r])]  # the roles whose weights moved
        self.learn_span = (start, time.monotonic())
        if updated and before_sync is not None:
            with timer("async_wait"):  # the engines finish the rollout in flight on the weights it started with
                before_sync()
        with timer("weight_sync"):  # only updated roles re-sync their engines (a LoRA role: its adapter only)
            results = self.hybrid.sync(k, updated, lambda r: self.stacks[r].sync_engines_async(self.updates[r] + 1))
            synced = {r: next((x for x in rs if x), None) for r, rs in results.items()}
        for r in updated:
            self.updates[r] += 1
        with timer("snapshot"):  # Alg. 1 line 13: exports start now and overlap the next rollout
            self.start_snapshots(k, updated)
        self.rollout_log.append(
            {
                "iteration": k,
                "configuration": configuration,
                **rollout.opponents,  # "opponents" (every policy in each role's seat) and "pairings"
                "scenarios": [u for u, _ in rollout.scenarios],
            }
        )
        made = {r: len(scored[r]) for r in self.trained}
        metrics = self._metrics(k, trajectories, experiences, status, timer, configuration, schedule, made, splits)
        for r in self.trained:  # of the samples made, the penalised re-sampled attempts (the rest: its dialogues)
            metrics[f"{r}/samples_penalized"] = float(sum(1 for t, _ in scored[r] if t.outcome.info.get("attempt")))
        for r, spread in spreads.items():
            metrics[f"{r}/groups"], metrics[f"{r}/informative_groups"] = float(spread.groups), float(spread.informative)
        self.keep_transcripts(k, trajectories)
        for r, info in synced.items():  # what an adapter-only sync moved (full-weight syncs report nothing)
            if info:
                metrics[f"{r}/sync/bytes"], metrics[f"{r}/sync/seconds"] = float(info["bytes"]), info["seconds"]
        return metrics

    def keep_transcripts(self, k: int, trajectories: Sequence[Trajectory]) -> None:
        """``--logger.transcripts``: a seeded sample of iteration k's dialogues, on disk before k+1 starts
        (:mod:`marti_ibrl.rollout.transcripts`); shown in the logger's text tab."""
        kept = transcripts.sample(trajectories, self.cfg.logger.transcripts, self._rng("transcripts", k))
        records = [transcripts.transcript_record(k, t) for t in kept]
        transcripts.append(self.run_dir, records)
        if records and getattr(self, "logger", None) is not None:
            text = "\n\n".join(f"```\n{transcripts.format_dialogue(r)}\n```" for r in records)
            rewards = [x for r in records for x in r["rewards"].values()]
            self.logger.log_train(k, {"generated_samples": (text, mean(rewards) if rewards else 0.0)})

    # -- --train.async_rollout: the rollout of k+1 beside the updates of k ------------------------------------

    def async_iteration(self, k: int) -> dict[str, float]:
        """Iteration k under ``--train.async_rollout``: it learns from the rollout made while k-1 learned (made now
        for the first iteration; after a resume, the one the commit record holds) while the rollout of k+1 runs on
        the engines' weights: started before k's updates (``max_staleness`` 1; k's weight syncs wait for it) or
        after k's syncs (0: on-policy, the synchronous run exactly). ``ROLE/async/staleness``: how many of its own
        updates the role's policy had taken since the one that generated k's data; ``async/overlap_seconds``: how
        much of that generation ran while k-1 learned."""
        cfg, wait = self.cfg, Timer()
        with wait("rollout_wait"):
            rollout = self.finish_ahead() or self.generate(self.prepare(k))
        self.ahead = None
        stale = {r: self.updates[r] - rollout.versions.get(r, self.updates[r]) for r in self.trained}
        if max(stale.values(), default=0) > cfg.train.max_staleness:  # (by construction never: one in flight)
            raise RuntimeError(f"iteration {k}: samples {stale} updates old, over --train.max_staleness")
        overlap = 0.0
        if self.learn_span is not None and rollout.span is not None:
            overlap = max(0.0, min(rollout.span[1], self.learn_span[1]) - max(rollout.span[0], self.learn_span[0]))
        ahead = k < cfg.train.iterations
        if ahead and cfg.train.max_staleness >= 1:
            self.ahead = self.rollouts.submit(self.generate, self.prepare(k + 1))
        metrics = self.learn(k, rollout, before_sync=self.finish_ahead)
        if ahead and cfg.train.max_staleness == 0:
            self.ahead = self.rollouts.submit(self.generate, self.prepare(k + 1))
        metrics.update(wait.seconds)
        metrics["async/overlap_seconds"] = overlap
        metrics.update({f"{r}/async/staleness": float(s) for r, s in stale.items()})
        return metrics

    def finish_ahead(self) -> Rollout | None:
        """The rollout of the next iteration, once its engines are done with it (None when none was started)."""
        if isinstance(self.ahead, Future):
            self.ahead = self.ahead.result()
        return self.ahead

    def sample_configuration(self, k: int) -> str:
        """Eq. 6: ``both``, or the name of the role whose current policy faces the others' history."""
        if not self.pools:
            return BOTH
        return sample_configuration(self._rng("configuration", k), self.roles, self.cfg.pool.probs)

    def seat_policies(
        self, k: int, configuration: str, scenarios, due: Sequence[str] | None = None
    ) -> tuple[list[Play], dict]:
        """The iteration's plays: every scenario once per pairing of ``configuration`` (Eq. 6,
        :func:`~marti_ibrl.algorithm.pool.pairings`), with the policy of every seat and the roles it feeds; and
        the log entry: every policy that played each role's seat, and each pairing's learners and seats.

        In a pairing, a trained role plays as its current policy, or, if the pairing takes it from history, as a
        snapshot sampled from its pool (one per role and iteration, strictly older than its current policy; a
        pool without one lends the current policy). When that leaves nothing historical, the iteration is played
        as one all-current pairing feeding every role. A frozen role's counterpart is sampled per scenario and
        pairing (pool-of-N).

        ``due`` (u_i(k) of §4.2, the roles that update at k): a pairing none of whose learners is due is not played,
        since its dialogues would feed no update (the user's pairing on the agent's off-iterations); when no role
        is due at all, every pairing is played, for the iteration's metrics.
        """
        if configuration != BOTH:
            self.finish_snapshots()  # the pools must hold every snapshot up to iteration k-1
        rng = self._rng("opponents", k)
        cast: list[tuple[Pairing, dict[str, Policy]]] = []
        chosen = pairings(configuration, self.trained)
        feeding_due = [p for p in chosen if due is not None and set(p.learners) & set(due)]
        if feeding_due:
            chosen = feeding_due
        for pairing in chosen:
            fixed = {r: self._historical(r, rng) if r in pairing.history else self._current(r) for r in self.stacks}
            cast.append((pairing, fixed))
        if all(p.name == "current" for p in cast[0][1].values()):  # no history to face: current play for all
            cast = [(Pairing(tuple(self.trained), ()), cast[0][1])]
        # passes: the pairings of current policies first (0), then each facing history (1, 2, ...)
        numbers = iter(range(1, len(cast) + 1))
        passes = [0 if not pairing.history else next(numbers) for pairing, _ in cast]
        plays = [
            Play(scenario, i, {**fixed, **{r: rng.choice(ps) for r, ps in self.frozen.items()}}, pairing.learners, n)
            for (pairing, fixed), n in zip(cast, passes)
            for i, scenario in enumerate(scenarios)
        ]
        opponents = {r: ",".join(sorted({p.policies[r].name for p in plays})) for r in self.roles}
        log = [
            {"learners": list(pairing.learners), "seats": {r: p.name for r, p in fixed.items()}}
            for pairing, fixed in cast
        ]
        for entry, (_, fixed) in zip(log, cast):  # LoRA roles: the adapter (LoRARequest) each seat was served with
            adapters = {r: p.adapter.name for r, p in fixed.items() if p.adapter is not None}
            if adapters:
                entry["adapters"] = adapters
        return plays, {"opponents": opponents, "pairings": log}

    def _current(self, role: str) -> Policy:
        stack = self.stacks[role]
        return Policy("current", stack.engines, stack.tokenizer, adapter=stack.adapter)

    def _historical(self, role: str, rng: random.Random) -> Policy:
        """π_θi^(<k) on the role's pool engines: a snapshot older than the current policy (else the current one)."""
        pool, stack = self.pools.get(role), self.stacks[role]
        try:
            snap = pool.sample(rng, older_than=self.updates[role]) if pool is not None else None
        except LookupError:  # nothing older than the current policy yet
            snap = None
        if snap is None:
            return self._current(role)
        if stack.lora:  # an adapter the role's current engines serve per request (loaded on first use)
            from marti_ibrl.lora import pool_adapter

            adapter = pool_adapter(role, stack.slot, snap.version, str(pool.path(snap)))
            return Policy(f"pool:{snap.version}", stack.engines, stack.tokenizer, adapter=adapter)
        if not stack.pool_engines:  # colocated: its own engines, loaded with the snapshot for the pass that plays it
            return Policy(f"pool:{snap.version}", stack.engines, stack.tokenizer, weights=str(pool.path(snap)))
        if self.pool_loaded.get(role) != snap.version:
            ray.get([e.load_weights_file.remote(str(pool.path(snap))) for e in stack.pool_engines])
            self.pool_loaded[role] = snap.version
        return Policy(f"pool:{snap.version}", stack.pool_engines, stack.tokenizer)

    def training_rewards(self, trajectories: Sequence[Trajectory]) -> dict[str, list[tuple[Trajectory, float]]]:
        """Per trained role, its group members (Eq. 4) and its penalised discarded attempts
        (:func:`~marti_ibrl.algorithm.advantages.penalized_attempts`), with the reward it optimises (R_i, or an
        ablation's)."""
        ablation, penalize = self.ablation, self.cfg.train.penalize_resamples
        scored = {}
        for r in self.trained:
            group = members(trajectories, r, ablation.rewards_needed(r, self.roles))
            if penalize:  # its discarded malformed attempts, each a sample of its own
                group += penalized_attempts(group, r, self.cfg.env.invalid_penalty)
            scored[r] = [(t, ablation.training_reward(t, r)) for t in group]
        if ablation.joint_baseline:
            flat = [(r, t.scenario_uid, x) for r in self.trained for t, x in scored[r]]
            shaped = iter(ablations.joint_normalized_advantages(flat))
            scored = {r: [(t, next(shaped)) for t, _ in scored[r]] for r in self.trained}
        return scored

    # -- opponent pools (Alg. 1 line 13) --------------------------------------------------------------------

    def start_snapshots(self, k: int, updated: Sequence[str]) -> None:
        """Start writing a snapshot of every updated role whose update count hits ``pool.snapshot_every``."""
        for r in updated:
            if r in self.pools and self.updates[r] % self.cfg.pool.snapshot_every == 0:
                version = self.updates[r]
                path = self.pools[r].path_for(version)
                path.parent.mkdir(parents=True, exist_ok=True)
                stack = self.stacks[r]
                export = stack.export_adapter_async if stack.lora else stack.export_weights_async
                self.pending_snapshots.append((r, version, k, export(str(path), self.cfg.pool.dtype)))

    def finish_snapshots(self) -> None:
        """Wait for started snapshots and add them to their pools (manifest on disk; evicted files collected)."""
        for r, version, k, refs in self.pending_snapshots:
            info = next(x for x in ray.get(refs) if x is not None)
            pool = self.pools[r]
            snap = Snapshot(r, version, k, pool.path_for(version).name, **info)
            pool.add(snap, self._rng(f"evict/{r}", k))
            pool.write_manifest()
            pool.gc(self.committed_pool_files[r])
        self.pending_snapshots = []

    def fit(self) -> list[dict]:
        """Run iterations ``start_iteration..train.iterations`` (Algorithm 1), committing every ``ckpt.save_steps``
        and at the end, and return every iteration's metrics (``history``: one dict per iteration, the keys of the
        iteration table and tensorboard, e.g. ``rollout/agreement``, ``ROLE/reward``; a resumed run's holds the
        committed iterations too). Raises :class:`TrainingStopped` (non-finite values past their limits) or
        ``NodeLostError`` (a Ray node lost), the last commit intact either way. Call :meth:`close` after it, also
        when it raised, to stop the processes (docs/python-api.md)."""
        cfg = self.cfg
        k = self.start_iteration
        # a lost Ray node stops the run with NodeLostError, naming the node
        watch = NodeWatch(self.topology["nodes"], describe=lambda lost: str(self._node_lost(lost, k)))
        try:
            try:
                self.check_sync(k - 1)  # (--train.check_sync) the start-up broadcast
                bar = progress_bar(range(self.start_iteration, cfg.train.iterations + 1), desc="IB-RL", unit="it")
                for k in bar:
                    start = time.perf_counter()
                    metrics = self.async_iteration(k) if cfg.train.async_rollout else self.iteration(k)
                    metrics["timing/iteration"] = time.perf_counter() - start  # wall time, whatever overlapped
                    self.check_sync(k)
                    self.history.append(metrics)
                    self.logger.log_train(k, metrics)
                    bar.set_postfix({f"{r}/reward": f"{metrics[f'{r}/reward']:.2f}" for r in self.roles})
                    if cfg.ckpt.save_steps > 0 and k % cfg.ckpt.save_steps == 0 and k < cfg.train.iterations:
                        self.save(k)
                self.save(cfg.train.iterations, final=True)
            except NonFiniteError as e:  # a role's actor refused (Ray wraps it): one line, not the actor's traceback
                raise TrainingStopped(f"iteration {k}: {getattr(e, 'cause', e)}") from None
            except ray.exceptions.RayError as e:  # a lost node's first sign is often an actor gone
                lost = watch.lost_error(e)  # (the watch's interrupt may land in here: the outer handler takes it)
                if not lost:
                    raise
                raise self._node_lost(lost, k) from e
        except KeyboardInterrupt:
            if not watch.lost:  # a real Ctrl-C
                raise
            raise self._node_lost(watch.lost, k) from None
        finally:
            watch.stop()
            if self.rollouts is not None:  # a rollout in flight when the run stopped is dropped, not waited for
                self.rollouts.shutdown(wait=False, cancel_futures=True)
            self.release_run_dir()
        self.logger.close()
        self.rewards.close()
        return self.history

    def release_run_dir(self) -> None:
        """Let another process write the run directory (:class:`marti_ibrl.outputs.OutputLock`)."""
        if self.run_lock is not None:
            self.run_lock.release()

    def close(self) -> None:
        """Kill the run's processes (every role's ranks and engines, the frozen counterparts' engines)."""
        self.release_run_dir()
        for stack in self.stacks.values():
            stack.kill()
        kill_actors(e for policies in self.frozen.values() for p in policies for e in p.engines)

    def _node_lost(self, lost: list[dict], k: int) -> NodeLostError:
        committed = getattr(Commit.read(self.run_dir), "iteration", 0)
        placed = {r: v.get("placed_on", {}) for r, v in self.topology["trained"].items()}
        return NodeLostError(loss_message(lost, placed, k, committed, str(self.run_dir)))

    def check_sync(self, k: int) -> None:
        """--train.check_sync: after iteration k (0: start-up) every trained role's engines hold its actor's
        weights and its pool engines the snapshot file they loaded; the digests go to ``RUN/sync_checks.jsonl``
        (a resumed run appends: the last line of an iteration is the committed run's). A mismatch stops the run."""
        if not self.cfg.train.check_sync:
            return
        from safetensors.torch import load_file

        from marti_ibrl.rollout.digest import params_digest

        self.hybrid.wake_for_reading(k, list(self.stacks))  # colocated engines asleep hold no weights to read
        for r, stack in self.stacks.items():
            if stack.lora:  # the adapter the actor trains vs the one its engines serve as the current policy
                record = {"iteration": k, "role": r, "actor": stack.adapter_digest()}
                record["engines"] = stack.engine_adapter_digests()
            else:
                record = {"iteration": k, "role": r, "actor": stack.weights_digest(), "engines": stack.engine_digests()}
            pool = self.pools.get(r) if not stack.lora else None
            snap = next((m for m in pool.members if m.version == self.pool_loaded.get(r)), None) if pool else None
            if snap is not None:  # (a snapshot evicted since it was loaded is not checked)
                record["pool_version"] = snap.version
                record["pool_file"] = params_digest(load_file(str(pool.path(snap))).items())
                record["pool_engines"] = stack.engine_digests(stack.pool_engines)
            with open(self.run_dir / SYNC_CHECKS_FILE, "a") as f:
                f.write(json.dumps(record) + "\n")
            wrong = [i for i, d in enumerate(record["engines"]) if d != record["actor"]]
            wrong_pool = [i for i, d in enumerate(record.get("pool_engines", [])) if d != record["pool_file"]]
            if wrong or wrong_pool:
                what = "start-up" if k == 0 else f"iteration {k}"
                raise RuntimeError(
                    f"--train.check_sync: after {what}, {r}'s engines {wrong} do not hold its actor's weights "
                    f"and its pool engines {wrong_pool} not pool snapshot v{record.get('pool_version')} "
                    f"(weight sync {self.topology['trained'][r]['weight_sync']}); digests in "
                    f"{self.run_dir / SYNC_CHECKS_FILE}"
                )

    # -- checkpoints, logs -----------------------------------------------------------------------------------

    def save(self, k: int, final: bool = False) -> None:
        """Every role's DeepSpeed checkpoint at tag ``global_step{k}``, then the commit record (atomic)."""
        self.finish_snapshots()
        tag = f"global_step{k}"
        refs = [ref for s in self.stacks.values() for ref in s.save_checkpoint_async(tag, {"ibrl_iteration": k})]
        if final:
            refs += [ref for s in self.stacks.values() for ref in s.save_hf_async()]
        ray.get(refs)
        steps = [self.run_dir / r / "ckpt" / "_actor" / tag for r in self.stacks]  # what a resume will load
        files = file_manifest(self.run_dir, [d for d in steps if d.is_dir()])
        ahead = self.finish_ahead()  # --train.async_rollout: k+1's rollout, made by weights gone after k's syncs
        entry = write_rollout(self.run_dir, ahead) if ahead is not None else None
        Commit(
            iteration=k,
            seed=self.cfg.train.seed,
            updates=self.updates,
            sampler=self.sampler.state_dict(),  # (k+1's scenarios drawn already when a rollout is ahead)
            pools={r: pool.manifest() for r, pool in self.pools.items()},
            history=self.history,
            rollout_log=self.rollout_log,
            ahead=entry,
            files=files,
        ).write(self.run_dir)  # atomic: a half-written record is never picked up
        drop_rollouts(self.run_dir, keep=entry and entry["file"])
        for r, pool in self.pools.items():
            self.committed_pool_files[r] = {m.file for m in pool.members}
            pool.gc(set())

    def _resume(self, commit: Commit) -> None:
        """Continue after the committed iteration: counters, sampler, history and pools as they were then."""
        self.start_iteration = commit.iteration + 1
        print(
            f"--ckpt.load_enable: {self.run_dir} commits iteration {commit.iteration}; resuming at iteration "
            f"{self.start_iteration} of {self.cfg.train.iterations}",
            flush=True,
        )
        self.updates = dict(commit.updates)
        self.sampler.load_state_dict(commit.sampler)
        self.history = commit.history
        self.rollout_log = commit.rollout_log
        if dropped := transcripts.keep_until(self.run_dir, commit.iteration):  # played again, identically
            print(f"--ckpt.load_enable: {dropped} transcript(s) of uncommitted iterations dropped", flush=True)
        if commit.ahead is not None:  # --train.async_rollout: made while the committed iteration learnt
            self.ahead = read_rollout(self.run_dir, commit.ahead)
        for r, pool in self.pools.items():
            pool.load_manifest(commit.pools[r])
            pool.write_manifest()
            self.committed_pool_files[r] = {m.file for m in pool.members}
            pool.gc(set())  # snapshots written after the commit are dropped: they will be written again

    def _make_logger(self):
        from openrlhf.utils.logging_utils import TensorboardLogger, WandbLogger

        args = next(iter(self.stacks.values())).args
        return WandbLogger(args) if self.cfg.logger.wandb_project else TensorboardLogger(args)

    def _metrics(
        self, k, trajectories, experiences, status, timer, configuration, schedule, made, splits
    ) -> dict[str, float]:
        n = len(trajectories)
        m: dict[str, float] = {"iteration": k, **timer.seconds}
        m["rollout/dialogues"] = float(n)  # B × G per pairing: twice that in a history iteration (Eq. 6)
        m["rollout/agreement"] = sum(t.outcome.agreed for t in trajectories) / n
        m["rollout/malformed"] = sum(t.outcome.malformed for t in trajectories) / n
        m["rollout/turns"] = mean(len(t.turns) for t in trajectories)
        m["rollout/truncated"] = sum(t.truncated for t in trajectories) / n
        m["rollout/failed"] = sum(t.failed for t in trajectories) / n
        m["pool/configuration"] = float(configurations(self.roles).index(configuration))
        for r, pool in self.pools.items():
            m[f"{r}/pool/size"] = float(len(pool))
            m[f"{r}/pool/snapshot_seconds"] = pool.members[-1].seconds if len(pool) else 0.0
        m.update(self.rewards.stats())
        for r in self.roles:
            scored = [t.rewards[r] for t in trajectories if r in t.rewards]
            m[f"{r}/reward"] = mean(scored) if scored else float("nan")
            m[f"{r}/reward_failed"] = sum(r in t.reward_failures for t in trajectories) / n
            m[f"{r}/reward/failures"] = float(sum(r in t.reward_failures for t in trajectories))
            m[f"{r}/utility"] = mean(t.outcome.utilities.get(r, 0.0) for t in trajectories)
            m[f"{r}/malformed"] = sum(t.outcome.info.get("fault_role") == r for t in trajectories) / n
            m[f"{r}/attempts_malformed"] = attempts_malformed(trajectories, r)
            m[f"{r}/updated"] = float(r in status and stepped(status[r]))
            m[f"{r}/scheduled"] = float(r in schedule)
            m[f"{r}/current_share"] = sum(t.policies[r] == "current" for t in trajectories) / n
            for key, value in status.get(r, {}).items():
                if isinstance(value, int | float):
                    m[f"{r}/{key}"] = float(value)
            if r in experiences:
                adv = [float(e.advantages[e.action_mask.bool()].mean()) for e in experiences[r] if e.action_mask.any()]
                m[f"{r}/adv_abs_mean"] = mean(abs(a) for a in adv) if adv else 0.0
        for r in self.trained:
            m.update(sample_metrics(r, made[r], splits.get(r) if r in status else None, self.stacks[r].dp_ranks))
        return m


def attempts_malformed(trajectories: Sequence[Trajectory], role: str) -> float:
    """The share of ``role``'s generated turns the env refused, re-sampled ones included: the per-attempt malformed
    rate (``ROLE/malformed`` counts dialogues that ended malformed after the re-samples, §5's protocol)."""
    bad = sum(1 for t in trajectories for a in t.discarded if a.role == role)
    bad += sum(1 for t in trajectories for x in t.turns if x.role == role and not x.valid)
    total = sum(1 for t in trajectories for a in t.discarded if a.role == role)
    total += sum(1 for t in trajectories for x in t.turns if x.role == role)
    return bad / total if total else 0.0


def sample_metrics(role: str, made: int, split: RankSplit | None, ranks: int) -> dict[str, float]:
    """The role's samples this iteration: made (its group members, Eq. 4), trained (real samples, each once per
    epoch), padding (zero-weight samples filling the ranks' micro-batches), in total and per data-parallel rank.
    ``split`` is None when the role did not update (nothing trained)."""
    trained = split.trained if split else (0,) * ranks
    padding = split.padding if split else (0,) * ranks
    m = {
        f"{role}/samples_made": float(made),
        f"{role}/samples_trained": float(sum(trained)),
        f"{role}/samples_padding": float(sum(padding)),
    }
    for rank, (t, p) in enumerate(zip(trained, padding, strict=True)):
        m[f"{role}/rank{rank}/samples_trained"] = float(t)
        m[f"{role}/rank{rank}/samples_padding"] = float(p)
    return m


def update_mark(m: dict, role: str) -> str:
    """The iteration table's ``upd`` for a role: ``y`` it updated, ``0`` it updated with every advantage 0 (no
    informative group: the policy moved by its KL term only), ``-`` it did not update."""
    if not m.get(f"{role}/updated"):
        return "-"
    return "0" if m.get(f"{role}/informative_groups", 1.0) == 0 else "y"


def summary_table(history: list[dict], roles: Sequence[str]) -> str:
    """Per-iteration, per-role table: Eq. 6 configuration ("vs pool": whose current policy faced the other
    roles' snapshots), agreement and malformed rates, reward, whether the role updated (:func:`update_mark`)."""
    head = ["iter", "vs pool", "agree", "malf"] + [f"{r}:{c}" for r in roles for c in ("reward", "malf", "upd")]
    names = ["-", *roles]  # configurations(): "both" shown as "-"
    rows = [head]
    for m in history:
        config = names[int(m.get("pool/configuration", 0))]
        row = [f"{int(m['iteration'])}", config, f"{m['rollout/agreement']:.2f}", f"{m['rollout/malformed']:.2f}"]
        for r in roles:
            row += [f"{m[f'{r}/reward']:.2f}", f"{m[f'{r}/malformed']:.2f}", update_mark(m, r)]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)


def train(cfg: Config) -> list[dict]:
    trainer = IBRLTrainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    print(summary_table(history, trainer.roles))
    return history
