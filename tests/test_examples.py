"""Examples are real: the fairness reward plugs in through the same loader the trainer uses."""

import sys
from pathlib import Path

from marti_ibrl.envs.base import Outcome
from marti_ibrl.rewards import load_reward_fn
from marti_ibrl.rollout.dialogue import Trajectory

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_fair_reward_example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    fn = load_reward_fn("fair_reward:fair_share")
    traj = Trajectory("s1", None, ["agent1", "agent2"], {"agent1": "current", "agent2": "current"})
    traj.outcome = Outcome(agreed=True, malformed=False, utilities={"agent1": 8.0, "agent2": 2.0})
    assert fn(traj, "agent1", None) == 8.0 - 0.5 * 6.0
    assert fn(traj, "agent2", None) == 2.0 - 0.5 * 6.0
    traj.outcome = Outcome(agreed=False, malformed=False, utilities={"agent1": 0.0, "agent2": 0.0})
    assert fn(traj, "agent1", None) == 0.0
    sys.modules.pop("fair_reward", None)
