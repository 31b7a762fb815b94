"""TextArena's two-player games as environments (``--env.name textarena:GAME-ID``, marti_ibrl/envs/arena.py): the
contract's rules on TextArena's own game classes — what each role is shown, invalid moves put back exactly and
re-sampled, TextArena's rewards, a random stream of each game's own — and the games refused in one line. Training
and evaluation of each: the slow test at the end."""

import copy
import json
import random
import re

import pytest

from marti_ibrl.config import ConfigError, EnvConfig, load_config
from marti_ibrl.envs import make_env
from marti_ibrl.envs.arena import VERIFIED, GameRefused, check_game
from marti_ibrl.sft.data import scripted_dialogue, scripted_records

pytest.importorskip("textarena")


def _env(gid: str, n: int = 16):
    return make_env(EnvConfig(name=f"textarena:{gid}", num_scenarios=n, max_rounds=99), seed=0)


@pytest.mark.parametrize("gid", VERIFIED)
def test_scripted_games_end_with_textarenas_rewards_and_leave_the_global_stream_alone(gid: str) -> None:
    env, scenarios = _env(gid)
    outside = random.getstate()
    players = env.scripted_players()
    outcomes = []
    for i, (_, scenario) in enumerate(scenarios):
        history = scripted_dialogue(env, scenario, {r: players["random"] for r in env.roles}, env.roles,
                                    random.Random(i))  # fmt: skip
        assert all(len(h) == 3 for h in history)  # every turn says what each role was shown
        outcomes.append(history)
    assert random.getstate() == outside  # TextArena reseeds the global stream; each game swapped in its own
    state = env.new_state(scenarios[0][1], env.roles)
    for role, text, _ in outcomes[0]:
        assert env.current_role(state) == role and env.step(state, role, text).valid
    result = env.outcome(state)
    ta_rewards = state.env.state.rewards
    assert result.utilities == {"player0": float(ta_rewards[0]), "player1": float(ta_rewards[1])}
    assert [env.reward(state, r) for r in env.roles] == [float(ta_rewards[0]), float(ta_rewards[1])]
    assert not result.malformed and result.info["reason"]
    if gid in ("TicTacToe-v0", "KuhnPoker-v0"):  # zero-sum: a win and a loss, or a draw
        assert sum(result.utilities.values()) == 0 and result.agreed == (max(result.utilities.values()) > 0)


def test_a_game_is_the_same_whatever_is_played_beside_it() -> None:
    """Kuhn Poker deals each round's cards from TextArena's random stream: two games played turn by turn side by
    side deal what each deals alone."""
    env, scenarios = _env("KuhnPoker-v0")
    players = {r: env.scripted_players()["random"] for r in env.roles}
    alone = [scripted_dialogue(env, s, players, env.roles, random.Random(7)) for _, s in scenarios[:2]]
    states = [env.new_state(s, env.roles) for _, s in scenarios[:2]]
    moves = [iter(alone[0]), iter(alone[1])]
    shown: list[list] = [[], []]
    while not all(s.done for s in states):
        for k in (0, 1):
            if not states[k].done:
                role, text, _ = next(moves[k])
                shown[k].append(env.step(states[k], role, text).shown)
    assert shown == [[h[2] for h in alone[0]], [h[2] for h in alone[1]]]


def test_an_invalid_move_leaves_the_game_as_it_was_and_says_textarenas_reason() -> None:
    env, scenarios = _env("TicTacToe-v0")
    state = env.new_state(scenarios[0][1], env.roles)
    first = env.step(state, "player0", "I take the centre. [4]")
    assert first.valid and "[Player 0] I take the centre. [4]" in first.shown["player1"]
    assert "[Player 0]" not in first.shown["player0"] and "placed their symbol" in first.shown["player0"]
    before = copy.deepcopy(state.env.state.__dict__)
    for text in ("[4]", "no marker at all", "[9]"):
        result = env.step(state, "player1", text)
        assert not result.valid and not result.done and result.shown is None
        assert result.reason.startswith("malformed: Player 1 attempted an invalid move.")
        assert copy.deepcopy(state.env.state.__dict__) == before  # TextArena's retry note and error count too
    assert env.step(state, "player0", "[0]").reason == "not player0's turn"
    assert env.step(state, "player1", "[0]").valid
    env.finish_malformed(state, "player0")
    out = env.outcome(state)
    assert out.malformed and out.info["fault_role"] == "player0" and out.utilities == {"player0": -1.0, "player1": 0.0}


def test_the_system_prompt_is_what_reset_gave_the_player_and_is_not_shown_again() -> None:
    env, scenarios = _env("KuhnPoker-v0")
    seed = scenarios[3][1]
    p0, p1 = (env.system_prompt(seed, r) for r in env.roles)
    assert p0.startswith("[GAME] You are Player 0") and p1.startswith("[GAME] You are Player 1")
    assert "Your card is" in p0 and "Your card is" in p1
    state = env.new_state(seed, env.roles)
    role = env.current_role(state)
    shown = env.step(state, role, "[check]").shown
    assert all("You are Player" not in text for text in shown.values())


def test_sft_records_show_each_role_what_textarena_showed_it() -> None:
    env, scenarios = _env("TicTacToe-v0", n=4)
    records = scripted_records(env, [s for _, s in scenarios], env.scripted_players(), seed=0)
    assert len(records) == 8
    for record in records:
        m = record["messages"]
        assert m[0]["role"] == "system" and m[-1]["role"] == "assistant"
        assert all(x["content"].strip().startswith("[") for x in m[1:])  # moves and TextArena's messages


def test_games_textarena_cannot_play_here_are_refused_in_one_line(tmp_path) -> None:
    cases = {
        "Wordle-v0": "fetches data at run time",
        "ThreePlayerTicTacToe-v0": "not a two-player game",
        "NoSuchGame-v0": "no such TextArena game",
    }
    for gid, why in cases.items():
        with pytest.raises(GameRefused, match=why):
            check_game(gid)
        with pytest.raises(ConfigError, match=f"--env.name: textarena:{gid}: {why}"):
            load_config(["--env.name", f"textarena:{gid}", "--role1.pretrain", "x", "--role2.pretrain", "y"])


def test_own_payoff_is_each_players_score_and_not_zero_sum() -> None:
    """``--env.payoff own``: the dilemma's points (TextArena's last message says them: "Player 1 wins 39 - 9",
    "Draw! Both players scored 10") and the negotiation's gain in inventory value, where ``outcome`` is TextArena's
    win/loss/draw (zero-sum there too)."""
    sums = []
    for gid in ("IteratedPrisonersDilemma-v0", "SimpleNegotiation-v0"):
        env, scenarios = make_env(EnvConfig(name=f"textarena:{gid}", num_scenarios=6, max_rounds=99, payoff="own"), 0)
        players = {r: env.scripted_players()["random"] for r in env.roles}
        for i, (_, scenario) in enumerate(scenarios):
            state = env.new_state(scenario, env.roles)
            for role, text, _ in scripted_dialogue(env, scenario, players, env.roles, random.Random(i)):
                assert env.step(state, role, text).valid
            own = env.outcome(state).utilities
            assert [env.reward(state, r) for r in env.roles] == [own["player0"], own["player1"]]
            ta = state.env.state
            assert sorted(ta.rewards.values()) in ([-1, 1], [0, 0])  # TextArena's outcome: zero-sum
            if gid == "IteratedPrisonersDilemma-v0":
                said = [int(x) for x in re.findall(r"\d+", ta.game_info[0]["reason"])][-2:]
                assert sorted(own.values()) == sorted(said if "wins" in ta.game_info[0]["reason"] else said * 2)
            else:
                value = {p: v["current"] - v["initial"] for p, v in ta.game_state["inventory_value"].items()}
                assert own == {"player0": value[0], "player1": value[1]}
            sums.append(sum(own.values()))
    assert any(x != 0 for x in sums)  # not zero-sum


def test_own_payoff_is_refused_where_the_game_keeps_no_score_and_outside_textarena() -> None:
    cases = {
        "textarena:TicTacToe-v0": "--env.payoff: own: textarena:TicTacToe-v0 keeps no score of each player's own",
        "dond": "--env.payoff: own: other payoffs are for TextArena's games",
    }
    for name, why in cases.items():
        with pytest.raises(ConfigError, match=re.escape(why)):
            load_config(["--env.name", name, "--env.payoff", "own", "--role1.pretrain", "x", "--role2.pretrain", "y"])
    with pytest.raises(ConfigError, match="--env.payoff: best: must be one of outcome, own"):
        load_config(["--env.name", "textarena:KuhnPoker-v0", "--env.payoff", "best", "--role1.pretrain", "x",
                     "--role2.pretrain", "y"])  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("gid", VERIFIED)
def test_each_game_trains_two_iterations_then_is_evaluated(gid, tmp_path, monkeypatch) -> None:
    """``train`` on a tiny model (2 iterations) then ``eval --run`` (each policy in its role against the other);
    TicTacToe also ``diagnose`` (each checkpoint against the other role's start and its same-step partner)."""
    import ray

    from marti_ibrl.cli import main
    from marti_ibrl.tiny import build_tiny_model

    env, scenarios = _env(gid, n=4)
    corpus = [env.system_prompt(s, r) for _, s in scenarios for r in env.roles]
    model = build_tiny_model(tmp_path / "tiny", corpus, vocab_size=400)
    run = tmp_path / "run"
    train = [
        *("train", "--env.name", f"textarena:{gid}", "--role1.pretrain", model, "--role2.pretrain", model),
        *("--env.num_scenarios", "8", "--role1.kl_coef", "0", "--role2.kl_coef", "0", "--pool.probs", "[1.0,0,0]"),
        *("--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "8"),
        *("--rollout.max_len", "1024", "--rollout.micro_batch_size", "4", "--train.micro_batch_size", "4"),
        *("--train.iterations", "2", "--ckpt.path", str(run)),
    ]
    diagnosed = gid == "TicTacToe-v0"  # one game also saves a checkpoint each iteration and is diagnosed
    train += ["--ckpt.save_steps", "1"] if diagnosed else []
    train += ["--env.payoff", "own"] if gid == "IteratedPrisonersDilemma-v0" else []  # the non-zero-sum game
    assert main(train) == 0
    ray.shutdown()
    from marti_ibrl.eval.figures import load_history

    history = load_history(run)
    assert [h["iteration"] for h in history] == [1, 2]
    assert all(0.0 <= h["rollout/malformed"] <= 1.0 for h in history)
    out = run / "eval"
    evaluate = ["eval", "--run", str(run), "--policy", f"a={run}/player0/hf", "--policy", f"b={run}/player1/hf"]
    assert main([*evaluate, "--cross-play", "-n", "2", "--engine", "hf", "--out", str(out)]) == 0
    ray.shutdown()
    pairs = {(p["policy"], p["counterpart"]): p["summary"] for p in json.loads((out / "summary.json").read_text())}
    assert set(pairs) == {("a", "policy:b"), ("b", "policy:a")}
    assert pairs["a", "policy:b"]["roles"]["player0"]["n"] == 2
    if diagnosed:
        assert main(["diagnose", str(run), "--role", "player0", "-n", "2"]) == 0
        ray.shutdown()
        points = json.loads((run / "diagnostics" / "player0.json").read_text())["points"]
        assert [p["checkpoint"] for p in points] == [1, 2] and all(p["n"] == 2 for p in points)
