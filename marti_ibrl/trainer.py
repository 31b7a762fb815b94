"""The IB-RL trainer (paper Algorithm 1). :meth:`IBRLTrainer.iteration` is one iteration, top to bottom; the rooms
around it live in :mod:`marti_ibrl.training` (start-up, seating, snapshots, checks, metrics).

Exact resume: everything random on the driver is drawn from streams keyed by (seed, stream, iteration)
(:func:`marti_ibrl.training.records.stream`), the rollout engines sample with per-call seeds and each update reseeds
the actors, so iteration k depends only on the committed state before it: ``trainer_state.json``, the commit
record (:mod:`marti_ibrl.commit`), written atomically after every role's DeepSpeed checkpoint of that iteration;
on resume each role's DeepSpeed ``latest`` is pinned to the committed tag, so a checkpoint written half-way
(killed during a save) is never picked up.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import ray

from marti_ibrl.algorithm.advantages import group_key, group_spread
from marti_ibrl.algorithm.pool import BOTH, sample_configuration
from marti_ibrl.algorithm.schedule import roles_due
from marti_ibrl.backend.cluster import kill_actors
from marti_ibrl.backend.finite import NonFiniteError
from marti_ibrl.backend.stack import save_checkpoints
from marti_ibrl.cluster.device import check_device_dtype, resolve_device
from marti_ibrl.cluster.nodes import NodeLostError, NodeWatch, loss_message
from marti_ibrl.commit import Commit, drop_rollouts, read_rollout, write_rollout
from marti_ibrl.config import Config
from marti_ibrl.outputs import OutputLock
from marti_ibrl.progress import bar as progress_bar
from marti_ibrl.progress import line as print_line
from marti_ibrl.rollout import transcripts
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.rollout.render import role_experience
from marti_ibrl.training import checks, startup
from marti_ibrl.training.ahead import RolloutAhead, overlap_seconds
from marti_ibrl.training.checks import (
    TrainingStopped,
    check_first_turns_fit,
    check_reward_failures,
    count_skipped_updates,
    report_reward_failures,
    training_scenarios,
    warn_malformed_jump,
    warn_uninformative,
    weights_moved,
)
from marti_ibrl.training.metrics import iteration_metrics, mean_advantages, table_head, table_row
from marti_ibrl.training.records import ScenarioSampler, Timer, stream
from marti_ibrl.training.seating import Play, seat_run, snapshot_loads
from marti_ibrl.training.snapshots import SnapshotBook

__all__ = ["IBRLTrainer", "Rollout", "TrainingStopped", "train"]


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

    def log_entry(self) -> dict:
        """The rollout log's entry (commit record): the configuration, every policy in each role's seat
        (``opponents``), each pairing's learners and seats (``pairings``), the scenarios in order."""
        scenarios = [u for u, _ in self.scenarios]
        return {"iteration": self.k, "configuration": self.configuration, **self.opponents, "scenarios": scenarios}


def role_samples(scored: Sequence[tuple[Trajectory, float]], role: str, max_len: int) -> list:
    """The role's OpenRLHF experiences: its own rendering and mask m_i, its training reward, group (role, q)."""
    samples = []
    for t, reward in scored:
        exp = role_experience(t.views[role], max_len, reward=reward, label=t.scenario_uid)
        exp.group_ids = [group_key(role, t.scenario_uid)]
        samples.append(exp)
    return samples


class IBRLTrainer:
    """One IB-RL run: :meth:`fit` runs iterations ``start_iteration..train.iterations`` (:meth:`iteration`), saving
    and committing as it goes. Start-up (:mod:`marti_ibrl.training.startup`), in order: the run directory and its
    commit record, every role's processes (Ray, DeepSpeed ranks, engines), the rollout (rewards, runner), the
    opponent pools, then the committed state when resuming."""

    run_lock: OutputLock | None = None  # held from the run directory's checks to the end of fit() or close()

    def __init__(self, cfg: Config):
        self.cfg = cfg = copy.deepcopy(cfg)  # the caller's config is never modified
        self.ablation = checks.applied_ablation(cfg)  # Table 3; its config changes are load_config's
        device = resolve_device(cfg.train.device)  # ConfigErrors come before anything is written or started
        check_device_dtype(cfg.ds.param_dtype, device)
        self.env, scenarios = training_scenarios(cfg)
        check_first_turns_fit(cfg, self.env, scenarios)
        self.roles = [r.name for r in cfg.roles]  # every seat
        self.trained = [r.name for r in cfg.roles if not r.frozen]
        self.sampler = ScenarioSampler(scenarios, cfg.train.seed)
        self.run_dir = Path(cfg.ckpt.path)
        commit, self.run_lock = startup.claim_run_dir(cfg, self.roles)
        try:
            started = startup.start_processes(cfg, device, self.run_dir, commit)
            self.stacks, self.frozen, self.topology, self.colocation = (
                started.stacks, started.frozen, started.topology, started.colocation,
            )  # fmt: skip
            self.rewards, self.runner = startup.make_rollout(cfg, self.env)
            self.snapshots = SnapshotBook(cfg, self.run_dir, self.trained, self.stacks)
        except BaseException:
            self.release_run_dir()  # a start that failed leaves the run directory free for the next attempt
            raise
        self.pools = self.snapshots.pools  # each trained role's opponent pool (Eq. 6), when pools are on
        self.updates = {r: 0 for r in self.trained}  # each role's update count (schedule, snapshot versions)
        self.skipped_in_a_row: dict[str, int] = {}  # per role: its latest updates with NaN/inf steps skipped
        self.uninformative_in_a_row: dict[str, int] = {}  # per role: its latest due iterations with every Â = 0
        self.warned_uninformative: set[str] = set()
        self.start_iteration = 1
        self.history: list[dict] = []
        self.rollout_log: list[dict] = []  # per iteration: configuration, opponents, scenario order
        self.ahead = RolloutAhead(cfg.train.async_rollout)  # the next iteration's rollout, in flight or made
        self.learn_span: tuple[float, float] | None = None  # the last learn's experiences and updates (overlap)
        if commit is not None:
            self._resume(commit)
        self.logger = startup.make_logger(cfg, self.stacks)

    def _rng(self, stream_name: str, k: int) -> random.Random:
        """The random stream ``stream_name`` of iteration k: a function of (seed, stream, k) only (exact resume)."""
        return stream(self.cfg.train.seed, stream_name, k)

    def _seed(self, stream_name: str, k: int) -> int:
        return self._rng(stream_name, k).getrandbits(31)

    def iteration(self, k: int) -> dict[str, float]:
        """IB-RL iteration k (Alg. 1, lines 3-13): its joint rollout, then what each role learns from it."""
        return self.learn(k, self.generate(self.prepare(k)))

    def prepare(self, k: int) -> Rollout:
        """Alg. 1 lines 3-4: iteration k's scenarios q, Eq. 6's configuration, the roles due (§4.2) and who plays each
        seat, as the pools and update counts stand now (the policies' versions: the data's staleness later)."""
        cfg, timer = self.cfg, Timer()
        with timer("sample"):  # scenarios q and the opponent configuration of Eq. 6
            scenarios = self.sampler.next_batch(cfg.rollout.batch_size)
            configuration = BOTH  # Eq. 6: both current, or the name of the role whose current policy faces history
            if self.pools:
                configuration = sample_configuration(self._rng("configuration", k), self.roles, cfg.pool.probs)
            schedule = roles_due(k, {r.name: r.update_every for r in cfg.roles if not r.frozen})  # u_i(k), §4.2
        with timer("opponents"):  # per Eq. 6 pairing, who plays each seat: current, pool snapshot, frozen counterpart
            if configuration != BOTH:
                self.snapshots.finish()  # the pools must hold every snapshot up to iteration k-1
            plays, opponents, loads = seat_run(self, k, configuration, scenarios, due=schedule)
            self.snapshots.load_pool_engines(loads)  # the snapshots seated on pool engines, before generation
        return Rollout(k, scenarios, configuration, schedule, opponents, dict(self.updates), plays, timer.seconds)

    def generate(self, rollout: Rollout) -> Rollout:
        """Alg. 1 line 5: the shared trajectories of ``rollout``'s plays, each role's rewards R_i(τ) scored as its
        dialogues finish (colocated: the engines awake). Thread-safe with :meth:`learn` (``--train.async_rollout``
        runs it beside the previous iteration's updates)."""
        cfg, k, plays = self.cfg, rollout.k, rollout.plays
        start = time.monotonic()
        with self.colocation.generation(k):
            loads = snapshot_loads(plays)  # colocated: pool snapshots its own engines serve, per pass
            trajectories = self.runner.run(
                [p.request() for p in plays],  # each pairing a pass: batched and seeded apart, one after the other ...
                cfg.rollout.n_samples_per_prompt,
                progress=True,
                seed=self._seed("rollout", k),
                before_pass=(lambda n: self.colocation.load_snapshots(k, loads.get(n, {}))) if loads else None,
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
            self.snapshots.finish()
        penalty = cfg.env.invalid_penalty if cfg.train.penalize_resamples else None
        scored = self.ablation.scored(trajectories, self.trained, self.roles, penalty)  # Eq. 4; R_i or an ablation's
        report_reward_failures(k, trajectories, self.roles)  # e.g. a failed judgement: out of that role's groups
        check_reward_failures(k, trajectories, self.trained, cfg.train.max_reward_failures)
        learning = [r for r in schedule if scored[r]]  # due, and with group members: something to learn from
        spreads = {r: group_spread(scored[r]) for r in self.trained}  # groups whose rewards differ: Â ≠ 0 somewhere
        due_spreads, limit = {r: spreads[r] for r in learning}, cfg.train.warn_uninformative
        warn_uninformative(k, due_spreads, self.uninformative_in_a_row, self.warned_uninformative, limit)
        with timer("experience"), ThreadPoolExecutor(max(1, len(learning))) as pool:  # per-role masks m_i, Eq. 4
            precomputed = self.ablation.joint_baseline  # advantages already made over every role (Table 3)
            samples = {r: role_samples(scored[r], r, cfg.rollout.max_len) for r in learning}
            with self.colocation.log.phases([(k, r, "actor", "experience") for r in learning]):  # π, π_ref log-probs
                built = pool.map(lambda r: self.stacks[r].make_experiences(samples[r], precomputed), learning)
                experiences = dict(zip(learning, built))
        with timer("update"):  # Eq. 5, each role's own optimizer; roles that are not due do not step
            # every sample once per epoch on one rank; zero-weight padding fills the ranks' micro-batches;
            # colocated: each role's DeepSpeed states reloaded for its update and offloaded after it
            status, splits = self.colocation.update(
                k, learning, lambda r: self.stacks[r].fit_async(experiences[r], seed=self._seed(f"update/{r}", k))
            )
            count_skipped_updates(k, status, self.skipped_in_a_row, cfg.train.max_skipped_updates)
            updated = [r for r in status if weights_moved(status[r])]  # the roles whose weights moved
        self.learn_span = (start, time.monotonic())
        if updated and before_sync is not None:
            with timer("async_wait"):  # the engines finish the rollout in flight on the weights it started with
                before_sync()
        with timer("weight_sync"):  # only updated roles re-sync their engines (a LoRA role: its adapter only)
            results = self.colocation.sync(k, updated, lambda r: self.stacks[r].sync_engines_async(self.updates[r] + 1))
            synced = {r: next((x for x in rs if x), None) for r, rs in results.items()}
        for r in updated:
            self.updates[r] += 1
        with timer("snapshot"):  # Alg. 1 line 13: exports start now and overlap the next rollout
            self.snapshots.start(k, updated, self.updates)
        self.rollout_log.append(rollout.log_entry())
        transcripts.keep(self.run_dir, k, trajectories, self.cfg.logger.transcripts, self._rng("transcripts", k),
                         getattr(self, "logger", None))  # fmt: skip
        return iteration_metrics(
            k,
            trajectories,
            roles=self.roles,
            configuration=configuration,
            schedule=schedule,
            status=status,
            advantages={r: mean_advantages(e) for r, e in experiences.items()},
            scored=scored,
            splits=splits,
            ranks={r: s.dp_ranks for r, s in self.stacks.items()},
            spreads=spreads,
            synced=synced,
            pools=self.pools,
            reward_stats=self.rewards.stats(),
            seconds=timer.seconds,
        )

    def async_iteration(self, k: int) -> dict[str, float]:
        """Iteration k under ``--train.async_rollout``: it learns from the rollout made while k-1 learned (made now
        for the first iteration; after a resume, the one the commit record holds) while the rollout of k+1 runs on
        the engines' weights: started before k's updates (``max_staleness`` 1; k's weight syncs wait for it) or
        after k's syncs (0: on-policy, the synchronous run exactly). ``ROLE/async/staleness``: how many of its own
        updates the role's policy had taken since the one that generated k's data; ``async/overlap_seconds``: how
        much of that generation ran while k-1 learned."""
        cfg, wait = self.cfg, Timer()
        with wait("rollout_wait"):
            rollout = self.ahead.take() or self.generate(self.prepare(k))
        stale = {r: self.updates[r] - rollout.versions.get(r, self.updates[r]) for r in self.trained}
        if max(stale.values(), default=0) > cfg.train.max_staleness:  # (by construction never: one in flight)
            raise RuntimeError(f"iteration {k}: samples {stale} updates old, over --train.max_staleness")
        overlap = overlap_seconds(rollout.span, self.learn_span)
        ahead = k < cfg.train.iterations
        if ahead and cfg.train.max_staleness >= 1:
            self.ahead.start(self.generate, self.prepare(k + 1))
        metrics = self.learn(k, rollout, before_sync=self.ahead.result)
        if ahead and cfg.train.max_staleness == 0:
            self.ahead.start(self.generate, self.prepare(k + 1))
        metrics.update(wait.seconds)
        metrics["async/overlap_seconds"] = overlap
        metrics.update({f"{r}/async/staleness": float(s) for r, s in stale.items()})
        return metrics

    def fit(self) -> list[dict]:
        """Run iterations ``start_iteration..train.iterations`` (Algorithm 1), committing every ``ckpt.save_steps``
        and at the end; return every iteration's metrics (``history``, a resumed run's with the committed ones; keys
        as in docs/training.md). Raises :class:`TrainingStopped` or ``NodeLostError``, the last commit intact either
        way; call :meth:`close` after it, also when it raised (docs/python-api.md)."""
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
                    before = self.history[-1] if self.history else None
                    lr_flags = {r.name: f"--role{i}.lr" for i, r in enumerate(cfg.roles, 1) if r.name in self.trained}
                    warn_malformed_jump(k, before, metrics, lr_flags, cfg.train.warn_malformed_jump)
                    self.history.append(metrics)
                    self.logger.log_train(k, metrics)
                    if k == self.start_iteration:  # the table's head, then a row as each iteration ends
                        print_line(table_head(self.roles, cfg.train.iterations))
                    print_line(table_row(metrics, self.roles, cfg.train.iterations))
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
            self.ahead.stop()  # a rollout in flight when the run stopped is dropped, not waited for
            self.release_run_dir()
        self.logger.close()
        self.rewards.close()
        return self.history

    def release_run_dir(self) -> None:
        """Let another process write the run directory (:class:`marti_ibrl.outputs.OutputLock`)."""
        if self.run_lock is not None:
            self.run_lock.release()

    def close(self) -> None:
        """Kill the run's processes (every role's ranks and engines, the frozen counterparts' engines), then let a
        rollout that was in flight when the run stopped end (its engines gone, its wait raises) before Ray is shut
        down (:meth:`RolloutAhead.drain`)."""
        self.release_run_dir()
        for stack in self.stacks.values():
            stack.kill()
        kill_actors(e for policies in self.frozen.values() for p in policies for e in p.engines)
        if getattr(self, "ahead", None) is not None:  # (a trainer built without __init__, as some tests build it)
            self.ahead.drain()

    def _node_lost(self, lost: list[dict], k: int) -> NodeLostError:
        committed = getattr(Commit.read(self.run_dir), "iteration", 0)
        placed = {r: v.get("placed_on", {}) for r, v in self.topology["trained"].items()}
        return NodeLostError(loss_message(lost, placed, k, committed, str(self.run_dir)))

    def check_sync(self, k: int) -> None:
        """``--train.check_sync`` after iteration k (0: start-up): :func:`marti_ibrl.training.checks.check_sync`."""
        if self.cfg.train.check_sync:
            checks.check_sync(k, self.run_dir, self.stacks, self.snapshots, self.colocation, self.topology)

    def save(self, k: int, final: bool = False) -> None:
        """Every role's DeepSpeed checkpoint at tag ``global_step{k}``, then the commit record (atomic)."""
        self.snapshots.finish()
        files = save_checkpoints(self.run_dir, self.stacks, k, final)
        ahead = self.ahead.result()  # --train.async_rollout: k+1's rollout, made by weights gone after k's syncs
        entry = write_rollout(self.run_dir, ahead) if ahead is not None else None
        Commit(
            iteration=k,
            seed=self.cfg.train.seed,
            updates=self.updates,
            sampler=self.sampler.state_dict(),  # (k+1's scenarios drawn already when a rollout is ahead)
            pools=self.snapshots.manifests(),
            history=self.history,
            rollout_log=self.rollout_log,
            ahead=entry,
            files=files,
        ).write(self.run_dir)  # atomic: a half-written record is never picked up
        drop_rollouts(self.run_dir, keep=entry and entry["file"])
        self.snapshots.committed()

    def _resume(self, commit: Commit) -> None:
        """Continue after the committed iteration: counters, sampler, history and pools as they were then."""
        self.start_iteration = commit.iteration + 1
        resuming = f"resuming at iteration {self.start_iteration} of {self.cfg.train.iterations}"
        print(f"--ckpt.load_enable: {self.run_dir} commits iteration {commit.iteration}; {resuming}", flush=True)
        self.updates = dict(commit.updates)
        self.sampler.load_state_dict(commit.sampler)
        self.history = commit.history
        self.rollout_log = commit.rollout_log
        if dropped := transcripts.keep_until(self.run_dir, commit.iteration):  # played again, identically
            print(f"--ckpt.load_enable: {dropped} transcript(s) of uncommitted iterations dropped", flush=True)
        if commit.ahead is not None:  # --train.async_rollout: made while the committed iteration learnt
            self.ahead.next = read_rollout(self.run_dir, commit.ahead)
        self.snapshots.committed(commit.pools)  # snapshots written after the commit are dropped: written again


def train(cfg: Config) -> list[dict]:
    trainer = IBRLTrainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    return history
