"""tests/ray_watchdog.py: a test blocked in ``ray.get`` past its timeout fails, and the session goes on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.e2e  # its pytest session starts a local Ray (tests/tiers.py)

HUNG = """
import time

import pytest
import ray


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class Stuck:
    def wait(self):
        time.sleep(3600)


def test_hangs(cluster):
    ray.get(Stuck.remote().wait.remote())


def test_after():
    assert 1 + 1 == 2
"""


def test_a_hung_ray_get_fails_after_its_timeout_and_the_session_goes_on(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    pytester.makeconftest("from ray_watchdog import pytest_timeout_cancel_timer, pytest_timeout_set_timer\n")
    pytester.makepyfile(test_hung=HUNG)
    start = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "timeout=30", timeout=240)
    elapsed = time.monotonic() - start
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_hangs: over its 30 s timeout*"])  # under "Captured stderr call"
    assert elapsed < 150, elapsed  # without the watchdog: the hour of Stuck.wait
