"""Structured outputs of :class:`marti_ibrl.llm.AsyncChatClient` (issue 20), against the real 127.0.0.1 OpenAI-style
server of the player tests: the body sent in ``on`` / ``auto`` / ``off``, the one-time fallback of ``auto`` after an
endpoint refuses the schema (without counting the probe as the caller's failure or retry), ``on``'s final error,
validation of constrained replies, the counts, and the refusal rule. Also the helpers other test modules use to
check each reply schema against its validator (:func:`conforms`, :func:`assert_strict`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import test_players
from test_players import Reply

from marti_ibrl.llm import AsyncChatClient, ChatFailure, refuses_schema
from marti_ibrl.reply_schema import ReplySchema, closed_object, list_of, number_in, one_of

serve = test_players.serve  # fixture: the 127.0.0.1 OpenAI-style server of the player tests

STRICT_KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "enum", "anyOf", "minimum",
                   "maximum", "minItems", "maxItems"}  # fmt: skip
"""The keywords our schemas may use (llm module doc: what OpenAI's strict mode and vLLM's backends all take)."""
OPENAI_REFUSAL = {
    "error": {
        "message": "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model.",
        "type": "invalid_request_error",
        "param": "response_format",
    }
}
PAIR = ReplySchema("pair", closed_object({"label": one_of(["yes", "no"]), "p": number_in(0, 1)}))


def check_pair(obj: dict) -> tuple[str, float]:
    """The validator PAIR is the schema of."""
    if set(obj) != {"label", "p"} or obj["label"] not in ("yes", "no"):
        raise ValueError(f"not a pair: {obj!r}")
    if isinstance(obj["p"], bool) or not isinstance(obj["p"], (int, float)) or not 0 <= obj["p"] <= 1:
        raise ValueError(f"p must be a number in [0, 1], got {obj['p']!r}")
    return obj["label"], float(obj["p"])


def ok(content: Any) -> Reply:
    import json

    return test_players.ok(content if isinstance(content, str) else json.dumps(content))


def client(url: str, **kw: Any) -> AsyncChatClient:
    return AsyncChatClient(url, "m", **{"backoff": 0.001, "max_backoff": 0.01, "max_retries": 2, "timeout": 5, **kw})


def ask(llm: AsyncChatClient, n: int = 1, schema: ReplySchema | None = PAIR) -> list[Any]:
    """``n`` concurrent ``complete_json`` calls (ChatFailure returned in place), then the loop's pool closed."""

    async def one(k: int) -> Any:
        try:
            return await llm.complete_json([{"role": "user", "content": f"q{k}"}], check_pair, None, schema)
        except ChatFailure as failure:
            return failure

    async def main() -> list[Any]:
        try:
            return list(await asyncio.gather(*(one(k) for k in range(n))))
        finally:
            await llm.aclose()

    return asyncio.run(main())


def formats(server: test_players.FakeServer) -> list[Any]:
    return [r["body"].get("response_format") for r in server.requests]


def counts(llm: AsyncChatClient) -> tuple[int, int, int]:
    return llm.stats["structured"], llm.stats["unstructured"], llm.stats["structured_fallbacks"]


# ---- helpers for the schema tests of the reply types (test_telesales_eval, test_telesales_judges) ----
def conforms(schema: ReplySchema, obj: Any) -> bool:
    """Whether ``obj`` is an instance of ``schema`` (the jsonschema package, Draft 2020-12)."""
    jsonschema = pytest.importorskip("jsonschema")
    return jsonschema.Draft202012Validator(dict(schema.schema)).is_valid(obj)


def assert_strict(node: Any, where: str = "$") -> None:
    """Every object closed with every key required, and only :data:`STRICT_KEYWORDS` used (no jsonschema needed)."""
    assert isinstance(node, dict), where
    assert set(node) <= STRICT_KEYWORDS, f"{where}: {sorted(set(node) - STRICT_KEYWORDS)}"
    if node.get("type") == "object":
        assert node["additionalProperties"] is False and node["required"] == list(node["properties"]), where
        for key, sub in node["properties"].items():
            assert_strict(sub, f"{where}.{key}")
    if "items" in node:
        assert_strict(node["items"], f"{where}[]")
    for i, branch in enumerate(node.get("anyOf", ())):
        assert_strict(branch, f"{where}|{i}")


def agrees(schema: ReplySchema, validator: Any, accepted: list, rejected: list) -> None:
    """``schema`` and ``validator`` agree on each example: both accept ``accepted``, both reject ``rejected``."""
    assert_strict(schema.schema)
    for obj in accepted:
        validator(obj)
        assert conforms(schema, obj), obj
    for obj in rejected:
        with pytest.raises(ValueError):
            validator(obj)
        assert not conforms(schema, obj), obj


# ---- the body sent ----
@pytest.mark.parametrize("setting", ["auto", "on"])
def test_schema_is_sent_in_auto_and_on(serve, setting) -> None:
    server = serve([ok({"label": "yes", "p": 0.25})])
    llm = client(server.base_url, structured=setting)
    assert ask(llm) == [("yes", 0.25)]
    (sent,) = formats(server)
    assert sent == {
        "type": "json_schema",
        "json_schema": {
            "name": "pair",
            "schema": {
                "type": "object",
                "properties": {"label": {"type": "string", "enum": ["yes", "no"]},
                               "p": {"type": "number", "minimum": 0, "maximum": 1}},
                "required": ["label", "p"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }  # fmt: skip
    assert counts(llm) == (1, 0, 0) and llm.stats["requests"] == 1 and llm.stats["successes"] == 1


def test_off_never_sends_a_schema(serve) -> None:
    server = serve([ok({"label": "no", "p": 1})])
    llm = client(server.base_url, structured="off")
    assert ask(llm, 3) == [("no", 1.0)] * 3
    assert formats(server) == [{"type": "json_object"}] * 3 and counts(llm) == (0, 3, 0)
    bare = client(server.base_url, structured="off", json_mode=False)  # JSON mode off too: no response_format
    assert ask(bare) == [("no", 1.0)] and formats(server)[-1] is None and counts(bare) == (0, 1, 0)


def test_no_schema_and_plain_text_calls(serve) -> None:
    server = serve([ok({"label": "no", "p": 0})])
    llm = client(server.base_url)  # auto, but the call site has no schema: JSON mode
    assert ask(llm, schema=None) == [("no", 0.0)] and formats(server) == [{"type": "json_object"}]
    assert counts(llm) == (0, 1, 0)
    texts = llm.complete_many([[{"role": "user", "content": "hi"}]])  # plain text counts as neither
    llm.close()
    assert texts == ['{"label": "no", "p": 0}'] and formats(server)[-1] is None and counts(llm) == (0, 1, 0)


# ---- auto: one fallback, for the client's life ----
def test_auto_falls_back_once_without_a_failure(serve, caplog) -> None:
    server = serve([(400, OPENAI_REFUSAL, {}, 0.0), ok({"label": "yes", "p": 0.5})])
    llm = client(server.base_url, max_retries=0)  # the probe does not use up the caller's only attempt
    with caplog.at_level(logging.WARNING, logger="marti_ibrl.llm"):
        assert ask(llm) == [("yes", 0.5)]
        assert ask(llm, 2) == [("yes", 0.5)] * 2
    assert [f["type"] for f in formats(server)] == ["json_schema", "json_object", "json_object", "json_object"]
    assert llm.schema_refused and counts(llm) == (1, 3, 1)
    assert {k: llm.stats[k] for k in ("requests", "successes", "retries", "failures")} == {
        "requests": 4, "successes": 3, "retries": 0, "failures": 0}  # fmt: skip
    assert "http_4xx" not in llm.stats
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "marti_ibrl.llm"]
    assert "refused the JSON schema (HTTP 400" in warning and "JSON mode with parse-and-retry from now on" in warning


def test_auto_fallback_under_concurrency(serve, caplog) -> None:
    def reply(body: dict) -> Reply:  # refuses every schema; slow enough that the first requests overlap
        if body.get("response_format", {}).get("type") == "json_schema":
            return 422, {"detail": "response_format: unknown variant `json_schema`"}, {}, 0.1
        return ok({"label": "yes", "p": 0.0})

    server = serve(reply)
    llm = client(server.base_url, max_concurrency=4, max_retries=0)
    with caplog.at_level(logging.WARNING, logger="marti_ibrl.llm"):
        assert ask(llm, 6) == [("yes", 0.0)] * 6
    structured, unstructured, fallbacks = counts(llm)
    # every request that went out with the schema was refused and sent again without; nothing failed
    assert 1 <= structured == fallbacks <= 4 and unstructured == 6 and llm.stats["failures"] == 0
    assert llm.stats["requests"] == len(server.requests) == structured + 6
    assert len([r for r in caplog.records if r.name == "marti_ibrl.llm"]) == 1  # one warning, at the switch


def test_auto_keeps_the_schema_after_another_400(serve) -> None:
    server = serve([(400, {"error": "This model's maximum context length is 8192 tokens"}, {}, 0.0),
                    ok({"label": "no", "p": 0.5})])  # fmt: skip
    llm = client(server.base_url)
    (failed,) = ask(llm)
    assert isinstance(failed, ChatFailure) and failed.kind == "http_4xx" and "maximum context length" in str(failed)
    assert ask(llm) == [("no", 0.5)]
    assert [f["type"] for f in formats(server)] == ["json_schema", "json_schema"]
    assert not llm.schema_refused and counts(llm) == (2, 0, 0) and llm.stats["http_4xx"] == 1


# ---- on: a refusal is final ----
def test_on_refusal_is_a_final_error(serve) -> None:
    server = serve([(400, OPENAI_REFUSAL, {}, 0.0), ok({"label": "no", "p": 0.5})])
    llm = client(server.base_url, structured="on", max_retries=3)
    (failed,) = ask(llm)
    assert isinstance(failed, ChatFailure) and failed.kind == "schema_refused" and failed.attempts == 1
    assert "schema_refused after 1 attempt(s): the endpoint refused the JSON schema (structured=on;" in str(failed)
    assert "'response_format' of type 'json_schema' is not supported" in str(failed)
    assert len(server.requests) == 1 and counts(llm) == (1, 0, 0)
    assert (llm.stats["failures"], llm.stats["retries"], llm.stats["schema_refused"]) == (1, 0, 1)
    assert ask(llm) == [("no", 0.5)] and formats(server)[-1]["type"] == "json_schema"  # still on


# ---- a constrained reply is validated all the same ----
def test_structured_replies_are_still_validated(serve) -> None:
    server = serve([ok({"label": "maybe", "p": 0.5}), ok("not json"), ok({"label": "yes", "p": 2}),
                    ok({"label": "yes", "p": 1})])  # fmt: skip
    llm = client(server.base_url, max_retries=3)
    assert ask(llm) == [("yes", 1.0)]
    assert [f["type"] for f in formats(server)] == ["json_schema"] * 4
    assert (llm.stats["bad_output"], llm.stats["retries"], llm.stats["successes"]) == (3, 3, 1)
    assert counts(llm) == (4, 0, 0)


# ---- the refusal rule, settings, schemas ----
@pytest.mark.parametrize(
    "status, body, refused",
    [
        (400, str(OPENAI_REFUSAL), True),
        (400, "Invalid schema for response_format 'audit': In context=(), 'additionalProperties' must be false", True),
        (400, '{"object": "error", "message": "The provided JSON schema contains features not supported by '
              'xgrammar."}', True),
        (422, "Failed to deserialize the JSON body into the target type: response_format: unknown variant", True),
        (400, "Structured outputs are not available for this model", True),
        (400, "This model's maximum context length is 8192 tokens", False),
        (400, "temperature is not supported with this model", False),
        (401, "invalid key; response_format", False),
        (404, "json_schema", False),
        (500, "response_format", False),
    ],
)  # fmt: skip
def test_refuses_schema(status, body, refused) -> None:
    assert refuses_schema(status, body) is refused


def test_settings_and_schemas_are_checked() -> None:
    with pytest.raises(ValueError, match="structured must be one of auto, on, off, got 'yes'"):
        AsyncChatClient("http://127.0.0.1:9/v1", "m", structured="yes")
    assert AsyncChatClient("http://127.0.0.1:9/v1", "m").structured == "auto"
    with pytest.raises(ValueError, match="1-64 letters, digits, _ or -, got 'a pair'"):
        ReplySchema("a pair", closed_object({}))
    with pytest.raises(ValueError, match="the root must be an object schema"):
        ReplySchema("pairs", list_of(PAIR.schema))
    assert list_of({"type": "integer"}, 1, 3) == {"type": "array", "items": {"type": "integer"}, "minItems": 1,
                                                  "maxItems": 3}  # fmt: skip
    assert list_of({"type": "integer"}) == {"type": "array", "items": {"type": "integer"}}


def test_pair_schema_agrees_with_its_validator() -> None:
    agrees(
        PAIR,
        check_pair,
        [{"label": "yes", "p": 0}, {"label": "no", "p": 1.0}],
        [{"label": "yes"}, {"label": "yes", "p": 0.5, "extra": 1}, {"label": "Yes", "p": 0.5},
         {"label": "no", "p": 1.5}, {"label": "no", "p": True}, {"label": "no", "p": "0.5"}],
    )  # fmt: skip
