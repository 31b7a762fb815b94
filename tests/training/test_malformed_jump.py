"""``warn_malformed_jump``: an update that broke a role's output format is said in one line (issue 49, item 5's
sibling). Replayed on the measured runs of ``benchmarks/learning_paths.py``: it fires on the LoRA collapse and on the
async path's one-iteration breaks of agent1's offers (docs/measured.md), and on no other run."""

import json
from pathlib import Path

from marti_ibrl.training.checks import warn_malformed_jump

UNITS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "learning_paths"


FLAGS = {"agent1": "--role1.lr", "agent2": "--role2.lr"}


def _m(agent1: float, agent2: float = 0.0, updated: float = 1.0, lr: float | None = None) -> dict:
    m = {"agent1/attempts_malformed": agent1, "agent2/attempts_malformed": agent2, "agent1/updated": updated}
    return m | ({"agent1/actor_lr": lr} if lr else {})


def test_a_jump_after_an_update_is_said_naming_role_rates_and_learning_rate(capsys) -> None:
    lines = warn_malformed_jump(18, _m(0.0, lr=0.0038), _m(0.61, 0.07), FLAGS, 0.3)
    assert lines == [
        "iteration 18: warning: agent1's malformed turns rose from 0.00 at iteration 17 to 0.61 after its update "
        "(learning rate 0.0038): an update that broke its output format; if it persists, lower --role1.lr "
        "(`marti-ibrl show RUN --malformed` says what it writes; docs/troubleshooting.md)"
    ]
    assert capsys.readouterr().out.strip() == lines[0]


def test_no_warning_below_the_jump_without_an_update_at_the_first_iteration_or_when_off(capsys) -> None:
    assert warn_malformed_jump(5, _m(0.10), _m(0.39), {"agent1": "--role1.lr"}, 0.3) == []  # +0.29
    assert (
        warn_malformed_jump(5, _m(0.0, updated=0.0), _m(0.9), {"agent1": "--role1.lr"}, 0.3) == []
    )  # it did not update
    assert warn_malformed_jump(1, None, _m(0.9), {"agent1": "--role1.lr"}, 0.3) == []
    assert warn_malformed_jump(5, _m(0.0), _m(0.9), {"agent1": "--role1.lr"}, 0.0) == []
    assert warn_malformed_jump(5, _m(0.0), _m(0.9), {"agent2": "--role2.lr"}, 0.3) == []  # (agent2 did not jump)
    assert capsys.readouterr().out == ""


def test_replayed_on_the_measured_runs_it_fires_on_the_lora_collapse_and_the_async_breaks_only(capsys) -> None:
    """Every unit of benchmarks/learning_paths.py, as if each role updated every iteration (more warnings, not
    fewer): the LoRA run at 5e-3, seed 1, at iteration 18 (agent1 0.00 -> 0.66), and the two 60-iteration async runs
    at the one iteration each where agent1's offers broke (seed 1: 0.00 -> 0.58 at 26; seed 42: 0.00 -> 0.94 at 33;
    both back to 0 the next iteration); no other unit (the largest jump elsewhere is below 0.3)."""
    fired = {}
    units = sorted(UNITS.glob("**/*.json"))
    assert len(units) >= 9
    for f in units:
        unit = json.loads(f.read_text())
        history = [m | {f"{r}/updated": 1.0 for r in unit["roles"]} for m in unit["history"]]
        for before, now in zip(history, history[1:]):
            flags = {r: f"--role{i}.lr" for i, r in enumerate(unit["roles"], 1)}
            lines = warn_malformed_jump(int(now["iteration"]), before, now, flags, 0.3)
            if lines:
                fired.setdefault(f.stem, []).append((int(now["iteration"]), lines[0].split("'")[0].split()[-1]))
    assert fired == {
        "lora-lr5e-3-s1": [(18, "agent1")],
        "async1-s1": [(26, "agent1")],
        "async1-s42": [(33, "agent1")],
    }
