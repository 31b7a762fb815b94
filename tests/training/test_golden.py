"""The golden-trajectory check itself (tests/golden.py): it names the path, the iteration and the value that moved,
and every path has a reference."""

from __future__ import annotations

import copy
import json

import golden
import pytest


def _history() -> list[dict]:
    return [
        {
            "iteration": k,
            "rollout/agreement": 0.25 * k,
            "rollout/malformed": 0.5,
            **{f"{r}/{c}": v for r in ("agent1", "agent2") for c, v in (("reward", 0.1 * k), ("malformed", 0.0))},
            "agent1/updated": 1.0,
            "agent2/updated": float(k % 2 == 0),
        }
        for k in (1, 2)
    ]


def test_the_same_run_has_no_difference() -> None:
    t = golden.trajectory(_history(), ["agent1", "agent2"], {"agent1": "aa", "agent2": "bb"})
    assert golden.differences("hf", t, json.loads(json.dumps(t))) == []


def test_a_moved_value_is_named_with_its_path_iteration_and_role() -> None:
    want = golden.trajectory(_history(), ["agent1", "agent2"], {"agent1": "aa", "agent2": "bb"})
    got = copy.deepcopy(want)
    got["iterations"][1]["agent2"]["reward"] += 1e-6
    got["iterations"][0]["agreement"] = 0.0
    got["iterations"][0]["agent1"]["updated"] = False
    got["digests"]["agent1"] = "cc"
    assert golden.differences("lora", want, got) == [
        "lora: iteration 1: agreement 0, recorded 0.25",
        "lora: iteration 1: agent1 updated False, recorded True",
        "lora: iteration 2: agent2 reward 0.200001, recorded 0.2",
        "lora: agent1's final weights digest cc, recorded aa",
    ]
    assert golden.differences("lora", want, {**got, "iterations": got["iterations"][:1]})[0] == (
        "lora: 1 iterations, recorded 2"
    )


@pytest.mark.parametrize("path", golden.PATHS)
def test_every_path_has_a_reference(path) -> None:
    ref = json.loads((golden.REFERENCES / f"{path}.json").read_text())
    assert len(ref["iterations"]) >= 3 and set(ref["digests"]) == {"agent1", "agent2"}
    assert all(len(d) == 64 for d in ref["digests"].values())  # sha256 hex
