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
    assert golden.REFERENCES / f"{path}@{golden.CI_MACHINE}.json" in files
    for file in files:
        ref = json.loads(file.read_text())
        assert len(ref["iterations"]) >= 3 and set(ref["digests"]) == {"agent1", "agent2"}, file.name
        assert all(len(d) == 64 for d in ref["digests"].values())  # sha256 hex
        assert ref.get("machine", "") == file.stem.partition("@")[2] or "@" not in file.name, file.name


def test_the_machine_fingerprint_is_stable_and_short() -> None:
    golden.machine.cache_clear()
    first = golden.machine()
    golden.machine.cache_clear()
    assert golden.machine() == first and len(first) == 12 and int(first, 16) >= 0


@pytest.fixture()
def refs(tmp_path, monkeypatch):
    """tests/references in ``tmp_path``, on a machine whose fingerprint is ``here``."""
    monkeypatch.setattr(golden, "REFERENCES", tmp_path)
    monkeypatch.setattr(golden, "machine", lambda: "here")
    monkeypatch.delenv(golden.RECORD_ENV, raising=False)
    return tmp_path


def _run(k: float = 0.0) -> tuple[list[dict], list[str], dict]:
    h = _history()
    h[1]["agent2/reward"] += k
    return h, ["agent1", "agent2"], {"agent1": "aa", "agent2": "bb"}


def test_a_run_is_compared_with_its_own_machines_reference_first(refs, monkeypatch) -> None:
    monkeypatch.setenv(golden.RECORD_ENV, "hf")
    golden.check("hf", *_run())  # no reference yet: the first recording is PATH.json, with this machine's fingerprint
    assert json.loads((refs / "hf.json").read_text())["machine"] == "here"
    monkeypatch.delenv(golden.RECORD_ENV)
    golden.check("hf", *_run())  # the same run passes
    with pytest.raises(pytest.fail.Exception, match=r"(?s)tests/references/hf\.json.*iteration 2: agent2 reward"):
        golden.check("hf", *_run(0.5))


def test_another_machines_reference_is_kept_and_this_machine_records_its_own_beside_it(refs, monkeypatch) -> None:
    legacy = golden.trajectory(*_run(0.5))  # the first recording, made before fingerprints: no "machine"
    (refs / "hf.json").write_text(json.dumps(legacy))
    with pytest.raises(pytest.skip.Exception, match="hf.json is the first recording machine's .* this is here"):
        golden.check("hf", *_run())  # no reference of its own: a skip naming this machine, never a comparison
    monkeypatch.setenv(golden.RECORD_ENV, "hf")
    golden.check("hf", *_run())
    assert json.loads((refs / "hf.json").read_text()) == legacy  # untouched
    assert json.loads((refs / "hf@here.json").read_text())["machine"] == "here"
    monkeypatch.delenv(golden.RECORD_ENV)
    golden.check("hf", *_run())  # now compared with its own
    with pytest.raises(pytest.fail.Exception, match="hf@here.json"):
        golden.check("hf", *_run(0.25))


def test_a_reference_of_another_machine_only_is_a_skip_that_says_so(refs) -> None:
    (refs / "lora.json").write_text(json.dumps({"machine": "there", **golden.trajectory(*_run())}))
    with pytest.raises(pytest.skip.Exception, match="machine there's and this is here"):
        golden.check("lora", *_run())
