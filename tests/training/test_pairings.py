"""Eq. 6 as the paper writes it, in the trainer: every scenario is played once per pairing, and each pairing feeds
the groups of its own learners (``marti_ibrl.training.seating.seat_policies``; pairings from
``marti_ibrl.algorithm.pool``).

No Ray: the trainer's parts are assembled by hand (stacks with fake engine handles, pools with snapshot entries), so
what is checked is the plays themselves: how many, who sits where, whose groups each feeds, and which snapshot.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from marti_ibrl.algorithm.pool import BOTH, OpponentPool, Snapshot
from marti_ibrl.training import snapshots as snapshots_module
from marti_ibrl.training.seating import seat_run
from marti_ibrl.training.snapshots import SnapshotBook

ROLES = ("agent1", "agent2")
SCENARIOS = [(f"q{i}", object()) for i in range(3)]


class _Engine:
    def __init__(self, name: str) -> None:
        self.name, self.loaded = name, []
        self.load_weights_file = SimpleNamespace(remote=self.loaded.append)


class _Run:
    """What :meth:`IBRLTrainer.prepare` seats policies from: the stacks, the snapshot book, the update counts."""

    def __init__(self, stacks: dict, book: SnapshotBook, updates: dict[str, int]) -> None:
        self.roles, self.stacks, self.snapshots, self.updates = list(stacks), stacks, book, updates
        self.pools, self.frozen, self.cfg = book.pools, {}, SimpleNamespace(train=SimpleNamespace(seed=1))

    def seat_policies(self, k: int, configuration: str, scenarios, due=None):
        """Seated as the trainer seats them, then the pool engines loaded (its next step, before generation)."""
        plays, log, loads = seat_run(self, k, configuration, scenarios, due)
        self.snapshots.load_pool_engines(loads)
        return plays, log


def _trainer(tmp_path, updates: dict[str, int], snapshots: dict[str, list[int]], roles=ROLES) -> _Run:
    stacks = {
        r: SimpleNamespace(
            engines=[_Engine(f"{r}/current")],
            pool_engines=[_Engine(f"{r}/pool")],
            tokenizer=None,
            lora=False,
            adapter=None,
        )
        for r in roles
    }
    book = object.__new__(SnapshotBook)
    book.stacks, book.pools, book.loaded, book.pending = stacks, {}, {}, []
    for r in roles:
        pool = book.pools[r] = OpponentPool(tmp_path, r, size=4)
        for v in snapshots.get(r, []):
            pool.members.append(Snapshot(r, v, v, pool.path_for(v).name, "0" * 64, 1, 0.1))
    return _Run(stacks, book, dict(updates))


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    monkeypatch.setattr(snapshots_module, "ray", SimpleNamespace(get=lambda refs: refs))


def _plays(t: _Run, configuration: str, k: int = 5):
    plays, log = t.seat_policies(k, configuration, SCENARIOS)
    return plays, log, [({r: p.name for r, p in play.policies.items()}, play.learners) for play in plays]


def test_a_history_iteration_plays_both_pairings_with_the_whole_batch(tmp_path) -> None:
    """p_agent1: current agent1 vs a historical agent2 feeds agent1; all-current play feeds agent2. Each pairing
    plays every scenario (then G samples each): both roles' groups are as large as in a ``both`` iteration."""
    t = _trainer(tmp_path, {"agent1": 4, "agent2": 2}, {"agent2": [1, 2]})
    plays, log, seated = _plays(t, "agent1")
    assert len(plays) == 2 * len(SCENARIOS)
    assert seated[:3] == [({"agent1": "current", "agent2": "pool:1"}, ("agent1",))] * 3  # v2 is current agent2
    assert seated[3:] == [({"agent1": "current", "agent2": "current"}, ("agent2",))] * 3
    assert [p.scenario for p in plays] == SCENARIOS * 2 and [p.index for p in plays] == [0, 1, 2] * 2
    assert plays[0].policies["agent2"].engines == t.stacks["agent2"].pool_engines  # the snapshot on pool engines
    assert plays[3].policies["agent2"].engines == t.stacks["agent2"].engines
    assert t.stacks["agent2"].pool_engines[0].loaded == [str(t.pools["agent2"].path_for(1))]
    assert log == {
        "opponents": {"agent1": "current", "agent2": "current,pool:1"},
        "pairings": [
            {"learners": ["agent1"], "seats": {"agent1": "current", "agent2": "pool:1"}},
            {"learners": ["agent2"], "seats": {"agent1": "current", "agent2": "current"}},
        ],
    }
    _, _, mirror = _plays(t, "agent2")  # agent1's pool is empty: nothing historical to face, current play for all
    assert mirror == [({"agent1": "current", "agent2": "current"}, ("agent1", "agent2"))] * 3


def test_each_pairing_is_a_rollout_pass_current_policies_first(tmp_path) -> None:
    """The pairing of current policies is pass 0, the one facing history pass 1 (DialogueRunner batches and seeds
    each apart); a colocated role (no pool engines) serves its snapshot from its own engines, loaded for pass 1."""
    from marti_ibrl.training.seating import snapshot_loads

    t = _trainer(tmp_path, {"agent1": 4, "agent2": 2}, {"agent2": [1, 2]})
    plays, _, _ = _plays(t, "agent1")
    assert [p.pass_ for p in plays] == [1, 1, 1, 0, 0, 0]
    assert snapshot_loads(plays) == {}  # the separate layout: a pool engine holds it
    t.stacks["agent2"].pool_engines = []  # --train.colocate: no pool engines
    t.snapshots.loaded = {}
    plays, _, _ = _plays(t, "agent1")
    history = plays[0].policies["agent2"]
    assert history.name == "pool:1" and history.engines == t.stacks["agent2"].engines
    assert history.weights == str(t.pools["agent2"].path_for(1))
    assert (
        not t.stacks["agent2"].engines[0].loaded
    )  # loaded by the rollout, before pass 1 (ColocationPhases.load_snapshots)
    assert snapshot_loads(plays) == {1: {"agent2": str(t.pools["agent2"].path_for(1))}}
    both, _, _ = _plays(t, BOTH)
    assert [p.pass_ for p in both] == [0, 0, 0] and snapshot_loads(both) == {}


def test_both_is_one_all_current_pairing_feeding_every_role(tmp_path) -> None:
    t = _trainer(tmp_path, {"agent1": 3, "agent2": 3}, {"agent1": [1, 2], "agent2": [1, 2]})
    plays, log, seated = _plays(t, BOTH)
    assert seated == [({"agent1": "current", "agent2": "current"}, ROLES)] * 3
    assert log["pairings"] == [{"learners": list(ROLES), "seats": {"agent1": "current", "agent2": "current"}}]
    assert not t.stacks["agent1"].pool_engines[0].loaded and not t.stacks["agent2"].pool_engines[0].loaded


def test_the_newest_snapshot_is_not_history_when_it_is_the_current_policy(tmp_path) -> None:
    """agent2 has updated once and its only snapshot (v1) is that update's weights: facing it would be current play
    thrown out of agent2's group. So the iteration is played all-current, and agent2 learns from it."""
    t = _trainer(tmp_path, {"agent1": 1, "agent2": 1}, {"agent1": [1], "agent2": [1]})
    _, _, seated = _plays(t, "agent1")
    assert seated == [({"agent1": "current", "agent2": "current"}, ROLES)] * 3
    t.updates["agent2"] = 2  # one update later, v1 is history (v2 is still being written: not in the pool yet)
    _, _, seated = _plays(t, "agent1")
    assert {s["agent2"] for s, _ in seated[:3]} == {"pool:1"}


def test_history_samples_are_uniform_and_seeded(tmp_path) -> None:
    t = _trainer(tmp_path, {"agent1": 9, "agent2": 9}, {"agent2": [5, 6, 7, 8, 9]})
    drawn = [_plays(t, "agent1", k)[2][0][0]["agent2"] for k in range(1, 401)]
    assert set(drawn) == {"pool:5", "pool:6", "pool:7", "pool:8"}  # v9 = current agent2, never drawn
    assert min(drawn.count(f"pool:{v}") for v in (5, 6, 7, 8)) > 60  # 100 expected each (binomial sd ~ 8.7)
    again = [_plays(t, "agent1", k)[2][0][0]["agent2"] for k in range(1, 401)]
    assert drawn == again  # a function of (seed, k): a resumed run draws the same


def test_three_roles_the_configurations_role_faces_every_others_history(tmp_path) -> None:
    roles = ("a", "b", "c")
    t = _trainer(tmp_path, {"a": 3, "b": 3, "c": 3}, {"a": [1, 2], "c": [2]}, roles=roles)
    _, log, _ = _plays(t, "b")
    history, current = log["pairings"]
    assert history["learners"] == ["b"] and current["learners"] == ["a", "c"]
    assert history["seats"]["b"] == "current" and history["seats"]["c"] == "pool:2"
    assert history["seats"]["a"] in {"pool:1", "pool:2"}
    assert current["seats"] == {"a": "current", "b": "current", "c": "current"}


def test_a_pairing_whose_learners_are_not_due_is_not_played(tmp_path) -> None:
    """u_i(k) = 0 for agent2 (it updates every second iteration): in a p_agent1 iteration the all-current pairing
    would feed only agent2's groups, which no update reads, so only agent1's pairing is played; in a p_agent2
    iteration only the all-current pairing is, feeding agent1. With no role due, every pairing is played."""
    t = _trainer(tmp_path, {"agent1": 4, "agent2": 2}, {"agent1": [1, 2], "agent2": [1]})
    plays, log = t.seat_policies(5, "agent1", SCENARIOS, due=["agent1"])
    assert [(p.learners, p.policies["agent2"].name) for p in plays] == [(("agent1",), "pool:1")] * 3
    assert log["pairings"] == [{"learners": ["agent1"], "seats": {"agent1": "current", "agent2": "pool:1"}}]
    plays, log = t.seat_policies(5, "agent2", SCENARIOS, due=["agent1"])
    assert {(p.learners, p.policies["agent1"].name, p.policies["agent2"].name) for p in plays} == {
        (("agent1", "agent2"), "current", "current")
    }
    assert len(plays) == len(SCENARIOS) and not t.stacks["agent1"].pool_engines[0].loaded
    plays, _ = t.seat_policies(5, "agent1", SCENARIOS, due=[])
    assert len(plays) == 2 * len(SCENARIOS)
    plays, _ = t.seat_policies(6, "agent1", SCENARIOS, due=["agent1", "agent2"])
    assert len(plays) == 2 * len(SCENARIOS)
