from __future__ import annotations

from marti_ibrl.training.metrics import summary_table


def _m(k: int, config: int, upd1: float, upd2: float) -> dict:
    return {
        "iteration": k,
        "pool/configuration": float(config),
        "rollout/agreement": 0.25,
        "rollout/malformed": 0.5,
        **{f"agent1/{c}": v for c, v in (("reward", 1.0), ("malformed", 0.0), ("updated", upd1))},
        **{f"agent2/{c}": v for c, v in (("reward", -0.5), ("malformed", 0.125), ("updated", upd2))},
    }


def test_summary_table_shows_configuration_and_updates() -> None:
    table = summary_table([_m(1, 0, 1.0, 0.0), _m(2, 2, 0.0, 1.0)], ["agent1", "agent2"])
    lines = [line.split() for line in table.splitlines()]
    assert lines[0][:2] == ["iter", "vs"] and lines[0][-1] == "agent2:upd"
    assert lines[1] == ["1", "-", "0.25", "0.50", "1.00", "0.00", "y", "-0.50", "0.12", "-"]
    assert lines[2] == ["2", "agent2", "0.25", "0.50", "1.00", "0.00", "-", "-0.50", "0.12", "y"]


def test_an_update_with_every_advantage_zero_shows_as_0() -> None:
    """Issue 49 item 5: a role that stepped with no informative group (Â = 0 everywhere) reads ``0``, not ``y``."""
    rows = [_m(1, 0, 1.0, 1.0), _m(2, 0, 1.0, 0.0)]
    rows[0] |= {"agent1/informative_groups": 0.0, "agent2/informative_groups": 3.0}
    rows[1] |= {"agent1/informative_groups": 2.0, "agent2/informative_groups": 0.0}  # agent2 did not update
    lines = [line.split() for line in summary_table(rows, ["agent1", "agent2"]).splitlines()]
    assert [lines[1][6], lines[1][9]] == ["0", "y"]
    assert [lines[2][6], lines[2][9]] == ["y", "-"]
