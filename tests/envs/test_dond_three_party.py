"""ThreePartyDondEnv ("dond3"): three roles split one DoND item pool, round-robin, three complementary selections."""

from __future__ import annotations

import copy
import pickle

import pytest

from marti_ibrl.config import ConfigError, EnvConfig, env_roles
from marti_ibrl.envs import make_env
from marti_ibrl.envs.dond import (
    DondScenario,
    ThreePartyDondEnv,
    format_three_party_selection,
    format_three_party_try,
    generate_three_party_scenarios,
    parse_three_party,
)
from marti_ibrl.envs.dond.scenarios import valid_count_vectors

A, B, C = "agent1", "agent2", "agent3"
# counts (2, 2, 2); agent1 values (1, 2, 2), agent2 (3, 0, 2), agent3 (0, 4, 1): each Σ count·value = 10
SCENARIO = DondScenario(counts=(2, 2, 2), values=((1, 2, 2), (3, 0, 2), (0, 4, 1)), uid="t3")
SPLIT = {A: (0, 1, 1), B: (2, 0, 1), C: (0, 1, 0)}  # utilities: A 0+2+2=4, B 6+0+2=8, C 0+4+0=4
TRY = "Books to agent2, one hat each to agent1 and agent3. " + format_three_party_try(SPLIT)


def sel(alloc: tuple[int, int, int]) -> str:
    return "Fine by me. " + format_three_party_selection(alloc)


def play(env: ThreePartyDondEnv, turns: list[str], seats: tuple[str, ...] = (A, B, C)):
    state = env.new_state(SCENARIO, seats)
    for i, text in enumerate(turns):
        result = env.step(state, seats[i % 3], text)
        assert result.valid, (text, result.reason)
    return state


def test_format_and_parse() -> None:
    assert format_three_party_try(SPLIT) == "<try> agent1: 0 1 1 | agent2: 2 0 1 | agent3: 0 1 0"
    assert format_three_party_selection((2, 0, 1)) == "<selection> 2 0 1"
    action = parse_three_party(TRY)
    assert action.kind == "try" and action.split == SPLIT
    assert parse_three_party("ok <SELECTION>  2 0 1 \n").alloc == (2, 0, 1)
    assert parse_three_party("Let us stop. <disagree>").kind == "disagree"
    # roles may come in any order
    assert parse_three_party("<try> agent3: 0 1 0 | agent1: 0 1 1 | agent2: 2 0 1").split == SPLIT


def test_full_deal_with_hand_checked_utilities() -> None:
    env = ThreePartyDondEnv()
    state = play(env, [TRY, sel((2, 0, 1)), sel((0, 1, 0)), sel((0, 1, 1))])
    assert state.done and state.agreed and state.n_turns == 4 and state.n_tries == 1
    assert [r for r, _ in state.history] == [A, B, C, A]
    outcome = env.outcome(state)
    assert outcome.agreed and not outcome.malformed
    assert outcome.utilities == {A: 4.0, B: 8.0, C: 4.0}
    assert outcome.info == {
        "allocations": {B: [2, 0, 1], C: [0, 1, 0], A: [0, 1, 1]},
        "selections": {B: [2, 0, 1], C: [0, 1, 0], A: [0, 1, 1]},
        "n_turns": 4,
        "n_tries": 1,
        "reason": "deal",
        "fault_role": None,
    }
    assert [env.reward(state, r) for r in (A, B, C)] == [4.0, 8.0, 4.0]


def test_values_follow_roles_not_seats() -> None:
    env = ThreePartyDondEnv()
    seats = (C, A, B)
    state = play(env, [TRY, sel((0, 1, 1)), sel((2, 0, 1)), sel((0, 1, 0))], seats=seats)
    assert [r for r, _ in state.history] == [C, A, B, C]
    assert env.outcome(state).utilities == {A: 4.0, B: 8.0, C: 4.0}


def test_mismatched_selections_no_deal() -> None:
    env = ThreePartyDondEnv()
    # item2: 1 + 0 + 0 = 1 of 2 units handed out
    state = play(env, [TRY, sel((2, 0, 1)), sel((0, 1, 0)), sel((0, 1, 0))])
    outcome = env.outcome(state)
    assert state.done and not outcome.agreed
    assert outcome.info["reason"] == "selections_not_complementary"
    assert outcome.utilities == {A: 0.0, B: 0.0, C: 0.0}
    assert outcome.info["allocations"] == {} and outcome.info["selections"][A] == [0, 1, 0]
    # over-claiming in total (each selection within the counts): also no deal
    state = play(env, [TRY, sel((2, 0, 1)), sel((0, 2, 0)), sel((0, 1, 1))])
    assert env.outcome(state).info["reason"] == "selections_not_complementary"


def test_selection_before_any_try_no_deal() -> None:
    env = ThreePartyDondEnv()
    state = play(env, [sel((0, 1, 1)), sel((2, 0, 1)), sel((0, 1, 0))])
    outcome = env.outcome(state)
    assert state.done and not outcome.agreed and outcome.info["reason"] == "selection_without_try"
    assert outcome.info["n_tries"] == 0 and outcome.utilities == {A: 0.0, B: 0.0, C: 0.0}


def test_disagree_ends_without_deal_even_after_a_selection() -> None:
    env = ThreePartyDondEnv()
    state = play(env, [TRY, sel((2, 0, 1)), "No way. <disagree>"])
    outcome = env.outcome(state)
    assert state.done and not outcome.agreed and outcome.info["reason"] == "disagree"
    assert outcome.info["selections"] == {B: [2, 0, 1]} and outcome.utilities[B] == 0.0


INVALID = [
    "",
    "Let us talk first.",  # no marker
    "<try> agent1: 0 1 1 | agent2: 2 0 1",  # a role missing
    "<try> agent1: 0 1 1 | agent2: 2 0 1 | agent2: 0 1 0",  # duplicate role
    "<try> agent1: 0 1 1 | agent2: 2 0 1 | agent4: 0 1 0",  # unknown role
    "<try> agent1: 0 1 1 | agent2: 2 0 1 | agent3: 0 1 1",  # sums to (2, 2, 3)
    "<try> agent1: 0 0 1 | agent2: 2 0 1 | agent3: 0 1 0",  # sums to (2, 1, 2)
    "<try> agent1: 3 1 1 | agent2: 0 0 1 | agent3: 0 1 0",  # exceeds item0
    "<try> agent1: 0 1 1 | agent2: 2 0 1 | agent3: 0 1 0 thanks",  # text after the body
    "<try> agent1=0,1,1 | agent2=2,0,1 | agent3=0,1,0",  # wrong body
    "<selection> 3 0 0",  # exceeds item0
    "<selection> 1 1",
    "<selection> 1 1 1 <selection>",  # two markers
    "<selection> 1 1 1 please",
    "</disagree>",
    "<disagree> bye",
    "<disagree> <disagree>",
    "<try> agent1: 0 1 1 | agent2: 2 0 1 | agent3: 0 1 0 <selection> 0 1 1",
]


@pytest.mark.parametrize("text", INVALID)
def test_invalid_utterance_leaves_state_unchanged(text: str) -> None:
    env = ThreePartyDondEnv()
    state = play(env, [TRY])
    before = copy.deepcopy(state)
    result = env.step(state, B, text)
    assert not result.valid and not result.done and result.reason
    assert state == before


def test_only_selection_or_disagree_after_a_selection() -> None:
    env = ThreePartyDondEnv()
    state = play(env, [TRY, sel((2, 0, 1))])
    before = copy.deepcopy(state)
    for text in (TRY, "Wait, one more idea."):
        result = env.step(state, C, text)
        assert not result.valid and state == before
    assert "only <selection> or <disagree>" in env.step(state, C, TRY).reason


def test_wrong_speaker_and_finished_dialogue_raise() -> None:
    env = ThreePartyDondEnv()
    state = env.new_state(SCENARIO, (B, C, A))
    with pytest.raises(ValueError, match="agent2"):
        env.step(state, A, TRY)
    assert state.n_turns == 0 and state.history == []
    with pytest.raises(ValueError, match="not over"):
        env.outcome(state)
    state = play(env, [TRY, "<disagree>"])
    with pytest.raises(ValueError, match="already over"):
        env.step(state, C, TRY)
    with pytest.raises(ValueError, match="already over"):
        env.finish_malformed(state, C)


def test_turn_limit() -> None:
    env = ThreePartyDondEnv(max_rounds=2)
    assert env.max_turns == 6
    state = env.new_state(SCENARIO)
    for i in range(6):
        result = env.step(state, env.current_role(state), TRY)
        assert result.valid and result.done == (i == 5)
    outcome = env.outcome(state)
    assert outcome.info["reason"] == "turn_limit" and not outcome.agreed and outcome.info["n_tries"] == 6
    # the limit also cuts an unfinished round of selections
    env = ThreePartyDondEnv(max_rounds=1)
    state = play(env, [TRY, sel((2, 0, 1)), sel((0, 1, 0))])
    assert state.done and env.outcome(state).info["reason"] == "turn_limit"
    assert env.outcome(state).utilities == {A: 0.0, B: 0.0, C: 0.0}


def test_malformed_ending_penalises_only_the_fault_role() -> None:
    env = ThreePartyDondEnv(invalid_penalty=-0.5)
    state = play(env, [TRY, sel((2, 0, 1))])
    env.finish_malformed(state, C)
    outcome = env.outcome(state)
    assert outcome.malformed and not outcome.agreed
    assert outcome.info["reason"] == "malformed" and outcome.info["fault_role"] == C
    assert [env.reward(state, r) for r in (A, B, C)] == [0.0, 0.0, -0.5]
    with pytest.raises(ValueError, match="unknown role"):
        env.finish_malformed(env.new_state(SCENARIO), "agent9")


def test_abort_blames_nobody() -> None:
    env = ThreePartyDondEnv()
    state = play(env, [TRY])
    env.abort(state, "context_limit")
    env.abort(state, "ignored: already over")
    outcome = env.outcome(state)
    assert outcome.info["reason"] == "context_limit" and outcome.info["fault_role"] is None
    assert not outcome.malformed and [env.reward(state, r) for r in (A, B, C)] == [0.0, 0.0, 0.0]


def test_seats_permutation_and_round_robin() -> None:
    env = ThreePartyDondEnv()
    assert env.new_state(SCENARIO).seats == (A, B, C)
    for bad in [(A, B), (A, A, B), (A, B, "agent4"), (A, B, C, A)]:
        with pytest.raises(ValueError, match="permutation"):
            env.new_state(SCENARIO, bad)
    state = env.new_state(SCENARIO, (B, C, A))
    order = []
    for _ in range(7):
        order.append(env.current_role(state))
        env.step(state, order[-1], TRY)
    assert order == [B, C, A, B, C, A, B]
    two_values = DondScenario(counts=(2, 2, 2), values=((1, 2, 2), (3, 0, 2)))
    with pytest.raises(ValueError, match="value vectors"):
        env.new_state(two_values)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="3 distinct roles"):
        ThreePartyDondEnv(roles=(A, B))
    with pytest.raises(ValueError, match="3 distinct roles"):
        ThreePartyDondEnv(roles=(A, A, B))
    with pytest.raises(ValueError, match="max_rounds"):
        ThreePartyDondEnv(max_rounds=0)
    with pytest.raises(ValueError, match="prompt_style"):
        ThreePartyDondEnv(prompt_style="long")


def test_state_pickles() -> None:
    env = ThreePartyDondEnv()
    state = play(env, [TRY, sel((2, 0, 1))])
    assert pickle.loads(pickle.dumps(state)) == state


def test_generator_is_deterministic_and_valid() -> None:
    scenarios = generate_three_party_scenarios(200, seed=7)
    assert scenarios == generate_three_party_scenarios(200, seed=7)
    assert scenarios != generate_three_party_scenarios(200, seed=8)
    assert [s.uid for s in scenarios[:3]] == ["tp-7-0", "tp-7-1", "tp-7-2"]
    counts_ok = set(valid_count_vectors())
    for s in scenarios:
        assert s.counts in counts_ok and 5 <= sum(s.counts) <= 7 and min(s.counts) >= 1
        assert len(s.values) == 3
        for values in s.values:
            assert min(values) >= 0 and sum(c * v for c, v in zip(s.counts, values, strict=True)) == 10
        assert all(any(v[j] > 0 for v in s.values) for j in range(3))
    assert len({s.counts for s in scenarios}) > 10 and len({s.values for s in scenarios}) > 100


def test_counterpart_text() -> None:
    assert ThreePartyDondEnv().counterpart_text(B, "Hi. <disagree>", SCENARIO) == "agent2: Hi. <disagree>"


@pytest.mark.parametrize("style", ["paper", "compact"])
def test_prompts_show_own_values_only(style: str) -> None:
    env = ThreePartyDondEnv(prompt_style=style)
    inputs = {A: "2 1 2 2 2 2", B: "2 3 2 0 2 2", C: "2 0 2 4 2 1"}
    for role in (A, B, C):
        prompt = env.system_prompt(SCENARIO, role)
        assert f"<input> {inputs[role]} </input>" in prompt
        assert all(inputs[other] not in prompt for other in inputs if other != role)
        assert f"You are {role}" in prompt
        assert "<try> agent1: N N N | agent2: N N N | agent3: N N N" in prompt
        assert "<selection> N N N" in prompt and "<disagree>" in prompt
    compact = ThreePartyDondEnv(prompt_style="compact").system_prompt(SCENARIO, B)
    assert "item0: 2 worth 3, item1: 2 worth 0, item2: 2 worth 2" in compact
    assert len(compact.split()) < len(ThreePartyDondEnv().system_prompt(SCENARIO, B).split()) / 2
    with pytest.raises(ValueError, match="unknown role"):
        env.system_prompt(SCENARIO, "agent4")


def test_make_env_and_env_roles() -> None:
    assert env_roles("dond3") == (A, B, C)
    with pytest.raises(ConfigError, match="dond3"):
        env_roles("chess")
    env, scenarios = make_env(EnvConfig(name="dond3", num_scenarios=5, max_rounds=4, prompt_style="compact"), seed=3)
    assert isinstance(env, ThreePartyDondEnv)
    assert env.roles == (A, B, C) and env.max_turns == 12 and env.prompt_style == "compact"
    assert [uid for uid, _ in scenarios] == [f"tp-3-{i}" for i in range(5)]
    assert [s for _, s in scenarios] == generate_three_party_scenarios(5, 3)
    with pytest.raises(ValueError, match="not supported for dond3"):
        make_env(EnvConfig(name="dond3", data="some/file.txt"), seed=0)
