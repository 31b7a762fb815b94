"""The LLM roles of the TeleSales held-out evaluation (paper §5.2, Appendix D: Tables 8, 9, 10 and 12).

Every role talks to an OpenAI-compatible endpoint through :class:`marti_ibrl.llm.AsyncChatClient`
(``complete_json``), each request with the JSON schema of its reply as structured outputs (built next to the
validator: :func:`~.outputs.story_schema`, :meth:`~.env.TeleSalesEvalEnv.customer_schema`,
:func:`~.outputs.sales_turn_schema`, :func:`~.outputs.audit_schema`), or in JSON mode when the client's
``structured`` setting (``--structured``) or the endpoint says no. Either way the reply is validated: one that is not
one JSON object, or that its validator refuses, is a retryable ``bad_output``; after the client's retries a
:class:`~marti_ibrl.llm.ChatFailure` names the last fault. Nothing is ever replaced by a default: a failure is
reported to the caller, who records it.

* **Story compiler** (Table 8, :func:`compile_stories`): one story per evaluation profile, validated by
  :func:`~.outputs.validate_story` and kept in a :class:`~.outputs.StoryCache` (compiled once per profile,
  reused by every later run that shares the cache directory). The prompt is sent as one user message.
* **User simulator** (Table 9, :class:`UserSimulator`): a :class:`~marti_ibrl.rollout.players.TextPlayer` for the
  ``customer`` seat of :class:`~.env.TeleSalesEvalEnv`. Each turn it renders Table 9 with the story and the
  state trace so far (system message), gives the call as chat messages (agent = user, its own earlier JSON turns =
  assistant), and accepts a reply only if :meth:`~.env.TeleSalesEvalEnv.check_customer` does (schema, labels,
  scores = the Table 11 rubric update within tolerance, ConfirmAdded only after a contact tool). A turn it cannot
  get is ``None`` after :meth:`~.env.TeleSalesEvalEnv.fail` has recorded why: the runner ends the call as a
  counterpart failure, recorded as a failed episode with that reason.
* **Prompted sales agent** (Table 10, :class:`PromptedSalesAgent`): the frontier baseline in the ``sales`` seat
  (``sales_mode="prompted"``), Table 10 system prompt, the call as chat messages (customer replies = user, its own
  earlier Table 10 JSON turns = assistant), replies validated by
  :meth:`~.env.TeleSalesEvalEnv.parse_sales` (Table 10 JSON, markers, each tool once per call). Replies that
  stay invalid end the call as the policy's own ``malformed`` (see the env). Checkpoints do not come here: they are
  served by rollout engines (:mod:`.evaluator`).
* **Auditor** (Table 12, :class:`Auditor`): one audit per finished call over the observable dialogue (what each side
  said; no simulator labels or scores), validated by :func:`~.outputs.validate_audit` plus our check that every
  evidence turn exists in the dialogue.

Ours, not the paper's: the message layout (which prompt is a system or a user message), structured outputs and
JSON mode, the sampling defaults of the command, the evidence-turn bound check.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from marti_ibrl.envs.telesales.prompts import audit_prompt
from marti_ibrl.eval.telesales.env import TeleSalesEvalEnv, simulator_turn_json
from marti_ibrl.eval.telesales.outputs import (
    Audit,
    Story,
    StoryCache,
    audit_schema,
    sales_turn_schema,
    story_schema,
    validate_audit,
    validate_story,
)
from marti_ibrl.llm import AsyncChatClient, ChatFailure
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.rollout.players import chat_messages, parse_player_spec

T = TypeVar("T")
SALES_KEYS = ("thinking_content", "agent_action", "agent_message")
"""Table 10's output keys, kept (in this order) as the prompted sales turn's transcript text."""


def parse_endpoint(text: str) -> dict[str, Any]:
    """``MODEL@BASE_URL[#API_KEY_ENV]`` (an ``endpoint:`` prefix is allowed) as an endpoint spec dict
    (:func:`~marti_ibrl.rollout.players.parse_player_spec`); ``ValueError`` on bad syntax."""
    text = str(text).strip()
    return parse_player_spec(text if text.startswith("endpoint:") else f"endpoint:{text}")


def endpoint_client(
    spec: Mapping[str, Any], max_concurrency: int, structured: str = "auto", **retry: Any
) -> AsyncChatClient:
    """The JSON client of an endpoint spec (``structured``: auto | on | off, :mod:`marti_ibrl.llm`); ``ValueError``
    when its API-key variable is unset or ``structured`` is none of those."""
    return AsyncChatClient(
        spec["base_url"],
        spec["model"],
        spec.get("api_key_env"),
        max_concurrency=max_concurrency,
        structured=structured,
        **retry,
    )


async def _gather(coros: Iterable[Awaitable[T]]) -> list[T]:
    return list(await asyncio.gather(*coros))


# ---- Table 8 ----
def compile_stories(
    profiles: Sequence[dict],
    cache: StoryCache,
    client: AsyncChatClient,
    sampling: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> dict[str, Story | ChatFailure]:
    """sample_id -> its story (from the cache, or compiled through ``client`` and cached), or the
    :class:`~marti_ibrl.llm.ChatFailure` of a profile whose story could not be compiled. Compilations run
    concurrently (the client's concurrency limit)."""
    from marti_ibrl.progress import bar as progress_bar

    def ask(prompt: str) -> dict[str, Any]:
        messages = [{"role": "user", "content": prompt}]
        return client.run_sync(client.complete_json(messages, validate_story, sampling, story_schema())).to_json()

    def one(profile: dict) -> Story | ChatFailure:
        try:
            return cache.get_or_compile(profile, ask)
        except ChatFailure as failure:
            return failure

    out: dict[str, Story | ChatFailure] = {}
    with ThreadPoolExecutor(max_workers=client.max_concurrency, thread_name_prefix="story") as pool:
        results = pool.map(one, profiles)
        bar = progress_bar(results, total=len(profiles), desc="stories", unit="profile", disable=not progress)
        for profile, result in zip(profiles, bar):
            out[profile["case_control"]["sample_id"]] = result
    return out


# ---- Table 9 ----
class UserSimulator:
    """The customer seat (module doc). ``sampling`` goes with every request."""

    def __init__(self, client: AsyncChatClient, sampling: Mapping[str, Any] | None = None) -> None:
        self.client = client
        self.sampling = dict(sampling or {})
        self.name = f"simulator:{client.model}"

    def messages(self, env: TeleSalesEvalEnv, traj: Trajectory) -> list[dict[str, str]]:
        """Table 9 with the state trace as the system message, then the call (agent = user, customer = assistant)."""
        messages = chat_messages(env, traj, "customer")
        messages[0] = {"role": "system", "content": env.simulator_prompt(traj.state)}
        return messages

    async def turn(self, env: TeleSalesEvalEnv, traj: Trajectory) -> str | None:
        state = traj.state
        try:
            turn = await self.client.complete_json(
                self.messages(env, traj),
                lambda obj: env.check_customer(state, obj),
                self.sampling,
                env.customer_schema(state),
            )
        except ChatFailure as failure:
            env.fail(state, "customer", failure.kind, f"user simulator: {failure}")
            return None
        return simulator_turn_json(turn)

    def respond(self, env: TeleSalesEvalEnv, role: str, trajectories: Sequence[Trajectory]) -> list[str | None]:
        if role != "customer":
            raise ValueError(f"the user simulator plays the customer seat, not {role!r}")
        if not trajectories:
            return []
        return self.client.run_sync(_gather(self.turn(env, t) for t in trajectories))


# ---- Table 10 ----
class PromptedSalesAgent:
    """The prompted sales baseline (module doc), named ``name`` in tables and files."""

    def __init__(self, client: AsyncChatClient, name: str, sampling: Mapping[str, Any] | None = None) -> None:
        self.client, self.name = client, name
        self.sampling = dict(sampling or {})

    async def turn(self, env: TeleSalesEvalEnv, traj: Trajectory) -> str | None:
        state = traj.state

        def validate(obj: dict) -> dict[str, Any]:
            env.parse_sales(state, obj)
            return {k: obj[k] for k in SALES_KEYS}

        try:
            messages = chat_messages(env, traj, "sales")
            obj = await self.client.complete_json(messages, validate, self.sampling, sales_turn_schema())
        except ChatFailure as failure:
            env.fail(state, "sales", failure.kind, f"sales agent: {failure}")
            return None
        return json.dumps(obj, ensure_ascii=False)

    def respond(self, env: TeleSalesEvalEnv, role: str, trajectories: Sequence[Trajectory]) -> list[str | None]:
        if role != "sales" or env.sales_mode != "prompted":
            raise ValueError("the prompted sales agent plays the sales seat of a sales_mode='prompted' env")
        if not trajectories:
            return []
        return self.client.run_sync(_gather(self.turn(env, t) for t in trajectories))


# ---- Table 12 ----
class Auditor:
    """Post-dialogue audit of one call (module doc); deterministic sampling (temperature 0) unless told otherwise."""

    def __init__(
        self,
        client: AsyncChatClient,
        lang: str = "en",
        sampling: Mapping[str, Any] | None = None,
        service: Mapping[str, str] | None = None,
    ) -> None:
        self.client, self.lang = client, lang
        self.sampling = dict(sampling) if sampling is not None else {"temperature": 0.0}
        self.service = dict(service or {})

    @staticmethod
    def dialogue(env: TeleSalesEvalEnv, traj: Trajectory) -> list[tuple[str, str]]:
        """The observable call: ``("agent" | "customer", what was said)`` per turn, in order."""
        return [("agent" if t.role == "sales" else "customer", env.spoken(t.role, t.text)) for t in traj.turns]

    async def audit(self, profile: dict, dialogue: Sequence[tuple[str, str]]) -> Audit:
        """Table 12 over ``dialogue``; :class:`~marti_ibrl.llm.ChatFailure` when no valid audit comes back."""
        prompt = audit_prompt(profile, dialogue, self.lang, self.service or None)

        def validate(obj: dict) -> Audit:
            audit = validate_audit(obj)
            outside = [t for t in (*audit.fabrication_turns, *audit.ai_style_turns) if not 1 <= t <= len(dialogue)]
            if outside:
                raise ValueError(f"audit: evidence turns {outside} are not turns of the dialogue (1-{len(dialogue)})")
            return audit

        messages = [{"role": "user", "content": prompt}]
        return await self.client.complete_json(messages, validate, self.sampling, audit_schema(len(dialogue)))

    def audit_many(self, calls: Sequence[tuple[dict, Sequence[tuple[str, str]]]]) -> list[Audit | ChatFailure]:
        """:meth:`audit` of every ``(profile, dialogue)``, concurrently; a failure is returned in place."""

        async def one(profile: dict, dialogue: Sequence[tuple[str, str]]) -> Audit | ChatFailure:
            try:
                return await self.audit(profile, dialogue)
            except ChatFailure as failure:
                return failure

        if not calls:
            return []
        return self.client.run_sync(_gather(one(p, d) for p, d in calls))
