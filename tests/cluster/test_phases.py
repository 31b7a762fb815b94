"""marti_ibrl.cluster.phases: the phase record is durable and readable, and violations() finds every breach of the rules."""

from __future__ import annotations

import json
import threading

import pytest

from marti_ibrl.cluster.phases import PHASES_FILE, PhaseLog, read_phases, violations


def _rec(k, role, comp, ev, t):
    return {"iteration": k, "role": role, "component": comp, "event": ev, "start": t, "end": t + 0.5}


def _colocated_iteration(k, due, t0=0.0):
    """The order the colocated trainer keeps: offload every actor, wake every engine set, generate, sleep every
    engine set, reload and train the due roles, offload them, wake, sync the due roles."""
    roles, t, out = ("agent1", "agent2"), t0, []

    def add(role, comp, ev):
        nonlocal t
        out.append(_rec(k, role, comp, ev, t))
        t += 1.0

    for r in roles:
        add(r, "actor", "offload")
    for r in roles:
        add(r, "engines", "wake")
    for r in roles:
        add(r, "engines", "generate")
    for r in roles:
        add(r, "engines", "sleep")
    for r in due:
        add(r, "actor", "reload")
        add(r, "actor", "train")
    for r in due:
        add(r, "actor", "sync")
        add(r, "engines", "sync")
    return out, t


def test_the_colocated_order_has_no_violation_and_each_breach_is_named():
    due = {1: ["agent1", "agent2"], 2: ["agent1"]}
    one, t = _colocated_iteration(1, due[1])
    two, _ = _colocated_iteration(2, due[2], t)
    assert violations(one + two, due) == []
    # agent2 is not due at 2: reloading or syncing it is a breach
    bad = two + [_rec(2, "agent2", "actor", "reload", 500.0), _rec(2, "agent2", "engines", "sync", 501.0)]
    found = violations(one + bad, due)
    assert len(found) == 2 and all("agent2 is not due at iteration 2" in v for v in found)
    # generating after a sleep without a wake
    asleep = one + [_rec(2, "agent1", "engines", "generate", 500.0)]
    assert any("generated while asleep" in v for v in violations(asleep, due))
    # training while the engines are awake (the wake of iteration 2 came, no sleep after it)
    awake = one + [_rec(2, "agent1", "engines", "wake", 500.0), _rec(2, "agent1", "actor", "train", 501.0)]
    assert any("while engines of agent1 were awake" in v for v in violations(awake, due))
    # training with offloaded states
    off = [_rec(1, "agent1", "engines", "sleep", 0.0), _rec(1, "agent2", "engines", "sleep", 0.0)]
    off += [_rec(1, "agent1", "actor", "offload", 1.0), _rec(1, "agent1", "actor", "train", 2.0)]
    assert any("offloaded" in v for v in violations(off, due))
    # generating before the actors were offloaded (both share the GPUs)
    early = [_rec(1, "agent1", "engines", "generate", -1.0)]  # before iteration 1's offloads
    found = violations(early + one, due)
    assert found == ["iteration 1, agent1 engines generate at -1.000--0.500s: generated while the states of agent1, "
                     "agent2 were loaded"]  # fmt: skip


def test_separate_layouts_only_check_sleep_and_schedule():
    due = {1: ["agent1"]}
    records = [_rec(1, "agent1", "engines", "generate", 0.0), _rec(1, "agent1", "actor", "train", 1.0)]
    assert violations(records, due, colocated=False) == []
    assert violations(records, due, colocated=True) != []


def test_an_engine_set_is_never_synced_while_it_generates():
    """--train.async_rollout: k+1's rollout runs while k trains, and k's sync waits for it (any layout)."""
    due = {1: ["agent1"], 2: ["agent1"]}
    records = [_rec(1, "agent1", "engines", "generate", 0.0), _rec(1, "agent1", "actor", "train", 1.0)]
    records += [_rec(2, "agent1", "engines", "generate", 1.2), _rec(1, "agent1", "engines", "sync", 2.0)]
    records += [_rec(2, "agent2", "engines", "generate", 2.1)]  # another role's engines: theirs to generate
    assert violations(records, due, colocated=False) == []
    records[2]["end"] = 2.3  # k=2's rollout still running when k=1's sync started
    assert violations(records, due, colocated=False) == [
        "iteration 1, agent1 engines sync at 2.000-2.500s: while they generated iteration 2's rollout (1.200-2.300s)"
    ]
    assert violations([{**r, "session": i} for i, r in enumerate(records)], due, colocated=False) == []


def test_the_log_is_durable_threadsafe_and_says_what_had_no_effect(tmp_path):
    log = PhaseLog(tmp_path, effect="none on cpu")

    def work(role):
        for _ in range(50):
            with log.phase(1, role, "engines", "generate"):
                pass
        with log.phase(1, role, "engines", "sleep"):
            pass

    workers = [threading.Thread(target=work, args=(r,)) for r in ("agent1", "agent2")]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    records = read_phases(tmp_path)
    assert len(records) == 102 and all(r["end"] >= r["start"] for r in records)
    sleeps = [r for r in records if r["event"] == "sleep"]
    assert len(sleeps) == 2 and all(r["effect"] == "none on cpu" for r in sleeps)
    assert all("effect" not in r for r in records if r["event"] == "generate")
    (tmp_path / PHASES_FILE).open("a").write('{"iteration": 2, "ro')  # a torn last line from a kill
    assert len(read_phases(tmp_path)) == 102
    with pytest.raises(ValueError, match="unknown phase actor/generate"), log.phase(1, "agent1", "actor", "generate"):
        pass
    assert json.loads((tmp_path / PHASES_FILE).read_text().splitlines()[0])["iteration"] == 1
