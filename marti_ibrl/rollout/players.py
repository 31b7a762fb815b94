"""Frozen text-level counterparts ("players"): seats in a dialogue filled without a token-level rollout engine.

A :class:`TextPlayer` answers, for a batch of live dialogues where it is ``role``'s turn, one utterance per
dialogue (text only: no token ids, no log-probs). It serves unilateral-RL baselines (one role trained against a
frozen counterpart) and evaluation. Two kinds:

* :class:`ScriptedBotPlayer`: a DoND scripted negotiator, deterministic per (seed, scenario, sample, turn), so a
  resumed run replays identically: a training bot (``bot:NAME``, :mod:`marti_ibrl.envs.dond.bots`) or a held-out
  bot for evaluation only (``heldout:NAME``, :mod:`marti_ibrl.envs.dond.heldout`);
* :class:`EndpointPlayer`: an OpenAI-compatible ``/chat/completions`` endpoint (vLLM, SGLang, TGI, hosted APIs)
  through :class:`OpenAIChatClient`, with bounded concurrency and retries; a turn that still fails after the
  retries is ``None``.

Specs (config dicts / command-line strings) are turned into players by :func:`make_player` and
:func:`parse_player_spec`. Checkpoints are not text players: they are served by rollout engines.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

import httpx

from marti_ibrl.envs.base import shown_after
from marti_ibrl.envs.dond.bots import TRAINING_BOTS, ScriptedNegotiator
from marti_ibrl.envs.dond.heldout import HELDOUT_BOTS, phrase_around, split_surface, with_rounds
from marti_ibrl.envs.dond.scenarios import DondScenario
from marti_ibrl.llm import RETRIED, ChatEndpoint, Fault, reply_content, transport_fault
from marti_ibrl.rollout.dialogue import Trajectory

__all__ = [
    "EndpointPlayer",
    "OpenAIChatClient",
    "ScriptedBotPlayer",
    "TextPlayer",
    "chat_messages",
    "make_player",
    "parse_player_spec",
]


@runtime_checkable
class TextPlayer(Protocol):
    """A frozen counterpart producing utterances as text."""

    name: str  # e.g. "bot:greedy", "endpoint:<model>"

    def respond(self, env: Any, role: str, trajectories: Sequence[Trajectory]) -> list[str | None]:
        """One utterance of ``role`` per live trajectory; ``None``: this turn could not be produced."""
        ...


def chat_messages(env: Any, traj: Trajectory, role: str) -> list[dict[str, str]]:
    """OpenAI chat messages of ``traj`` so far from ``role``'s perspective.

    The system message is ``env.system_prompt(scenario, role)``; ``role``'s own turns are ``assistant`` messages,
    what it was shown of each turn ``user`` messages (:func:`marti_ibrl.envs.base.shown_after`: by default every other
    role's turns, through ``env.counterpart_text`` when the environment defines it). A dialogue ``role`` opens has no
    user message before its first assistant message.
    """
    messages = [{"role": "system", "content": env.system_prompt(traj.scenario, role)}]
    for turn in traj.turns:
        if turn.role == role:
            messages.append({"role": "assistant", "content": turn.text})
        shown = shown_after(env, turn.role, turn.text, traj.scenario, turn.shown).get(role)
        if shown:
            messages.append({"role": "user", "content": shown})
    return messages


# ----------------------------------------------------------------------------------------------------------------
# Scripted DoND bots

_BOT_KINDS = {"bot": "scripted bot", "heldout": "held-out bot"}


class ScriptedBotPlayer:
    """A DoND scripted negotiator in a seat: ``bot_name`` from ``registry`` (default: the training bots
    :data:`marti_ibrl.envs.dond.bots.TRAINING_BOTS`); the player is named ``f"{kind}:{bot_name}"``.

    The bot's randomness (its phrasing) comes from ``random.Random(f"{seed}/{scenario_uid}/{sample_index}/{n}")``
    with ``n`` the number of turns so far: the same seed replays the same transcript, also after a resume.
    A time-dependent bot is calibrated to the env's round limit (:func:`~marti_ibrl.envs.dond.heldout.with_rounds`);
    ``NAME+phrased`` speaks a short phrase around the (possibly marker-only) turn
    (:func:`~marti_ibrl.envs.dond.heldout.phrase_around`).
    """

    def __init__(
        self,
        bot_name: str,
        seed: int = 0,
        registry: Mapping[str, Callable[[], ScriptedNegotiator]] | None = None,
        kind: str = "bot",
    ) -> None:
        bots = TRAINING_BOTS if registry is None else registry
        base, self.surface = split_surface(bot_name)
        if base not in bots:
            raise ValueError(f"unknown {_BOT_KINDS.get(kind, kind)} {base!r}; known bots: {sorted(bots)}")
        self.bot: ScriptedNegotiator = bots[base]()
        self._by_rounds: dict[int, ScriptedNegotiator] = {}
        self.bot_name = bot_name
        self.seed = seed
        self.kind = kind
        self.name = f"{kind}:{bot_name}"

    def __repr__(self) -> str:
        kind = "" if self.kind == "bot" else f", kind={self.kind!r}"
        return f"ScriptedBotPlayer(bot_name={self.bot_name!r}, seed={self.seed}{kind})"

    def respond(self, env: Any, role: str, trajectories: Sequence[Trajectory]) -> list[str | None]:
        """The bot's next utterance in each dialogue (bots never fail, so never ``None``)."""
        roles = list(env.roles)
        if role not in roles:
            raise ValueError(f"unknown role {role!r}; roles are {roles}")
        role_index = roles.index(role)
        bot = self._calibrated(env)
        out: list[str | None] = []
        for traj in trajectories:
            if not isinstance(traj.scenario, DondScenario):
                raise ValueError(
                    f"{self.name} plays Deal-or-No-Deal only; scenario {traj.scenario_uid!r} is a "
                    f"{type(traj.scenario).__name__}"
                )
            history = [(roles.index(t.role), t.text) for t in traj.turns if t.valid]
            rng = random.Random(f"{self.seed}/{traj.scenario_uid}/{traj.sample_index}/{len(traj.turns)}")
            text = env.bot_utterance(bot.respond(traj.scenario, role_index, history, rng))
            out.append(phrase_around(text, rng) if self.surface == "phrased" else text)
        return out

    def _calibrated(self, env: Any) -> ScriptedNegotiator:
        """The bot calibrated to the env's round limit (a time-dependent held-out bot; others as they are)."""
        rounds = getattr(env, "max_rounds", None)
        if rounds is None:
            return self.bot
        if rounds not in self._by_rounds:
            self._by_rounds[rounds] = with_rounds(self.bot, rounds)
        return self._by_rounds[rounds]

    def close(self) -> None:
        """Nothing to release."""


# ----------------------------------------------------------------------------------------------------------------
# OpenAI-compatible endpoints


class OpenAIChatClient(ChatEndpoint):
    """A thread-safe client of an OpenAI-compatible ``POST {base_url}/chat/completions`` endpoint.

    :meth:`complete` returns the first choice's message content, retrying the faults of
    :data:`marti_ibrl.llm.RETRIED` (timeout, connection errors, HTTP 429 and 5xx, a non-JSON body, missing/empty
    ``choices`` or a null content) up to ``max_retries`` times with the backoff of
    :class:`~marti_ibrl.llm.ChatEndpoint` (exponential, full jitter, ``Retry-After`` honoured). Other 4xx answers
    are not retried. After the last attempt it logs one warning and returns ``None``. ``timeout`` bounds each phase
    (connect, write, read) of a request.

    The API key is read once from the environment variable ``api_key_env``; it never appears in ``repr``, logs or
    exceptions. ``stats`` counts ``requests`` (attempts), ``retries``, ``failures``, ``successes`` and each fault
    kind (``timeout``, ``connect``, ``transport``, ``http_429``, ``http_5xx``, ``http_4xx``, ``bad_json``,
    ``empty``). The asyncio counterpart, for LLM judges, is :class:`marti_ibrl.llm.AsyncChatClient`.
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
        max_connections: int | None = None,
    ) -> None:
        super().__init__(base_url, model, api_key_env, max_retries, timeout, backoff, max_backoff)
        limits = httpx.Limits() if max_connections is None else httpx.Limits(max_connections=max_connections)
        self._http = httpx.Client(headers=self._headers, timeout=httpx.Timeout(self.timeout), limits=limits)
        self._closed = threading.Event()

    def _attempt(self, body: dict[str, Any]) -> str:
        """One request: the content of the first choice, or raise :class:`~marti_ibrl.llm.Fault`."""
        try:
            response = self._http.post(self.url, json=body)
        except httpx.TransportError as exc:
            raise transport_fault(exc) from None
        return reply_content(response)

    def complete(self, messages: Sequence[Mapping[str, str]], sampling: Mapping[str, Any] | None = None) -> str | None:
        """The assistant's reply to ``messages``; ``None`` after ``max_retries`` retries (counted, logged)."""
        body = self._body(messages, sampling)
        fault, attempts = Fault("closed", "the client was closed"), 0
        for attempt in range(self.max_retries + 1):
            if self._closed.is_set():
                fault = Fault("closed", "the client was closed")
                break
            attempts += 1
            self._bump("requests")
            try:
                text = self._attempt(body)
            except Fault as exc:
                fault = exc
                self._bump(exc.kind)
                if exc.kind not in RETRIED or attempt == self.max_retries:
                    break
                self._bump("retries")
                if self._closed.wait(self.backoff_delay(attempt, exc.retry_after)):
                    break
                continue
            self._bump("successes")
            return text
        self._give_up(fault, attempts)
        return None

    def close(self) -> None:
        """Stop retrying (pending backoffs end) and close the HTTP connections."""
        self._closed.set()
        self._http.close()


class EndpointPlayer:
    """A counterpart served by an OpenAI-compatible chat endpoint.

    ``sampling`` holds ``temperature`` / ``top_p`` / ``max_new_tokens``. The requests of one :meth:`respond`
    batch run concurrently, at most ``max_concurrency`` in flight (across all callers of this player).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        sampling: dict[str, Any] | None = None,
        max_concurrency: int = 8,
        max_retries: int = 4,
        timeout: float = 60.0,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.client = OpenAIChatClient(
            base_url,
            model,
            api_key_env=api_key_env,
            max_retries=max_retries,
            timeout=timeout,
            backoff=backoff,
            max_backoff=max_backoff,
            max_connections=max_concurrency,
        )
        self.model = model
        self.sampling = dict(sampling or {})
        self.max_concurrency = int(max_concurrency)
        self.name = f"endpoint:{model}"
        self.stats = self.client.stats  # the same dict: requests, retries, failures, per-fault counts
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"EndpointPlayer(model={self.model!r}, base_url={self.client.base_url!r}, "
            f"api_key_env={self.client.api_key_env!r}, max_concurrency={self.max_concurrency})"
        )

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="endpoint-player")
            return self._pool

    def respond(self, env: Any, role: str, trajectories: Sequence[Trajectory]) -> list[str | None]:
        """The endpoint's utterance for ``role`` in each dialogue; ``None`` where it failed after the retries."""
        conversations = [chat_messages(env, traj, role) for traj in trajectories]
        if not conversations:
            return []
        if len(conversations) == 1:
            return [self.client.complete(conversations[0], self.sampling)]
        pool = self._executor()
        futures = [pool.submit(self.client.complete, messages, self.sampling) for messages in conversations]
        return [future.result() for future in futures]

    def close(self) -> None:
        """Stop pending retries, release the worker threads and the HTTP connections."""
        self.client.close()
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


# ----------------------------------------------------------------------------------------------------------------
# Specs

_ENDPOINT_OPTIONAL = ("api_key_env", "sampling", "max_concurrency", "max_retries", "timeout", "backoff", "max_backoff")
_SPEC_FORMS = "bot:NAME, heldout:NAME, checkpoint:PATH or endpoint:MODEL@BASE_URL[#API_KEY_ENV]"
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENDPOINT = re.compile(r"(?P<model>[^@]+?)@(?P<url>https?://[^#\s]+)(?:#(?P<env>[^#]*))?")


def _check_keys(spec: Mapping[str, Any], kind: str, required: Sequence[str], optional: Sequence[str]) -> None:
    missing = [k for k in required if spec.get(k) in (None, "")]
    if missing:
        raise ValueError(f"{kind} player spec is missing {missing}: {dict(spec)}")
    unknown = sorted(set(spec) - {"kind", *required, *optional})
    if unknown:
        raise ValueError(f"{kind} player spec has unknown keys {unknown}; allowed: {[*required, *optional]}")


def make_player(spec: Mapping[str, Any]) -> TextPlayer:
    """A text player from a spec dict.

    ``{"kind": "bot", "name": "greedy"[, "seed": 0]}``, ``{"kind": "heldout", "name": "hardliner"[, "seed": 0]}``
    (a held-out bot of :data:`marti_ibrl.envs.dond.heldout.HELDOUT_BOTS`, for evaluation only) or
    ``{"kind": "endpoint", "base_url": ..., "model": ... [, "api_key_env", "sampling", "max_concurrency",
    "max_retries", "timeout", "backoff", "max_backoff"]}``. A ``checkpoint`` spec is refused: checkpoints are
    served by rollout engines.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"a player spec must be a dict, got {type(spec).__name__}: {spec!r}")
    kind = spec.get("kind")
    if kind == "bot":
        _check_keys(spec, "bot", ("name",), ("seed",))
        return ScriptedBotPlayer(str(spec["name"]), seed=int(spec.get("seed", 0)))
    if kind == "heldout":
        _check_keys(spec, "heldout", ("name",), ("seed",))
        return ScriptedBotPlayer(str(spec["name"]), int(spec.get("seed", 0)), registry=HELDOUT_BOTS, kind="heldout")
    if kind == "endpoint":
        _check_keys(spec, "endpoint", ("base_url", "model"), _ENDPOINT_OPTIONAL)
        options = {k: spec[k] for k in _ENDPOINT_OPTIONAL if k in spec}
        return EndpointPlayer(str(spec["base_url"]), str(spec["model"]), **options)
    if kind == "checkpoint":
        raise ValueError(
            f"checkpoint {spec.get('path')!r}: checkpoints are served by rollout engines (a policy with its own "
            "vLLM/HF engine), not by text players; use a bot or an endpoint as a text player"
        )
    raise ValueError(
        f"unknown player kind {kind!r}; known kinds: 'bot', 'heldout', 'endpoint' (and 'checkpoint' for engines)"
    )


def parse_player_spec(text: str) -> dict[str, Any]:
    """A spec dict from a command-line string.

    ``bot:greedy`` → ``{"kind": "bot", "name": "greedy"}``; ``heldout:hardliner`` → ``{"kind": "heldout",
    "name": "hardliner"}``; ``checkpoint:/path/to/hf`` →
    ``{"kind": "checkpoint", "path": ...}``; ``endpoint:MODEL@BASE_URL[#API_KEY_ENV]``, e.g.
    ``endpoint:qwen-72b@http://10.0.0.5:8000/v1#MY_KEY`` → ``{"kind": "endpoint", "model": "qwen-72b",
    "base_url": "http://10.0.0.5:8000/v1", "api_key_env": "MY_KEY"}``.
    """
    kind, sep, rest = str(text).strip().partition(":")
    rest = rest.strip()
    if not sep or not rest:
        raise ValueError(f"bad player spec {text!r}; expected {_SPEC_FORMS}")
    if kind in ("bot", "heldout"):
        return {"kind": kind, "name": rest}
    if kind == "checkpoint":
        return {"kind": "checkpoint", "path": rest}
    if kind == "endpoint":
        match = _ENDPOINT.fullmatch(rest)
        if match is None:
            raise ValueError(
                f"bad endpoint spec {text!r}; expected endpoint:MODEL@BASE_URL[#API_KEY_ENV] with an http(s) "
                "BASE_URL, e.g. endpoint:qwen-72b@http://10.0.0.5:8000/v1#MY_KEY"
            )
        spec: dict[str, Any] = {"kind": "endpoint", "model": match["model"], "base_url": match["url"]}
        env_var = match["env"]
        if env_var is not None:
            if not _ENV_VAR.fullmatch(env_var):
                raise ValueError(f"bad API key environment variable name {env_var!r} in {text!r}")
            spec["api_key_env"] = env_var
        return spec
    raise ValueError(f"unknown player kind {kind!r} in {text!r}; expected {_SPEC_FORMS}")
