"""A run's start-up, in order: the run directory and its commit record (:func:`claim_run_dir`), every role's processes
(:func:`start_processes`: Ray, DeepSpeed ranks, engines, frozen counterparts, the first weight sync), the rollout
(:func:`make_rollout`: rewards and the dialogue runner) and the logger. Each stage prints one line with its seconds
(:func:`startup_stage`), so a job file shows where the first minute went."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ray

from marti_ibrl.backend.args import engine_kind
from marti_ibrl.backend.cluster import init_ray, wait_for_cluster
from marti_ibrl.backend.stack import RoleStack, start_engines
from marti_ibrl.cluster.colocate import (
    CPU_EFFECT,
    ColocationPhases,
    device_memory_gib,
    placement_groups,
    sleep_summary,
    updates_together,
)
from marti_ibrl.cluster.phases import PHASES_FILE, PhaseLog
from marti_ibrl.cluster.placement import colocated, frozen_checkpoints, shares_engines
from marti_ibrl.cluster.topology import topology, write_topology
from marti_ibrl.commit import (
    STATE_FILE,
    Commit,
    RunDirError,
    check_writable,
    clear_run,
    open_run_dir,
    pin_deepspeed_latest,
)
from marti_ibrl.config import Config, RoleConfig, to_yaml
from marti_ibrl.outputs import OutputInUse, OutputLock, repair_jsonl
from marti_ibrl.rewards import JUDGE, RULE, RoleRewards
from marti_ibrl.rollout import transcripts
from marti_ibrl.rollout.runner import DialogueRunner, Policy
from marti_ibrl.training.checks import SYNC_CHECKS_FILE

APPEND_ONLY = (SYNC_CHECKS_FILE, PHASES_FILE, transcripts.TRANSCRIPTS_FILE)
"""The run's JSONL logs, appended as it goes (marti_ibrl.outputs.repair_jsonl before a run appends to them)."""


@contextmanager
def startup_stage(what: str, quiet: bool = False):
    """One console line per start-up stage, with its seconds, as it ends (a job file shows where the first minute
    went: Ray, each role's processes, model loading, the first weight sync)."""
    start = time.perf_counter()
    yield
    if not quiet:
        print(f"[start-up] {what}: {time.perf_counter() - start:.1f}s", flush=True)


def claim_run_dir(cfg: Config, roles: list[str]) -> tuple[Commit | None, OutputLock]:
    """``--ckpt.path`` held by this process (:class:`~marti_ibrl.outputs.OutputLock`) with the run's config written
    in it; its last commit when resuming (``--ckpt.load_enable``). The lock is taken first and the directory judged
    while it is held (:func:`marti_ibrl.commit.open_run_dir`), so a second ``train`` that waited for the first
    (``--ckpt.lock_wait``) judges what the first left, never what was there before it: a directory that holds a run
    is refused unless resumed or ``--ckpt.overwrite``, and a run written while this one waited is refused unless it
    is resumed and unfinished. ``cfg.ckpt``'s ``load_enable`` and ``overwrite`` are set to what was done (nothing to
    resume; deleted), so the config written is safe to reuse."""
    run_dir = Path(cfg.ckpt.path)
    check_writable(run_dir)  # before the lock makes the directory: a path that cannot be one is one line
    try:  # one writer per run directory (docs/reliability.md): a second run on it refuses, naming the first
        lock = OutputLock(run_dir, "--ckpt.path").acquire(wait=cfg.ckpt.lock_wait)
    except OutputInUse as e:
        raise RunDirError(str(e)) from None
    except OSError as e:
        raise RunDirError(f"--ckpt.path: {run_dir}: {e.strerror or e}") from None
    try:  # judged under the lock; a refused start leaves the directory as it was (the lock's own file goes)
        commit = open_run_dir(
            run_dir,
            resume=cfg.ckpt.load_enable,
            overwrite=cfg.ckpt.overwrite,
            seed=cfg.train.seed,
            iterations=cfg.train.iterations,
            waited_for=lock.waited_for,
        )
        if commit is not None and commit.ahead is not None and not cfg.train.async_rollout:
            raise RunDirError(
                f"--train.async_rollout: {run_dir} was trained with it and its commit holds the rollout of "
                f"iteration {commit.ahead['iteration']}, made before the commit: resume with --train.async_rollout true"
            )
        _prepare_run_dir(cfg, roles, run_dir, commit)
    except BaseException:
        lock.release()
        raise
    return commit, lock


def _prepare_run_dir(cfg: Config, roles: list[str], run_dir: Path, commit: Commit | None) -> None:
    if commit is None and cfg.ckpt.load_enable:  # nothing committed, and no run here (open_run_dir): a new one
        print(f"--ckpt.load_enable: no {STATE_FILE} in {run_dir} and no run, starting from iteration 1")
        cfg.ckpt.load_enable = False
    if cfg.ckpt.overwrite:
        deleted, kept = clear_run(run_dir, roles)
        if deleted:
            left = f"; left as they were: {', '.join(kept)}" if kept else ""
            print(f"--ckpt.overwrite: deleted the run in {run_dir} ({', '.join(deleted)}){left}", flush=True)
        cfg.ckpt.overwrite = False  # done: RUN/config.yaml reused as a --config must not delete this run
    for name in APPEND_ONLY:  # a line torn by a crash moved aside
        if said := repair_jsonl(run_dir / name):
            print(said, flush=True)
    # (no transcripts are dropped here: a directory whose transcripts.jsonl holds lines holds a run, refused above
    # unless resumed, when the trainer keeps the committed iterations' lines, or deleted with --ckpt.overwrite)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
    except OSError as e:
        raise RunDirError(f"--ckpt.path: {run_dir}: {e.strerror or e}") from None


@dataclass
class Processes:
    """What :func:`start_processes` started: every trained role's stack (DeepSpeed ranks, reference, engines), the
    frozen roles' counterparts, the topology record, and the colocation phases (:class:`marti_ibrl.cluster.colocate.ColocationPhases`)."""

    stacks: dict[str, RoleStack]
    frozen: dict[str, list[Policy]]
    topology: dict
    colocation: ColocationPhases


def start_processes(cfg: Config, device: str, run_dir: Path, commit: Commit | None) -> Processes:
    """Ray, every trained role's stack, the frozen roles' counterparts; ``RUN/topology.json``; the actors' models
    (loaded from the committed tag when resuming), then the engines synced to them."""
    if cfg.ray.address:  # a cluster that does not answer: one line after --ray.connect_timeout, not Ray's retries
        wait_for_cluster(cfg.ray.address, cfg.ray.connect_timeout)
    with startup_stage(f"Ray ({cfg.ray.address or 'a local cluster'})"):
        init_ray(cfg, device)
    stacks: dict[str, RoleStack] = {}
    groups = placement_groups(cfg)  # --train.colocate role|all: the GPUs a role's processes share
    for r in cfg.roles:
        if not r.frozen:  # --rollout.share_engines: the first role's engines serve every LoRA role's adapters
            shared = next(iter(stacks.values())).engines if shares_engines(cfg, r) else None
            with startup_stage(f"{r.name}: engines and DeepSpeed rank processes placed"):
                stacks[r.name] = RoleStack.start(cfg, r, device, engines=shared, shared_pg=groups.get(r.name))
    with startup_stage("frozen counterparts", quiet=not any(r.frozen for r in cfg.roles)):
        frozen = {r.name: frozen_policies(cfg, r, device) for r in cfg.roles if r.frozen}
    kind = engine_kind(cfg.rollout.engine, device)
    record = topology(  # what actually runs: ranks, ZeRO stage, engines, reference, weight sync, nodes
        cfg,
        stacks,
        frozen,
        device,
        ray.nodes(),
        kind,
        placed={r: s.node_ids() for r, s in stacks.items()},  # which node each process runs on
    )
    record["colocate"] = {"mode": cfg.train.colocate, "sleep": sleep_summary(cfg, device, kind)}
    write_topology(run_dir, record)
    if commit is not None:
        actors = [Path(s.args.ckpt.path) / "_actor" for s in stacks.values()]
        pin_deepspeed_latest(run_dir, actors, commit.iteration)
    with startup_stage("models loaded: every role's DeepSpeed ranks and reference"):
        ray.get([ref for s in stacks.values() for ref in s.init_models(cfg.train.iterations)])
    # every phase change from here on: RUN/phases.jsonl (marti_ibrl/cluster/colocate.py)
    effect = CPU_EFFECT if colocated(cfg) and device != "cuda" else None
    together = updates_together(cfg, device_memory_gib(stacks) if device == "cuda" else None)
    colocation = ColocationPhases(cfg, stacks, PhaseLog(run_dir, effect=effect), together)
    colocation.record_start()
    # engines start from the actor's weights (as loaded, in its dtype), exactly as after any update
    updates = commit.updates if commit is not None else {}
    with startup_stage("engines synced to the actors' weights"):
        colocation.sync(0, list(stacks), lambda r: stacks[r].sync_engines_async(updates.get(r, 0)))
    return Processes(stacks, frozen, record, colocation)


def frozen_policies(cfg: Config, role: RoleConfig, device: str) -> list[Policy]:
    """A frozen role's counterparts (unilateral baselines): engines for checkpoints, text players otherwise."""
    from transformers import AutoTokenizer

    from marti_ibrl.rollout.players import make_player, parse_player_spec

    policies = []
    for i, spec in enumerate(role.frozen):
        parsed = parse_player_spec(spec)
        if parsed["kind"] == "checkpoint":
            seed = cfg.train.seed + 7000 + 100 * i
            engines = start_engines(cfg, role, parsed["path"], seed, device, role.num_engines)
            policies.append(Policy(f"frozen:{spec}", engines, AutoTokenizer.from_pretrained(parsed["path"])))
        else:
            if parsed["kind"] == "endpoint":
                parsed["sampling"] = sampling(cfg)
            elif parsed["kind"] == "bot":
                parsed["seed"] = cfg.train.seed
            policies.append(Policy(f"frozen:{spec}", player=make_player(parsed)))
    assert len(frozen_checkpoints(role)) == sum(bool(p.engines) for p in policies)
    return policies


def sampling(cfg: Config) -> dict:
    """The rollout's sampling parameters (``--rollout.*``), for engines and endpoints alike."""
    return {
        "temperature": cfg.rollout.temperature,
        "top_p": cfg.rollout.top_p,
        "max_new_tokens": cfg.rollout.max_new_tokens,
    }


def make_rollout(cfg: Config, env) -> tuple[RoleRewards, DialogueRunner]:
    """R_i per role (rule, LLM judge or a user function) and the dialogue runner."""
    rewards = RoleRewards(cfg, env)
    runner = DialogueRunner(
        env,
        rewards.fns,
        sampling(cfg),
        cfg.rollout.max_len,
        cfg.env.max_resamples,
        reward_workers=max(4, cfg.judge.max_concurrency) if rewards.judges else 4,
        reward_timeouts={r: cfg.train.reward_timeout for r, spec in rewards.specs.items() if spec not in (RULE, JUDGE)},
        reward_names=rewards.specs,
    )
    return rewards, runner


def make_logger(cfg: Config, stacks: dict[str, RoleStack]):
    """OpenRLHF's tensorboard logger, or its wandb logger with ``--logger.wandb_project``."""
    from openrlhf.utils.logging_utils import TensorboardLogger, WandbLogger

    args = next(iter(stacks.values())).args
    return WandbLogger(args) if cfg.logger.wandb_project else TensorboardLogger(args)
