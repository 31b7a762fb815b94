"""Recorded TeleSales calls for the annotation tests: real ``telesales eval`` episode lines, played through
:class:`~marti_ibrl.eval.telesales.env.TeleSalesEvalEnv` with scripted sales and simulator turns and written by the
evaluator's own :func:`~marti_ibrl.eval.telesales.evaluator.episode_record`."""

from __future__ import annotations

import json
from pathlib import Path

from marti_ibrl.envs.telesales import generate_profile
from marti_ibrl.eval.telesales.env import EvalCase, TeleSalesEvalEnv, simulator_turn_json
from marti_ibrl.eval.telesales.evaluator import episode_record
from marti_ibrl.eval.telesales.outputs import SCENES, SimulatorTurn, Story
from marti_ibrl.rollout.dialogue import Trajectory, Turn

STORY = Story("A courier who answers between deliveries.", {s: ("one line",) for s in SCENES})
SUCCESS_PLAN = [
    ("sales", "Hello, this is Li from the used-car app, about the hatchback you saved."),
    ("customer", ("ProvideInfo", "AskQuestion", "Oh right, what about it?")),
    ("sales", "I can send you the inspection report on WeChat. <call_function=send_contact_invitation>"),
    ("customer", ("AcceptContact", "ConfirmAdded", "OK, I accepted your request.")),
]
FAILURE_PLAN = [
    ("sales", "Hello, this is Li from the used-car app, about the hatchback you saved."),
    ("customer", ("EndCall", "HangUp", "Not interested, bye.")),
]


def play_call(index: int, success: bool, policy: str) -> dict:
    """One call on evaluation profile ``index``, ending in an add (``success``) or a hang-up; its episode record."""
    env = TeleSalesEvalEnv(sales_mode="checkpoint")
    case = EvalCase(generate_profile(index, seed=7, split="eval"), STORY)
    state = env.new_state(case)
    traj = Trajectory(scenario_uid=case.uid, scenario=case, seats=["sales", "customer"], policies={})
    for role, turn in SUCCESS_PLAN if success else FAILURE_PLAN:
        if role == "customer":
            intent, action, reply = turn
            turn = simulator_turn_json(SimulatorTurn((), **state.scores, intent=intent, action=action, reply=reply))
        result = env.step(state, role, turn)
        assert result.valid, result.reason
        traj.turns.append(Turn(role, turn, [], [], True))
    traj.state, traj.outcome = state, env.outcome(state)
    return episode_record(traj, policy, "simulator-x")


def write_calls(directory: Path) -> tuple[list[Path], dict[str, bool]]:
    """Five calls in two episode files (two methods): profiles 0-4, successes on 0 and 1; (files, profile ->
    success)."""
    outcomes = {0: True, 1: True, 2: False, 3: False, 4: False}
    directory.mkdir(parents=True, exist_ok=True)
    files = {"ibrl": directory / "ibrl.jsonl", "baseline": directory / "baseline.jsonl"}
    truth = {}
    for i, success in outcomes.items():
        policy = "ibrl" if i % 2 == 0 else "baseline"
        rec = play_call(i, success, policy)
        truth[rec["profile_id"]] = success
        with files[policy].open("a") as f:
            f.write(json.dumps(rec) + "\n")
    return list(files.values()), truth
