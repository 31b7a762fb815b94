"""OpenAI-compatible chat endpoints: the fault taxonomy both clients share and an asyncio client for LLM judges.

Paper §5.1 ("Task-Specific Rewards"): TeleSales rewards come from an LLM judge behind an endpoint. Judging a step's
trajectories is many independent requests, so :class:`AsyncChatClient` runs them on one event loop with a
concurrency limit; the thread-based :class:`marti_ibrl.rollout.players.OpenAIChatClient` (frozen counterparts)
shares everything here but its retry loop: settings checks, the API key, stats, backoff, redaction and how a
reply is classified.

Fault kinds (each a ``stats`` key): ``timeout``, ``connect``, ``transport``, ``http_429``, ``http_5xx``,
``bad_json`` (the HTTP body is not JSON), ``empty`` (no choice / no content), ``bad_output`` (the reply is not the
JSON object the caller asked for, or its validator refused it) are retried (:data:`RETRIED`); ``http_4xx``,
``schema_refused`` (``structured="on"`` and the endpoint refused the schema) and ``closed`` are final. ``stats`` also
counts ``requests`` (HTTP requests sent), ``retries``, ``successes`` and ``failures``.

**Structured outputs** (ours; the paper says nothing about how its judge and simulator replies are constrained).
A JSON call site hands :meth:`AsyncChatClient.complete_json` the :class:`ReplySchema` of its reply type, built next
to the reply's validator from the validator's own constants (labels, ranges, counts), and the client sends it as
``response_format={"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}``, the OpenAI / vLLM
structured-outputs form, so a constrained server writes replies of the validator's shape (fewer ``bad_output``
retries, no Markdown fences or prose around the JSON). The client's ``structured`` setting (:data:`STRUCTURED`):

* ``"on"``: always send the schema; an endpoint that refuses it is a final ``schema_refused`` failure saying so.
* ``"off"``: never send one: JSON mode (``{"type": "json_object"}``) with parse, validate and retry, as before.
* ``"auto"`` (default): send the schema; the first reply that refuses it (:func:`refuses_schema`) switches the client
  to JSON mode for the rest of its life, and that request is sent again at once in JSON mode, in the same
  concurrency slot. The refused probe is counted in ``requests``, ``structured`` and ``structured_fallbacks``, never
  as a fault, retry or failure, and does not use up one of the caller's retries. Requests already in flight when
  the first refusal comes back are refused too and resent the same way (at most ``max_concurrency`` probes). Why a
  sticky switch: an endpoint that does not take ``json_schema`` will not start to mid-run, and probing every request
  would double the traffic; why only a refusal naming the schema: any other 4xx would recur without it.

The validator runs on every reply, constrained or not (a server may ignore the schema, and what JSON Schema cannot
state stays the validator's: a turn scored once, the rubric arithmetic, marker grammar, non-empty strings): a
refused reply is still a retryable ``bad_output``. Schemas keep to what OpenAI's strict mode and vLLM's backends all
take: closed objects with every key required (the keys the prompt asks for; a validator's tolerance of extra keys
serves unconstrained replies), ``enum``, ``anyOf``, ``minimum``/``maximum``, ``minItems``/``maxItems``; no
``pattern`` (engines disagree on whether it is anchored), ``minLength`` or ``uniqueItems`` (not in OpenAI's strict
mode). ``stats`` counts the JSON requests sent with a schema (``structured``) and without (``unstructured``), and
the refused probes (``structured_fallbacks``); plain-text :meth:`AsyncChatClient.complete` requests are neither.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from marti_ibrl import safeparse
from marti_ibrl.reply_schema import ReplySchema

T = TypeVar("T")
RETRIED = frozenset({"timeout", "connect", "transport", "http_429", "http_5xx", "bad_json", "empty", "bad_output"})
STRUCTURED = ("auto", "on", "off")
"""The ``structured`` settings of :class:`AsyncChatClient` (module doc)."""
SCHEMA_REFUSALS = ("response_format", "json_schema", "json schema", "structured output")
"""What a refusal of the schema names in its body (lower case; :func:`refuses_schema`)."""


class Fault(Exception):
    """One failed attempt: ``kind`` is the stats key; ``retry_after`` a server-requested delay in seconds."""

    def __init__(self, kind: str, detail: str, retry_after: float | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.retry_after = kind, detail, retry_after


class ChatFailure(RuntimeError):
    """No usable reply after the retries: ``kind`` is the last fault's kind; the message is redacted."""

    def __init__(self, kind: str, message: str, attempts: int) -> None:
        super().__init__(message)
        self.kind, self.attempts = kind, attempts


def sampling_fields(sampling: Mapping[str, Any] | None) -> dict[str, Any]:
    """The request fields of a sampling dict: temperature, top_p, max_new_tokens (as ``max_tokens``)."""
    pairs = (("temperature", "temperature"), ("top_p", "top_p"), ("max_new_tokens", "max_tokens"))
    return {field: sampling[key] for key, field in pairs if sampling is not None and sampling.get(key) is not None}


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (delta-seconds or an HTTP date); ``None`` if absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def transport_fault(exc: httpx.TransportError) -> Fault:
    if isinstance(exc, httpx.TimeoutException):
        return Fault("timeout", type(exc).__name__)
    return Fault("connect" if isinstance(exc, httpx.ConnectError) else "transport", f"{type(exc).__name__}: {exc}")


def _snippet(response: httpx.Response) -> str:
    return f"HTTP {response.status_code} " + response.text[:200].replace("\n", " ")


def reply_content(response: httpx.Response) -> str:
    """The first choice's message content of a ``/chat/completions`` response, or raise :class:`Fault`."""
    status = response.status_code
    if status != 200:
        snippet = _snippet(response)
        retry_after = retry_after_seconds(response.headers.get("retry-after")) if status in (429, 503) else None
        if status == 429:
            raise Fault("http_429", snippet, retry_after)
        if status >= 500:
            raise Fault("http_5xx", snippet, retry_after)
        raise Fault("http_4xx", snippet)  # 400/401/403/404/...: not retried
    try:  # bounded: a body nested 200,000 deep is a fault, not a RecursionError (safeparse's limits)
        payload = safeparse.loads(response.text)
    except (ValueError, RecursionError):
        raise Fault("bad_json", f"non-JSON body {response.text[:200]!r}") from None
    if not isinstance(payload, dict):
        raise Fault("bad_json", f"JSON body is a {type(payload).__name__}, not an object")
    choices = payload.get("choices")
    if not choices or not isinstance(choices, list):
        raise Fault("empty", "no choices in the response")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise Fault("empty", "the first choice has no message content")
    return content


def parse_json_reply(text: str, validator: Callable[[dict], T]) -> T:
    """``validator`` of the one JSON object in ``text`` (optionally in one markdown fence); the validator raises
    ``ValueError`` on a bad object. Any problem is a retryable ``bad_output`` fault, too long a number or too deep a
    nesting included (:mod:`marti_ibrl.safeparse`)."""
    body = safeparse.unfence(text)
    try:
        obj = safeparse.loads(body)
    except json.JSONDecodeError as e:
        raise Fault("bad_output", f"the reply is not one JSON object ({e.msg}): {body[:120]!r}") from None
    if not isinstance(obj, dict):
        raise Fault("bad_output", f"the reply is a JSON {type(obj).__name__}, not an object")
    try:
        return validator(obj)
    except ValueError as e:
        raise Fault("bad_output", str(e)) from None


def refuses_schema(status: int, body: str) -> bool:
    """Whether the reply to a request with a ``json_schema`` response_format says the endpoint does not take it:
    HTTP 400 or 422 (what OpenAI, vLLM, TGI and llama.cpp answer to a request field they reject) with a body naming
    :data:`SCHEMA_REFUSALS` (e.g. OpenAI's "'response_format' of type 'json_schema' is not supported with this
    model", vLLM's "features not supported by xgrammar" of a JSON schema). Any other 4xx (the context length, a
    sampling value, auth) is about something else and would recur without the schema: it stays a final
    ``http_4xx``, and the client keeps sending schemas."""
    return status in (400, 422) and any(marker in body.lower() for marker in SCHEMA_REFUSALS)


class ChatEndpoint:
    """Settings, API key, stats, backoff and redaction shared by the sync and the async client.

    The API key is read once from the environment variable ``api_key_env`` (``ValueError`` naming it when unset);
    it never appears in ``repr``, logs or exceptions. Backoff before retry ``attempt + 1`` is full jitter on
    ``min(max_backoff, backoff * 2**attempt)``; a ``Retry-After`` (429/503) replaces it, capped at ``max_backoff``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        max_retries: int = 4,
        timeout: float = 60.0,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
    ) -> None:
        if not base_url or not str(base_url).startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not model:
            raise ValueError("model must be a non-empty model name")
        if max_retries < 0 or timeout <= 0 or backoff < 0 or max_backoff < 0:
            raise ValueError(
                f"need max_retries >= 0, timeout > 0, backoff >= 0 and max_backoff >= 0, got "
                f"{max_retries}, {timeout}, {backoff} and {max_backoff}"
            )
        self.base_url = str(base_url).rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model, self.api_key_env = model, api_key_env
        self.max_retries, self.timeout = int(max_retries), float(timeout)
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self._headers = {"Content-Type": "application/json"}
        self._api_key: str | None = None
        if api_key_env:
            self._api_key = os.environ.get(api_key_env) or None
            if self._api_key is None:
                raise ValueError(f"environment variable {api_key_env!r} (the API key of {model!r}) is not set")
            self._headers["Authorization"] = f"Bearer {self._api_key}"
        self.stats: dict[str, int] = {"requests": 0, "retries": 0, "failures": 0, "successes": 0}
        self._stats_lock = threading.Lock()
        self._rng = random.Random()

    def __repr__(self) -> str:
        key = f"api_key_env={self.api_key_env!r}" if self.api_key_env else "no api key"
        return f"{type(self).__name__}(url={self.url!r}, model={self.model!r}, {key})"

    def stats_snapshot(self) -> dict[str, int]:
        """A copy of ``stats``, safe while requests are in flight on other threads."""
        with self._stats_lock:
            return dict(self.stats)

    def _bump(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] = self.stats.get(key, 0) + n

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _body(self, messages: Sequence[Mapping[str, str]], sampling: Mapping[str, Any] | None) -> dict[str, Any]:
        return {"model": self.model, "messages": [dict(m) for m in messages], **sampling_fields(sampling)}

    def backoff_delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt + 1`` (``attempt`` counts from 0)."""
        if retry_after is not None:
            return min(self.max_backoff, max(0.0, retry_after))
        return self._rng.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))

    def _give_up(self, fault: Fault, attempts: int) -> str:
        """Count the failure, log one warning; the redacted reason."""
        self._bump("failures")
        reason = self._redact(f"{fault.kind} after {attempts} attempt(s): {fault.detail}")
        logging.getLogger(type(self).__module__).warning(
            "%s: no reply from model %r at %s: %s", type(self).__name__, self.model, self.url, reason
        )
        return reason


class AsyncChatClient(ChatEndpoint):
    """An asyncio client of an OpenAI-compatible ``POST {base_url}/chat/completions`` endpoint.

    :meth:`complete` returns the reply text, :meth:`complete_json` a validated JSON reply; both raise
    :class:`ChatFailure` after ``max_retries`` retries. A JSON request carries its :class:`ReplySchema` as structured
    outputs while ``structured`` (``auto`` | ``on`` | ``off``, module doc) allows it, else JSON mode
    (``response_format={"type": "json_object"}``, none when ``json_mode=False``). At most ``max_concurrency`` requests are in flight per event
    loop (an ``asyncio.Semaphore``, held during a request, not during its backoff); ``timeout`` bounds each whole
    request. Connection pools and semaphores are made per event loop, on first use: call :meth:`aclose` before your
    loop ends. Synchronous callers (any thread) use :meth:`run_sync` / :meth:`complete_many`, which run on the
    client's own background loop, so they share one pool and one limit; :meth:`close` stops it.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        max_concurrency: int = 8,
        json_mode: bool = True,
        structured: str = "auto",
        **retry: Any,
    ) -> None:
        super().__init__(base_url, model, api_key_env, **retry)
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if structured not in STRUCTURED:
            raise ValueError(f"structured must be one of {', '.join(STRUCTURED)}, got {structured!r}")
        self.max_concurrency, self.json_mode, self.structured = int(max_concurrency), json_mode, structured
        self.schema_refused = False  # auto: the endpoint refused a schema; JSON mode from then on
        self.stats.update(structured=0, unstructured=0, structured_fallbacks=0)
        self._per_loop: dict[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, asyncio.Semaphore]] = {}
        self._lock = threading.Lock()
        self._background: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
        self._closed = False

    def _resources(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        with self._lock:
            for stale in [lp for lp in self._per_loop if lp.is_closed()]:
                del self._per_loop[stale]
            if loop not in self._per_loop:
                limits = httpx.Limits(max_connections=self.max_concurrency)
                http = httpx.AsyncClient(headers=self._headers, timeout=httpx.Timeout(self.timeout), limits=limits)
                self._per_loop[loop] = (http, asyncio.Semaphore(self.max_concurrency))
            return self._per_loop[loop]

    async def _post(self, http: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
        """One HTTP request (the caller holds a concurrency slot)."""
        self._bump("requests")
        try:
            return await asyncio.wait_for(http.post(self.url, json=body), self.timeout)
        except asyncio.TimeoutError:
            raise Fault("timeout", f"no reply within {self.timeout:g}s") from None
        except httpx.TransportError as exc:
            raise transport_fault(exc) from None

    async def _attempt(self, body: dict[str, Any]) -> str:
        http, slots = self._resources()
        async with slots:
            return reply_content(await self._post(http, body))

    def uses_schema(self, schema: ReplySchema | None) -> bool:
        """Whether a JSON request with ``schema`` is sent with it now (``structured`` and what the endpoint said)."""
        return schema is not None and self.structured != "off" and not self.schema_refused

    async def _attempt_json(self, body: dict[str, Any], schema: ReplySchema | None) -> str:
        """One attempt of a JSON request: with ``schema`` while :meth:`uses_schema`; in ``auto``, a refused schema
        is sent again at once in JSON mode, in the same concurrency slot (the probe is not the caller's fault, module
        doc). Deciding inside the slot means only requests already in flight can meet a refusal."""
        http, slots = self._resources()
        async with slots:
            if self.uses_schema(schema):
                self._bump("structured")
                response = await self._post(http, {**body, "response_format": schema.response_format()})
                if not refuses_schema(response.status_code, response.text):
                    return reply_content(response)
                if self.structured == "on":
                    why = "structured=on; auto falls back to JSON mode, off never sends a schema"
                    raise Fault("schema_refused", f"the endpoint refused the JSON schema ({why}): {_snippet(response)}")
                self._fall_back(_snippet(response))
            self._bump("unstructured")
            plain = {**body, "response_format": {"type": "json_object"}} if self.json_mode else body
            return reply_content(await self._post(http, plain))

    def _fall_back(self, why: str) -> None:
        """``auto``: the endpoint refused a schema; JSON mode with parse-and-retry for the rest of the client's life."""
        with self._stats_lock:
            first, self.schema_refused = not self.schema_refused, True
            self.stats["structured_fallbacks"] += 1
        if first:
            logging.getLogger(__name__).warning(
                "%s: model %r at %s refused the JSON schema (%s): JSON mode with parse-and-retry from now on",
                type(self).__name__,
                self.model,
                self.url,
                self._redact(why),
            )

    async def _request(self, send: Callable[[], Awaitable[str]], parse: Callable[[str], T]) -> T:
        fault, attempts = Fault("closed", "the client was closed"), 0
        for attempt in range(self.max_retries + 1):
            if self._closed:
                fault = Fault("closed", "the client was closed")
                break
            attempts += 1
            try:
                result = parse(await send())
            except Fault as exc:
                fault = exc
                self._bump(exc.kind)
                if exc.kind not in RETRIED or attempt == self.max_retries:
                    break
                self._bump("retries")
                await asyncio.sleep(self.backoff_delay(attempt, exc.retry_after))
                continue
            self._bump("successes")
            return result
        raise ChatFailure(fault.kind, self._give_up(fault, attempts), attempts)

    async def complete(self, messages: Sequence[Mapping[str, str]], sampling: Mapping[str, Any] | None = None) -> str:
        """The assistant's reply to ``messages``."""
        body = self._body(messages, sampling)
        return await self._request(lambda: self._attempt(body), lambda text: text)

    async def complete_json(
        self,
        messages: Sequence[Mapping[str, str]],
        validator: Callable[[dict], T],
        sampling: Mapping[str, Any] | None = None,
        schema: ReplySchema | None = None,
    ) -> T:
        """``validator(obj)`` of the reply's JSON object, asked for with ``schema`` as structured outputs where the
        ``structured`` setting allows (JSON mode without one); a non-JSON reply or a ``ValueError`` of the
        validator is a retryable ``bad_output`` (the request is sent again), schema or not."""
        body = self._body(messages, sampling)
        return await self._request(
            lambda: self._attempt_json(body, schema), lambda text: parse_json_reply(text, validator)
        )

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` (which uses this client) on the client's background loop and wait for its result."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("run_sync blocks: inside an event loop, await the coroutine instead")
        with self._lock:
            if self._closed:
                coro.close()
                raise RuntimeError(f"{self!r} is closed")
            if self._background is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="llm-client", daemon=True)
                thread.start()
                self._background = (loop, thread)
            loop = self._background[0]
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def complete_many(
        self,
        conversations: Sequence[Sequence[Mapping[str, str]]],
        sampling: Mapping[str, Any] | None = None,
        validator: Callable[[dict], T] | None = None,
        schema: ReplySchema | None = None,
    ) -> list[str | T | ChatFailure]:
        """Synchronously, one reply (validated when ``validator`` is given, asked for with ``schema``) or
        :class:`ChatFailure` per conversation, in order; the requests run concurrently."""

        async def one(messages: Sequence[Mapping[str, str]]) -> str | T | ChatFailure:
            try:
                if validator is None:
                    return await self.complete(messages, sampling)
                return await self.complete_json(messages, validator, sampling, schema)
            except ChatFailure as failure:
                return failure

        async def all_() -> list[str | T | ChatFailure]:
            return list(await asyncio.gather(*(one(m) for m in conversations)))

        return self.run_sync(all_())

    async def aclose(self) -> None:
        """Close the running loop's connection pool (a later call on this loop opens a new one)."""
        with self._lock:
            resources = self._per_loop.pop(asyncio.get_running_loop(), None)
        if resources is not None:
            await resources[0].aclose()

    def close(self) -> None:
        """Refuse further requests, cancel what runs on the background loop, close its connections, stop it."""
        with self._lock:
            self._closed, background, self._background = True, self._background, None
        if background is None:
            return
        loop, thread = background

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.aclose()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
