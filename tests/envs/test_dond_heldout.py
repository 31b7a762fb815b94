"""Held-out scripted DoND counterparts: always valid turns, their documented rules, distinct from the training bots."""

from __future__ import annotations

import ast
import inspect
import itertools
import math
import random
from collections import defaultdict

import pytest

from marti_ibrl.envs.dond import (
    TRAINING_BOTS,
    DondEnv,
    DondScenario,
    complement,
    format_selection,
    format_try,
    generate_scenarios,
    heldout,
    make_bot,
    negotiation,
    parse_utterance,
    play_dialogue,
    utility,
)
from marti_ibrl.envs.dond import bots as training_bots_module
from marti_ibrl.envs.dond.game import DEAL, DISAGREE, TURN_LIMIT
from marti_ibrl.envs.dond.heldout import HELDOUT_BOTS, make_heldout_bot

ROLES = ("agent1", "agent2")
SEATINGS = (ROLES, ROLES[::-1])
N_SCENARIOS = 200
# counts (1, 2, 3); role 0 values (2, 1, 2): every own value 0..10 is reachable; role 1 values (4, 3, 0)
SC = DondScenario(counts=(1, 2, 3), values=((2, 1, 2), (4, 3, 0)), uid="hand")


V1 = ("hardliner", "tit_for_tat", "slow_conceder", "fast_conceder")  # the designs the module fixture checks
V2 = tuple(b for b in HELDOUT_BOTS if b not in V1)  # the strategy-disjoint families: test_v2_families_play_cleanly


def _heldout_pairs() -> list[tuple[str, str]]:
    training = [(h, t) for h in V1 for t in TRAINING_BOTS]
    among = list(itertools.combinations_with_replacement(V1, 2))
    return training + among


@pytest.fixture(scope="module")
def games() -> dict[tuple[str, str, int], list]:
    """(held-out bot as agent1, opponent as agent2, seating) -> [(scenario, state, outcome)] over 200 scenarios.

    play_dialogue raises RuntimeError on the first invalid turn of either bot.
    """
    env = DondEnv()
    scenarios = generate_scenarios(N_SCENARIOS, 2024)
    out: dict[tuple[str, str, int], list] = {}
    for first, second in _heldout_pairs():
        opponent = make_heldout_bot if second in V1 else make_bot
        for s, seats in enumerate(SEATINGS):
            played = []
            for i, sc in enumerate(scenarios):
                bots = {"agent1": make_heldout_bot(first), "agent2": opponent(second)}
                state, outcome = play_dialogue(env, sc, bots, seed=i, seats=seats)
                played.append((sc, state, outcome))
            out[(first, second, s)] = played
    return out


def _agreement_by_opponent(games) -> dict[str, dict[str, float]]:
    """Held-out bot -> opponent -> agreement rate over both seatings (held-out pairs counted for both sides)."""
    deals: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for (first, second, _), played in games.items():
        flags = [outcome.agreed for _, _, outcome in played]
        deals[first][second] += flags
        if second in V1 and second != first:
            deals[second][first] += flags
    return {h: {o: sum(f) / len(f) for o, f in row.items()} for h, row in deals.items()}


def test_every_matchup_is_played_in_both_seats_and_ends_cleanly(games):
    assert len(games) == 2 * (len(V1) * len(TRAINING_BOTS) + 10)
    for (first, second, s), played in games.items():
        assert len(played) == N_SCENARIOS
        for sc, state, outcome in played:
            assert state.seats == SEATINGS[s]
            # every turn was valid (play_dialogue would have raised) and the bots only close complementary deals
            assert outcome.info["reason"] in (DEAL, DISAGREE, TURN_LIMIT), (first, second, state.history)
            if outcome.agreed:
                allocs = outcome.info["allocations"]
                assert tuple(complement(sc.counts, allocs["agent1"])) == tuple(allocs["agent2"])


def test_agreement_ordering_follows_the_designs(games):
    rates = _agreement_by_opponent(games)
    overall = {h: sum(row.values()) / len(row) for h, row in rates.items()}
    assert set(rates) == set(V1) and all(len(row) == 8 for row in rates.values())
    # ≥ 8 of 10 points vs a target falling to 3 within a few turns: against every opponent
    for opponent in rates["hardliner"]:
        assert rates["hardliner"][opponent] < rates["fast_conceder"][opponent], opponent
    # Boulware (e = 0.2, reserve 5) holds out longer than Conceder (e = 3, reserve 3), but deals more than the
    # hardliner; tit-for-tat only moves when the partner does
    assert overall["hardliner"] < overall["slow_conceder"] < overall["fast_conceder"]
    assert overall["tit_for_tat"] < overall["slow_conceder"]
    # two tit-for-tat bots both open with their maximum and never move: no deal, ever (some item is valued by both)
    assert rates["tit_for_tat"]["tit_for_tat"] == 0.0
    # the held-out set spans a real range of agreeableness
    assert overall["fast_conceder"] - overall["hardliner"] > 0.25


def test_hardliner_deals_only_at_eight_points_and_concedes_at_most_once(games):
    for (first, second, _), played in games.items():
        if "hardliner" not in (first, second):
            continue
        for sc, state, outcome in played:
            for role in [r for r, name in zip(ROLES, (first, second)) if name == "hardliner"]:
                index = ROLES.index(role)
                if outcome.agreed:
                    assert outcome.utilities[role] >= 8, (sc, state.history)
                moves = [parse_utterance(t) for r, t in state.history if r == role]
                demands = list(dict.fromkeys(m.alloc for m in moves if m.kind == "try"))
                assert len(demands) <= 2  # its opening demand and at most one concession
                assert all(utility(a, sc.values[index]) >= 8 for a in demands)


def _turn(bot_name: str, history: list[tuple[int, str]], role_index: int = 0, sc: DondScenario = SC) -> str:
    return make_heldout_bot(bot_name).respond(sc, role_index, history, random.Random(0))


def test_hardliner_rules_by_hand():
    opening = _turn("hardliner", [])
    assert parse_utterance(opening).alloc == (1, 2, 3)  # everything: worth 10 to role 0
    partner = [format_try((0, 2, 3))]  # leaves the hardliner (1, 0, 0) = 2
    two = [(0, format_try((1, 2, 3))), (1, partner[0])]
    assert parse_utterance(_turn("hardliner", two)).alloc == (1, 2, 3)  # one own offer so far: no concession yet
    four = two + [(0, format_try((1, 2, 3))), (1, partner[0])]
    conceded = parse_utterance(_turn("hardliner", four))
    # the single concession: the cheapest share still worth ≥ 8, with the fewest units: (1,0,3) = 2 + 6
    assert conceded.kind == "try" and conceded.alloc == (1, 0, 3)
    six = four + [(0, format_try((1, 0, 3))), (1, partner[0])]
    assert parse_utterance(_turn("hardliner", six)).alloc == (1, 0, 3)  # and never another
    # a <try> leaving it exactly 8 is taken; 7 is not
    assert parse_utterance(_turn("hardliner", [(1, format_try((0, 2, 0)))])) == parse_utterance(
        format_selection((1, 0, 3))
    )
    assert parse_utterance(_turn("hardliner", [(1, format_try((0, 1, 1)))])).kind == "try"  # (1,1,2) = 7
    # a final selection: confirmed at 8, refused below
    base = [(0, format_try((1, 2, 3)))]
    assert parse_utterance(_turn("hardliner", [*base, (1, format_selection((0, 2, 0)))])).alloc == (1, 0, 3)
    refusal = _turn("hardliner", [*base, (1, format_selection((0, 1, 1)))])
    assert parse_utterance(refusal).kind == "disagree"
    # a selection before any <try> cannot make a deal: refused
    assert parse_utterance(_turn("hardliner", [(1, format_selection((0, 0, 0)))])).kind == "disagree"


def test_tit_for_tat_mirrors_the_partner_in_its_own_values():
    # role 0, partner opens: it takes (1,2,1) leaving TFT (0,0,2) = 4
    first = [(1, format_try((1, 2, 1)))]
    assert parse_utterance(_turn("tit_for_tat", first)).alloc == (1, 2, 3)  # starts at its maximum, 10
    mine = (0, format_try((1, 2, 3)))
    # the partner concedes (1,2,0): TFT's share rises 4 -> 6, so TFT concedes 2 of its own points: target 8,
    # the share worth 8 nearest its previous offer (ties: lexicographic)
    moved = parse_utterance(_turn("tit_for_tat", [*first, mine, (1, format_try((1, 2, 0)))]))
    assert moved.kind == "try" and moved.alloc == (0, 2, 3) and utility(moved.alloc, SC.values[0]) == 8
    # no partner concession: no move
    still = parse_utterance(_turn("tit_for_tat", [*first, mine, (1, format_try((1, 2, 1)))]))
    assert still.alloc == (1, 2, 3)
    # a concession worth 5 to TFT brings its target to 5, below what is on the table (9): it accepts
    taken = parse_utterance(_turn("tit_for_tat", [*first, mine, (1, format_try((0, 1, 0)))]))
    assert taken.kind == "selection" and taken.alloc == (1, 1, 3)
    # a retraction is mirrored too: 4 -> 6 (target 8) then back 6 -> 4 (target 10)
    history = [*first, mine, (1, format_try((1, 2, 0))), (0, format_try((0, 2, 3))), (1, format_try((1, 2, 1)))]
    assert parse_utterance(_turn("tit_for_tat", history)).alloc == (1, 2, 3)
    # final selections: confirmed from its reserve (5) up
    assert parse_utterance(_turn("tit_for_tat", [mine, (1, format_selection((1, 1, 1)))])).kind == "selection"
    assert parse_utterance(_turn("tit_for_tat", [mine, (1, format_selection((1, 2, 1)))])).kind == "disagree"


@pytest.mark.parametrize(("name", "e", "reserve"), [("slow_conceder", 0.2, 5.0), ("fast_conceder", 3.0, 3.0)])
def test_time_dependent_conceders_follow_their_curve(name: str, e: float, reserve: float):
    """Against a partner that only chats, own turn t offers the value closest to 10 − (10 − reserve)·(t/9)^(1/e)."""
    env = DondEnv(max_rounds=10)
    state = env.new_state(SC, seats=ROLES)
    bot = make_heldout_bot(name)
    offered: list[int] = []
    rng = random.Random(1)
    while not state.done:
        role = env.current_role(state)
        if role == "agent1":
            history = [(ROLES.index(r), t) for r, t in state.history]
            text = bot.respond(SC, 0, history, rng)
            action = parse_utterance(text)
            assert action.kind == "try"
            offered.append(utility(action.alloc, SC.values[0]))
        else:
            text = "Hmm, let me think about it."
        assert env.step(state, role, text).valid
    targets = [10 - (10 - reserve) * (t / 9) ** (1 / e) for t in range(10)]
    assert offered == [math.floor(x + 0.5) for x in targets]  # all of 0..10 reachable; a tie rounds up
    assert offered[0] == 10 and offered[-1] == reserve
    assert offered == sorted(offered, reverse=True)


def test_conceder_curves_order():
    """At every turn but the first and last, Boulware (e = 0.2) asks for more than Conceder (e = 3)."""
    slow, fast = make_heldout_bot("slow_conceder"), make_heldout_bot("fast_conceder")
    for t in range(1, 9):
        ledger = negotiation.Ledger(t, (), (), None, None, False)
        assert slow.target(SC, 0, ledger) > fast.target(SC, 0, ledger) + 1  # type: ignore[attr-defined]


def _random_partner_turn(sc: DondScenario, pending_from_bot: bool, rng: random.Random) -> str:
    """A valid but erratic counterpart turn (an LLM that chats, tries, selects or walks away at random)."""
    share = tuple(rng.randint(0, c) for c in sc.counts)
    if pending_from_bot:
        return rng.choice([format_selection(share), "No. <disagree>"])
    return rng.choices(
        ["Tell me what you value.", f"Maybe {format_try(share)}", f"Final: {format_selection(share)}", "<disagree>"],
        weights=[3, 6, 2, 1],
    )[0]


@pytest.mark.parametrize("name", sorted(HELDOUT_BOTS))
def test_valid_turns_against_an_erratic_partner(name: str):
    env = DondEnv()
    for i, sc in enumerate(generate_scenarios(N_SCENARIOS, 77)):
        rng = random.Random(i)
        for seats in SEATINGS:
            state = env.new_state(sc, seats=seats)
            bot = make_heldout_bot(name)
            while not state.done:
                role = env.current_role(state)
                history = [(ROLES.index(r), t) for r, t in state.history]
                if role == "agent1":
                    text = bot.respond(sc, 0, history, rng)
                    result = env.step(state, role, text)
                    assert result.valid, (name, text, result.reason, state.history)
                else:
                    pending = state.pending_selection is not None
                    assert env.step(state, role, _random_partner_turn(sc, pending, rng)).valid


def test_registry_is_disjoint_from_the_training_bots():
    assert not set(HELDOUT_BOTS) & set(TRAINING_BOTS)
    assert {"hardliner", "tit_for_tat", "slow_conceder", "fast_conceder"} <= set(HELDOUT_BOTS)
    for name in HELDOUT_BOTS:
        bot = make_heldout_bot(name)
        assert bot.name == name and bot is not make_heldout_bot(name)
        assert not isinstance(bot, (training_bots_module.ConcedingNegotiator, training_bots_module.FairNegotiator))
    for name in TRAINING_BOTS:
        with pytest.raises(ValueError, match=f"unknown held-out bot '{name}'"):
            make_heldout_bot(name)


def test_heldout_code_and_phrasing_share_nothing_with_the_training_bots():
    # the training-bot module is imported only for type checking (the ScriptedNegotiator interface)
    for module in (heldout, negotiation):  # the bots, and what they reason with
        tree = ast.parse(inspect.getsource(module))
        imported = [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
        assert imported and not [m for m in imported if m and m.endswith(".bots")]
    # no sentence of a training bot appears in a held-out bot's turns
    training_phrases = [
        p.split("{")[0].strip()
        for p in (
            *training_bots_module._OFFER,
            *training_bots_module._COUNTER,
            *training_bots_module._ACCEPT,
            *training_bots_module._CONFIRM,
            *training_bots_module._REFUSE,
        )
    ]
    env = DondEnv()
    for i, sc in enumerate(generate_scenarios(30, 9)):
        for name in HELDOUT_BOTS:
            bots = {"agent1": make_heldout_bot(name), "agent2": make_heldout_bot("fast_conceder")}
            state, _ = play_dialogue(env, sc, bots, seed=i)
            for role, text in state.history:
                if role == "agent1":
                    assert not any(p and p in text for p in training_phrases), text


# -- calibration to the round limit, the strategy-disjoint families (mini Table 2 v2), surface variation ------------


def _target_after(bot, own_turns: int) -> float:
    ledger = negotiation.Ledger(own_turns, (), (), None, None, False)
    return bot.target(SC, 0, ledger)


def test_conceders_are_calibrated_to_the_round_limit_actually_played():
    # SC role 0: everything is worth 10; the slow conceder (e = 0.2, reserve 5) at its last own turn of a 5-round game
    slow = make_heldout_bot("slow_conceder")
    assert _target_after(slow, 4) == pytest.approx(10 - 5 * (4 / 9) ** 5)  # v1: parameterised for 10 rounds, ≈ 9.91
    five = make_heldout_bot("slow_conceder", rounds=5)
    assert five.rounds == 5 and _target_after(five, 4) == pytest.approx(5.0)  # reaches its reserve at T = 4
    assert _target_after(five, 2) == pytest.approx(10 - 5 * 0.5**5)
    assert heldout.with_rounds(make_heldout_bot("hardliner"), 5) == make_heldout_bot("hardliner")  # no clock: as is
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        make_heldout_bot("fast_conceder", rounds=0)


def test_the_player_calibrates_a_heldout_bot_to_the_env():
    from marti_ibrl.rollout.dialogue import Trajectory
    from marti_ibrl.rollout.players import ScriptedBotPlayer

    player = ScriptedBotPlayer("slow_conceder", registry=HELDOUT_BOTS, kind="heldout")
    for rounds in (5, 10):
        env = DondEnv(max_rounds=rounds)
        traj = Trajectory(scenario_uid=SC.uid, scenario=SC, seats=list(ROLES), policies={})
        player.respond(env, "agent1", [traj])
        assert player._calibrated(env).rounds == rounds
    assert player.bot.rounds == 10  # the registry's bot itself is left as it is


def test_utility_search_infers_the_partner_values_and_leaves_it_its_demand():
    bot = make_heldout_bot("utility_search", rounds=5)
    # the partner keeps item1 (values of role 1: 4, 3, 0) twice: mass moves to vectors valuing item1
    ledger = negotiation.Ledger(1, (), ((0, 2, 0), (0, 2, 0)), "try", (0, 2, 0), True)
    post = dict(bot.posterior(SC, ledger))
    assert sum(post.values()) == pytest.approx(1.0)
    flat = dict(bot.posterior(SC, negotiation.Ledger(0, (), (), None, None, False)))
    assert len(set(flat.values())) == 1  # uniform prior
    mass = sum(p for v, p in post.items() if v[1] >= 3)
    assert mass > sum(p for v, p in flat.items() if v[1] >= 3)
    share = bot.propose(SC, 0, ledger)
    rest = complement(SC.counts, share)
    demand = 6 - 3 * (1 / 4)
    assert sum(p * utility(rest, v) for v, p in post.items()) >= demand - 1e-9
    assert share[1] < SC.counts[1]  # leaves some of what the partner asks for


def test_split_difference_meets_in_the_middle():
    bot = make_heldout_bot("split_difference")
    opening = bot.propose(SC, 0, negotiation.Ledger(0, (), (), None, None, False))
    assert opening == (1, 2, 3)  # every unit it values (all three items are worth something to role 0)
    # the partner's <try> keeps (1, 2, 0) for itself, i.e. leaves (0, 0, 3): midpoint of (1, 2, 3) and (0, 0, 3)
    ledger = negotiation.Ledger(1, ((1, 2, 3),), ((1, 2, 0),), "try", (1, 2, 0), True)
    assert bot.propose(SC, 0, ledger) == (1, 1, 3)
    assert bot.takes(SC, 0, ledger, gain=utility((1, 1, 3), SC.values[0]) - 1, proposal=(1, 1, 3))
    assert not bot.takes(SC, 0, ledger, gain=utility((1, 1, 3), SC.values[0]) - 2, proposal=(1, 1, 3))


def test_random_aspiration_is_drawn_per_dialogue_and_falls_to_its_floor():
    bot = make_heldout_bot("random_aspiration", rounds=5)
    start = negotiation.Ledger(0, (), (), None, None, False)
    firsts = [bot.aspiration(sc, 0, start) for sc in generate_scenarios(200, 5)]
    assert all(5.0 <= a <= 9.0 for a in firsts) and max(firsts) - min(firsts) > 3.0  # varies across dialogues
    assert bot.aspiration(SC, 0, start) == bot.aspiration(SC, 0, start)  # recomputable within one dialogue
    path = [bot.aspiration(SC, 0, negotiation.Ledger(t, (), (), None, None, False)) for t in range(5)]
    assert path == sorted(path, reverse=True) and path[-1] >= 3.0
    late = negotiation.Ledger(40, (), (), None, None, False)
    assert heldout.with_rounds(bot, 40).aspiration(SC, 0, late) == 3.0
    offers = {bot.choose(SC, 0, start, random.Random(i)) for i in range(50)}
    assert len(offers) > 1 and all(utility(o, SC.values[0]) >= path[0] for o in offers)


def test_picky_then_fold_switches_at_half_the_horizon():
    bot = make_heldout_bot("picky_then_fold", rounds=5)  # T = 4: picky for own turns 0-1, folded from turn 2
    picky, folded = (negotiation.Ledger(t, (), (), None, None, False) for t in (1, 2))
    assert utility(bot.propose(SC, 0, picky), SC.values[0]) == 10
    assert utility(bot.propose(SC, 0, folded), SC.values[0]) == 5
    assert not bot.takes(SC, 0, picky, gain=8, proposal=(1, 2, 3)) and bot.takes(SC, 0, picky, gain=9, proposal=())
    assert bot.takes(SC, 0, folded, gain=1, proposal=()) and not bot.signs(SC, 0, folded, gain=0)


def test_phrased_variants_make_the_same_moves_in_other_words():
    from marti_ibrl.rollout.dialogue import Trajectory
    from marti_ibrl.rollout.players import ScriptedBotPlayer

    env = DondEnv(max_rounds=5, bot_speech="markers")
    plain = ScriptedBotPlayer("utility_search", registry=HELDOUT_BOTS, kind="heldout")
    phrased = ScriptedBotPlayer("utility_search+phrased", registry=HELDOUT_BOTS, kind="heldout")
    assert phrased.name == "heldout:utility_search+phrased"
    seen = set()
    for i, sc in enumerate(generate_scenarios(40, 3)):
        traj = Trajectory(scenario_uid=sc.uid, scenario=sc, seats=list(ROLES), policies={}, sample_index=i)
        (a,), (b,) = plain.respond(env, "agent1", [traj]), phrased.respond(env, "agent1", [traj])
        assert a.startswith("<") and b != a and a in b  # markers only, then a phrase around the same markup
        assert parse_utterance(a) == parse_utterance(b)
        seen.add(b.split("<")[0])
    assert seen <= set(heldout.OPENERS) and len(seen) > 2
    with pytest.raises(ValueError, match="unknown surface 'shouted'"):
        ScriptedBotPlayer("utility_search+shouted", registry=HELDOUT_BOTS, kind="heldout")


def test_v2_families_play_cleanly_against_every_bot_in_both_seats():
    """Each new family against every training and held-out bot, 5-round games: valid turns only (play_dialogue raises
    on the first invalid one), complementary deals, and a real spread of agreement."""
    env = DondEnv(max_rounds=5, bot_speech="markers")
    scenarios = generate_scenarios(40, 11)
    rates = {}
    for name in V2:
        for other in (*TRAINING_BOTS, *HELDOUT_BOTS):
            deals = 0
            for seats in SEATINGS:
                for i, sc in enumerate(scenarios):
                    partner = make_heldout_bot(other, 5) if other in HELDOUT_BOTS else make_bot(other)
                    bots = {"agent1": make_heldout_bot(name, 5), "agent2": partner}
                    state, outcome = play_dialogue(env, sc, bots, seed=i, seats=seats)
                    assert outcome.info["reason"] in (DEAL, DISAGREE, TURN_LIMIT)
                    if outcome.agreed:
                        allocs = outcome.info["allocations"]
                        assert tuple(complement(sc.counts, allocs["agent1"])) == tuple(allocs["agent2"])
                    deals += outcome.agreed
            rates[(name, other)] = deals / (2 * len(scenarios))
    for name in V2:
        row = [rates[(name, o)] for o in (*TRAINING_BOTS, *HELDOUT_BOTS)]
        assert max(row) >= 0.8 and min(row) < max(row) - 0.2, (name, row)
