"""TeleSales role-specific LLM judges and the trajectory reward (paper §5.1 "Task-Specific Rewards").

§5.1: "role-specific rewards are judged by DeepSeek V4 Pro. The trajectory reward combines a normalized discounted
turn-level score with an episode-level outcome (λ_turn = 0.2, λ_episode = 0.8, γ = 0.9)"; the sales reward is
outcome-oriented, the customer reward realism-oriented (behavioural realism, decision rationality), and "the reward
judge audits the plausibility of the emitted scores". The paper prints neither the judge prompts nor how the parts
are computed; what follows is ours (prompts: ``prompts/<lang>/judge_sales.txt`` and ``judge_customer.txt``).

**Reward** (:func:`trajectory_reward`), for a role with turn scores s_0 … s_{T-1} ∈ [0, 1] (its own turns in
dialogue order) and an episode outcome E ∈ [0, 1]::

    R = λ_turn · (Σ_t γ^t s_t / Σ_t γ^t) + λ_episode · E,    t = 0 at the role's FIRST turn

Discounting runs from the first turn: it is the ordinary discounted return G_0 of the role's turn scores, and in a
cold call the opening turns decide whether the call goes on at all. Dividing by Σ_t γ^t makes the turn part a
weighted mean in [0, 1], independent of the call's length (all-max turns give 1, all-min 0), so neither a longer
nor a shorter call moves it by itself. R ∈ [0, 1].

* **Sales** (:class:`SalesJudge`, outcome-oriented): per agent turn, relevance, compliance and contact_push
  (0-10 each), s_t = (relevance + compliance + contact_push) / 30; E = w · 1[contact added] + (1 − w) · outcome / 10
  with w = ``success_weight`` = 0.5: the rule-based success of the environment (a ``ConfirmAdded`` after an
  agreement and a contact tool) and the judge's graded outcome, which separates a near-miss from an annoyed
  hang-up and withholds credit for a success bought with fabrication. When the agent's own malformed turn ended
  the call, ``malformed_penalty`` (-1.0, as :class:`TeleSalesEnv`'s ``invalid_penalty``) is added to R.
* **Customer** (:class:`CustomerJudge`, realism-oriented): per customer turn, realism, rationality and
  score_plausibility (0-10 each), s_t = (realism + rationality) / 20; the plausibility audit is folded into the
  episode part multiplicatively: E = (episode realism / 10) · mean_t(score_plausibility_t / 10), so implausible
  willingness/patience scores scale the episode reward down however realistic the replies read.

A judge reply is validated strictly (exact keys, every listed turn scored exactly once, numbers in [0, 10]); a
reply that fails is retried by the client (``bad_output``). The request carries the verdict's JSON schema
(:func:`verdict_schema`: the validator's keys, turn numbers, count and score range; only "each turn once" is the
validator's alone) as structured outputs, unless ``--judge.structured`` says otherwise (:mod:`marti_ibrl.llm`). A judge that still fails raises :class:`JudgeFailure`
with the reason: never a silent 0. :meth:`Judge.score_batch` scores many trajectories concurrently and returns a
result or a failure per trajectory, counted in ``Judge.stats`` and logged (the caller drops the trajectory from its
group).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marti_ibrl.envs.telesales.env import TeleSalesEnv, TeleSalesState
from marti_ibrl.envs.telesales.profiles import flat_fields, sales_view
from marti_ibrl.envs.telesales.prompts import (
    PHRASES,
    default_service,
    format_dialogue,
    load_template,
    phrase,
    render,
)
from marti_ibrl.llm import AsyncChatClient, ChatFailure
from marti_ibrl.reply_schema import TEXT, ReplySchema, closed_object, list_of, number_in, one_of
from marti_ibrl.reward_types import RewardFn, RewardUnavailable

logger = logging.getLogger(__name__)

GAMMA, LAM_TURN, LAM_EPISODE = 0.9, 0.2, 0.8
"""§5.1: γ, λ_turn, λ_episode."""
MAX_SCORE = 10


def ending(reason: str, lang: str = "en") -> str:
    """How the call ended, for the judge prompt (``prompts.PHRASES``)."""
    key = f"ending:{reason}"
    return phrase(key, lang) if key in PHRASES["en"] else phrase("ending:other", lang, reason=reason)


def discounted_turn_score(turn_scores: Sequence[float], gamma: float = GAMMA) -> float:
    """Σ_t γ^t s_t / Σ_t γ^t with t = 0 at the role's first turn; each s_t ∈ [0, 1], so the result is in [0, 1]."""
    if not turn_scores:
        raise ValueError("no turn scores: a role without turns has no turn-level score")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    if any(not 0.0 <= s <= 1.0 for s in turn_scores):
        raise ValueError(f"turn scores must lie in [0, 1], got {list(turn_scores)}")
    weights = [gamma**t for t in range(len(turn_scores))]
    return sum(w * s for w, s in zip(weights, turn_scores)) / sum(weights)


def trajectory_reward(
    turn_scores: Sequence[float],
    episode_outcome: float,
    gamma: float = GAMMA,
    lam_turn: float = LAM_TURN,
    lam_episode: float = LAM_EPISODE,
) -> float:
    """§5.1: R = λ_turn · Σ_t γ^t s_t / Σ_t γ^t + λ_episode · E (module doc: discounting from the first turn)."""
    if not 0.0 <= episode_outcome <= 1.0:
        raise ValueError(f"the episode outcome must lie in [0, 1], got {episode_outcome}")
    if lam_turn < 0 or lam_episode < 0:
        raise ValueError(f"lam_turn and lam_episode must be >= 0, got {lam_turn} and {lam_episode}")
    return lam_turn * discounted_turn_score(turn_scores, gamma) + lam_episode * episode_outcome


class JudgeFailure(RewardUnavailable):
    """No valid judgement for a trajectory: ``reason`` says why, ``kind`` is a count key (``bad_output``,
    ``timeout``, ``http_5xx``, ``no_turns``, ...). The trajectory must leave its role's group."""


@dataclass(frozen=True)
class TurnScore:
    turn: int  # the dialogue turn number (1-based, as in the prompt)
    criteria: dict[str, float]  # criterion -> 0..10
    reason: str


@dataclass(frozen=True)
class Verdict:
    """A validated judge reply: one :class:`TurnScore` per scored turn (dialogue order) and the episode score."""

    turns: tuple[TurnScore, ...]
    episode: float  # 0..10: sales "outcome", customer "realism"
    reason: str


@dataclass(frozen=True)
class JudgeResult:
    role: str
    reward: float  # R_role(τ)
    turn_part: float  # Σ γ^t s_t / Σ γ^t ∈ [0, 1]
    episode_part: float  # E ∈ [0, 1]
    turn_scores: tuple[float, ...]  # s_t ∈ [0, 1], the role's turns in order
    verdict: Verdict


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} must be a number from 0 to {MAX_SCORE}, got {value!r}")
    if not 0 <= value <= MAX_SCORE:
        raise ValueError(f"{where} = {value} is outside [0, {MAX_SCORE}]")
    return float(value)


def _keys(obj: Mapping[str, Any], expected: Sequence[str], where: str) -> None:
    missing, extra = [k for k in expected if k not in obj], sorted(set(obj) - set(expected))
    if missing or extra:
        parts = [f"missing {', '.join(missing)}" if missing else "", f"unexpected {', '.join(extra)}" if extra else ""]
        raise ValueError(f"{where}: {'; '.join(p for p in parts if p)} (keys must be exactly {', '.join(expected)})")


def validate_verdict(
    obj: Mapping[str, Any], turns: Sequence[int], criteria: Sequence[str], episode_key: str, what: str
) -> Verdict:
    """``{"turns": [{"turn", *criteria, "reason"}], episode_key, "reason"}`` with exactly ``turns`` scored, each
    once; every score a number in [0, 10]. Raises ``ValueError`` naming the problem."""
    _keys(obj, ("turns", episode_key, "reason"), what)
    if not isinstance(obj["turns"], list):
        raise ValueError(f"{what}: 'turns' must be a list, got {type(obj['turns']).__name__}")
    expected, seen = set(turns), {}
    for entry in obj["turns"]:
        if not isinstance(entry, dict):
            raise ValueError(f"{what}: every entry of 'turns' must be an object, got {entry!r}")
        n = entry.get("turn")
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"{what}: 'turn' must be a turn number, got {n!r}")
        if n in seen:
            raise ValueError(f"{what}: turn {n} scored twice")
        if n not in expected:
            raise ValueError(f"{what}: turn {n} is not to be scored (score exactly turns {_listing(turns)})")
        _keys(entry, ("turn", *criteria, "reason"), f"{what}: turn {n}")
        scores = {c: _number(entry[c], f"{what}: turn {n} {c}") for c in criteria}
        seen[n] = TurnScore(n, scores, _reason(entry, f"{what}: turn {n}"))
    if len(seen) != len(expected):
        raise ValueError(f"{what}: turns not scored: {_listing(sorted(expected - set(seen)))}")
    episode = _number(obj[episode_key], f"{what}: {episode_key}")
    return Verdict(tuple(seen[n] for n in sorted(seen)), episode, _reason(obj, what))


def verdict_schema(turns: Sequence[int], criteria: Sequence[str], episode_key: str, name: str) -> ReplySchema:
    """The JSON schema of :func:`validate_verdict`'s replies: the same keys, one entry per listed turn (``turns``,
    as many entries as turns), every score a number in [0, 10]. That no turn comes twice is left to the validator
    (no ``uniqueItems`` in strict mode); with the count and the turn numbers fixed, it also makes every turn scored."""
    score = number_in(0, MAX_SCORE)
    entry = closed_object({"turn": one_of(turns, "integer"), **dict.fromkeys(criteria, score), "reason": TEXT})
    verdict = {"turns": list_of(entry, len(turns), len(turns)), episode_key: score, "reason": TEXT}
    return ReplySchema(name, closed_object(verdict))


def _reason(obj: Mapping[str, Any], where: str) -> str:
    if not isinstance(obj["reason"], str):
        raise ValueError(f"{where}: 'reason' must be a string, got {obj['reason']!r}")
    return obj["reason"].strip()


def _listing(turns: Sequence[int]) -> str:
    return ", ".join(map(str, turns))


class Judge:
    """One role's judge: renders the prompt, asks the endpoint (the verdict's schema, or JSON mode), validates,
    computes the reward.

    ``client`` is shared by both judges (one concurrency limit); ``lang`` picks the prompt language; ``sampling``
    is sent with every request (default temperature 0).
    """

    role = ""
    template = ""
    criteria: tuple[str, ...] = ()
    episode_key = ""

    def __init__(
        self,
        client: AsyncChatClient,
        lang: str = "en",
        sampling: Mapping[str, Any] | None = None,
        gamma: float = GAMMA,
        lam_turn: float = LAM_TURN,
        lam_episode: float = LAM_EPISODE,
    ) -> None:
        self.client, self.lang = client, lang
        self.sampling = dict(sampling) if sampling is not None else {"temperature": 0.0}
        self.gamma, self.lam_turn, self.lam_episode = gamma, lam_turn, lam_episode
        load_template(self.template, lang)  # fail early on an unknown language
        self.view = TeleSalesEnv(lang=lang)  # only its stateless counterpart_text: what each role heard
        self.stats: dict[str, int] = {"scored": 0, "failures": 0}

    # -- role-specific -------------------------------------------------------------------------------------------
    def fields(self, traj: Any, state: TeleSalesState) -> dict[str, Any]:
        raise NotImplementedError

    def turn_score(self, turn: TurnScore) -> float:
        raise NotImplementedError

    def episode_outcome(self, verdict: Verdict, state: TeleSalesState) -> float:
        raise NotImplementedError

    def penalty(self, state: TeleSalesState) -> float:
        return 0.0

    # -- shared --------------------------------------------------------------------------------------------------
    def messages(self, traj: Any) -> list[dict[str, str]]:
        state = _finished_state(traj)
        fields = {**self.fields(traj, state), "ending": ending(state.reason, self.lang)}
        fields["turns_to_score"] = _listing(self.turns(traj))
        return [
            {"role": "system", "content": phrase("judge_system", self.lang)},
            {"role": "user", "content": render(load_template(self.template, self.lang), fields, self.lang)},
        ]

    def turns(self, traj: Any) -> list[int]:
        """The dialogue turn numbers (1-based) of this judge's role."""
        return [i for i, turn in enumerate(traj.turns, 1) if turn.role == self.role]

    async def score(self, traj: Any) -> JudgeResult:
        """The role's reward for one finished trajectory; :class:`JudgeFailure` when there is no valid verdict."""
        turns = self.turns(traj)
        if not turns:
            raise JudgeFailure(f"{self.role} judge: the {self.role} has no turns to score", "no_turns")
        what = f"{self.role} judge"
        try:
            verdict = await self.client.complete_json(
                self.messages(traj),
                lambda obj: validate_verdict(obj, turns, self.criteria, self.episode_key, what),
                self.sampling,
                verdict_schema(turns, self.criteria, self.episode_key, f"{self.role}_judge_verdict"),
            )
        except ChatFailure as failure:
            raise JudgeFailure(f"{what}: {failure}", failure.kind) from None
        state = traj.state
        scores = tuple(self.turn_score(t) for t in verdict.turns)
        turn_part = discounted_turn_score(scores, self.gamma)
        episode = self.episode_outcome(verdict, state)
        reward = trajectory_reward(scores, episode, self.gamma, self.lam_turn, self.lam_episode) + self.penalty(state)
        return JudgeResult(self.role, reward, turn_part, episode, scores, verdict)

    async def score_counted(self, traj: Any) -> JudgeResult | JudgeFailure:
        """:meth:`score`, with a failure returned instead of raised, counted in ``stats`` (``failures`` and
        ``failure:KIND``) and logged with its reason."""
        try:
            result = await self.score(traj)
        except JudgeFailure as failure:
            self.stats["failures"] += 1
            self.stats[f"failure:{failure.kind}"] = self.stats.get(f"failure:{failure.kind}", 0) + 1
            logger.warning(
                "no %s reward for trajectory %s/%s (drop it from its group): %s",
                self.role,
                traj.scenario_uid,
                traj.sample_index,
                failure.reason,
            )
            return failure
        self.stats["scored"] += 1
        return result

    async def score_batch(self, trajectories: Sequence[Any]) -> list[JudgeResult | JudgeFailure]:
        """:meth:`score_counted` of every trajectory, concurrently (the client's limit), in order."""
        return list(await asyncio.gather(*(self.score_counted(t) for t in trajectories)))

    def score_batch_sync(self, trajectories: Sequence[Any]) -> list[JudgeResult | JudgeFailure]:
        """:meth:`score_batch` for callers outside an event loop (the client's background loop)."""
        return self.client.run_sync(self.score_batch(trajectories))

    def reward_fn(self, without_turns: RewardFn) -> RewardFn:
        """R_role as a rollout reward function ``fn(trajectory, role, scenario)`` (any thread; requests from all
        threads share the client's loop and concurrency limit). A failed judgement raises :class:`JudgeFailure`
        (a :class:`~marti_ibrl.reward_types.RewardUnavailable`: the trainer drops the trajectory from the role's group).
        A call in which the role never spoke (the agent's malformed opening) has nothing to judge and is in none
        of the role's groups: it gets ``without_turns`` (the env's rule reward), without a request."""

        def reward(traj: Any, role: str, scenario: Any) -> float:
            if role != self.role:
                raise ValueError(f"the {self.role} judge cannot score role {role!r}")
            if not self.turns(traj):
                return without_turns(traj, role, scenario)
            result = self.client.run_sync(self.score_counted(traj))
            if isinstance(result, JudgeFailure):
                raise result
            return result.reward

        return reward


class SalesJudge(Judge):
    """Outcome-oriented (module doc). The judge sees what the agent could see: the lead fields, its own identity,
    the dialogue with tool notes and the customer's spoken replies (never the customer's scores)."""

    role, template, episode_key = "sales", "judge_sales", "outcome"
    criteria = ("relevance", "compliance", "contact_push")

    def __init__(
        self,
        client: AsyncChatClient,
        success_weight: float = 0.5,
        malformed_penalty: float = -1.0,
        service: Mapping[str, str] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(client, **kw)
        if not 0.0 <= success_weight <= 1.0:
            raise ValueError(f"success_weight must be in [0, 1], got {success_weight}")
        self.success_weight, self.malformed_penalty = success_weight, malformed_penalty
        self.service = {**default_service(self.lang), **(service or {})}

    def fields(self, traj: Any, state: TeleSalesState) -> dict[str, Any]:
        lines = [
            ("agent" if t.role == "sales" else "customer", self.view.counterpart_text(t.role, t.text, None))
            for t in traj.turns
        ]
        return {"lead_info": sales_view(state.profile), "service": self.service, "dialogue": format_dialogue(lines)}

    def turn_score(self, turn: TurnScore) -> float:
        return sum(turn.criteria.values()) / (MAX_SCORE * len(self.criteria))

    def episode_outcome(self, verdict: Verdict, state: TeleSalesState) -> float:
        w = self.success_weight
        return w * float(state.success) + (1.0 - w) * verdict.episode / MAX_SCORE

    def penalty(self, state: TeleSalesState) -> float:
        return self.malformed_penalty if state.malformed and state.fault_role == "sales" else 0.0


class CustomerJudge(Judge):
    """Realism-oriented with a plausibility audit of the emitted scores (module doc). The judge sees the full
    profile, the initial scores, the agent's turns as the customer heard them and the customer's JSON records."""

    role, template, episode_key = "customer", "judge_customer", "realism"
    criteria = ("realism", "rationality", "score_plausibility")

    def fields(self, traj: Any, state: TeleSalesState) -> dict[str, Any]:
        lines = [
            ("agent", self.view.counterpart_text("sales", t.text, None))
            if t.role == "sales"
            else ("customer", t.text if t.valid else phrase("malformed_record", self.lang) + t.text)
            for t in traj.turns
        ]
        return {
            "profile": flat_fields(state.profile),
            "initial_state": state.initial,
            "dialogue": format_dialogue(lines),
        }

    def turn_score(self, turn: TurnScore) -> float:
        return (turn.criteria["realism"] + turn.criteria["rationality"]) / (2 * MAX_SCORE)

    def episode_outcome(self, verdict: Verdict, state: TeleSalesState) -> float:
        audit = sum(t.criteria["score_plausibility"] for t in verdict.turns) / (MAX_SCORE * len(verdict.turns))
        return verdict.episode / MAX_SCORE * audit


def _finished_state(traj: Any) -> TeleSalesState:
    state = getattr(traj, "state", None)
    if not isinstance(state, TeleSalesState) or not state.done:
        raise ValueError(f"trajectory {traj.scenario_uid!r}: judges score finished TeleSales calls only")
    return state


JUDGES: dict[str, type[Judge]] = {"sales": SalesJudge, "customer": CustomerJudge}


def make_judges(cfg: Any, lang: str, roles: Sequence[str]) -> tuple[AsyncChatClient, dict[str, Judge]]:
    """One endpoint client (``cfg``: :class:`marti_ibrl.config.JudgeConfig`) shared by the judges of ``roles``."""
    unknown = [r for r in roles if r not in JUDGES]
    if unknown:
        raise ValueError(f"no TeleSales judge for roles {unknown} (judged roles: {', '.join(JUDGES)})")
    client = AsyncChatClient(
        cfg.base_url,
        cfg.model,
        cfg.api_key_env,
        max_concurrency=cfg.max_concurrency,
        max_retries=cfg.max_retries,
        timeout=cfg.timeout,
        structured=cfg.structured,
    )
    sampling = {"temperature": cfg.temperature}
    if cfg.max_new_tokens is not None:
        sampling["max_new_tokens"] = cfg.max_new_tokens
    return client, {r: JUDGES[r](client, lang=lang, sampling=sampling) for r in roles}
