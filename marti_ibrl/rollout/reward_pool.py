"""A user's reward function with a bound (``--train.reward_timeout``): :class:`RewardPool` runs every reward call of a
rollout on daemon threads, and :func:`reward_result` waits for a call with a limit (a user's ``module:function``; the
rule and the LLM judges, bounded by ``--judge.timeout`` and its retries, have none) at most that many seconds from its
start. A call past it is given up on: its dialogue has no reward for that role (:class:`RewardUnavailable`, kind
:data:`REWARD_TIMEOUT`, counted with ``--train.max_reward_failures``), a warning names the reward, a new thread takes
the stuck one's place, and the call runs on, never waited for. A call that took half of its limit or more is named in
a warning as slow (docs/training.md, "Custom rewards"; docs/reliability.md)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from marti_ibrl.reward_types import RewardUnavailable

log = logging.getLogger(__name__)

REWARD_TIMEOUT = "timeout"
"""The failure kind of a reward call that took longer than ``--train.reward_timeout``."""
POLL = 1.0
"""Seconds between looks at a call still queued or without a limit (meanwhile calls past their limit may hold every
thread: :meth:`RewardPool.unstick`)."""


class RewardPool:
    """Reward calls on ``workers`` daemon threads (a :class:`concurrent.futures.Future` each, as an executor's), so a
    call given up on is never waited for: not at the end of the rollout and not at the process's exit (an executor
    joins its threads at both). Each future's ``limit`` is its call's bound in seconds (None: none), ``started`` and
    ``ended`` when its worker began and finished it (``time.monotonic``; None until then). :meth:`unstick` starts a
    thread in place of each one stuck in a call past its limit, so the calls queued behind those still run."""

    def __init__(self, workers: int):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._running: set[Future] = set()
        self._replaced: set[Future] = set()  # running past their limit, their thread replaced
        for _ in range(workers):
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._work, name="marti-ibrl-reward", daemon=True).start()
        self._threads += 1

    def submit(self, fn: Callable, *args, limit: float | None = None) -> Future:
        future: Future = Future()
        future.limit, future.started, future.ended = limit, None, None
        self._queue.put((future, fn, args))
        return future

    def unstick(self) -> None:
        """A new thread for each call running past its limit (once per call)."""
        now = time.monotonic()
        with self._lock:
            for f in list(self._running - self._replaced):
                if f.limit is not None and now - f.started >= f.limit:
                    self._replaced.add(f)
                    self._spawn()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                future.started = time.monotonic()
                self._running.add(future)
            try:
                result, error = fn(*args), None
            except BaseException as e:  # (score() turns a reward's own exceptions into RewardUnavailable)
                result, error = None, e
            with self._lock:
                future.ended = time.monotonic()
                self._running.discard(future)
                self._replaced.discard(future)
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def shutdown(self) -> None:
        """Every thread ends after its current call; nothing is waited for."""
        with self._lock:
            for _ in range(self._threads):
                self._queue.put(None)


def reward_result(future: Future, pool: RewardPool, name: str, role: str, traj: Any, warned: set[str]) -> Any:
    """The result of ``future``, a reward call of ``pool`` (``name``: the reward as configured, ``role`` the role it
    scores, ``traj`` the dialogue). Past its limit since its worker started it: :class:`RewardUnavailable` (kind
    :data:`REWARD_TIMEOUT`) and a warning; a call queued behind others is waited for until it starts, then for its own
    limit. ``warned``: the roles whose reward was named in a warning already (one warning per role and rollout)."""
    limit = future.limit
    while True:
        started = future.started
        bounded = limit is not None and started is not None
        try:
            value = future.result(timeout=max(started + limit - time.monotonic(), 0.0) if bounded else POLL)
            break
        except FutureTimeout:
            pool.unstick()  # calls past their limit keep their threads; the calls behind them get new ones
            if not bounded:
                continue  # queued (its own clock starts when it does), or no limit
            if role not in warned:
                warned.add(role)
                log.warning(
                    "reward %s of %s took longer than --train.reward_timeout %g s (scenario %r): given up on, that "
                    "dialogue has no %s reward (the call runs on, unwaited); a reward that needs longer: raise "
                    "--train.reward_timeout", name, role, limit, traj.scenario_uid, role,
                )  # fmt: skip
            raise RewardUnavailable(
                f"reward {name} took longer than --train.reward_timeout {limit:g} s", kind=REWARD_TIMEOUT
            ) from None
    if limit is not None and future.ended - future.started >= limit / 2 and role not in warned:
        warned.add(role)
        log.warning(
            "reward %s of %s is slow: one call took %.1f s (scenario %r); --train.reward_timeout %g s gives up on a "
            "call at that", name, role, future.ended - future.started, traj.scenario_uid, limit,
        )  # fmt: skip
    return value
