"""Decoupled role-update scheduling (paper §4.2): u_i(k) gates role i's update at iteration k."""

from __future__ import annotations

import pytest

from marti_ibrl.algorithm.schedule import is_due, num_updates, roles_due


@pytest.mark.parametrize(
    ("update_every", "due_iterations"),
    [(1, [1, 2, 3, 4, 5, 6]), (2, [2, 4, 6]), (3, [3, 6]), (4, [4]), (7, [])],
)
def test_is_due_fires_on_multiples_of_the_period(update_every: int, due_iterations: list[int]) -> None:
    assert [k for k in range(1, 7) if is_due(k, update_every)] == due_iterations


def test_roles_due_paper_default_agent_every_iteration_user_every_second() -> None:
    schedule = {"agent": 1, "user": 2}
    got = {k: roles_due(k, schedule) for k in range(1, 7)}
    assert got == {
        1: ["agent"],
        2: ["agent", "user"],
        3: ["agent"],
        4: ["agent", "user"],
        5: ["agent"],
        6: ["agent", "user"],
    }


def test_roles_due_keeps_mapping_order_and_can_be_empty() -> None:
    assert roles_due(6, {"user": 2, "agent": 3}) == ["user", "agent"]
    assert roles_due(6, {"agent": 3, "user": 2}) == ["agent", "user"]
    assert roles_due(1, {"agent": 2, "user": 3}) == []
    assert roles_due(1, {}) == []


def test_num_updates_matches_counting_due_iterations() -> None:
    assert num_updates(10, 1) == 10
    assert num_updates(10, 2) == 5
    assert num_updates(10, 3) == 3
    assert num_updates(1, 2) == 0
    for iterations in range(1, 13):
        for every in range(1, 5):
            assert num_updates(iterations, every) == sum(is_due(k, every) for k in range(1, iterations + 1))


@pytest.mark.parametrize(("iteration", "update_every"), [(0, 1), (-1, 1), (1, 0), (3, -2)])
def test_is_due_rejects_non_positive_arguments(iteration: int, update_every: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        is_due(iteration, update_every)


def test_roles_due_rejects_bad_period_and_iteration_zero() -> None:
    with pytest.raises(ValueError):
        roles_due(2, {"agent": 1, "user": 0})
    with pytest.raises(ValueError):
        roles_due(0, {"agent": 1})


@pytest.mark.parametrize(("iterations", "update_every"), [(10, 0), (10, -1), (-5, 2)])
def test_num_updates_rejects_bad_input(iterations: int, update_every: int) -> None:
    # before the fix: (10, 0) raised ZeroDivisionError and (-5, 2) silently returned -3
    with pytest.raises(ValueError, match="update_every"):
        num_updates(iterations, update_every)
