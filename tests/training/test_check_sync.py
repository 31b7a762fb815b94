"""``--train.check_sync`` (``IBRLTrainer.check_sync``): digests of every actor, engine, pool engine and pool
snapshot appended to ``RUN/sync_checks.jsonl``; an engine that missed the broadcast stops the run, naming it.

No Ray: the trainer is assembled from its parts, its stacks report digests as a real stack would."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from marti_ibrl.algorithm.pool import OpponentPool, Snapshot
from marti_ibrl.rollout.digest import params_digest
from marti_ibrl.trainer import IBRLTrainer


def _trainer(tmp_path, engines: dict[str, list[str]], pool_engines: list[str] | None = None) -> IBRLTrainer:
    t = object.__new__(IBRLTrainer)
    t.cfg = SimpleNamespace(train=SimpleNamespace(check_sync=True))
    t.run_dir = tmp_path
    t.stacks = {
        r: SimpleNamespace(
            weights_digest=lambda r=r: f"{r}-actor",
            engine_digests=lambda es=None, r=r: list(pool_engines if es == "pool" else engines[r]),
            pool_engines="pool",
            lora=False,
        )
        for r in engines
    }
    t.topology = {"trained": {r: {"weight_sync": "gloo"} for r in engines}}
    t.snapshots = SimpleNamespace(pools={}, loaded={})  # the pools and the snapshot each role's pool engines hold
    # the separate layout: reading engines wakes nothing (a colocated run wakes their weights first)
    t.colocation = SimpleNamespace(wake_for_reading=lambda k, roles: None)
    return t


def _lines(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "sync_checks.jsonl").read_text().splitlines()]


def test_in_sync_engines_are_recorded_every_check(tmp_path) -> None:
    t = _trainer(tmp_path, {"agent1": ["agent1-actor"] * 2, "agent2": ["agent2-actor"]})
    t.check_sync(0)
    t.check_sync(1)
    assert [(x["iteration"], x["role"], x["actor"], x["engines"]) for x in _lines(tmp_path)] == [
        (0, "agent1", "agent1-actor", ["agent1-actor"] * 2),
        (0, "agent2", "agent2-actor", ["agent2-actor"]),
        (1, "agent1", "agent1-actor", ["agent1-actor"] * 2),
        (1, "agent2", "agent2-actor", ["agent2-actor"]),
    ]


def test_an_engine_that_missed_the_broadcast_stops_the_run(tmp_path) -> None:
    t = _trainer(tmp_path, {"agent1": ["agent1-actor", "stale"]})
    with pytest.raises(RuntimeError, match=r"after iteration 3, agent1's engines \[1\] do not hold its actor's"):
        t.check_sync(3)
    assert _lines(tmp_path)[0]["engines"] == ["agent1-actor", "stale"]  # recorded before stopping


def test_a_pool_engine_is_checked_against_its_snapshot_file(tmp_path) -> None:
    weights = {"w": torch.arange(4.0)}
    pool = OpponentPool(tmp_path / "pool", "agent1", size=2)
    pool.path_for(1).parent.mkdir(parents=True)
    save_file(weights, str(pool.path_for(1)))
    pool.members.append(Snapshot("agent1", 1, 1, pool.path_for(1).name, "0" * 64, 1, 0.1))
    digest = params_digest(weights.items())
    t = _trainer(tmp_path, {"agent1": ["agent1-actor"]}, pool_engines=[digest])
    t.snapshots.pools, t.snapshots.loaded = {"agent1": pool}, {"agent1": 1}
    t.check_sync(2)
    assert _lines(tmp_path)[0] == {
        "iteration": 2,
        "role": "agent1",
        "actor": "agent1-actor",
        "engines": ["agent1-actor"],
        "pool_version": 1,
        "pool_file": digest,
        "pool_engines": [digest],
    }
    t.stacks["agent1"].engine_digests = lambda es=None: ["other"] if es == "pool" else ["agent1-actor"]
    with pytest.raises(RuntimeError, match=r"its pool engines \[0\] not pool snapshot v1"):
        t.check_sync(3)


def test_off_by_default_nothing_is_gathered(tmp_path) -> None:
    t = _trainer(tmp_path, {"agent1": ["x"]})
    t.cfg.train.check_sync = False
    t.stacks["agent1"].weights_digest = lambda: pytest.fail("gathered with --train.check_sync false")
    t.check_sync(1)
    assert not (tmp_path / "sync_checks.jsonl").exists()
