"""The commit record (marti_ibrl/commit.py): round trip, atomic replacement, seed check, DeepSpeed ``latest`` pins.
The trainer's exact resume through it is tests/e2e/test_e2e_resume.py."""

from __future__ import annotations

import json

import pytest

from marti_ibrl.commit import (
    ROLLOUTS_DIR,
    STATE_FILE,
    Commit,
    RunDirError,
    drop_rollouts,
    open_run_dir,
    pin_deepspeed_latest,
    read_rollout,
    write_rollout,
)
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.trainer import Rollout


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
    keys = ["iteration", "seed", "updates", "sampler", "pools", "history", "rollout_log", "ahead", "files"]
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


def _ahead(k: int = 4) -> Rollout:
    traj = Trajectory("s0", {"items": [1, 2]}, ["agent1", "agent2"], {"agent1": "current", "agent2": "pool:1"})
    traj.rewards, traj.learners = {"agent1": 0.25, "agent2": -1.0}, ("agent1",)
    return Rollout(
        k,
        [("s0", {"items": [1, 2]})],
        "agent1",
        ["agent1"],
        {"pairings": []},
        {"agent1": 2, "agent2": 1},
        seconds={"timing/rollout": 1.5},
        trajectories=[traj],
        span=(10.0, 11.5),
    )


def test_a_rollout_ahead_is_committed_durably_and_checked_before_it_is_read(tmp_path) -> None:
    """--train.async_rollout: the commit of k holds k+1's rollout (made by weights k's syncs replaced); resume reads it
    back equal, and refuses one whose bytes are not the committed ones (truncated, or another file's) by name."""
    entry = write_rollout(tmp_path, _ahead())
    assert entry["file"] == f"{ROLLOUTS_DIR}/k4.pkl" and entry["iteration"] == 4 and len(entry["sha256"]) == 64
    commit = Commit(**{**_commit().__dict__, "ahead": entry})
    commit.write(tmp_path)
    got = read_rollout(tmp_path, Commit.read(tmp_path).ahead)
    assert got == _ahead() and got.trajectories[0].learners == ("agent1",)
    path = tmp_path / entry["file"]
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    with pytest.raises(RunDirError, match=r"k4\.pkl \(\d+ bytes, not the \d+ committed\)"):
        read_rollout(tmp_path, entry)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes: never unpickled
    with pytest.raises(RunDirError, match="sha256 differs"):
        read_rollout(tmp_path, entry)
    path.unlink()
    with pytest.raises(RunDirError, match=r"k4\.pkl \(missing\), the rollout of iteration 4"):
        read_rollout(tmp_path, entry)


def test_resume_checks_the_committed_rollout_before_anything_starts(tmp_path) -> None:
    entry = write_rollout(tmp_path, _ahead())
    Commit(**{**_commit().__dict__, "ahead": entry}).write(tmp_path)
    for role in ("agent1", "agent2"):
        (tmp_path / role / "ckpt" / "_actor" / "global_step3").mkdir(parents=True)
    assert open_run_dir(tmp_path, resume=True, overwrite=False, seed=7).ahead == entry
    (tmp_path / entry["file"]).write_bytes(b"x")
    with pytest.raises(RunDirError, match="k4.pkl"):
        open_run_dir(tmp_path, resume=True, overwrite=False, seed=7)


def test_only_the_committed_rollout_is_kept(tmp_path) -> None:
    old, new = write_rollout(tmp_path, _ahead(3)), write_rollout(tmp_path, _ahead(5))
    drop_rollouts(tmp_path, keep=new["file"])
    assert sorted(p.name for p in (tmp_path / ROLLOUTS_DIR).iterdir()) == ["k5.pkl"] and old["file"] != new["file"]
    drop_rollouts(tmp_path, keep=None)  # the last commit: nothing ahead
    assert list((tmp_path / ROLLOUTS_DIR).iterdir()) == []
