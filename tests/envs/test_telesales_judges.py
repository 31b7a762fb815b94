"""TeleSales LLM judges and the trajectory reward (paper §5.1 "Task-Specific Rewards"; issue 6 §3 and §6), against a
real HTTP server on 127.0.0.1 speaking the OpenAI chat API with scripted replies: exact rewards by hand, retries
and their stats, strict validation, the verdict's JSON schema (issue 20: sent as structured outputs, agreeing with
the validator, ``--judge.structured``), timeouts, the concurrency limit, API-key hygiene and the sync wrappers."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import test_llm_structured
import test_players
from fake_model import fake_checkpoint
from test_players import Reply

from marti_ibrl.envs.telesales.env import TeleSalesEnv
from marti_ibrl.envs.telesales.judges import (
    CustomerJudge,
    JudgeFailure,
    JudgeResult,
    SalesJudge,
    discounted_turn_score,
    make_judges,
    trajectory_reward,
    validate_verdict,
    verdict_schema,
)
from marti_ibrl.envs.telesales.profiles import generate_profile
from marti_ibrl.envs.telesales.protocol import format_customer_turn
from marti_ibrl.llm import AsyncChatClient, ChatFailure, retry_after_seconds
from marti_ibrl.rollout.dialogue import Trajectory, Turn

KEY = "sk-judge-SECRET-7777"
PROFILE = generate_profile(0, seed=0, split="train")
PHONE = PROFILE["lead"]["phone_number"]
SALES_MARK = "judge of outbound automotive-sales phone calls"
CUSTOMER_MARK = "judge of a simulated customer"


serve = test_players.serve  # fixture: the real 127.0.0.1 OpenAI-style server of the player tests, re-exported


def ok(content: Any) -> Reply:
    """A 200 reply whose message content is ``content`` (a dict is sent as its JSON text)."""
    return test_players.ok(content if isinstance(content, str) else json.dumps(content))


def client(url: str, **kw: Any) -> AsyncChatClient:
    kw = {"backoff": 0.001, "max_backoff": 0.01, "max_retries": 2, "timeout": 2.0, **kw}
    return AsyncChatClient(url, "judge-model", **kw)


def arun(llm: AsyncChatClient, coro: Any) -> Any:
    async def main() -> Any:
        try:
            return await coro
        finally:
            await llm.aclose()

    return asyncio.run(main())


def call(*steps: str, opener: str = "Hello, this is Li Na from the car platform, is now a good time?") -> Trajectory:
    """A finished call: ``opener``, then alternating customer / sales turns; a customer step is a behavior name
    (``Name`` or ``Name:dw:dp``) or raw text (applied with the fallback when invalid)."""
    env = TeleSalesEnv(max_turns=12)
    state = env.new_state(PROFILE)
    turns = []
    for i, text in enumerate((opener, *steps)):
        role = env.current_role(state)
        if role == "customer" and not text.startswith(("{", "not json")):
            behavior, *deltas = text.split(":")
            dw, dp = (float(d) for d in deltas) if deltas else (0.0, 0.0)
            text = format_customer_turn(
                behavior, "exploration", f"reply {i}", state.scores, {"willingness": dw, "patience": dp}
            )
        result = env.step(state, role, text)
        turns.append(Turn(role, text, [], [], result.valid))
        if not result.valid:
            env.finish_malformed(state, role)
    assert state.done
    return Trajectory(PROFILE["sample_id"], PROFILE, ["sales", "customer"], {"sales": "current", "customer": "current"},
                      turns, state=state, outcome=env.outcome(state))  # fmt: skip


def success_call(opener: str = "Hello, this is Li Na from the car platform, is now a good time?") -> Trajectory:
    return call(
        "Greeting:0.05:-0.02",
        "I can send the inspection report on WeChat, may I add you?",
        "AgreeWeChat:0.1:0.0",
        f"Great, sending the request now. <call_function=add_business_contact(phone_number={PHONE})>",
        "ConfirmAdded",
        opener=opener,
    )


def sales_verdict(turns=((1, 8, 10, 6), (3, 6, 10, 9), (5, 10, 10, 10)), outcome=9) -> dict:
    keys = ("turn", "relevance", "compliance", "contact_push")
    return {"turns": [{**dict(zip(keys, t)), "reason": "ok"} for t in turns], "outcome": outcome, "reason": "fine"}


def customer_verdict(turns=((2, 8, 6, 10), (4, 9, 8, 5), (6, 10, 10, 10)), realism=8) -> dict:
    keys = ("turn", "realism", "rationality", "score_plausibility")
    return {"turns": [{**dict(zip(keys, t)), "reason": "ok"} for t in turns], "realism": realism, "reason": "fine"}


def by_judge(body: dict) -> Reply:
    prompt = body["messages"][-1]["content"]
    return ok(sales_verdict() if SALES_MARK in prompt else customer_verdict())


# ---- the reward formula ----
def test_trajectory_reward_by_hand() -> None:
    # γ = 0.9, discounting from the first turn: (1·1 + 0.9·0.5 + 0.81·0) / (1 + 0.9 + 0.81)
    assert discounted_turn_score([1.0, 0.5, 0.0]) == pytest.approx(1.45 / 2.71)
    assert trajectory_reward([1.0, 0.5, 0.0], 0.6) == pytest.approx(0.2 * 1.45 / 2.71 + 0.8 * 0.6)
    for n in (1, 2, 5, 20):  # normalisation bounds, for any length
        assert discounted_turn_score([1.0] * n) == pytest.approx(1.0)
        assert discounted_turn_score([0.0] * n) == 0.0
        assert discounted_turn_score([0.7] * n) == pytest.approx(0.7)  # a constant score is length-independent
        assert trajectory_reward([1.0] * n, 1.0) == pytest.approx(1.0)
        assert trajectory_reward([0.0] * n, 0.0) == 0.0
    assert discounted_turn_score([1.0, 0.0]) > discounted_turn_score([0.0, 1.0])  # earlier turns weigh more
    assert trajectory_reward([0.5], 1.0, gamma=0.5, lam_turn=0.5, lam_episode=0.5) == pytest.approx(0.75)
    for bad in (lambda: trajectory_reward([], 1.0), lambda: trajectory_reward([1.1], 0.5),
                lambda: trajectory_reward([0.5], -0.1), lambda: trajectory_reward([0.5], 0.5, gamma=0.0)):  # fmt: skip
        with pytest.raises(ValueError):
            bad()


# ---- judges over HTTP ----
def test_valid_verdicts_give_exact_rewards(serve, monkeypatch) -> None:
    monkeypatch.setenv("IBRL_JUDGE_KEY", KEY)
    server = serve(by_judge)
    llm = client(server.base_url, api_key_env="IBRL_JUDGE_KEY")
    sales, customer = SalesJudge(llm), CustomerJudge(llm)
    traj = success_call()

    async def both() -> tuple[JudgeResult, JudgeResult]:
        return await sales.score(traj), await customer.score(traj)

    s, c = arun(llm, both())
    # sales: s_t = (relevance + compliance + contact_push) / 30; E = 0.5 · success + 0.5 · outcome / 10
    assert s.turn_scores == pytest.approx((24 / 30, 25 / 30, 30 / 30))
    assert s.turn_part == pytest.approx((24 / 30 + 0.9 * 25 / 30 + 0.81 * 1.0) / 2.71)
    assert s.episode_part == pytest.approx(0.5 * 1 + 0.5 * 0.9)
    assert s.reward == pytest.approx(0.2 * 2.36 / 2.71 + 0.8 * 0.95)
    assert s.reward == pytest.approx(0.934170, abs=1e-6)
    # customer: s_t = (realism + rationality) / 20; E = realism / 10 · mean(score_plausibility / 10)
    assert c.turn_scores == pytest.approx((0.7, 0.85, 1.0))
    assert c.episode_part == pytest.approx(0.8 * (1.0 + 0.5 + 1.0) / 3)
    assert c.reward == pytest.approx(0.2 * (0.7 + 0.9 * 0.85 + 0.81) / 2.71 + 0.8 * 0.8 * 2.5 / 3)
    assert c.verdict.turns[1].criteria == {"realism": 9.0, "rationality": 8.0, "score_plausibility": 5.0}

    assert len(server.requests) == 2 and llm.stats["successes"] == 2 and llm.stats["retries"] == 0
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["headers"]["Authorization"] == f"Bearer {KEY}"
    assert req["body"]["model"] == "judge-model" and req["body"]["temperature"] == 0.0
    schema = verdict_schema([1, 3, 5], SalesJudge.criteria, "outcome", "sales_judge_verdict")
    assert req["body"]["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "sales_judge_verdict", "schema": schema.schema, "strict": True}}  # fmt: skip
    customer_format = server.requests[1]["body"]["response_format"]["json_schema"]
    assert customer_format["name"] == "customer_judge_verdict"
    assert customer_format["schema"]["properties"]["turns"]["items"]["properties"]["turn"]["enum"] == [2, 4, 6]
    assert (llm.stats["structured"], llm.stats["unstructured"], llm.stats["structured_fallbacks"]) == (2, 0, 0)
    sales_prompt = req["body"]["messages"][-1]["content"]
    assert "exactly these agent turns, each once: 1, 3, 5." in sales_prompt
    assert "Turn 2 - customer: reply 1" in sales_prompt and "willingness" not in sales_prompt  # replies only
    assert f"[The agent sent a WeChat friend request to {PHONE}]" in sales_prompt
    customer_prompt = server.requests[1]["body"]["messages"][-1]["content"]
    assert "exactly these customer turns, each once: 2, 4, 6." in customer_prompt
    assert f"Turn 2 - customer: {traj.turns[1].text}" in customer_prompt  # the emitted record, scores included


def test_500_then_success_is_retried(serve) -> None:
    server = serve([(500, {"error": "overloaded"}, {}, 0.0), ok(sales_verdict())])
    llm = client(server.base_url)
    result = arun(llm, SalesJudge(llm).score(success_call()))
    assert result.reward == pytest.approx(0.934170, abs=1e-6)
    assert len(server.requests) == 2
    assert llm.stats == {"requests": 2, "retries": 1, "failures": 0, "successes": 1, "http_5xx": 1, "structured": 2,
                         "unstructured": 0, "structured_fallbacks": 0}  # fmt: skip


def test_429_retry_after_is_honoured(serve) -> None:
    server = serve([(429, {"error": "slow down"}, {"Retry-After": "0.2"}, 0.0), ok(sales_verdict())])
    llm = client(server.base_url, max_backoff=1.0)
    t0 = time.monotonic()
    arun(llm, SalesJudge(llm).score(success_call()))
    assert time.monotonic() - t0 >= 0.2 and llm.stats["http_429"] == 1 and llm.stats["retries"] == 1
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0 and retry_after_seconds("soon") is None


@pytest.mark.parametrize(
    "content, message",
    [
        (sales_verdict(turns=((1, 8, 10, 6), (3, 6, 10, 9), (3, 6, 10, 9), (5, 1, 1, 1))), "turn 3 scored twice"),
        ("Sure! Here are my scores: relevance 8", "not one JSON object"),
    ],
)
def test_persistent_invalid_output_fails_with_reason(serve, caplog, content, message) -> None:
    server = serve([ok(content)])
    llm = client(server.base_url, max_retries=2)
    judge = SalesJudge(llm)
    with pytest.raises(JudgeFailure, match=message) as info:
        arun(llm, judge.score(success_call()))
    assert info.value.kind == "bad_output" and "bad_output after 3 attempt(s)" in info.value.reason
    assert len(server.requests) == 3 and llm.stats["bad_output"] == 3 and llm.stats["failures"] == 1
    # in a batch: returned in place, counted, logged (never a silent 0)
    with caplog.at_level(logging.WARNING, logger="marti_ibrl.envs.telesales.judges"):
        (failure,) = arun(llm, judge.score_batch([success_call()]))
    assert isinstance(failure, JudgeFailure) and message in failure.reason
    assert judge.stats == {"scored": 0, "failures": 1, "failure:bad_output": 1}
    assert any("no sales reward for trajectory" in r.getMessage() and message in r.getMessage() for r in caplog.records)


def test_timeout_is_retried_then_fails(serve) -> None:
    server = serve([(200, ok(sales_verdict())[1], {}, 0.5)])
    llm = client(server.base_url, timeout=0.1, max_retries=1)
    t0 = time.monotonic()
    with pytest.raises(JudgeFailure, match="timeout after 2 attempt") as info:
        arun(llm, SalesJudge(llm).score(success_call()))
    assert time.monotonic() - t0 < 1.0 and info.value.kind == "timeout"
    assert len(server.requests) == 2 and llm.stats["timeout"] == 2 and llm.stats["retries"] == 1


def test_batch_respects_the_concurrency_limit(serve) -> None:
    def reply(body: dict) -> Reply:
        if "Hello 3," in body["messages"][-1]["content"]:
            return 400, {"error": "bad request"}, {}, 0.1  # not retried
        return by_judge(body)[:3] + (0.1,)

    server = serve(reply)
    llm = client(server.base_url, max_concurrency=3)
    judge = SalesJudge(llm)
    results = arun(llm, judge.score_batch([success_call(f"Hello {k}, this is Li Na.") for k in range(8)]))
    assert 1 < server.max_inflight <= 3 and len(server.requests) == 8
    assert [type(r).__name__ for r in results] == ["JudgeResult"] * 3 + ["JudgeFailure"] + ["JudgeResult"] * 4
    assert results[3].kind == "http_4xx" and "HTTP 400" in results[3].reason
    assert judge.stats == {"scored": 7, "failures": 1, "failure:http_4xx": 1}


def test_missing_key_env_names_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("IBRL_UNSET_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="'IBRL_UNSET_JUDGE_KEY'.*not set"):
        AsyncChatClient("http://127.0.0.1:1/v1", "m", api_key_env="IBRL_UNSET_JUDGE_KEY")


@pytest.mark.parametrize("status", [401, 500])
def test_key_never_in_exceptions_or_logs(serve, monkeypatch, caplog, status) -> None:
    monkeypatch.setenv("IBRL_JUDGE_KEY", KEY)
    server = serve([(status, {"error": f"invalid key {KEY}"}, {}, 0.0)])  # the server echoes the key
    with caplog.at_level(logging.DEBUG):
        llm = client(server.base_url, api_key_env="IBRL_JUDGE_KEY", max_retries=1)
        with pytest.raises(JudgeFailure) as info:
            arun(llm, SalesJudge(llm).score(success_call()))
    assert f"HTTP {status}" in str(info.value) and "***" in str(info.value)
    assert KEY not in str(info.value) and KEY not in repr(info.value) and KEY not in caplog.text
    assert KEY not in repr(llm) and "IBRL_JUDGE_KEY" in repr(llm)
    assert server.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"


# ---- validation, edge cases, sync wrappers ----
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda v: v.pop("outcome"), "missing outcome"),
        (lambda v: v.update(extra=1), "unexpected extra"),
        (lambda v: v["turns"].pop(), "turns not scored: 5"),
        (lambda v: v["turns"][0].update(turn=2), "turn 2 is not to be scored"),
        (lambda v: v["turns"][0].update(turn="1"), "'turn' must be a turn number"),
        (lambda v: v["turns"][0].update(compliance=11), "turn 1 compliance = 11 is outside"),
        (lambda v: v["turns"][0].update(relevance=True), "turn 1 relevance must be a number"),
        (lambda v: v["turns"][1].pop("contact_push"), "turn 3: missing contact_push"),
        (lambda v: v.update(outcome=-1), "outcome = -1 is outside"),
        (lambda v: v.update(reason=None), "'reason' must be a string"),
        (lambda v: v.update(turns={}), "'turns' must be a list"),
    ],
)
def test_validator_is_strict(change, message) -> None:
    args = ([1, 3, 5], SalesJudge.criteria, "outcome", "sales judge")
    verdict = validate_verdict(sales_verdict(), *args)
    assert [t.turn for t in verdict.turns] == [1, 3, 5] and verdict.episode == 9.0
    broken = sales_verdict()
    change(broken)
    with pytest.raises(ValueError, match=message):
        validate_verdict(broken, *args)
    # the verdict's schema refuses it too, and takes the valid verdict
    schema = verdict_schema([1, 3, 5], SalesJudge.criteria, "outcome", "sales_judge_verdict")
    assert test_llm_structured.conforms(schema, sales_verdict()) and not test_llm_structured.conforms(schema, broken)


def test_verdict_schemas_agree_with_the_validator() -> None:
    for judge, verdict, turns in ((SalesJudge, sales_verdict, [1, 3, 5]), (CustomerJudge, customer_verdict, [2, 4, 6])):
        schema = verdict_schema(turns, judge.criteria, judge.episode_key, f"{judge.role}_judge_verdict")
        entry = schema.schema["properties"]["turns"]["items"]
        assert entry["required"] == ["turn", *judge.criteria, "reason"] and entry["properties"]["turn"]["enum"] == turns
        assert schema.schema["required"] == ["turns", judge.episode_key, "reason"]
        reordered = verdict()
        reordered["turns"].reverse()  # any order is fine
        edges = verdict()
        edges[judge.episode_key] = 0
        edges["turns"][0].update(dict.fromkeys(judge.criteria, 10.0), reason="")
        broken = [verdict(), verdict(), verdict(), verdict()]
        broken[0]["turns"].append({**broken[0]["turns"][0]})  # four entries for three turns
        broken[1]["turns"][0]["turn"] = 1.5
        broken[2][judge.episode_key] = 10.5
        broken[3]["turns"][1]["reason"] = 7
        test_llm_structured.agrees(
            schema,
            functools.partial(
                validate_verdict, turns=turns, criteria=judge.criteria, episode_key=judge.episode_key, what="judge"
            ),  # fmt: skip
            [verdict(), reordered, edges],
            broken,
        )
    # what only the validator sees: a turn scored twice and another not at all (the count and the numbers fit)
    twice = sales_verdict(turns=((1, 8, 10, 6), (3, 6, 10, 9), (3, 6, 10, 9)))
    assert test_llm_structured.conforms(verdict_schema([1, 3, 5], SalesJudge.criteria, "outcome", "v"), twice)
    with pytest.raises(ValueError, match="turn 3 scored twice"):
        validate_verdict(twice, [1, 3, 5], SalesJudge.criteria, "outcome", "sales judge")


def judge_cfg(url: str, structured: str, max_new_tokens: int | None = None) -> SimpleNamespace:
    fields = dict(base_url=url, model="judge-model", api_key_env=None, max_concurrency=2, max_retries=1)
    return SimpleNamespace(**fields, timeout=2.0, temperature=0.0, structured=structured, max_new_tokens=max_new_tokens)


def test_judge_structured_setting(serve) -> None:
    refusal = (400, test_llm_structured.OPENAI_REFUSAL, {}, 0.0)

    def refusing(body: dict) -> Reply:
        return refusal if body["response_format"]["type"] == "json_schema" else by_judge(body)

    server = serve(refusing)
    # off: JSON mode only
    llm, judges = make_judges(judge_cfg(server.base_url, "off"), "en", ["sales"])
    assert arun(llm, judges["sales"].score(success_call())).reward == pytest.approx(0.934170, abs=1e-6)
    assert server.requests[-1]["body"]["response_format"] == {"type": "json_object"}
    assert "max_tokens" not in server.requests[-1]["body"]  # the endpoint's own cap unless --judge.max_new_tokens
    llm, judges = make_judges(judge_cfg(server.base_url, "off", max_new_tokens=300), "en", ["sales"])
    arun(llm, judges["sales"].score(success_call()))
    assert server.requests[-1]["body"]["max_tokens"] == 300
    # auto: the refused schema is no failure of the judgement; the rest of the run is in JSON mode
    llm, judges = make_judges(judge_cfg(server.base_url, "auto"), "en", ["sales", "customer"])
    n = len(server.requests)
    results = arun(llm, judges["sales"].score_batch([success_call()]))
    results += arun(llm, judges["customer"].score_batch([success_call()]))
    assert [type(r).__name__ for r in results] == ["JudgeResult"] * 2
    assert [r["body"]["response_format"]["type"] for r in server.requests[n:]] == [
        "json_schema", "json_object", "json_object"]  # fmt: skip
    assert (llm.stats["structured"], llm.stats["unstructured"], llm.stats["structured_fallbacks"]) == (1, 2, 1)
    assert llm.stats["failures"] == 0 and llm.stats["retries"] == 0
    assert judges["sales"].stats == {"scored": 1, "failures": 0}
    # on: the refusal fails the judgement, with the reason
    llm, judges = make_judges(judge_cfg(server.base_url, "on"), "en", ["sales"])
    with pytest.raises(JudgeFailure, match="the endpoint refused the JSON schema") as info:
        arun(llm, judges["sales"].score(success_call()))
    assert info.value.kind == "schema_refused" and llm.stats["structured"] == 1
    with pytest.raises(ValueError, match="structured must be one of auto, on, off"):
        make_judges(judge_cfg(server.base_url, "yes"), "en", ["sales"])


def test_role_rewards_log_the_endpoint_counts(serve, tmp_path) -> None:
    from marti_ibrl.config import load_config
    from marti_ibrl.rewards import RoleRewards

    server = serve(by_judge)
    ckpt = str(fake_checkpoint(tmp_path / "ckpt"))
    cfg = load_config(["--env.name", "telesales", "--role1.pretrain", ckpt, "--role2.pretrain", ckpt,
                       "--judge.base_url", server.base_url, "--judge.model", "judge-model"])  # fmt: skip
    rewards = RoleRewards(cfg, TeleSalesEnv())
    try:
        assert rewards.stats()["judge/endpoint/structured"] == 0.0
        traj = success_call()
        assert rewards.fns["sales"](traj, "sales", None) == pytest.approx(0.934170, abs=1e-6)
        stats = rewards.stats()
    finally:
        rewards.close()
    assert stats["sales/judge/scored"] == 1.0 and stats["judge/endpoint/requests"] == 1.0
    assert (stats["judge/endpoint/structured"], stats["judge/endpoint/unstructured"]) == (1.0, 0.0)
    assert stats["judge/endpoint/structured_fallbacks"] == 0.0


def test_malformed_turns_penalty_and_no_turns(serve) -> None:
    server = serve([ok(sales_verdict(turns=((1, 0, 5, 0),), outcome=0))])
    llm = client(server.base_url)
    cut = call(opener="Hi <call_function=bogus>")  # a malformed sales turn ends the call
    result = arun(llm, SalesJudge(llm).score(cut))
    assert result.reward == pytest.approx(0.2 * 5 / 30 + 0.8 * 0.0 - 1.0)
    with pytest.raises(JudgeFailure, match="no turns") as info:  # the customer never spoke: no request is made
        arun(llm, CustomerJudge(llm).score(cut))
    assert info.value.kind == "no_turns" and len(server.requests) == 1
    # a customer turn replaced by the fallback is shown to the judge as malformed (plausibility 0 asked)
    fallback = call("not json", "Okay, bye. <status=end>")
    messages = CustomerJudge(llm).messages(fallback)
    assert "Turn 2 - customer: [malformed record; the environment replaced it" in messages[-1]["content"]


def refuse(obj: dict) -> None:
    raise ValueError("refused by the validator")


def test_sync_wrappers(serve) -> None:
    server = serve(by_judge)
    llm = client(server.base_url, max_concurrency=2)
    try:
        results = SalesJudge(llm).score_batch_sync([success_call(), success_call()])
        assert [r.reward for r in results] == pytest.approx([0.934170] * 2, abs=1e-6)
        texts = llm.complete_many([[{"role": "user", "content": f"{SALES_MARK} {k}"}] for k in range(3)])
        assert [json.loads(t) for t in texts] == [sales_verdict()] * 3
        # from other threads too: one background loop, one limit
        outs: list[Any] = []
        threads = [threading.Thread(target=lambda: outs.append(SalesJudge(llm).score_batch_sync([success_call()])))
                   for _ in range(3)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outs) == 3 and all(isinstance(o[0], JudgeResult) for o in outs) and server.max_inflight <= 2
        (failed,) = llm.complete_many([[{"role": "user", "content": "x"}]], validator=refuse)
        assert isinstance(failed, ChatFailure) and failed.kind == "bad_output" and "refused by" in str(failed)

        async def inside() -> None:
            with pytest.raises(RuntimeError, match="await the coroutine"):
                llm.run_sync(asyncio.sleep(0))

        asyncio.run(inside())
    finally:
        llm.close()
    with pytest.raises(RuntimeError, match="closed"):
        llm.complete_many([[{"role": "user", "content": "x"}]])
