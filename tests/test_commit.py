"""The commit record (marti_ibrl/commit.py): round trip, atomic replacement, seed check, DeepSpeed ``latest`` pins.
The trainer's exact resume through it is tests/test_e2e_resume.py."""

from __future__ import annotations

import json

import pytest

from marti_ibrl.commit import STATE_FILE, Commit, pin_deepspeed_latest


def _commit(k: int = 3) -> Commit:
    return Commit(
        iteration=k,
        seed=7,
        updates={"agent1": 3, "agent2": 1},
        sampler={"epoch": 1, "position": 2},
        pools={"agent1": {"role": "agent1", "size": 2, "eviction": "oldest", "members": []}},
        history=[{"iteration": i, "agent1/reward": 0.5 * i} for i in range(1, k + 1)],
        rollout_log=[{"iteration": i, "configuration": "both"} for i in range(1, k + 1)],
    )


def test_round_trip_and_the_file_format(tmp_path) -> None:
    assert Commit.read(tmp_path) is None  # before the first commit
    _commit().write(tmp_path)
    assert Commit.read(tmp_path) == _commit()
    on_disk = json.loads((tmp_path / STATE_FILE).read_text())
    keys = ["iteration", "seed", "updates", "sampler", "pools", "history", "rollout_log"]
    assert list(on_disk) == keys and on_disk["iteration"] == 3 and on_disk["updates"] == {"agent1": 3, "agent2": 1}
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]  # the temporary file was renamed over it


def test_a_later_commit_replaces_the_earlier(tmp_path) -> None:
    _commit(2).write(tmp_path)
    _commit(5).write(tmp_path)
    got = Commit.read(tmp_path)
    assert got.iteration == 5 and len(got.history) == 5


def test_resume_with_another_seed_is_refused() -> None:
    _commit().check(7)
    with pytest.raises(ValueError, match="made with --train.seed 7, not 8"):
        _commit().check(8)


def test_latest_is_pinned_to_the_committed_tag(tmp_path) -> None:
    actors = [tmp_path / r / "ckpt" / "_actor" for r in ("agent1", "agent2")]
    for a in actors:
        for k in (2, 3):
            (a / f"global_step{k}").mkdir(parents=True)
        (a / "latest").write_text("global_step3")  # a later save, half-written when the run was killed
    pin_deepspeed_latest(tmp_path, actors, 2)
    assert [(a / "latest").read_text() for a in actors] == ["global_step2"] * 2
    with pytest.raises(FileNotFoundError, match=r"commits iteration 4, but .*agent1/ckpt/_actor/global_step4"):
        pin_deepspeed_latest(tmp_path, actors, 4)
