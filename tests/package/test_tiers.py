"""tests/tiers.py: every test gets exactly one tier, ``unit`` (``make test-fast``) or ``e2e``, without being told,
and a ``unit`` test that starts Ray or a launcher fails, naming the marker it needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tiers import TIERS, launcher

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = """
import pytest
from tiers import assign_tiers, pytest_runtest_makereport, pytest_runtest_protocol


@pytest.fixture
def local_slurm():
    yield None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    assign_tiers(items)
"""

PLAIN = """
import subprocess
import sys

import pytest
import ray


def test_plain():
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


@pytest.mark.slow
def test_slow():
    pass


def test_on_slurm(local_slurm):
    pass


def test_starts_ray():
    ray.init(address="local", num_cpus=1)


def test_swallows_the_refusal():
    try:
        ray.init()
    except Exception:
        pass


def test_launches_torchrun(tmp_path):
    subprocess.run(["torchrun", "--nproc_per_node", "2", str(tmp_path / "x.py")])


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", num_cpus=1)


def test_fixture_starts_ray(cluster):
    pass


def test_fakes_ray(monkeypatch):
    monkeypatch.setattr(ray, "init", lambda **kw: kw)
    assert ray.init(address="local") == {"address": "local"}
"""

E2E_MODULE = """
import pytest

pytestmark = pytest.mark.e2e


def test_in_an_e2e_module():
    pass
"""

INI = "[pytest]\nmarkers =\n    slow: s\n    unit: u\n    e2e: e\n"


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.syspath_prepend(str(TESTS))
    pytester.makeini(INI)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_plain=PLAIN, test_e2e_module=E2E_MODULE)
    return pytester


def _selected(suite: pytest.Pytester, *args: str) -> set[str]:
    result = suite.runpytest("--collect-only", "-q", *args)
    return {line.split("::")[1] for line in result.outlines if "::" in line}


def test_this_test_is_unit(request: pytest.FixtureRequest) -> None:
    """The suite's own conftest tiers its tests, and pytest.ini registers the tiers."""
    assert [t for t in TIERS if request.node.get_closest_marker(t)] == ["unit"]
    assert {line.split(":")[0] for line in request.config.getini("markers")} >= {"slow", *TIERS}


def test_the_tiers_split_the_tests_by_the_rules(suite: pytest.Pytester) -> None:
    everything = _selected(suite)
    e2e = _selected(suite, "-m", "e2e")
    assert e2e == {"test_slow", "test_on_slurm", "test_in_an_e2e_module"}
    assert _selected(suite, "-m", "unit") == everything - e2e
    assert _selected(suite, "-m", "not e2e") == everything - e2e
    assert len(everything) == 9


def test_a_unit_test_that_starts_ray_or_a_launcher_fails_naming_the_marker(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-m", "unit", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=3, errors=1)  # test_fixture_starts_ray: an error in its set-up
    out = result.stdout.str()
    for name, what in [
        ("test_starts_ray", "Ray (ray.init)"),
        ("test_swallows_the_refusal", "Ray (ray.init)"),
        ("test_launches_torchrun", "torchrun (subprocess)"),
        ("test_fixture_starts_ray", "Ray (ray.init)"),
    ]:
        assert f"test_plain.py::{name} is in the unit tier (pytest -m unit, make test-fast) but starts {what}" in out
    assert out.count("mark it or its module `pytest.mark.e2e`") >= 4


def test_a_test_marked_unit_by_hand_cannot_be_e2e(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_both="import pytest\n\n\n@pytest.mark.unit\n@pytest.mark.slow\ndef test_both():\n    pass\n")
    result = suite.runpytest("--collect-only", "-q", "test_both.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_both.py::test_both: marked unit, but it is e2e" in result.stderr.str()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["torchrun", "--standalone", "x.py"], "torchrun"),
        (["/usr/bin/sbatch", "job.sh"], "sbatch"),
        ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "x.py"], "torch.distributed.run"),
        ("ray start --head", "ray"),
        ([Path("/opt/deepspeed"), "train.py"], "deepspeed"),
        ([sys.executable, "-m", "marti_ibrl.cli", "plan"], None),
        (["bash", "recipes/local-slurm.sh"], None),
        ("echo 'unclosed", None),
        ([], None),
    ],
)
def test_launcher(args, expected) -> None:
    assert launcher(args) == expected
