"""End to end, issue 37: the colocated layouts (``--train.colocate role`` and ``all``) run the same iterations as the
separate layout (``none``) and record their phases in the order the hybrid engine promises.

Three 4-iteration runs of the tiny two-role DoND (``tests/same_iterations.py``: Ray + DeepSpeed + HF engines on CPU,
KL reference on, role2 at half frequency so it is not due at k=1 and 3, opponent pools on with every iteration
agent2's current policy facing agent1's history, which first exists at k=4), one per layout, same seed. The separate layout serves agent1's
snapshot from its pool engine; the colocated ones from agent1's own engine, loaded for that pairing and restored
after it. The `role` run stops after k=3 and is resumed (``--ckpt.load_enable``) for k=4, so exact resume of a
colocated run is part of the equality: its k=4 serves a snapshot committed by the first session. On CPU nothing is
freed by sleeping (see
marti_ibrl/cluster/colocate.py): what is tested is that the calls are made in OpenRLHF's order, that a role not due neither
reloads nor syncs, and that placement and the calls change nothing: the same dialogues (token for token), the same
metrics and the same weights, bit for bit.
"""

from __future__ import annotations

import golden
import pytest

from marti_ibrl.cluster.phases import violations

pytestmark = pytest.mark.slow

LAYOUTS = ("none", "role", "all")


def _timing(key: str) -> bool:
    return key.startswith("timing/") or "seconds" in key


@pytest.fixture(scope="module")
def runs(same_iterations):
    """tests/same_iterations.py: the runs, made once for this module and tests/e2e/test_e2e_async.py."""
    return same_iterations


def test_colocated_runs_equal_the_separate_layout(runs):
    base = runs["none"]
    # 4 iterations × 2 scenarios × G=2, and at k=4 the pairing facing one of agent1's snapshots v1, v2 too
    assert len(base["dialogues"]) == 20 and all(len(d) > 2 for d in base["dialogues"])
    assert sum(dict(d[-1])["agent1"] in ("pool:1", "pool:2") for d in base["dialogues"]) == 4
    for layout in ("role", "all"):
        got = runs[layout]
        assert got["dialogues"] == base["dialogues"], layout  # same turns, token for token, and rewards
        assert got["digests"] == base["digests"], layout  # actors' and engines' weights, bit for bit
        for mine, theirs in zip(got["history"], base["history"], strict=True):
            a = {k: v for k, v in mine.items() if not _timing(k)}
            b = {k: v for k, v in theirs.items() if not _timing(k)}
            assert a == b, (
                layout,
                sorted((k, a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)),
            )
    assert [m["agent2/updated"] for m in base["history"]] == [0.0, 1.0, 0.0, 1.0]  # the schedule the phases assume


def test_colocated_layouts_take_fewer_device_slots(runs):
    # per role: 1 engine + 1 pool engine + 1 actor rank + 1 reference rank of its own (none); on the actor's slot,
    # no pool engine (role); all on one
    assert [runs[layout]["slots"] for layout in LAYOUTS] == [8, 2, 1]
    for layout in LAYOUTS:
        colocate = runs[layout]["topology"]["colocate"]
        assert colocate["mode"] == layout
        assert colocate["sleep"].startswith("off" if layout == "none" else "unsupported on cpu"), colocate


DUE = {0: ["agent1", "agent2"], 1: ["agent1"], 2: ["agent1", "agent2"], 3: ["agent1"], 4: ["agent1", "agent2"]}


def _events(records, k):
    return [(r["role"], r["component"], r["event"]) for r in records if r["iteration"] == k]


@pytest.mark.parametrize("layout", ["role", "all"])
def test_phases_follow_the_hybrid_engine_order(runs, layout):
    records = runs[layout]["phases"]
    if layout == "role":  # each role alone on its GPUs
        for role in ("agent1", "agent2"):
            assert violations([r for r in records if r["role"] == role], DUE) == [], role
    else:
        assert violations(records, DUE) == []
    assert all(r["effect"] == "none on cpu" for r in records if r["event"] in ("wake", "sleep", "reload", "offload"))
    both = ("agent1", "agent2")
    start = [(r, "engines", "sleep") for r in both] + [(r, "actor", "offload") for r in both]
    start += [(r, "engines", "wake") for r in both] + [(r, c, "sync") for r in both for c in ("actor", "engines")]
    sessions = sorted({r["session"] for r in records})
    assert len(sessions) == (2 if layout == "role" else 1)  # `role` resumed at k=4
    for session in sessions:  # OpenRLHF's own first sleep and offload, then the start-up sync (resumed: again)
        assert _events([r for r in records if r["session"] == session], 0) == start, session
    wake_kv = [r["tags"] for r in records if r["iteration"] == 1 and r["event"] == "wake"]
    assert wake_kv == [["kv_cache"], ["kv_cache"], ["weights"]]  # the start-up sync woke their weights; agent1's sync
    # k=1: agent2 is not due: it neither reloads, trains nor syncs; agent1 does, and its engines wake weights only
    assert _events(records, 1) == [
        *[(r, "engines", "wake") for r in both],
        *[(r, "engines", "generate") for r in both],
        *[(r, "engines", "sleep") for r in both],
        ("agent1", "actor", "experience"),
        ("agent1", "actor", "reload"),
        ("agent1", "actor", "train"),
        ("agent1", "actor", "offload"),
        ("agent1", "engines", "wake"),
        ("agent1", "actor", "sync"),
        ("agent1", "engines", "sync"),
    ]
    # k=2: both due; on CPU the plan has nothing to free, so both update at once
    k2 = _events(records, 2)
    assert k2[6:14] == [(r, "actor", e) for e in ("experience", "reload", "train", "offload") for r in both]
    assert [r["tags"] for r in records if r["iteration"] == 2 and r["event"] == "wake"] == [
        ["kv_cache"],
        ["weights", "kv_cache"],  # agent2's engines slept with their weights since k=1's rollout
        ["weights"],
        ["weights"],
    ]
    # k=4: agent1's engine serves its snapshot for the pairing facing it (after the pairing of current policies),
    # then gets agent1's weights back, all while awake
    k4 = _events(records, 4)
    assert k4[:8] == [
        *[(r, "engines", "wake") for r in both],
        ("agent1", "engines", "load"),
        *[(r, "engines", "generate") for r in both],
        ("agent1", "engines", "restore"),
        *[(r, "engines", "sleep") for r in both],
    ]
    load = next(r for r in records if r["event"] == "load")
    played = {dict(d[-1])["agent1"] for d in runs["none"]["dialogues"]} - {"current"}
    assert load["snapshot"].endswith(f"v{int(played.pop()[5:]):06d}.safetensors") and load["iteration"] == 4, load
    assert not any(r["event"] in ("load", "restore") for r in records if r["iteration"] < 4)


def test_the_separate_layout_records_work_without_sleep(runs):
    records = runs["none"]["phases"]
    assert {r["event"] for r in records} == {"generate", "experience", "train", "sync"}
    assert violations(records, DUE, colocated=False) == []


@pytest.mark.parametrize(("path", "name"), [("separate", "none"), ("colocate_all", "all")])
def test_golden_trajectory(runs, path, name):
    """What the separate and the colocated seeded runs learned, and their final weights: pinned (tests/golden.py)."""
    run = runs[name]
    golden.check(path, run["history"], ["agent1", "agent2"], {r: actor for r, (actor, _) in run["digests"].items()})
