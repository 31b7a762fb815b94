"""A test stuck in ``ray.get`` fails instead of hanging the run (hooks for pytest-timeout, imported by conftest)."""

from __future__ import annotations

import sys
import threading

import psutil
import pytest

RAY_KILL_GRACE_S = 15.0


def _kill_ray_workers(item, timeout: float) -> None:
    """SIGKILL to every Ray worker this pytest process started (pytest-timeout has printed the test's stacks).

    pytest-timeout's ``signal`` method cannot stop a driver blocked in ``ray.get``: Ray runs Python's signal
    handlers while it waits but swallows every exception but KeyboardInterrupt and SystemExit, so the timeout's
    failure is lost and the wait goes on (seen: test_e2e_pool waited 90 min on two engines with ``timeout = 900``).
    Its ``thread`` method ends the whole process and leaves the Ray cluster behind. Killing the workers instead
    makes the blocked ``ray.get`` raise (an actor died): the test fails with its stack on record, its fixtures
    tear their cluster down, and the session goes on. Ray started by this process (``ray.init(address="local")``)
    is its descendant; Slurm jobs' Ray is not, and is waited on by Python loops the signal method does stop.
    """
    sys.stderr.write(
        f"\n+++ {item.nodeid}: over its {timeout:.0f} s timeout and still waiting: its Ray workers killed\n"
    )
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name().startswith("ray::"):
                proc.kill()
        except psutil.Error:
            pass


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """Beside pytest-timeout's own timer (it still runs: this returns None), a watchdog that ends a ``ray.get`` wait
    ``RAY_KILL_GRACE_S`` after the timeout (:func:`_kill_ray_workers`)."""
    if settings.timeout and settings.timeout > 0:
        timer = threading.Timer(settings.timeout + RAY_KILL_GRACE_S, _kill_ray_workers, (item, settings.timeout))
        timer.daemon = True
        timer.start()
        item._ray_watchdog = timer


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item):
    timer = getattr(item, "_ray_watchdog", None)
    if timer is not None:
        timer.cancel()
        item._ray_watchdog = None
