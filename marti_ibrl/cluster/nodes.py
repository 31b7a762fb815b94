"""A Ray node lost mid-run: noticed within seconds, reported as one clear error that names the node.

On a cluster a node can go away under a running job (hardware, the scheduler, an OOM-killed raylet). What Ray
raises then depends on where the driver was blocked: an ``ActorDiedError`` from a rollout engine, a gloo/NCCL
error from a surviving rank, or nothing at all while the surviving ranks wait in a collective for a peer that is
gone. :class:`NodeWatch` polls ``ray.nodes()`` in a thread and interrupts the driver when a node the run started
on is no longer alive; :meth:`NodeWatch.lost_error` turns whatever was raised into a
:class:`NodeLostError` that names the node (its Slurm host name: ``recipes/slurm-ray.sh`` starts each Ray node with
``--node-name``), the roles that had processes there, and how to resume. Nothing of the interrupted iteration is
committed (``IBRLTrainer.save`` writes the commit record last, atomically).

:func:`lost_nodes` and :func:`loss_message` are pure; the watch is the only part that talks to Ray.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class NodeLostError(RuntimeError):
    """A Ray node the run had processes on died; the message says which, what ran there and how to resume."""


def lost_nodes(started: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The nodes of ``started`` (``topology.ray_node`` entries alive at start-up) that ``now`` (``ray.nodes()``)
    reports dead or no longer lists."""
    alive = {n["NodeID"] for n in now if n.get("Alive")}
    return [dict(n) for n in started if n["alive"] and n["node_id"] not in alive]


def loss_message(
    lost: Sequence[Mapping[str, Any]],
    placed: Mapping[str, Mapping[str, Sequence[str]]],
    iteration: int,
    committed: int,
    run_dir: str,
) -> str:
    """One paragraph: which node (name, address, id), whose processes ran there (``placed``: role -> kind -> node
    ids, as ``RoleStack.node_ids()``), the iteration that was lost and the one to resume from."""
    parts = []
    for node in lost:
        on = [
            f"{role} {kind} ({sum(i == node['node_id'] for i in ids)})"
            for role, kinds in placed.items()
            for kind, ids in kinds.items()
            if node["node_id"] in ids
        ]
        name = node.get("name") or node["address"]
        ran = ", ".join(on) if on else "none of the roles' processes"
        parts.append(
            f"Ray node {name} ({node['address']}, id {node['node_id'][:12]}) was lost during iteration {iteration}; "
            f"it ran {ran}"
        )
    resume = (
        f"the run directory {run_dir} holds iteration {committed} as committed"
        if committed
        else f"nothing was committed yet in {run_dir}"
    )
    return (
        "; ".join(parts)
        + f". Nothing of iteration {iteration} was committed: {resume}. Resume on a healthy allocation with the "
        f"same --ckpt.path and --ckpt.load_enable true (a Slurm recipe: RUN_DIR={run_dir} sbatch RECIPE "
        "--ckpt.load_enable true)."
    )


def _python_handles_sigint():
    """Make ``_thread.interrupt_main()`` work: it raises KeyboardInterrupt only where Python handles SIGINT, and a
    process started in the background by a script (``cmd &``: srun, ``ray start``, ``ray job submit`` in
    recipes/slurm-ray.sh) inherits SIGINT ignored. Installs Python's handler when SIGINT is ignored or default;
    returns the disposition to restore (None: nothing changed, or not the main thread, where it cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous not in (signal.SIG_IGN, signal.SIG_DFL):
        return None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return previous


class NodeWatch:
    """Polls ``ray.nodes()`` every ``period`` seconds; when a started node is lost, records it and interrupts the
    main thread (a ``KeyboardInterrupt`` there, which the trainer turns into :class:`NodeLostError`). If the main
    thread has not ended the run ``grace`` seconds later (stuck joining a thread that waits on a collective whose
    peer is gone), the watch prints ``describe(lost)`` as the error and exits the process with status 3.

    Only a run on more than one node is watched: on one node the driver goes down with it."""

    def __init__(
        self,
        started: Sequence[Mapping[str, Any]],
        describe: Callable[[list[dict]], str] = lambda lost: f"Ray node(s) lost: {lost}",
        period: float = 2.0,
        grace: float = 60.0,
    ):
        self.started = [n for n in started if n["alive"]]
        self.describe, self.period, self.grace = describe, period, grace
        self.lost: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._sigint = None
        if len(self.started) > 1:
            self._sigint = _python_handles_sigint()
            self._thread = threading.Thread(target=self._run, name="ibrl-node-watch", daemon=True)
            self._thread.start()

    def _check(self) -> list[dict]:
        import ray

        try:
            return lost_nodes(self.started, ray.nodes())
        except Exception:  # the GCS itself unreachable: the driver's own calls fail and say so
            return []

    def _claim(self, lost: list[dict]) -> bool:
        """Record ``lost``; True for the first to find it (only the watch's own find interrupts the driver)."""
        with self._lock:
            if self.lost:
                return False
            self.lost = lost
            return True

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            lost = self._check()
            if lost and self._claim(lost):
                _thread.interrupt_main()
            if self.lost:  # found by the watch or by lost_error: end the run if the driver does not
                if not self._stop.wait(self.grace):
                    print(f"marti-ibrl train: error: {self.describe(self.lost)}", file=sys.stderr, flush=True)
                    os._exit(3)
                return

    def lost_error(self, error: BaseException, wait: float = 30.0) -> list[dict]:
        """After ``error`` (a Ray error or the watch's interrupt): the lost nodes, waiting up to ``wait`` seconds
        for Ray to declare a node dead (its health check lags the first failed call); [] when none was lost."""
        if self._thread is None:
            return []
        deadline = time.monotonic() + wait
        while not self.lost and time.monotonic() < deadline:
            lost = self._check()
            if lost:
                self._claim(lost)
            else:
                time.sleep(1.0)
        return self.lost

    def stop(self) -> None:
        self._stop.set()
        if self._sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._sigint)
            self._sigint = None
