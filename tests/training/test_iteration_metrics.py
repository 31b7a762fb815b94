"""An iteration's numbers from plain records (``marti_ibrl.training.metrics.iteration_metrics``): what the iteration
table, tensorboard and the commit record's ``history`` read, computed here by hand from four dialogues."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from marti_ibrl.algorithm.advantages import GroupSpread
from marti_ibrl.algorithm.batching import RankSplit
from marti_ibrl.envs.base import Outcome
from marti_ibrl.rollout.dialogue import Attempt, Trajectory, Turn
from marti_ibrl.training.metrics import iteration_metrics, mean_advantages, sampled_nll

ROLES = ("agent1", "agent2")


def _dialogue(agreed: bool, malformed: bool, rewards: dict, turns: list[tuple[str, bool]], **kw) -> Trajectory:
    fault = {"fault_role": "agent2"} if malformed else {}
    return Trajectory(
        "q1",
        None,
        list(ROLES),
        kw.pop("policies", {"agent1": "current", "agent2": "current"}),
        turns=[Turn(r, "x", [1], [0.0], valid) for r, valid in turns],
        outcome=Outcome(agreed, malformed, {"agent1": 4.0 * agreed, "agent2": 6.0 * agreed}, fault),
        rewards=rewards,
        **kw,
    )


def test_every_number_is_the_one_counted_by_hand() -> None:
    dialogues = [
        _dialogue(True, False, {"agent1": 4.0, "agent2": 6.0}, [("agent1", True), ("agent2", True)]),
        _dialogue(
            False,
            True,
            {"agent1": 0.0, "agent2": -1.0},
            [("agent1", True), ("agent2", False)],
            discarded=[Attempt("agent2", "<try", [1], [2], [0.0], "format")],
        ),  # fmt: skip
        _dialogue(
            False,
            False,
            {"agent1": 0.0},
            [("agent1", True)] * 3,
            reward_failures={"agent2": "judge: timeout"},
            policies={"agent1": "current", "agent2": "pool:1"},
            truncated=True,
        ),  # fmt: skip
        _dialogue(True, False, {"agent1": 2.0, "agent2": 3.0}, [("agent1", True), ("agent2", True)]),
    ]
    attempt = SimpleNamespace(outcome=Outcome(False, True, {}, {"attempt": 1}))
    m = iteration_metrics(
        7,
        dialogues,
        roles=list(ROLES),
        configuration="agent1",
        schedule=["agent1"],
        status={"agent1": {"update/steps": 2.0, "update/skipped": 0.0, "policy_loss": 0.5, "note": "text"}},
        advantages={"agent1": [0.5, -1.5]},
        scored={"agent1": [(d, 1.0) for d in dialogues] + [(attempt, -1.0)], "agent2": [(dialogues[0], 6.0)]},
        splits={"agent1": RankSplit(((0, 1, 2), (3, 4)), (1, 2), 2)},
        ranks={"agent1": 2, "agent2": 1},
        spreads={"agent1": GroupSpread(1, 1), "agent2": GroupSpread(0, 1, "one member")},
        synced={"agent1": {"bytes": 1024, "seconds": 0.5}, "agent2": None},
        pools={"agent2": _Pool([0.25])},
        reward_stats={"judge/calls": 3.0},
        seconds={"timing/rollout": 1.5},
    )
    assert m["iteration"] == 7 and m["timing/rollout"] == 1.5 and m["judge/calls"] == 3.0
    assert (m["rollout/dialogues"], m["rollout/agreement"], m["rollout/malformed"]) == (4.0, 0.5, 0.25)
    assert (m["rollout/turns"], m["rollout/truncated"], m["rollout/failed"]) == (2.25, 0.25, 0.0)
    assert m["pool/configuration"] == 1.0  # ["both", "agent1", "agent2"]
    assert (m["agent2/pool/size"], m["agent2/pool/snapshot_seconds"]) == (1.0, 0.25) and "agent1/pool/size" not in m
    assert m["agent1/reward"] == pytest.approx(1.5) and m["agent2/reward"] == pytest.approx(8 / 3)
    assert (m["agent2/reward_failed"], m["agent2/reward/failures"], m["agent1/reward_failed"]) == (0.25, 1.0, 0.0)
    assert (m["agent1/utility"], m["agent2/utility"]) == (2.0, 3.0)
    assert (m["agent1/malformed"], m["agent2/malformed"]) == (0.0, 0.25)
    assert m["agent2/attempts_malformed"] == 0.5  # 1 discarded + 1 invalid turn, of 4 generated
    assert (m["agent1/updated"], m["agent2/updated"], m["agent1/scheduled"], m["agent2/scheduled"]) == (1, 0, 1, 0)
    assert (m["agent1/current_share"], m["agent2/current_share"]) == (1.0, 0.75)
    assert m["agent1/policy_loss"] == 0.5 and "agent1/note" not in m and m["agent1/adv_abs_mean"] == 1.0
    assert "agent2/adv_abs_mean" not in m
    assert (m["agent1/samples_made"], m["agent1/samples_trained"], m["agent1/samples_padding"]) == (5.0, 5.0, 3.0)
    assert (m["agent1/rank1/samples_trained"], m["agent1/rank1/samples_padding"]) == (2.0, 2.0)
    assert (m["agent2/samples_made"], m["agent2/samples_trained"], m["agent2/rank0/samples_padding"]) == (1, 0, 0)
    assert (m["agent1/samples_penalized"], m["agent2/samples_penalized"]) == (1.0, 0.0)
    assert (m["agent1/informative_groups"], m["agent2/informative_groups"], m["agent2/groups"]) == (1.0, 0.0, 1.0)
    assert (m["agent1/sync/bytes"], m["agent1/sync/seconds"]) == (1024.0, 0.5) and "agent2/sync/bytes" not in m


class _Pool:
    def __init__(self, seconds: list[float]) -> None:
        self.members = [SimpleNamespace(seconds=s) for s in seconds]

    def __len__(self) -> int:
        return len(self.members)


def test_mean_advantages_are_per_sample_not_per_micro_batch() -> None:
    """A micro-batch holding a whole group (Eq. 4: its advantages sum to 0) must not read as advantages of 0."""
    import torch

    # one experience of 4 samples, a group of one deal among four: +1.5 and three -0.5, over 3 action tokens each
    # (the last sample's final token is padding)
    adv = torch.tensor([[1.5, 1.5, 1.5], [-0.5, -0.5, -0.5], [-0.5, -0.5, -0.5], [-0.5, -0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
    batch = SimpleNamespace(advantages=adv, action_mask=mask)
    empty = SimpleNamespace(advantages=torch.zeros(2, 3), action_mask=torch.zeros(2, 3))  # no action tokens
    assert mean_advantages([batch, empty]) == [1.5, -0.5, -0.5, -0.5]
    one = SimpleNamespace(advantages=torch.tensor([2.0, 4.0, 7.0]), action_mask=torch.tensor([1, 1, 0]))
    assert mean_advantages([one]) == [3.0]


def test_sampled_nll_is_the_mean_negative_log_prob_of_the_current_policys_own_tokens() -> None:
    """The entropy estimate counts the role's action tokens only, and only where its current policy played."""

    def view(logprobs, ranges, has=True):
        return SimpleNamespace(logprobs=logprobs, action_ranges=ranges, has_logprobs=has)

    mine = _dialogue(False, False, {}, [("agent1", True)])
    mine.views = {"agent1": view([0.0, -1.0, -2.0, 0.0, -3.0], [(1, 3), (4, 5)])}  # tokens 1-2 and 4: 1 + 2 + 3
    pool = _dialogue(False, False, {}, [("agent1", True)], policies={"agent1": "pool:2", "agent2": "current"})
    pool.views = {"agent1": view([-9.0, -9.0], [(0, 2)])}  # a snapshot's tokens: not the current policy's
    remote = _dialogue(False, False, {}, [("agent2", True)])
    remote.views = {"agent2": view([0.0, 0.0], [(0, 2)], has=False)}
    assert sampled_nll([mine, pool], "agent1") == 2.0
    assert sampled_nll([remote], "agent2") is None and sampled_nll([mine], "agent2") is None
