"""``DialogueRunner`` with text players in a seat (unilateral baselines): a scripted DoND bot plays agent2 while
agent1 is served by a seed-aware fake engine. No Ray: the engine runs in-process behind a ``.remote`` shim and the
runner's ``ray.get`` is replaced by the identity."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import test_runner  # the tiny ChatML tokenizer fixture and the token-id helper of the Ray runner tests

from marti_ibrl.envs.dond import DondEnv, DondScenario, complement, format_selection, format_try, parse_utterance
from marti_ibrl.envs.dond.bots import all_allocations
from marti_ibrl.rewards import env_reward
from marti_ibrl.rollout import runner as runner_module
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.rollout.players import ScriptedBotPlayer
from marti_ibrl.rollout.render import RoleView
from marti_ibrl.rollout.runner import (
    CONTEXT_LIMIT,
    COUNTERPART_FAILURE,
    DialogueRunner,
    Policy,
    Request,
    first_turns_overflowing,
    requests,
    seats_for,
)
from marti_ibrl.tiny import IM_END, IM_START

tok = test_runner.tok  # module-scoped fixture, re-exported so pytest finds it here
ROLES = ("agent1", "agent2")
MAX_NEW_TOKENS = 32
SCENARIOS = [
    ("s0", DondScenario(counts=(1, 2, 3), values=((4, 3, 0), (0, 2, 2)), uid="s0")),
    ("s1", DondScenario(counts=(2, 2, 1), values=((1, 2, 4), (3, 1, 2)), uid="s1")),
]
N_SAMPLES = 3
_INPUT = re.compile(r"<input> (\d+) \d+ (\d+) \d+ (\d+) \d+ </input>")


class SeededFakeEngine:
    """agent1's engine: confirms a counterpart ``<selection>`` with its complement (a deal), otherwise proposes a
    ``<try>`` drawn from ``random.Random(sampling seed, session, prompt length)``: seed-aware and reproducible."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.calls: list[dict] = []
        self.generate_batch = SimpleNamespace(remote=self._generate_batch)  # the Ray-handle call syntax

    def _generate_batch(self, prompts: Sequence[list[int]], sampling: dict, session_ids: Sequence[str]) -> list[dict]:
        self.calls.append({"n": len(prompts), "sampling": dict(sampling), "sessions": list(session_ids)})
        out = []
        for prompt, session in zip(prompts, session_ids, strict=True):
            text = self.tok.decode(prompt, skip_special_tokens=False)
            counts = tuple(int(c) for c in _INPUT.search(text).groups())
            messages = text.split(IM_START)
            assert messages[-1] == "assistant\n"
            last = messages[-2].removesuffix("\n").removesuffix(IM_END)
            rng = random.Random(f"{sampling['seed']}/{session}/{len(prompt)}")
            action = parse_utterance(last.removeprefix("user\n")) if last.startswith("user\n") else None
            if action is not None and action.kind == "selection":
                reply = f"Deal. {format_selection(complement(counts, action.alloc))}"
            else:
                reply = f"I propose this. {format_try(rng.choice(all_allocations(counts)))}"
            ids = test_runner._ids(self.tok, reply)
            out.append(
                {
                    "token_ids": ids,
                    "logprobs": [-round(rng.random(), 4) for _ in ids],
                    "finish_reason": "stop",
                }
            )
        return out  # one engine ref: ray.get(refs) yields one such list per engine


class FlakyPlayer:
    """A text player whose endpoint is down for one scenario: ``None`` there, a scripted bot's turn elsewhere."""

    def __init__(self, down_for: str) -> None:
        self.name = "flaky"
        self.down_for = down_for
        self.bot = ScriptedBotPlayer("greedy")

    def respond(self, env: Any, role: str, trajectories: Sequence[Trajectory]) -> list[str | None]:
        texts = self.bot.respond(env, role, trajectories)
        return [None if t.scenario_uid == self.down_for else x for t, x in zip(trajectories, texts, strict=True)]


@pytest.fixture(scope="module")
def no_ray():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner_module, "ray", SimpleNamespace(get=lambda refs: refs))
        yield


@pytest.fixture(scope="module")
def env() -> DondEnv:
    return DondEnv(prompt_style="compact", max_rounds=6)


def _run(env, tok, policies_for_agent2, seed=0, max_live=None, reward_fns=None, max_len=4096, **runner_kwargs):
    engine = SeededFakeEngine(tok)
    runner = DialogueRunner(
        env,
        reward_fns=reward_fns or {r: env_reward(env) for r in ROLES},
        sampling={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": MAX_NEW_TOKENS},
        max_len=max_len,
        max_resamples=2,
        **runner_kwargs,
    )
    current = Policy("current", [engine], tok)
    if isinstance(policies_for_agent2, Policy):
        asked = requests(SCENARIOS, {"agent1": current, "agent2": policies_for_agent2})
    else:
        asked = [Request(*s, {"agent1": current, "agent2": p}) for s, p in zip(SCENARIOS, policies_for_agent2)]
    trajs = runner.run(asked, n_samples=N_SAMPLES, seed=seed, max_live=max_live)
    return trajs, engine


def _bot(name: str) -> Policy:
    return Policy(f"frozen:bot:{name}", player=ScriptedBotPlayer(name))


@pytest.fixture(scope="module")
def vs_greedy(env, tok, no_ray):
    return _run(env, tok, _bot("greedy"), seed=0)


def _replays_bot(env: DondEnv, traj: Trajectory, bot: str) -> bool:
    """Whether every agent2 turn of ``traj`` is what ``bot`` says given the turns before it."""
    player = ScriptedBotPlayer(bot)
    for k, turn in enumerate(traj.turns):
        if turn.role != "agent2":
            continue
        prefix = Trajectory(
            scenario_uid=traj.scenario_uid,
            scenario=traj.scenario,
            seats=traj.seats,
            policies=traj.policies,
            turns=traj.turns[:k],
            sample_index=traj.sample_index,
        )
        if player.respond(env, "agent2", [prefix])[0].strip() != turn.text:
            return False
    return True


def test_policy_takes_engines_or_a_player_never_both(tok) -> None:
    with pytest.raises(ValueError, match="either engines"):
        Policy("x")
    with pytest.raises(ValueError, match="either engines"):
        Policy("x", [object()], tok, player=ScriptedBotPlayer("greedy"))


def test_bot_seat_has_no_view_and_text_only_turns(vs_greedy, env) -> None:
    trajs, _ = vs_greedy
    assert [(t.scenario_uid, t.sample_index) for t in trajs] == [(uid, g) for uid, _ in SCENARIOS for g in range(3)]
    for si, t in enumerate(trajs):
        assert t.policies == {"agent1": "current", "agent2": "frozen:bot:greedy"}
        assert t.seats == seats_for(ROLES, si // N_SAMPLES, t.sample_index)
        assert "agent2" not in t.views and set(t.views) == {"agent1"}
        assert not t.failed and not t.truncated
        assert t.outcome is not None and t.outcome.info["reason"] != COUNTERPART_FAILURE
        assert len(t.turns) >= 2
        assert [turn.role for turn in t.turns] == [t.seats[k % 2] for k in range(len(t.turns))]
        for turn in t.turns:
            assert turn.valid and turn.resamples == 0
            if turn.role == "agent2":
                assert turn.token_ids == [] and turn.logprobs == []
                assert turn.text and turn.text == turn.text.strip()
                assert parse_utterance(turn.text).kind in ("try", "selection", "disagree")
            else:
                assert turn.token_ids and len(turn.logprobs) == len(turn.token_ids)
        assert _replays_bot(env, t, "greedy")


def test_agent1_view_has_the_bots_text_as_counterpart(vs_greedy, tok) -> None:
    trajs, _ = vs_greedy
    for t in trajs:
        view = t.views["agent1"]
        bot_texts = [turn.text for turn in t.turns if turn.role == "agent2"]
        assert [m["content"] for m in view.messages if m["role"] == "user"] == bot_texts
        own = [turn for turn in t.turns if turn.role == "agent1"]
        assert [view.ids[s:e] for s, e in view.action_ranges] == [turn.token_ids for turn in own]
        decoded = tok.decode(view.ids)
        for text in bot_texts:
            assert f"{IM_START}user\n{text}{IM_END}" in decoded
        # the bot's tokens are context only: the action mask covers exactly agent1's generated tokens
        assert int(view.action_mask().sum()) == sum(len(turn.token_ids) for turn in own)


def test_deals_with_the_bot_are_scored_for_both_roles(vs_greedy) -> None:
    trajs, _ = vs_greedy
    deals = [t for t in trajs if t.outcome.agreed]
    assert deals, "the greedy bot accepted none of the fake engine's offers: the scenario set is uninformative"
    for t in trajs:
        if t.outcome.agreed:
            alloc = t.outcome.info["allocations"]
            for i, role in enumerate(ROLES):
                expected = sum(n * v for n, v in zip(alloc[role], t.scenario.values[i]))
                assert t.rewards[role] == expected
        else:
            assert t.rewards == {"agent1": 0.0, "agent2": 0.0}


def test_engine_gets_only_agent1_turns_batched_with_seeds(vs_greedy) -> None:
    trajs, engine = vs_greedy
    n_agent1_turns = sum(turn.role == "agent1" for t in trajs for turn in t.turns)
    assert sum(c["n"] for c in engine.calls) == n_agent1_turns
    assert engine.calls[0]["n"] == 3  # 6 dialogues, openers alternate: agent1 opens 3 of them
    assert len(engine.calls) < n_agent1_turns  # batched per turn, not per dialogue
    for c in engine.calls:
        assert c["sampling"]["max_new_tokens"] == MAX_NEW_TOKENS
        assert isinstance(c["sampling"]["seed"], int)
        assert len(set(c["sessions"])) == c["n"]  # one session per dialogue
    assert len({c["sampling"]["seed"] for c in engine.calls}) == len(engine.calls)  # a fresh seed every call


def test_per_scenario_policies_pool_of_n(env, tok, no_ray) -> None:
    trajs, _ = _run(env, tok, [_bot("greedy"), _bot("fair")], seed=0)
    by_uid = {uid: [t for t in trajs if t.scenario_uid == uid] for uid, _ in SCENARIOS}
    assert all(len(ts) == N_SAMPLES for ts in by_uid.values())
    for t in by_uid["s0"]:
        assert t.policies == {"agent1": "current", "agent2": "frozen:bot:greedy"}
        assert _replays_bot(env, t, "greedy")
    for t in by_uid["s1"]:
        assert t.policies == {"agent1": "current", "agent2": "frozen:bot:fair"}
        assert _replays_bot(env, t, "fair")
        assert "agent2" not in t.views
    # the fair bot really played s1: the greedy bot would not have said the same things
    assert not all(_replays_bot(env, t, "greedy") for t in by_uid["s1"])


def test_a_failed_text_turn_ends_only_that_dialogue(env, tok, no_ray) -> None:
    trajs, _ = _run(env, tok, Policy("frozen:flaky", player=FlakyPlayer(down_for="s1")), seed=0)
    for t in trajs:
        assert t.policies["agent2"] == "frozen:flaky"
        if t.scenario_uid == "s1":
            assert t.failed
            assert t.outcome.info["reason"] == COUNTERPART_FAILURE
            assert not t.outcome.agreed and not t.outcome.malformed and not t.truncated
            assert t.rewards == {"agent1": 0.0, "agent2": 0.0}
            # the dialogue stopped at agent2's first turn: after agent1's opener, or before any turn
            assert [turn.role for turn in t.turns] == (["agent1"] if t.seats[0] == "agent1" else [])
        else:
            assert not t.failed
            assert t.outcome.info["reason"] != COUNTERPART_FAILURE
            assert len(t.turns) >= 2 and any(turn.role == "agent2" for turn in t.turns)
    assert sum(t.failed for t in trajs) == N_SAMPLES


def test_an_unavailable_reward_leaves_only_that_roles_group(env, tok, no_ray, capsys) -> None:
    from marti_ibrl.algorithm.ablations import ABLATIONS
    from marti_ibrl.algorithm.advantages import members
    from marti_ibrl.rewards import RewardUnavailable
    from marti_ibrl.training.checks import report_reward_failures

    def judged(traj, role, scenario) -> float:  # a remote reward that is down for scenario s1
        if traj.scenario_uid == "s1":
            raise RewardUnavailable("judge endpoint down after 3 retries", "http_5xx")
        return 0.5

    rule = env_reward(env)
    trajs, _ = _run(env, tok, _bot("greedy"), reward_fns={"agent1": judged, "agent2": rule})
    for t in trajs:
        if t.scenario_uid == "s1":
            assert t.reward_failures == {"agent1": "http_5xx: judge endpoint down after 3 retries"}
            assert t.rewards == {"agent2": rule(t, "agent2", t.scenario)}
        else:
            assert t.reward_failures == {} and t.rewards["agent1"] == 0.5
    assert [t.scenario_uid for t in members(trajs, "agent1")] == ["s0"] * N_SAMPLES
    # shared_reward trains agent1 on R_1 + R_2: a call missing either reward cannot be in its group
    assert ABLATIONS["shared_reward"].rewards_needed("agent2", ROLES) == list(ROLES)
    assert ABLATIONS["none"].rewards_needed("agent2", ROLES) == ["agent2"]
    assert members(trajs, "agent1", ABLATIONS["shared_reward"].rewards_needed("agent1", ROLES)) == members(
        trajs, "agent1"
    )
    report_reward_failures(7, trajs, ROLES)  # the trainer's console line, once per role with failures
    assert capsys.readouterr().out == (
        f"iteration 7: {N_SAMPLES} of {len(trajs)} dialogues have no agent1 reward and are left out of its groups "
        "(first reason: http_5xx: judge endpoint down after 3 retries)\n"
    )


def _faulty(kind: str):
    """agent1's reward for scenario s1 as a broken reward function gives it; 0.5 elsewhere."""

    def reward(traj, role, scenario):
        if traj.scenario_uid != "s1":
            return 0.5
        if kind == "raise":
            raise ValueError("no utility for this deal")
        return {"nan": float("nan"), "inf": float("inf"), "-inf": -float("inf"), "text": "high"}[kind]

    return reward


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("nan", "non_finite: returned nan"),
        ("inf", "non_finite: returned inf"),
        ("-inf", "non_finite: returned -inf"),
        ("raise", "ValueError: no utility for this deal"),
        ("text", "not_a_number: returned 'high', not a number"),
    ],
)
def test_a_broken_reward_leaves_the_group_counted_with_its_reason(env, tok, no_ray, kind: str, reason: str) -> None:
    """NaN/inf or any exception from a reward function: the sample leaves that role's groups with its reason (as a
    RewardUnavailable does), the run goes on, the other role keeps its reward."""
    import math

    from marti_ibrl.algorithm.advantages import members

    rule = env_reward(env)
    trajs, _ = _run(env, tok, _bot("greedy"), reward_fns={"agent1": _faulty(kind), "agent2": rule})
    for t in trajs:
        assert all(math.isfinite(x) for x in t.rewards.values())
        if t.scenario_uid == "s1":
            assert t.reward_failures == {"agent1": reason}
            assert t.rewards == {"agent2": rule(t, "agent2", t.scenario)}
        else:
            assert t.reward_failures == {} and t.rewards["agent1"] == 0.5
    assert [t.scenario_uid for t in members(trajs, "agent1")] == ["s0"] * N_SAMPLES


def test_too_many_reward_failures_stop_the_run_naming_the_role(env, tok, no_ray) -> None:
    from marti_ibrl.training.checks import TrainingStopped, check_reward_failures

    rule = env_reward(env)
    trajs, _ = _run(env, tok, _bot("greedy"), reward_fns={"agent1": _faulty("nan"), "agent2": rule})
    check_reward_failures(3, trajs, ROLES, 0.5)  # half of the dialogues (s1's): at the limit, the run goes on
    check_reward_failures(3, trajs, ["agent2"], 0.0)  # agent2 lost none
    with pytest.raises(TrainingStopped) as e:
        check_reward_failures(3, trajs, ROLES, 0.4)
    assert str(e.value) == (
        f"--train.max_reward_failures 0.4: iteration 3: {N_SAMPLES} of {len(trajs)} dialogues have no agent1 reward "
        f"({N_SAMPLES} non_finite; first: non_finite: returned nan); stopped before iteration 3 trained or saved "
        "anything"
    )


def test_a_reward_past_its_timeout_is_given_up_on_and_named(env, tok, no_ray, caplog) -> None:
    """Issue 63: a custom reward had no timeout (the runner waited on future.result() unbounded: a reward that
    sleeps 60 s made every iteration 63 s, said nowhere). A call past --train.reward_timeout leaves its dialogue
    without that role's reward (kind timeout), one warning names the reward, the rollout does not wait for the call,
    and calls queued behind stuck ones (one reward thread here) still run."""
    import threading
    import time

    bound = 300.0  # the stuck calls' own end: far past the timeout, so a runner that waits for them is seen waiting
    release = threading.Event()

    def stuck(traj, role, scenario):
        if traj.scenario_uid == "s1":
            release.wait(bound)
        return 0.5

    rule = env_reward(env)
    names = {"agent1": "my_rewards:stuck", "agent2": "rule"}
    caplog.set_level("WARNING", logger="marti_ibrl.rollout.reward_pool")
    start = time.monotonic()
    try:
        trajs, _ = _run(
            env, tok, _bot("greedy"), reward_fns={"agent1": stuck, "agent2": rule},
            reward_workers=1, reward_timeouts={"agent1": 3.0}, reward_names=names,
        )  # fmt: skip
        took = time.monotonic() - start
    finally:
        release.set()
    assert took < bound / 2, took  # N_SAMPLES stuck calls, each given up on 3 s after it started
    for t in trajs:
        assert t.rewards["agent2"] == rule(t, "agent2", t.scenario)
        if t.scenario_uid == "s1":
            assert t.reward_failures == {
                "agent1": "timeout: reward my_rewards:stuck took longer than --train.reward_timeout 3 s"
            }
        else:
            assert t.reward_failures == {} and t.rewards["agent1"] == 0.5
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "reward my_rewards:stuck of agent1 took longer than --train.reward_timeout 3 s (scenario 's1'): given up on, "
        "that dialogue has no agent1 reward (the call runs on, unwaited); a reward that needs longer: raise "
        "--train.reward_timeout"
    ], warnings  # once per role and rollout


def test_a_slow_reward_within_its_timeout_is_named_in_a_warning(env, tok, no_ray, caplog, monkeypatch) -> None:
    """Issue 63's probe: a reward taking 60 s of a 120 s timeout is scored, and named as slow (the runner's clock is
    a fake one the reward moves on, so no test waits for it; one reward thread, so no other call spans the jump)."""
    import time
    from types import SimpleNamespace

    from marti_ibrl.rollout import reward_pool

    clock = [time.monotonic()]
    monkeypatch.setattr(reward_pool, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    def slow(traj, role, scenario):
        if traj.scenario_uid == "s1" and traj.sample_index == 0:
            clock[0] += 60.0
        return 0.5

    caplog.set_level("WARNING", logger=reward_pool.__name__)
    trajs, _ = _run(
        env, tok, _bot("greedy"), reward_fns={"agent1": slow, "agent2": env_reward(env)},
        reward_workers=1, reward_timeouts={"agent1": 120.0}, reward_names={"agent1": "my_rewards:slow"},
    )  # fmt: skip
    assert all(t.reward_failures == {} and t.rewards["agent1"] == 0.5 for t in trajs)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "reward my_rewards:slow of agent1 is slow: one call took 60.0 s (scenario 's1'); --train.reward_timeout 120 s "
        "gives up on a call at that"
    ], warnings


def _signature(trajs: list[Trajectory]) -> list:
    return [
        (t.scenario_uid, t.sample_index, [(x.role, x.text, tuple(x.token_ids), tuple(x.logprobs)) for x in t.turns])
        for t in trajs
    ]


def test_same_seed_replays_the_same_rollouts(env, tok, vs_greedy, no_ray) -> None:
    # SeededFakeEngine samples from the call's seed and the dialogue's session, like vLLM with per-request seeds,
    # so this checks that the runner hands the engines the same seeds and sessions for the same run seed
    first, _ = vs_greedy
    again, _ = _run(env, tok, _bot("greedy"), seed=0)
    assert _signature(again) == _signature(first)
    assert [t.views["agent1"].ids for t in again] == [t.views["agent1"].ids for t in first]
    other, _ = _run(env, tok, _bot("greedy"), seed=1)
    assert _signature(other) != _signature(first)


def test_show_complement_reaches_the_policy_view_not_the_transcript(tok, no_ray) -> None:
    env = DondEnv(prompt_style="compact", max_rounds=6, show_complement=True)
    trajs, _ = _run(env, tok, _bot("greedy"))
    notes = 0
    for t in trajs:
        bot_texts = [turn.text for turn in t.turns if turn.role == "agent2"]
        shown = [m["content"] for m in t.views["agent1"].messages if m["role"] == "user"]
        assert shown == [env.counterpart_text("agent2", x, t.scenario) for x in bot_texts]
        notes += sum("(you get item0=" in s for s in shown)
        assert not any("(you get" in turn.text for turn in t.turns)  # transcripts keep what was said
    assert notes >= len(trajs)  # every greedy-bot turn is an offer: each dialogue shows at least one note


def test_max_live_refills_finished_dialogues_in_request_order(env, tok, vs_greedy, no_ray) -> None:
    trajs, engine = _run(env, tok, _bot("greedy"), max_live=2)
    assert [(t.scenario_uid, t.sample_index) for t in trajs] == [(u, g) for u, _ in SCENARIOS for g in range(N_SAMPLES)]
    assert max(c["n"] for c in engine.calls) <= 2  # never more than 2 dialogues in play
    assert len({s for c in engine.calls for s in c["sessions"]}) == len(trajs)  # ... yet every one was played
    assert all(t.outcome is not None and _replays_bot(env, t, "greedy") for t in trajs)
    _, unbounded = vs_greedy
    assert len(engine.calls) > len(unbounded.calls)  # smaller batches, more of them
    with pytest.raises(ValueError, match="max_live must be >= 1"):
        _run(env, tok, _bot("greedy"), max_live=0)


def _first_prompt_lengths(env, tok, role: str) -> dict[str, int]:
    return {uid: len(RoleView(tok, env.system_prompt(s, role)).generation_prompt()) for uid, s in SCENARIOS}


def test_a_first_prompt_that_leaves_no_room_is_never_sent(env, tok, no_ray) -> None:
    """The first turn obeys the context rule of later turns: agent1's system prompt + max_new_tokens over max_len
    ends the dialogue as context_limit (truncated, no deal) without an engine call, whoever opens."""
    first = _first_prompt_lengths(env, tok, "agent1")
    max_len = min(first.values()) + MAX_NEW_TOKENS - 1  # one token short for every scenario
    trajs, engine = _run(env, tok, _bot("greedy"), max_len=max_len)
    assert engine.calls == []  # agent1's prompt never went out: not as opener, not after the bot's opening
    assert len(trajs) == len(SCENARIOS) * N_SAMPLES
    for t in trajs:
        assert t.truncated and not t.outcome.agreed and not t.outcome.malformed
        assert t.outcome.info["reason"] == CONTEXT_LIMIT
        assert t.rewards == {"agent1": 0.0, "agent2": 0.0}
        assert t.views["agent1"].action_ranges == [] and len(t.views["agent1"].messages) == 1 + (t.seats[0] != "agent1")
        # agent1 opening: ended before any turn; the bot opening: its turn is played, then agent1's prompt is full
        assert [turn.role for turn in t.turns] == ([] if t.seats[0] == "agent1" else ["agent2"])
    assert {t.seats[0] for t in trajs} == {"agent1", "agent2"}  # both paths were taken
    assert first_turns_overflowing(env, SCENARIOS, {"agent1": [tok]}, MAX_NEW_TOKENS, max_len) == [
        (uid, "agent1", n) for uid, n in first.items()
    ]


def test_a_first_prompt_that_just_fits_is_sent(env, tok, no_ray) -> None:
    first = _first_prompt_lengths(env, tok, "agent1")
    max_len = max(first.values()) + MAX_NEW_TOKENS  # exactly room for one turn: the rule is "> max_len"
    trajs, engine = _run(env, tok, _bot("greedy"), max_len=max_len)
    opened = [t for t in trajs if t.seats[0] == "agent1"]
    assert opened and all(t.turns and t.turns[0].role == "agent1" for t in opened)
    assert len(engine.calls[0]["sessions"]) == len(opened)  # the first call: every dialogue agent1 opens
    assert first_turns_overflowing(env, SCENARIOS, {"agent1": [tok], "agent2": []}, MAX_NEW_TOKENS, max_len) == []


def test_rotation_gives_every_copy_of_a_scenario_its_batch_positions_openers(env, tok, no_ray) -> None:
    """The trainer plays each scenario once per Eq. 6 pairing; with ``rotation`` every copy alternates its openers
    as the scenario's batch position says. (A batch of one scenario, G = 3: by request position alone the second
    copy would open with the other role.)"""
    runner = DialogueRunner(
        env,
        reward_fns={r: env_reward(env) for r in ROLES},
        sampling={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": MAX_NEW_TOKENS},
        max_len=4096,
    )
    policies = {"agent1": _bot("greedy"), "agent2": _bot("fair")}
    twice = SCENARIOS[:1] * 2

    def openers(trajs):
        return [[t.seats[0] for t in trajs[i : i + N_SAMPLES]] for i in range(0, len(trajs), N_SAMPLES)]

    rotated = runner.run([Request(*s, policies, rotation=0) for s in twice], n_samples=N_SAMPLES)
    assert openers(rotated) == [["agent1", "agent2", "agent1"]] * 2
    assert [t.scenario_uid for t in rotated] == ["s0"] * 2 * N_SAMPLES
    by_position = runner.run(requests(twice, policies), n_samples=N_SAMPLES)
    assert openers(by_position) == [["agent1", "agent2", "agent1"], ["agent2", "agent1", "agent2"]]
