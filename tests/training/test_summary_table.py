from __future__ import annotations

from marti_ibrl.training.metrics import table_head, table_row


def _m(k: int, config: int, upd1: float, upd2: float) -> dict:
    return {
        "iteration": k,
        "pool/configuration": float(config),
        "rollout/agreement": 0.25,
        "rollout/malformed": 0.5,
        **{f"agent1/{c}": v for c, v in (("reward", 1.0), ("malformed", 0.0), ("updated", upd1))},
        **{f"agent2/{c}": v for c, v in (("reward", -0.5), ("malformed", 0.125), ("updated", upd2))},
    }


def summary_table(rows: list[dict], roles: list[str], iterations: int = 40) -> str:
    """The table as a run prints it, its head first and a row as each iteration ends."""
    return "\n".join([table_head(roles, iterations), *(table_row(m, roles, iterations) for m in rows)])


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


def test_the_live_rows_line_up_with_the_head_printed_before_the_first_iteration() -> None:
    """Issue 65: rows are printed as iterations end, so their widths are fixed before any value is known."""
    roles = ["agent1", "agent2"]
    wide = _m(1000, 1, 1.0, 0.0) | {"agent1/reward": -10.5, "agent2/reward": 12.25}
    lines = summary_table([_m(1, 0, 1.0, 0.0), wide], roles, iterations=1000).splitlines()
    assert len({len(line) for line in lines}) == 1, lines  # every row as wide as the head
    words = [line.replace("vs pool", "vs_pool") for line in lines]  # the one column name with a space
    ends = [[i + 1 for i, c in enumerate(w) if c != " " and (i + 1 == len(w) or w[i + 1] == " ")] for w in words]
    assert ends[0] == ends[1] == ends[2], lines  # right-aligned under their column names
    assert lines[2].split()[:2] == ["1000", "agent1"] and lines[2].split()[4] == "-10.50"
