"""SIGTERM (Slurm's ``scancel``, a container's stop, ``kill``) ends any command in seconds with one line and exit 4.

:func:`installed` (``marti_ibrl.cli.main``) makes SIGTERM raise :class:`Terminated` in the main thread. It is a
``BaseException``, so no ``except Exception`` on the way swallows it, and every ``finally`` of the command runs (a
trainer's :meth:`close`: actors killed, Ray shut down; an evaluation's open files closed), after every finished unit
of work was already made durable by the command itself (a committed iteration, an appended episode).
``ray.init`` installs Ray's own handler (``sys.exit(15)``, whose teardown printed C++ stacks and ended in exit 134):
:func:`kept` puts ours back around it.
"""

from __future__ import annotations

import contextlib
import signal
import threading

EXIT_CODE = 4
"""A stopped command's exit status (as a run stopped by its guards: ``marti-ibrl train``'s 4)."""


class Terminated(BaseException):
    """SIGTERM arrived (:func:`install`)."""


def _raise(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def installed():
    """While inside: SIGTERM raises :class:`Terminated` in the main thread (elsewhere signals cannot be handled:
    nothing changes); the handler before is put back after (``marti_ibrl.cli.main`` called as a library leaves the
    process as it found it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


@contextlib.contextmanager
def kept():
    """Around a call that installs its own SIGTERM handler (``ray.init``): the handler before it is put back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)
