"""``DialogueRunner`` with scripted Ray engines: per-turn batching, seats, deals, re-samples, context limit, views."""

from __future__ import annotations

from collections import Counter

import pytest
import ray
from transformers import AutoTokenizer

from marti_ibrl.envs.dond import DondEnv, DondScenario
from marti_ibrl.rewards import env_reward
from marti_ibrl.rollout.render import RoleView
from marti_ibrl.rollout.runner import CONTEXT_LIMIT, DialogueRunner, Policy, requests, seats_for
from marti_ibrl.tiny import IM_START, build_tiny_model, dond_corpus

pytestmark = pytest.mark.e2e  # the module fixture ray_local starts a local Ray (tests/tiers.py)

MAX_NEW_TOKENS = 16
MAX_LEN = 300  # the compact prompt is ~200 tokens, a chat turn ~18: the long dialogue hits it after a few turns
ROLES = ("agent1", "agent2")
MALFORMED = [
    "<try> item0=9 <try>",  # body is not item0=N item1=N item2=N
    "<selection> bad <selection>",
    "<try> item0=1 item1=1 item2=1 <try> <selection>",  # two kinds of markers
]
CHAT = "Let me think about it. Could you give me one more?"

# scenario uid, scenario, script: n_prior_turns -> attempts (one utterance per attempt; the last one repeats)
SCENARIOS = [
    (
        "s0-deal",
        DondScenario(counts=(1, 2, 3), values=((4, 3, 0), (0, 2, 2))),
        {
            0: ["<try> item0=1 item1=2 item2=0 <try>"],
            1: ["<selection> item0=0 item1=0 item2=3 <selection>"],
            2: ["<selection> item0=1 item1=2 item2=0 <selection>"],
        },
    ),
    (
        "s1-malformed",
        DondScenario(counts=(2, 2, 1), values=((1, 2, 4), (3, 1, 2))),
        {0: ["Hello! I would like to make a deal."], 1: MALFORMED},
    ),
    (
        "s2-long",
        DondScenario(counts=(1, 1, 4), values=((2, 4, 1), (6, 0, 1))),
        {0: ["<try> item0=1 <try>", "I really need the books, you can have the hats and the balls."], None: [CHAT]},
    ),
]


def _fake_engine_class():
    """A scripted rollout engine (Ray actor). Defined locally so Ray pickles it by value."""

    class FakeEngine:
        def __init__(self, prefixes, scripts, im_start_id):
            self.prefixes = prefixes  # [(the role's system-prompt ids, scenario index)]
            self.scripts = scripts  # scenario index -> {n_prior_turns | None: [attempt token ids]}
            self.im_start_id = im_start_id
            self.batch_sizes = []
            self.seen = {}  # prompt -> how often it was asked for
            self.asked, self.ended = set(), []  # session ids generated for / ended by the runner

        def end_sessions(self, session_ids):
            self.ended += session_ids

        def generate_batch(self, prompts, sampling, session_ids=None):
            assert sampling["max_new_tokens"] == 16
            self.batch_sizes.append(len(prompts))
            self.asked.update(session_ids)
            out = []
            for prompt in prompts:
                key = tuple(prompt)
                attempt = self.seen.get(key, 0)
                self.seen[key] = attempt + 1
                si = next(i for pre, i in self.prefixes if key[: len(pre)] == pre)
                n_prior = key.count(self.im_start_id) - 2  # minus the system message and the generation header
                script = self.scripts[si]
                attempts = script.get(n_prior) or script[None]
                ids = attempts[min(attempt, len(attempts) - 1)]
                out.append(
                    {
                        "token_ids": list(ids),
                        "logprobs": [-0.1 * (j + 1) for j in range(len(ids))],
                        "finish_reason": "stop",
                    }
                )
            return out

        def stats(self):
            return self.batch_sizes, self.seen

        def sessions(self):
            return self.asked, self.ended

    return FakeEngine


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny"), dond_corpus()))


@pytest.fixture(scope="module")
def ray_local():
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    if started:
        ray.shutdown()


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]


@pytest.fixture(scope="module")
def rollout(tok, ray_local):
    env = DondEnv(prompt_style="compact")
    im_start = tok.convert_tokens_to_ids(IM_START)
    scripts = {
        si: {k: [_ids(tok, u) for u in attempts] for k, attempts in script.items()}
        for si, (_, _, script) in enumerate(SCENARIOS)
    }
    actor = ray.remote(num_cpus=0)(_fake_engine_class())
    engines = {}
    for role in ROLES:
        prefixes = [
            (tuple(RoleView(tok, env.system_prompt(s, role)).ids), si) for si, (_, s, _) in enumerate(SCENARIOS)
        ]
        engines[role] = actor.remote(prefixes, scripts, im_start)
    runner = DialogueRunner(
        env,
        reward_fns={role: env_reward(env) for role in ROLES},
        sampling={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": MAX_NEW_TOKENS},
        max_len=MAX_LEN,
        max_resamples=2,
    )
    policies = {role: Policy("current", [engines[role]], tok) for role in ROLES}
    trajs = runner.run(requests([(uid, s) for uid, s, _ in SCENARIOS], policies), n_samples=2)
    stats = {role: ray.get(engines[role].stats.remote()) for role in ROLES}
    stats["sessions"] = {role: ray.get(engines[role].sessions.remote()) for role in ROLES}
    return env, trajs, stats


def _by_uid(trajs):
    return {(t.scenario_uid, t.sample_index): t for t in trajs}


def test_every_dialogue_is_returned_sorted_with_alternating_seats(rollout) -> None:
    _, trajs, _ = rollout
    assert [(t.scenario_uid, t.sample_index) for t in trajs] == [(uid, g) for uid, _, _ in SCENARIOS for g in range(2)]
    openers = [t.seats[0] for t in trajs]
    assert openers == ["agent1", "agent2", "agent2", "agent1", "agent1", "agent2"]
    for si, t in enumerate(trajs):
        assert t.seats == seats_for(ROLES, si // 2, t.sample_index)
        assert t.policies == {"agent1": "current", "agent2": "current"}
        assert [turn.role for turn in t.turns] == [t.seats[k % 2] for k in range(len(t.turns))]
    assert seats_for(ROLES, 0, 0) == ["agent1", "agent2"] and seats_for(ROLES, 1, 2) == ["agent2", "agent1"]


def test_every_prefix_cache_is_ended_once_with_its_dialogue(rollout) -> None:
    _, trajs, stats = rollout
    for role in ROLES:
        asked, ended = stats["sessions"][role]
        # one cache per dialogue and seat, each dropped once when its dialogue ended (engines keep nothing after)
        assert len(asked) == len(trajs) and all(key.endswith(f"/{role}") for key in asked)
        assert sorted(ended) == sorted(asked)


def test_scripted_deal_gives_the_utilities(rollout) -> None:
    _, trajs, _ = rollout
    by = _by_uid(trajs)
    # agent1 opens and keeps (1, 2, 0): 1*4 + 2*3 = 10; agent2 gets (0, 0, 3): 3*2 = 6
    t = by["s0-deal", 0]
    assert t.outcome.agreed and not t.truncated and len(t.turns) == 3
    assert t.outcome.info["allocations"] == {"agent1": [1, 2, 0], "agent2": [0, 0, 3]}
    assert t.outcome.utilities == {"agent1": 10.0, "agent2": 6.0}
    assert t.rewards == {"agent1": 10.0, "agent2": 6.0}
    # seats swapped: agent2 keeps (1, 2, 0): 2*2 = 4; agent1 gets (0, 0, 3): 0
    t = by["s0-deal", 1]
    assert t.outcome.agreed
    assert t.rewards == {"agent1": 0.0, "agent2": 4.0}


def test_malformed_turn_is_resampled_twice_then_ends_the_dialogue(rollout) -> None:
    _, trajs, stats = rollout
    by = _by_uid(trajs)
    for g, faulty, other in [(0, "agent1", "agent2"), (1, "agent2", "agent1")]:
        t = by["s1-malformed", g]
        assert t.seats[1] == faulty
        assert len(t.turns) == 2
        last = t.turns[-1]
        assert (last.role, last.valid, last.resamples) == (faulty, False, 2)
        assert last.text == MALFORMED[2]  # the third attempt is the one recorded
        assert t.outcome.malformed and not t.outcome.agreed
        assert t.outcome.info["fault_role"] == faulty
        assert t.rewards == {faulty: -1.0, other: 0.0}
        assert not t.truncated
        # the discarded attempts leave no trace in any view
        for view in t.views.values():
            text = view.tokenizer.decode(view.ids)
            assert MALFORMED[0] not in text and MALFORMED[1] not in text
        # they are kept aside, with the prompt the policy saw: the one its kept third attempt was written after
        view = t.views[faulty]
        assert [(a.role, a.text, a.finished) for a in t.discarded] == [(faulty, m, True) for m in MALFORMED[:2]]
        for a in t.discarded:
            assert view.ids[: len(a.prompt_ids)] == a.prompt_ids and view.action_ranges[-1][0] == len(a.prompt_ids)
            assert a.reason.startswith("malformed") and len(a.logprobs) == len(a.token_ids) > 0
    for role in ROLES:
        _, seen = stats[role]
        # per engine: one prompt asked 3 times (malformed: original + 2 re-samples), one asked twice (s2's first
        # turn succeeds on its re-sample), every other prompt exactly once
        counts = Counter(seen.values())
        assert counts[3] == 1 and counts[2] == 1 and set(counts) == {1, 2, 3}


def test_a_successful_resample_continues_the_dialogue(rollout) -> None:
    _, trajs, _ = rollout
    t = _by_uid(trajs)["s2-long", 0]
    first = t.turns[0]
    assert (first.valid, first.resamples) == (True, 1)
    assert first.text == SCENARIOS[2][2][0][1]
    assert all(turn.resamples == 0 and turn.valid for turn in t.turns[1:])
    assert [a.role for a in t.discarded] == [first.role]


def test_context_limit_ends_with_truncated_and_no_deal(rollout, tok) -> None:
    env, trajs, _ = rollout
    by = _by_uid(trajs)
    for g in range(2):
        t = by["s2-long", g]
        assert t.truncated
        assert not t.outcome.agreed and not t.outcome.malformed
        assert t.outcome.info["reason"] == CONTEXT_LIMIT
        assert t.rewards == {"agent1": 0.0, "agent2": 0.0}
        n = len(t.turns)
        assert 2 < n < 2 * env.max_rounds
        # the next speaker's prompt no longer fits ...
        nxt = t.seats[n % 2]
        assert len(t.views[nxt].generation_prompt()) + MAX_NEW_TOKENS > MAX_LEN
        # ... while after one turn less it did (replayed on fresh views)
        views = {r: RoleView(tok, env.system_prompt(t.scenario, r)) for r in ROLES}
        for turn in t.turns[:-1]:
            views[turn.role].add_own(turn.token_ids, turn.logprobs, finished=True)
            for r in ROLES:
                if r != turn.role:
                    views[r].add_counterpart(turn.text)
        assert len(views[turn_next(t, n - 1)].generation_prompt()) + MAX_NEW_TOKENS <= MAX_LEN
    for key in [("s0-deal", 0), ("s0-deal", 1), ("s1-malformed", 0), ("s1-malformed", 1)]:
        assert not by[key].truncated


def turn_next(t, n_turns: int) -> str:
    return t.seats[n_turns % 2]


def test_engines_get_one_batched_call_per_turn_not_per_dialogue(rollout) -> None:
    _, trajs, stats = rollout
    # every runner step advances every live dialogue by one generation (a turn or a re-sample);
    # the long dialogues (both seatings) are live in every step, so each role is called once per step
    steps = max(len(t.turns) + sum(turn.resamples for turn in t.turns) for t in trajs)
    for role in ROLES:
        sizes, _ = stats[role]
        assert len(sizes) == steps
        assert sizes[0] == 3  # 6 dialogues, seats alternate: 3 openers per role
        assert max(sizes) == 3 and min(sizes) >= 1
        assert sizes[1] == 3  # second step: 2 responders + 1 re-sample of a malformed opener
        # every generation of the role went through these calls: its turns plus its discarded attempts
        generated = sum(1 + turn.resamples for t in trajs for turn in t.turns if turn.role == role)
        assert sum(sizes) == generated
        assert len(sizes) < generated  # batched: fewer calls than generations


def test_role_views_action_spans_are_exactly_the_roles_utterances(rollout, tok) -> None:
    _, trajs, _ = rollout
    for t in trajs:
        for role in ROLES:
            view = t.views[role]
            own = [turn for turn in t.turns if turn.role == role]
            spans = [view.ids[s:e] for s, e in view.action_ranges]
            assert spans == [turn.token_ids for turn in own]  # the engine's ids, verbatim
            assert [tok.decode(ids, skip_special_tokens=True) for ids in spans] == [turn.text for turn in own]
            for (s, e), turn in zip(view.action_ranges, own):
                assert view.logprobs[s:e] == pytest.approx([-0.1 * (j + 1) for j in range(len(turn.token_ids))])
            mask = view.action_mask()
            assert int(mask.sum()) == sum(len(turn.token_ids) for turn in own)
            assert all(lp == 0.0 for lp, m in zip(view.logprobs, mask.tolist()) if not m)
            # the counterpart's utterances are in the view as plain context
            text = tok.decode(view.ids)
            for turn in t.turns:
                if turn.role != role:
                    assert turn.text in text
