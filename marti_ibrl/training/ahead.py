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


def overlap_seconds(a: tuple[float, float] | None, b: tuple[float, float] | None) -> float:
    """How long the spans ``a`` and ``b`` (start, end) ran at the same time."""
    if a is None or b is None:
        return 0.0
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
