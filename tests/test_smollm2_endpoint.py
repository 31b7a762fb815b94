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
    model = models.get(SMOL, models.cache_dir() / "models" / SMOL)
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
    out = tmp_path / "telesales"
    url = endpoint.base_url
    argv = [*("telesales", "eval", "--policy", f"smol=endpoint:smollm2@{url}", "--simulator", f"smollm2@{url}")]
    argv += [*("-n", "2", "--samples", "1", "--out", str(out), "--concurrency", "4", "--no-audit")]
    argv += [*("--max-retries", "1", "--backoff", "0.01", "--timeout", "120", "--max-new-tokens", "128")]
    assert main(argv) == 0
    records = [json.loads(x) for x in (out / "episodes" / "smol.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for rec in records:  # each call ended for a reason the metrics know, a failure flagged as one
        assert rec["reason"] and (not rec["failed"] or rec["failure"]["kind"])
        assert not (rec["failed"] and rec["success"])
    summary = json.loads((out / "summary.json").read_text())["policies"]["smol"]
    assert summary["failed"] == sum(r["failed"] for r in records) / 2  # failures counted, not scored as 0 wins
