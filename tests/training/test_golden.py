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
def test_every_path_has_a_reference_of_the_ci_machine(path) -> None:
    files = sorted(golden.REFERENCES.glob(f"{path}.json")) + sorted(golden.REFERENCES.glob(f"{path}@*.json"))
    assert ci_reference(path) in files
    for file in files:
        ref = json.loads(file.read_text())
        assert len(ref["iterations"]) >= 3 and set(ref["digests"]) == {"agent1", "agent2"}, file.name
        assert all(len(d) == 64 for d in ref["digests"].values())  # sha256 hex
        assert ref.get("machine", "") == file.stem.partition("@")[2] or "@" not in file.name, file.name


def ci_reference(path: str):
    """The CI machine's reference of ``path``: ``PATH@<CI machine>.json``, or ``PATH.json`` when it recorded first."""
    first = golden.REFERENCES / f"{path}.json"
    if first.exists() and json.loads(first.read_text()).get("machine") == golden.CI_MACHINE:
        return first
    return golden.REFERENCES / f"{path}@{golden.CI_MACHINE}.json"


def _learning_history() -> list[dict]:
    """Two iterations of 8 dialogues: a deal at k=2; agent1 updates both times, agent2 at k=2."""
    out = []
    for m in _history():
        k = m["iteration"]
        m = {**m, "rollout/dialogues": 8.0, "rollout/agreement": 0.125 * (k - 1)}
        for r in ("agent1", "agent2"):
            m |= {f"{r}/samples_penalized": 2.0, f"{r}/informative_groups": float(k), f"{r}/groups": 2.0}
            m |= {f"{r}/attempts_malformed": 0.1}
            if m[f"{r}/updated"]:
                m[f"{r}/adv_abs_mean"] = 0.5
        out.append(m)
    return out


def test_a_learning_trajectory_pins_the_learning_signal_and_counts_it() -> None:
    t = golden.trajectory(_learning_history(), ["agent1", "agent2"], {"agent1": "aa", "agent2": "bb"}, learning=True)
    first = t["iterations"][0]
    assert (first["dialogues"], first["deals"]) == (8, 0) and t["iterations"][1]["deals"] == 1
    # agent2 did not update at k=1: nothing of that iteration entered an update of its own
    assert first["agent2"] | {"attempts_malformed": None} == {
        **{"reward": 0.1, "malformed": 0.0, "updated": False, "penalized": 0, "informative_groups": 0},
        **{"groups": 2, "attempts_malformed": None, "adv_abs_mean": 0.0},
    }
    assert first["agent1"]["penalized"] == 2 and first["agent1"]["adv_abs_mean"] == 0.5
    assert t["counts"] == {
        "deals": 1,
        "dialogues": 16,
        "penalized": {"agent1": 4, "agent2": 2},
        "informative_groups": {"agent1": 3, "agent2": 2},
    }
    assert golden.unlearned("learn_hf", t) == []
    assert "counts" not in golden.trajectory(_learning_history(), ["agent1", "agent2"], {})  # mechanics: as before


def test_a_moved_count_is_named_and_a_run_without_learning_is_refused() -> None:
    want = golden.trajectory(_learning_history(), ["agent1", "agent2"], {"agent1": "aa"}, learning=True)
    got = copy.deepcopy(want)
    got["iterations"][1]["deals"] = 2
    got["iterations"][1]["agent1"]["penalized"] = 0
    got["iterations"][1]["agent1"]["adv_abs_mean"] = -0.5
    assert golden.differences("learn_hf", want, got) == [
        "learn_hf: iteration 2: deals 2, recorded 1",
        "learn_hf: iteration 2: agent1 penalized 0, recorded 2",
        "learn_hf: iteration 2: agent1 adv_abs_mean -0.5, recorded 0.5",
    ]
    history = [m | {"rollout/agreement": 0.0} for m in _learning_history()]
    for m in history:
        m |= {f"{r}/{c}": 0.0 for r in ("agent1", "agent2") for c in ("samples_penalized", "informative_groups")}
    none = golden.trajectory(history, ["agent1", "agent2"], {}, learning=True)
    assert golden.unlearned("learn_hf", none) == [
        "learn_hf: no deals in its 2 iterations",
        "learn_hf: no penalized in its 2 iterations",
        "learn_hf: no informative groups in its 2 iterations",
    ]


@pytest.mark.parametrize("path", golden.LEARNING)
def test_every_learning_reference_pins_learning(path) -> None:
    """Deals, penalised attempts and informative groups in the updates all occurred in the recorded run."""
    ref = json.loads(ci_reference(path).read_text())
    assert golden.unlearned(path, ref) == []
    assert ref["counts"] == golden.counts(ref["iterations"], ["agent1", "agent2"])
