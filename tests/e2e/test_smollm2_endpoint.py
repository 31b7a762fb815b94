"""A real LLM behind a real endpoint: SmolLM2-135M-Instruct (``marti-ibrl model get``) served by vLLM's own OpenAI
server (``marti_ibrl.serve.LocalEndpoint``) on 127.0.0.1, one server for the module, and used where users put an
endpoint: a DoND counterpart of ``marti-ibrl eval``, and TeleSales' user simulator and prompted sales policy.

Out of the box SmolLM2 cannot play either protocol (DoND's ``<try>``/``<selection>`` markup, TeleSales' JSON
turns): the point here is that its replies are asked, counted and scored as what they are (malformed turns
re-sampled and then a malformed ending; an invalid JSON reply retried, then a counterpart failure that stays in
the denominators), with nothing crashing, hanging, or scoring a failure as 0."""

from __future__ import annotations

import json

import httpx
import pytest

from marti_ibrl import models
from marti_ibrl.cli import main
from marti_ibrl.serve import LocalEndpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SMOL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    """vLLM's server on the converted model (cached under $MARTI_IBRL_CACHE/models: converted once per machine)."""
    model = models.cached(SMOL)
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with LocalEndpoint(model, log, name="smollm2", max_model_len=4096) as ep:
        yield ep


def test_a_chat_reply_ends_at_the_end_of_its_turn(endpoint):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 64}
    reply = httpx.post(f"{endpoint.base_url}/chat/completions", json={**body, "temperature": 0}, timeout=60).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop", choice  # at <|im_end|>: the converted tokenizer's eos
    assert "hello" in choice["message"]["content"].lower()
    assert reply["usage"]["completion_tokens"] < 64


def test_dond_eval_against_the_endpoint(endpoint, tmp_path, capsys):
    import ray

    from marti_ibrl.tiny import build_tiny_dond_model

    tiny = build_tiny_dond_model(tmp_path / "tiny")
    out = tmp_path / "eval"
    small = ["--prompt-style", "compact", "--max-rounds", "2", "--max-new-tokens", "24", "--max-len", "1024"]
    argv = ["eval", "--policy", f"tiny={tiny}", "--counterpart", f"smol={endpoint.spec}", "-n", "3", *small]
    try:
        assert main([*argv, "--out", str(out)]) == 0
    finally:
        ray.shutdown()
    episodes = [json.loads(x) for x in (out / "episodes" / "tiny__smol.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and not any(e["failed"] for e in episodes)  # every request answered
    turns = [t for e in episodes for t in e["transcript"] if t["role"] != e["policy_role"]]
    assert turns and all(t["text"].strip() for t in turns)  # SmolLM2 spoke, in natural language
    asked = sum(1 + t["resamples"] for t in turns)
    counts = json.loads((out / "endpoints.json").read_text())["smol"]
    assert counts["requests"] == counts["successes"] == asked and counts.get("failures", 0) == 0
    assert "endpoint smol: " in capsys.readouterr().err
    for e in episodes:  # what it could not play ends as malformed: no deal, not a failure
        assert not e["malformed"] or (not e["agreed"] and e["reason"] == "malformed")


def test_telesales_eval_with_smollm2_as_simulator_and_policy(endpoint, tmp_path):
    from marti_ibrl.envs.telesales.profiles import generate_profiles
    from marti_ibrl.eval.telesales.outputs import SCENES, StoryCache

    out, url = tmp_path / "telesales", endpoint.base_url
    # the first profile's story is compiled already, so its call is played (SmolLM2's sales turns, then its
    # simulator turns, as far as its JSON gets: at 04:31 its first sales turn already failed validation, under the
    # schema, within 64 tokens); the second profile's story is asked of SmolLM2 as story compiler
    first = generate_profiles(2, 0, "eval")[0]  # what --seed 0 -n 2 generates
    story = {"story": "A nurse on a night shift, busy but polite.", "scene_fewshots": {s: ["Hello?"] for s in SCENES}}
    StoryCache(tmp_path / "stories").get_or_compile(first, lambda prompt: json.dumps(story))
    argv = [*("telesales", "eval", "--policy", f"smol=endpoint:smollm2@{url}", "--simulator", f"smollm2@{url}")]
    argv += [*("-n", "2", "--samples", "1", "--out", str(out), "--concurrency", "4", "--no-audit")]
    argv += [*("--stories", str(tmp_path / "stories"), "--max-retries", "1", "--backoff", "0.01", "--timeout", "90")]
    argv += [*("--max-new-tokens", "64", "--simulator-max-new-tokens", "256", "--max-turns", "4")]  # bounded replies
    assert main(argv) == 0
    records = {r["episode_id"]: r for r in map(json.loads, _lines(out))}
    assert len(records) == 2
    played = [r for r in records.values() if r["reason"] != "story_failure"]
    assert played, records  # the call with a story was played: by SmolLM2 in both seats
    for rec in records.values():  # each call ended for a reason the metrics know; a failure is flagged as one
        assert rec["reason"] and not (rec["failed"] and rec["success"])
        assert not rec["failed"] or rec["failure"]["kind"] in ("bad_output", "timeout", "http_4xx", "schema_refused")
    summary = json.loads((out / "summary.json").read_text())["policies"]["smol"]
    assert summary["failed"] == sum(r["failed"] for r in records.values()) / 2  # failures counted, never a 0 score
    results = (out / "results.md").read_text()
    line = next(x for x in results.splitlines() if x.startswith(f"- requests to smollm2@{url}"))
    assert "structured" in line and "requests" in line  # what was asked of the endpoint, and how


def _lines(out) -> list[str]:
    return (out / "episodes" / "smol.jsonl").read_text().splitlines()


@pytest.fixture(scope="module")
def judged_iterations(endpoint, tmp_path_factory):
    """One TeleSales IB-RL iteration per ``--judge.structured`` setting (``on``: every verdict asked with its JSON
    schema; ``off``: JSON mode, parse and retry), SmolLM2 judging both roles; tiny local policies, no reference and
    no pool engines (fewer processes). Returns {setting: (trainer, first iteration's metrics, its trajectories)}."""
    import ray
    from rollouts import record_rollouts

    from marti_ibrl.config import load_config
    from marti_ibrl.tiny import build_tiny_telesales_model
    from marti_ibrl.trainer import IBRLTrainer

    tmp = tmp_path_factory.mktemp("judged")
    model = build_tiny_telesales_model(tmp / "tiny")
    runs = {}
    for structured in ("on", "off"):
        cfg = load_config(
            [
                *("--env.name", "telesales", "--env.max_rounds", "2", "--env.num_scenarios", "8"),
                *("--role1.pretrain", model, "--role2.pretrain", model, "--role1.lr", "5e-3", "--role2.lr", "5e-3"),
                *("--role1.kl_coef", "0", "--role2.kl_coef", "0", "--pool.probs", "[1.0,0,0]"),
                *("--judge.base_url", endpoint.base_url, "--judge.model", "smollm2", "--judge.structured", structured),
                *("--judge.max_retries", "1", "--judge.max_new_tokens", "384", "--judge.timeout", "120"),
                *("--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "16"),
                *("--rollout.max_len", "1800", "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2"),
                *("--train.iterations", "1", "--ckpt.path", str(tmp / f"run-{structured}")),
                # this test counts whatever SmolLM2 manages as a judge (at 19:23 it failed all 4 sales verdicts):
                # the run must train on what was judged, not stop at the default share of failures
                *("--train.max_reward_failures", "1"),
            ]
        )
        trainer = IBRLTrainer(cfg)
        played = record_rollouts(trainer)
        try:
            history = trainer.fit()
        finally:
            ray.shutdown()
        runs[structured] = (trainer, history[0], played)
    return runs


@pytest.mark.parametrize("structured", ["on", "off"])
def test_a_telesales_iteration_judged_by_smollm2(judged_iterations, structured, capsys):
    """Whatever SmolLM2 makes of the rubric, every judged (call, role) gets a reward or a recorded failure, never
    both; a failed one leaves its role's group (not trained on as a 0); the endpoint's counts add up."""
    from marti_ibrl.algorithm.advantages import members

    trainer, m, played = judged_iterations[structured]
    assert len(played) == 4 and all(t.state.done for t in played)
    for role in ("sales", "customer"):
        judged = [t for t in played if any(turn.role == role for turn in t.turns)]
        failed = [t for t in judged if role in t.reward_failures]
        for t in failed:
            assert role not in t.rewards and t not in members(played, role), t.reward_failures
            assert t.reward_failures[role].split(":")[0] in ("bad_output", "timeout", "http_4xx", "http_5xx"), t
        for t in judged:
            if t not in failed:
                assert role in t.rewards and -1.0 <= t.rewards[role] <= 1.0  # R in [0, 1]; a malformed turn -1
        assert m[f"{role}/reward_failed"] == pytest.approx(len(failed) / len(played)), role
        assert m[f"{role}/judge/failures"] == len(failed) and m[f"{role}/judge/scored"] == len(judged) - len(failed)
        if len(failed) < len(judged):  # some call of this role was judged: it trained on it
            assert m[f"{role}/updated"] == 1.0 and m[f"{role}/samples_trained"] > 0, role
    endpoint = {k.removeprefix("judge/endpoint/"): v for k, v in m.items() if k.startswith("judge/endpoint/")}
    scored = sum(m[f"{r}/judge/scored"] for r in ("sales", "customer"))
    failures = sum(m[f"{r}/judge/failures"] for r in ("sales", "customer"))
    assert endpoint["requests"] == scored + failures + endpoint["retries"]  # one per judgement, plus its retries
    assert (endpoint["successes"], endpoint["failures"]) == (scored, failures)
    sent = (endpoint["structured"], endpoint["unstructured"])
    assert sent == ((endpoint["requests"], 0) if structured == "on" else (0, endpoint["requests"])), endpoint
    assert endpoint["structured_fallbacks"] == 0
    with capsys.disabled():  # what SmolLM2 did as a judge, for the record
        print(f"\n[smollm2 judge, structured={structured}] endpoint {endpoint}; "
              f"failed: sales {m['sales/judge/failures']:.0f}, customer {m['customer/judge/failures']:.0f} of 4")  # fmt: skip
