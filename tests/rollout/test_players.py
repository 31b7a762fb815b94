"""Text players: chat messages, scripted DoND bots in a seat, an OpenAI-compatible endpoint over real HTTP, specs."""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from marti_ibrl.envs.dond import DondEnv, generate_scenarios, make_bot, parse_utterance
from marti_ibrl.rollout.dialogue import Trajectory, Turn
from marti_ibrl.rollout.players import (
    EndpointPlayer,
    OpenAIChatClient,
    ScriptedBotPlayer,
    TextPlayer,
    chat_messages,
    make_player,
    parse_player_spec,
)

ROLES = ("agent1", "agent2")
KEY = "sk-test-SECRET-4242"


def _turn(role: str, text: str) -> Turn:
    return Turn(role=role, text=text, token_ids=[], logprobs=[], valid=True)


def _traj(scenario, turns=(), seats=ROLES, sample_index: int = 0) -> Trajectory:
    return Trajectory(
        scenario_uid=scenario.uid,
        scenario=scenario,
        seats=list(seats),
        policies={r: "current" for r in ROLES},
        turns=list(turns),
        sample_index=sample_index,
    )


@pytest.fixture
def env() -> DondEnv:
    return DondEnv(prompt_style="compact")


@pytest.fixture
def scenario():
    return generate_scenarios(1, 0)[0]


# -- chat_messages ---------------------------------------------------------------------------------------------------


def test_chat_messages_roles(env, scenario):
    t1 = "I'd like the hats. <try> item0=2 item1=0 item2=0 <try>"
    t2 = "Okay. <selection> item0=0 item1=4 item2=1 <selection>"
    traj = _traj(scenario, [_turn("agent1", t1), _turn("agent2", t2)])

    as2 = chat_messages(env, traj, "agent2")
    assert as2 == [
        {"role": "system", "content": env.system_prompt(scenario, "agent2")},
        {"role": "user", "content": t1},
        {"role": "assistant", "content": t2},
    ]
    as1 = chat_messages(env, traj, "agent1")
    assert [m["role"] for m in as1] == ["system", "assistant", "user"]  # agent1 opened: no user message first
    assert as1[0]["content"] == env.system_prompt(scenario, "agent1")
    assert as1[0]["content"] != as2[0]["content"]  # each role sees its own private input
    assert [m["content"] for m in as1[1:]] == [t1, t2]
    assert chat_messages(env, _traj(scenario), "agent1") == [as1[0]]


def test_chat_messages_counterpart_text(env, scenario):
    class Prefixed(DondEnv):
        def counterpart_text(self, speaker: str, text: str, scenario) -> str:
            return f"[{speaker}] {text}"

    traj = _traj(scenario, [_turn("agent1", "a"), _turn("agent2", "b"), _turn("agent1", "c")])
    msgs = chat_messages(Prefixed(prompt_style="compact"), traj, "agent2")
    assert msgs[1:] == [
        {"role": "user", "content": "[agent1] a"},
        {"role": "assistant", "content": "b"},  # own turns are never rewritten
        {"role": "user", "content": "[agent1] c"},
    ]


# -- scripted bots ---------------------------------------------------------------------------------------------------


def _play(env, scenario, players: dict[str, Any], seats=ROLES, sample_index: int = 0) -> Trajectory:
    traj = _traj(scenario, seats=seats, sample_index=sample_index)
    traj.state = env.new_state(scenario, seats)
    while not traj.state.done:
        role = env.current_role(traj.state)
        [text] = players[role].respond(env, role, [traj])
        assert isinstance(text, str)
        result = env.step(traj.state, role, text)
        assert result.valid, (role, text, result.reason)
        traj.turns.append(_turn(role, text))
    return traj


def test_bot_vs_bot_dialogue(env):
    scenarios = generate_scenarios(6, 3)
    players = {"agent1": ScriptedBotPlayer("greedy", seed=1), "agent2": ScriptedBotPlayer("fair", seed=2)}
    assert players["agent1"].name == "bot:greedy"
    assert isinstance(players["agent1"], TextPlayer)
    deals = 0
    for i, sc in enumerate(scenarios):
        seats = ROLES if i % 2 == 0 else ROLES[::-1]
        traj = _play(env, sc, players, seats=seats)
        outcome = env.outcome(traj.state)
        assert traj.state.done and outcome.info["reason"]
        assert [t.role for t in traj.turns] == [seats[k % 2] for k in range(len(traj.turns))]
        assert [(t.role, t.text) for t in traj.turns] == traj.state.history  # every turn was accepted
        assert all(parse_utterance(t.text).kind != "malformed" for t in traj.turns)
        if outcome.agreed:
            deals += 1
            counts = sc.counts
            allocs = outcome.info["allocations"]
            assert [a + b for a, b in zip(allocs["agent1"], allocs["agent2"])] == list(counts)
            assert outcome.utilities["agent1"] >= 0 and outcome.utilities["agent2"] >= 0
    assert deals >= 1


def test_bot_determinism(env, scenario):
    def transcript(seed_a: int, seed_b: int, sample_index: int = 0) -> list[tuple[str, str]]:
        players = {"agent1": ScriptedBotPlayer("conceder", seed_a), "agent2": ScriptedBotPlayer("stubborn", seed_b)}
        traj = _play(env, scenario, players, sample_index=sample_index)
        return [(t.role, t.text) for t in traj.turns]

    first = transcript(0, 0)
    assert len(first) >= 2
    assert transcript(0, 0) == first
    # the phrasing depends on seed and sample index (the strategy does not): some differ among a few tries
    others = [transcript(s, s) for s in range(1, 6)] + [transcript(0, 0, sample_index=k) for k in range(1, 6)]
    assert any(o != first for o in others)
    for other in others:  # same moves, only the words differ
        assert [parse_utterance(t).kind for _, t in other] == [parse_utterance(t).kind for _, t in first]


def test_bot_batch_and_mid_dialogue(env, scenario):
    player = ScriptedBotPlayer("greedy", seed=7)
    trajs = [_traj(scenario, sample_index=k) for k in range(4)]
    texts = player.respond(env, "agent1", trajs)
    assert len(texts) == 4 and all(parse_utterance(t).kind == "try" for t in texts)
    # the rng key is (seed, uid, sample_index, n_turns): the same call replays
    assert player.respond(env, "agent1", trajs) == texts
    bot = make_bot("greedy")
    assert texts == [bot.respond(scenario, 0, [], random.Random(f"7/{scenario.uid}/{k}/0")) for k in range(4)]
    opener = "Hi. <try> item0=2 item1=4 item2=1 <try>"
    later = _traj(scenario, [_turn("agent2", opener)], seats=ROLES[::-1], sample_index=2)
    expected = bot.respond(scenario, 0, [(1, opener)], random.Random(f"7/{scenario.uid}/2/1"))
    assert player.respond(env, "agent1", [later]) == [expected]
    # after the partner's <selection>, a bot only confirms or refuses
    sel = "<selection> item0=0 item1=4 item2=1 <selection>"
    traj = _traj(scenario, [_turn("agent2", "Deal. " + sel)], seats=ROLES[::-1])
    [reply] = player.respond(env, "agent1", [traj])
    assert parse_utterance(reply).kind in ("selection", "disagree")


def test_bot_errors(env, scenario):
    with pytest.raises(ValueError, match=r"unknown scripted bot 'nope'.*'fair'.*'greedy'"):
        ScriptedBotPlayer("nope")
    with pytest.raises(ValueError, match="unknown role"):
        ScriptedBotPlayer("fair").respond(env, "agent3", [_traj(scenario)])


# -- endpoint over real HTTP -----------------------------------------------------------------------------------------

Reply = tuple[int, Any, dict[str, str], float]  # status, body (dict -> JSON, str -> raw), headers, sleep seconds


def ok(content: Any = "Hello. <try> item0=1 item1=1 item2=1 <try>") -> Reply:
    return (
        200,
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
        },
        {},
        0.0,
    )


class FakeServer:
    """A ThreadingHTTPServer on 127.0.0.1 answering /chat/completions from a script (the last entry repeats)."""

    def __init__(self, script: list[Reply] | Callable[[dict], Reply]):
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.inflight = 0
        self.max_inflight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                body = json.loads(raw)
                with server.lock:
                    n = len(server.requests)
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                counted = [True]

                def done():
                    with server.lock:
                        if counted:
                            server.inflight -= 1
                            counted.clear()

                try:
                    if callable(server.script):
                        status, payload, headers, sleep = server.script(body)
                    else:
                        status, payload, headers, sleep = server.script[min(n, len(server.script) - 1)]
                    time.sleep(sleep)
                    data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    done()  # before the client can have the reply (and send its next request): a sound count
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout)
                    pass
                finally:
                    done()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers: list[FakeServer] = []

    def start(script) -> FakeServer:
        servers.append(FakeServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: nothing listens there


def _player(url: str, **kw) -> EndpointPlayer:
    kw.setdefault("backoff", 0.01)
    kw.setdefault("max_backoff", 0.05)
    kw.setdefault("max_retries", 2)
    return EndpointPlayer(url, "test-model", **kw)


def test_endpoint_success(serve, env, scenario, monkeypatch):
    monkeypatch.setenv("IBRL_TEST_KEY", KEY)
    server = serve([ok()])
    player = _player(
        server.base_url + "/",  # a trailing slash is fine
        api_key_env="IBRL_TEST_KEY",
        sampling={"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 64, "ignored": 1},
    )
    assert player.name == "endpoint:test-model"
    assert isinstance(player, TextPlayer)
    traj = _traj(scenario, [_turn("agent1", "Hi. <try> item0=2 item1=0 item2=0 <try>")])
    try:
        assert player.respond(env, "agent2", [traj]) == ["Hello. <try> item0=1 item1=1 item2=1 <try>"]
    finally:
        player.close()
    [req] = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == f"Bearer {KEY}"
    assert req["body"] == {
        "model": "test-model",
        "messages": chat_messages(env, traj, "agent2"),
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 64,
    }
    assert req["body"]["messages"][1] == {"role": "user", "content": traj.turns[0].text}
    assert player.stats["requests"] == 1 and player.stats["retries"] == 0 and player.stats["failures"] == 0


def test_endpoint_no_key_no_auth_header(serve, env, scenario):
    server = serve([ok("hi")])
    player = _player(server.base_url)
    try:
        assert player.respond(env, "agent1", [_traj(scenario)]) == ["hi"]
    finally:
        player.close()
    assert "Authorization" not in server.requests[0]["headers"]
    assert "max_tokens" not in server.requests[0]["body"]  # only the sampling keys given are sent


def test_endpoint_429_then_ok(serve, env, scenario):
    server = serve([(429, {"error": "slow down"}, {"Retry-After": "0.05"}, 0.0), ok("fine")])
    player = _player(server.base_url, max_backoff=0.2)
    t0 = time.monotonic()
    try:
        assert player.respond(env, "agent1", [_traj(scenario)]) == ["fine"]
    finally:
        player.close()
    assert time.monotonic() - t0 >= 0.05  # Retry-After honoured
    assert len(server.requests) == 2
    assert player.stats["retries"] == 1 and player.stats["http_429"] == 1
    assert player.stats["requests"] == 2 and player.stats["failures"] == 0


def test_endpoint_500_forever(serve, env, scenario, caplog):
    server = serve([(500, {"error": "boom"}, {}, 0.0)])
    player = _player(server.base_url, max_retries=3)
    with caplog.at_level(logging.WARNING, logger="marti_ibrl.rollout.players"):
        try:
            assert player.respond(env, "agent1", [_traj(scenario), _traj(scenario, sample_index=1)]) == [None, None]
        finally:
            player.close()
    assert len(server.requests) == 2 * (3 + 1)
    assert player.stats["failures"] == 2 and player.stats["retries"] == 2 * 3 and player.stats["http_5xx"] == 8
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "http_5xx" in warnings[0].getMessage() and "4 attempt" in warnings[0].getMessage()


@pytest.mark.parametrize(
    "reply, kind",
    [
        ((200, "this is <html> not json", {}, 0.0), "bad_json"),
        ((200, {"choices": []}, {}, 0.0), "empty"),
        ((200, {"id": "no-choices"}, {}, 0.0), "empty"),
        (ok(None), "empty"),
    ],
)
def test_endpoint_bad_bodies_retried(serve, env, scenario, reply, kind):
    server = serve([reply, reply, ok("recovered")])
    player = _player(server.base_url, max_retries=2)
    try:
        assert player.respond(env, "agent1", [_traj(scenario)]) == ["recovered"]
    finally:
        player.close()
    assert len(server.requests) == 3
    assert player.stats[kind] == 2 and player.stats["retries"] == 2 and player.stats["failures"] == 0


def test_endpoint_bad_json_forever(serve, env, scenario):
    server = serve([(200, "{truncated", {}, 0.0)])
    player = _player(server.base_url, max_retries=1)
    try:
        assert player.respond(env, "agent1", [_traj(scenario)]) == [None]
    finally:
        player.close()
    assert len(server.requests) == 2 and player.stats["bad_json"] == 2 and player.stats["failures"] == 1


def test_endpoint_body_nested_200000_deep_is_a_fault(serve, env, scenario):
    """Issue 50: such a body was a RecursionError (a traceback) from the JSON decoder; now a counted bad_json fault."""
    server = serve([(200, "[" * 200_000 + "]" * 200_000, {}, 0.0), ok("recovered")])
    player = _player(server.base_url, max_retries=1)
    try:
        assert player.respond(env, "agent1", [_traj(scenario)]) == ["recovered"]
    finally:
        player.close()
    assert player.stats["bad_json"] == 1 and player.stats["failures"] == 0


@pytest.mark.parametrize("status", [400, 401, 404])
def test_endpoint_4xx_not_retried(serve, env, scenario, status):
    server = serve([(status, {"error": "no"}, {}, 0.0), ok("never")])
    player = _player(server.base_url, max_retries=3)
    try:
        assert player.respond(env, "agent1", [_traj(scenario)]) == [None]
    finally:
        player.close()
    assert len(server.requests) == 1
    assert player.stats["http_4xx"] == 1 and player.stats["retries"] == 0 and player.stats["failures"] == 1


def test_endpoint_timeout(serve, env, scenario):
    server = serve([(200, ok()[1], {}, 0.6)])
    player = _player(server.base_url, timeout=0.2, max_retries=1)
    t0 = time.monotonic()
    try:
        assert player.respond(env, "agent1", [_traj(scenario)]) == [None]
    finally:
        player.close()
    assert time.monotonic() - t0 < 1.5
    assert len(server.requests) == 2
    assert player.stats["timeout"] == 2 and player.stats["failures"] == 1 and player.stats["retries"] == 1


def test_endpoint_connection_refused(closed_port, env, scenario):
    player = _player(f"http://127.0.0.1:{closed_port}/v1", max_retries=2)
    try:
        assert player.respond(env, "agent1", [_traj(scenario)]) == [None]
    finally:
        player.close()
    assert player.stats["connect"] == 3 and player.stats["requests"] == 3 and player.stats["failures"] == 1


def test_endpoint_concurrency_limit(serve, env, scenario):
    def reply(body: dict) -> Reply:
        return ok(f"reply to {len(body['messages'])} / {body['messages'][-1]['content'][:12]}")[:3] + (0.1,)

    server = serve(reply)
    player = _player(server.base_url, max_concurrency=3)
    trajs = [_traj(scenario, [_turn("agent2", f"turn {k}")], seats=ROLES[::-1], sample_index=k) for k in range(10)]
    try:
        out = player.respond(env, "agent1", trajs)
    finally:
        player.close()
    assert out == [f"reply to 2 / turn {k}" for k in range(10)]  # in the trajectories' order
    assert len(server.requests) == 10
    assert 1 < server.max_inflight <= 3


def test_endpoint_key_hygiene(serve, env, scenario, monkeypatch, caplog):
    monkeypatch.setenv("IBRL_TEST_KEY", KEY)
    # the server echoes the key back in an error body: it must still not reach the logs
    server = serve([(401, {"error": f"invalid key {KEY}"}, {}, 0.0)])
    with caplog.at_level(logging.DEBUG):
        player = _player(server.base_url, api_key_env="IBRL_TEST_KEY")
        try:
            assert player.respond(env, "agent1", [_traj(scenario)]) == [None]
        finally:
            player.close()
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert "HTTP 401" in caplog.text and "***" in caplog.text
    assert KEY not in caplog.text
    assert KEY not in repr(player) and KEY not in repr(player.client) and "IBRL_TEST_KEY" in repr(player)
    assert KEY not in str(player.stats)


def test_endpoint_missing_key_env(monkeypatch):
    monkeypatch.delenv("IBRL_UNSET_KEY", raising=False)
    with pytest.raises(ValueError, match="IBRL_UNSET_KEY") as info:
        EndpointPlayer("http://127.0.0.1:1/v1", "m", api_key_env="IBRL_UNSET_KEY")
    assert "not set" in str(info.value)
    monkeypatch.setenv("IBRL_SET_KEY", KEY)
    with pytest.raises(ValueError) as info:
        EndpointPlayer("127.0.0.1:1/v1", "m", api_key_env="IBRL_SET_KEY")  # no scheme
    assert KEY not in str(info.value)


def test_client_reusable(serve):
    server = serve([ok("direct")])
    client = OpenAIChatClient(server.base_url, "m", backoff=0.01)
    try:
        assert client.complete([{"role": "user", "content": "hi"}], {"max_new_tokens": 5}) == "direct"
    finally:
        client.close()
    assert server.requests[0]["body"] == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
    }
    assert client.complete([{"role": "user", "content": "again"}]) is None  # closed: no request, a failure
    assert len(server.requests) == 1 and client.stats["failures"] == 1


def test_backoff_delay_bounds():
    client = OpenAIChatClient("http://127.0.0.1:1/v1", "m", backoff=1.0, max_backoff=5.0)
    try:
        for attempt in range(6):
            cap = min(5.0, 2**attempt)
            delays = [client.backoff_delay(attempt) for _ in range(200)]
            assert all(0.0 <= d <= cap for d in delays) and max(delays) > cap / 2
        assert client.backoff_delay(0, retry_after=2.5) == 2.5
        assert client.backoff_delay(0, retry_after=100.0) == 5.0  # capped
    finally:
        client.close()


# -- specs -----------------------------------------------------------------------------------------------------------


def test_parse_player_spec():
    assert parse_player_spec("bot:greedy") == {"kind": "bot", "name": "greedy"}
    assert parse_player_spec("checkpoint:/path/to/hf") == {"kind": "checkpoint", "path": "/path/to/hf"}
    assert parse_player_spec("endpoint:qwen-72b@http://10.0.0.5:8000/v1#MY_KEY") == {
        "kind": "endpoint",
        "model": "qwen-72b",
        "base_url": "http://10.0.0.5:8000/v1",
        "api_key_env": "MY_KEY",
    }
    assert parse_player_spec("endpoint:org/Model-7B@https://api.example.com/v1") == {
        "kind": "endpoint",
        "model": "org/Model-7B",
        "base_url": "https://api.example.com/v1",
    }
    for bad in [
        "greedy",
        "bot:",
        "robot:x",
        "endpoint:model",
        "endpoint:m@10.0.0.5:8000/v1",
        "endpoint:m@http://h/v1#1X",
    ]:
        with pytest.raises(ValueError):
            parse_player_spec(bad)


def test_make_player(monkeypatch):
    bot = make_player(parse_player_spec("bot:fair"))
    assert isinstance(bot, ScriptedBotPlayer) and bot.name == "bot:fair"
    assert make_player({"kind": "bot", "name": "greedy", "seed": 3}).seed == 3
    monkeypatch.setenv("MY_KEY", KEY)
    ep = make_player(parse_player_spec("endpoint:qwen-72b@http://10.0.0.5:8000/v1#MY_KEY"))
    try:
        assert isinstance(ep, EndpointPlayer) and ep.name == "endpoint:qwen-72b"
        assert ep.client.url == "http://10.0.0.5:8000/v1/chat/completions"
    finally:
        ep.close()
    ep = make_player({"kind": "endpoint", "base_url": "http://h/v1", "model": "m", "max_concurrency": 2, "timeout": 5})
    try:
        assert ep.max_concurrency == 2 and ep.client.timeout == 5.0 and ep.client.max_retries == 4
    finally:
        ep.close()

    with pytest.raises(ValueError, match="rollout engines"):
        make_player(parse_player_spec("checkpoint:/path/to/hf"))
    with pytest.raises(ValueError, match="unknown player kind 'human'"):
        make_player({"kind": "human"})
    with pytest.raises(ValueError, match=r"missing \['model'\]"):
        make_player({"kind": "endpoint", "base_url": "http://h/v1"})
    with pytest.raises(ValueError, match=r"missing \['name'\]"):
        make_player({"kind": "bot"})
    with pytest.raises(ValueError, match=r"unknown keys \['max_concurency'\]"):
        make_player({"kind": "endpoint", "base_url": "http://h/v1", "model": "m", "max_concurency": 2})
    with pytest.raises(ValueError, match="unknown scripted bot"):
        make_player({"kind": "bot", "name": "nope"})
    with pytest.raises(ValueError, match="must be a dict"):
        make_player("bot:greedy")  # type: ignore[arg-type]


# -- held-out bots ---------------------------------------------------------------------------------------------------


def test_heldout_player_spec_and_play(env):
    from marti_ibrl.envs.dond.heldout import HELDOUT_BOTS, make_heldout_bot

    assert parse_player_spec("heldout:hardliner") == {"kind": "heldout", "name": "hardliner"}
    with pytest.raises(ValueError, match="bad player spec 'heldout:'"):
        parse_player_spec("heldout:")
    player = make_player(parse_player_spec("heldout:tit_for_tat"))
    assert isinstance(player, ScriptedBotPlayer) and isinstance(player, TextPlayer)
    assert player.name == "heldout:tit_for_tat" and player.bot.name == "tit_for_tat"
    assert "kind='heldout'" in repr(player)
    assert make_player({"kind": "heldout", "name": "fast_conceder", "seed": 5}).seed == 5
    # the two registries do not mix: a training bot is not a held-out bot and vice versa
    with pytest.raises(ValueError, match=r"unknown held-out bot 'greedy'; known bots: \['fast_conceder'"):
        make_player({"kind": "heldout", "name": "greedy"})
    with pytest.raises(ValueError, match="unknown scripted bot 'hardliner'"):
        make_player({"kind": "bot", "name": "hardliner"})
    with pytest.raises(ValueError, match=r"missing \['name'\]"):
        make_player({"kind": "heldout"})
    with pytest.raises(ValueError, match=r"unknown keys \['temperature'\]"):
        make_player({"kind": "heldout", "name": "hardliner", "temperature": 1.0})

    # every held-out bot plays through the text-player interface against a training bot, both seats, valid turns,
    # with the same (seed, uid, sample, turn) phrasing key as the training bots
    scenarios = generate_scenarios(8, 21)
    for name in HELDOUT_BOTS:
        players = {
            "agent1": make_player({"kind": "heldout", "name": name, "seed": 3}),
            "agent2": ScriptedBotPlayer("fair"),
        }
        for i, sc in enumerate(scenarios):
            traj = _play(env, sc, players, seats=ROLES if i % 2 else ROLES[::-1])
            assert traj.state.done
        first = players["agent1"].respond(env, "agent1", [_traj(scenarios[0], sample_index=1)])
        assert first == [
            make_heldout_bot(name).respond(scenarios[0], 0, [], random.Random(f"3/{scenarios[0].uid}/1/0"))
        ]


def test_bots_speak_markers_only_when_the_env_says_so(scenario):
    from marti_ibrl.envs.dond import DondEnv

    with pytest.raises(ValueError, match="bot_speech must be one of"):
        DondEnv(bot_speech="terse")
    natural, markers = DondEnv(), DondEnv(bot_speech="markers")
    players = {"agent1": ScriptedBotPlayer("conceder", 3), "agent2": ScriptedBotPlayer("fair", 4)}
    long = _play(natural, scenario, players)
    short = _play(markers, scenario, players)
    # the same moves, without the sentences: every short turn is exactly its marker
    assert [parse_utterance(t.text) for t in short.turns] == [parse_utterance(t.text) for t in long.turns]
    assert all(t.text.startswith("<") and t.text.endswith(">") for t in short.turns)
    assert sum(len(t.text) for t in short.turns) < 0.7 * sum(len(t.text) for t in long.turns)
