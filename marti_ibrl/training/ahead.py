"""``--train.async_rollout``: the rollout of iteration k+1, made on a thread of its own while iteration k learns
(docs/cluster.md). In flight it is a future; made, the rollout itself, which a commit keeps (:mod:`marti_ibrl.commit`)
so that a resumed run learns from the very samples it would have."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class RolloutAhead:
    """The next iteration's rollout (``next``: None, a future, or the made rollout) and the thread that makes it
    (none for a synchronous run)."""

    def __init__(self, enabled: bool):
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="rollout") if enabled else None
        self.next: Future | Any = None

    def start(self, make: Callable, *args) -> None:
        """Make ``make(*args)`` on the rollout thread."""
        self.next = self.thread.submit(make, *args)

    def result(self):
        """The next iteration's rollout, once its engines are done with it (None when none was started)."""
        if isinstance(self.next, Future):
            self.next = self.next.result()
        return self.next

    def take(self):
        """:meth:`result`, no longer ahead."""
        made, self.next = self.result(), None
        return made

    def stop(self) -> None:
        """A rollout in flight when the run stops is dropped, not waited for."""
        if self.thread is not None:
            self.thread.shutdown(wait=False, cancel_futures=True)

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait (at most ``timeout`` s) for a rollout still in flight to end, as it does once the engines it waits on
        are killed (:meth:`marti_ibrl.trainer.IBRLTrainer.close`); whether none is left. A thread left inside
        ``ray.get`` when Ray shuts down crashed the process at its next ``ray.init`` (SIGSEGV in Ray's memory store:
        a second run in one process, after a failed asynchronous one)."""
        from concurrent.futures import wait

        if isinstance(self.next, Future) and not self.next.done():
            wait([self.next], timeout=timeout)
        return not (isinstance(self.next, Future) and not self.next.done())


def overlap_seconds(a: tuple[float, float] | None, b: tuple[float, float] | None) -> float:
    """How long the spans ``a`` and ``b`` (start, end) ran at the same time."""
    if a is None or b is None:
        return 0.0
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
