"""Issue 49 item 5: degenerate updates (every advantage 0) are counted per role and warned about once, with a cause."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from marti_ibrl.algorithm.advantages import GroupSpread, group_spread, role_advantages
from marti_ibrl.training.checks import warn_uninformative


def _t(uid: str, malformed: bool = False):
    return SimpleNamespace(scenario_uid=uid, outcome=SimpleNamespace(malformed=malformed))


def test_a_group_is_informative_when_its_rewards_differ() -> None:
    scored = [(_t("a"), 1.0), (_t("a"), 0.0), (_t("b"), 0.5), (_t("b"), 0.5), (_t("c"), 2.0)]
    assert group_spread(scored) == GroupSpread(informative=1, groups=3, cause="")


def test_informative_groups_are_exactly_those_with_a_nonzero_advantage() -> None:
    """The count agrees with the advantages OpenRLHF computes (patch 0005) over the same groups."""
    torch = pytest.importorskip("torch")
    uids = ["a", "a", "b", "b", "c", "d", "d", "d"]
    rewards = [1.0, 0.0, 0.5, 0.5, 2.0, -1.0, -1.0, 0.25]
    adv = role_advantages(torch.tensor(rewards), uids, "agent1")
    moving = {u for u, a in zip(uids, adv.tolist()) if abs(a) > 1e-6}
    assert moving == {"a", "d"}
    assert group_spread([(_t(u), x) for u, x in zip(uids, rewards)]).informative == len(moving)


@pytest.mark.parametrize(
    ("scored", "cause"),
    [
        (
            [(_t("a", True), -1.0), (_t("a", True), -1.0), (_t("b", True), -1.0)],
            "all 3 of its dialogues ended malformed",
        ),
        (
            [(_t("a"), 0.0), (_t("a"), 0.0), (_t("b"), 0.0), (_t("b"), 0.0)],
            "its reward was 0 in all 4 of its dialogues",
        ),
        ([(_t("a"), 0.0), (_t("a"), 0.0), (_t("b"), 1.0)], "every group's rewards were equal within the group"),
    ],
)
def test_no_informative_group_names_its_cause(scored, cause) -> None:
    spread = group_spread(scored)
    assert spread.informative == 0 and spread.cause.startswith(cause)


def test_the_warning_comes_once_after_limit_uninformative_iterations(capsys) -> None:
    dead, alive = GroupSpread(0, 4, "all 8 of its dialogues ended malformed"), GroupSpread(2, 4)
    in_a_row: dict[str, int] = {}
    warned: set[str] = set()
    for k in range(1, 4):  # agent1 dead for 3 due iterations; agent2 alive, then dead twice: below the limit
        warn_uninformative(k, {"agent1": dead, "agent2": alive if k == 1 else dead}, in_a_row, warned, limit=3)
    assert in_a_row == {"agent1": 3, "agent2": 2} and warned == {"agent1"}
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "iteration 3: warning: agent1 has had no informative update for 3 iterations in a row (every advantage 0: all 8 "
        "of its dialogues ended malformed); it learns nothing from its rewards until its groups differ "
        "(docs/troubleshooting.md)"
    ]
    warn_uninformative(4, {"agent1": dead}, in_a_row, warned, limit=3)  # once per run
    warn_uninformative(5, {"agent1": alive}, in_a_row, warned, limit=3)  # an informative one resets the count
    assert capsys.readouterr().out == "" and in_a_row["agent1"] == 0


def test_limit_0_never_warns(capsys) -> None:
    in_a_row: dict[str, int] = {}
    for k in range(10):
        warn_uninformative(k, {"agent1": GroupSpread(0, 1, "x")}, in_a_row, set(), limit=0)
    assert capsys.readouterr().out == "" and in_a_row == {"agent1": 10}
