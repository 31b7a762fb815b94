"""The two test tiers, assigned to every test at collection (hooks and helpers imported by conftest).

* ``e2e``: the test starts a Ray cluster, a vLLM engine, the local Slurm or a training run, or downloads a model:
  it is marked ``slow`` (the end-to-end runs), uses one of :data:`E2E_FIXTURES`, or is marked ``e2e`` itself
  (a module-level ``pytestmark = pytest.mark.e2e`` for a module whose own fixture starts Ray).
* ``unit``: every other test: ``pytest -m unit`` (``make test-fast``) runs exactly these.

Nobody has to remember to tier a new test: it is ``unit`` unless one of the rules above makes it ``e2e``, and a
``unit`` test that starts Ray or a launcher fails, naming the marker it needs (:func:`pytest_runtest_protocol`).
``ray.init`` is the one door to a local cluster, to engines (Ray actors) and to an in-process training run; a
training run in a subprocess goes through a launcher (``torchrun``, ``deepspeed``, ``sbatch``, ...) or through
``marti-ibrl train``, whose tests are ``slow``.
"""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

TIERS = ("unit", "e2e")
# fixtures that start what the unit tier must not: the session's two-node Slurm (and Ray inside its jobs)
E2E_FIXTURES = frozenset({"local_slurm"})
# what a unit test must not run as a subprocess: distributed and cluster launchers, as programs or `python -m`
LAUNCHERS = frozenset({"torchrun", "deepspeed", "ray", "sbatch", "srun", "salloc", "vllm"})
LAUNCHER_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.runner"})


def tier(item) -> str:
    """``e2e`` or ``unit`` by the rules of the module docstring."""
    if item.get_closest_marker("slow") or item.get_closest_marker("e2e") or E2E_FIXTURES & set(item.fixturenames):
        return "e2e"
    return "unit"


def assign_tiers(items) -> None:
    """Mark every item with its tier (before ``-m`` deselects: called from a ``tryfirst`` collection hook). A test
    marked ``unit`` by hand that the rules make ``e2e`` is an error: one tier per test."""
    for item in items:
        name = tier(item)
        if name == "e2e" and item.get_closest_marker("unit"):
            raise pytest.UsageError(f"{item.nodeid}: marked unit, but it is e2e (slow, e2e or {sorted(E2E_FIXTURES)})")
        item.add_marker(getattr(pytest.mark, name))


class UnitTierViolation(RuntimeError):
    """A test of the unit tier started Ray or a distributed/cluster launcher."""


def launcher(args) -> str | None:
    """The launcher a ``subprocess.Popen`` argument list starts (:data:`LAUNCHERS`, ``python -m`` one of
    :data:`LAUNCHER_MODULES`), or None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        try:
            argv = shlex.split(os.fsdecode(args))  # a shell command line, or one program
        except ValueError:
            return None
    else:
        argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    if not argv:
        return None
    if os.path.basename(argv[0]) in LAUNCHERS:
        return os.path.basename(argv[0])
    return next((b for a, b in zip(argv, argv[1:]) if a == "-m" and b in LAUNCHER_MODULES), None)


def _refuse(item, what: str) -> None:
    item._tier_violation = (
        f"{item.nodeid} is in the unit tier (pytest -m unit, make test-fast) but starts {what}: mark it or its module "
        "`pytest.mark.e2e` (tests/tiers.py), or fake it as tests/backend/test_role_args.py fakes ray.init"
    )
    raise UnitTierViolation(item._tier_violation)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """While a ``unit`` test runs (its fixtures' set-up and teardown included), ``ray.init`` and a
    ``subprocess.Popen`` of a launcher raise :class:`UnitTierViolation`; a test that swallows the error still fails
    (:func:`pytest_runtest_makereport`)."""
    if item.get_closest_marker("unit") is None:
        yield
        return
    try:
        import ray
    except ImportError:  # no Ray, nothing to start
        ray = None
    real_init, real_popen = ray and ray.init, subprocess.Popen

    def init(*args, **kwargs):
        _refuse(item, "Ray (ray.init)")

    class Popen(real_popen):
        def __init__(self, args, *rest, **kwargs):
            if what := launcher(args):
                _refuse(item, f"{what} (subprocess)")
            super().__init__(args, *rest, **kwargs)

    if ray is not None:
        ray.init = init
    subprocess.Popen = Popen
    try:
        yield
    finally:
        subprocess.Popen = real_popen
        if ray is not None:
            ray.init = real_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The phase in which a unit test broke its tier fails, even where the test caught the error."""
    outcome = yield
    message = getattr(item, "_tier_violation", None)
    if message is None:
        return
    report = outcome.get_result()
    item._tier_violation = None
    if not report.failed:
        report.outcome = "failed"
        report.longrepr = message
