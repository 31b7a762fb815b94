"""Batched multi-role dialogue rollout (paper §4.1: shared trajectories): :class:`DialogueRunner` plays
:class:`Request`s, every turn batching the live dialogues by the policy that speaks next, all policies' batches in
flight at once; each role renders its own view with its own tokenizer (:class:`RoleView`); rewards are scored as
dialogues end. docs/training.md, "The rollout", states its rules: passes, seeds, text players, malformed turns and
re-samples, the context limit, rewards that cannot be had.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import ray

from marti_ibrl.envs.base import DialogueEnv, TurnResult, shown_after
from marti_ibrl.envs.custom import UserCodeError
from marti_ibrl.progress import bar as progress_bar
from marti_ibrl.reward_types import RewardUnavailable, score
from marti_ibrl.rollout.dialogue import Attempt, Trajectory, Turn
from marti_ibrl.rollout.render import RoleView
from marti_ibrl.rollout.reward_pool import RewardPool, reward_result

log = logging.getLogger(__name__)
CONTEXT_LIMIT = "context_limit"
COUNTERPART_FAILURE = "counterpart_failure"


@dataclass
class Policy:
    """A policy that can take a seat: rollout engines with their tokenizer, or a text-level player."""

    name: str  # "current" | "pool:<version>" | "frozen:<name>"
    engines: Sequence[Any] = ()  # Ray actor handles implementing generate_batch
    tokenizer: Any = None
    player: Any = None  # a TextPlayer (respond(env, role, trajectories) -> texts) instead of engines
    adapter: Any = None  # LoRA roles: the AdapterRef (marti_ibrl/lora.py) the engines serve this policy with
    weights: str | None = None  # a snapshot file its engines must hold while serving it (another policy's engines,
    # --train.colocate): the caller loads it before the pass that plays it (DialogueRunner.run's before_pass)

    def __post_init__(self):
        if (self.player is None) == (not self.engines):
            raise ValueError(f"policy {self.name!r}: give either engines (+ tokenizer) or a text player")


@dataclass
class Request:
    """One scenario for :meth:`DialogueRunner.run` to play ``n_samples`` times: who plays each role's seat and how."""

    uid: str
    scenario: Any
    policies: Mapping[str, Policy]  # role -> the policy in its seat
    seats: Sequence[str] | None = None  # the speaking order; default: the env's fixed seats, else rotated (seats_for)
    rotation: int | None = None  # where the default rotation counts from; default: the request's position in the call
    pass_: int = 0  # the pass it is played in (docs/training.md, "The rollout"): each pass batched and seeded apart


def requests(
    scenarios: Sequence[tuple[str, Any]], policies: Mapping[str, Policy], seats: Sequence[str] | None = None
) -> list[Request]:
    """Every scenario played by the same ``policies`` (and speaking order ``seats``, when given)."""
    return [Request(uid, scenario, policies, seats) for uid, scenario in scenarios]


@dataclass
class _Live:
    traj: Trajectory
    session: str  # the engines' prefix-cache key (hex)
    policies: Mapping[str, Policy]  # who plays each seat of this dialogue
    attempts: int = 0
    pass_: int = 0  # batched and seeded apart from other passes (docs/training.md, "The rollout")


def _engine_index(item: _Live, n_engines: int) -> int:
    """The engine of a policy that serves this dialogue, always the same one (its prefix caches live there)."""
    return int(item.session, 16) % n_engines


def _cache_key(item: _Live, role: str) -> str:
    """An engine's prefix-cache key: one per dialogue and seat (a policy in both seats sees two different views)."""
    return f"{item.session}/{role}"


def context_full(view: RoleView, max_new_tokens: int, max_len: int) -> bool:
    """The context rule of every turn, the first included: the role's next prompt leaves no room for a whole turn
    (``max_new_tokens``) within ``max_len`` tokens. Such a prompt is never sent to an engine."""
    return len(view.generation_prompt()) + max_new_tokens > max_len


PROMPT_CHARS_PER_TOKEN = 32
"""No tokenizer here averages more characters a token over a prompt (SmolLM2's, Qwen's and the tiny models' take 3-5
for English text): a system prompt longer than this many characters per ``max_len`` token cannot fit and is refused
without tokenizing it (:func:`first_turns_overflowing`; a 10 MB prompt takes 124 s to tokenize here)."""


def overlong_system_prompts(
    env: DialogueEnv, scenarios: Sequence[tuple[str, Any]], roles: Sequence[str], max_len: int
) -> list[tuple[str, str, int]]:
    """(uid, role, characters) of every system prompt of ``roles`` (those an engine-served policy may play) longer
    than :data:`PROMPT_CHARS_PER_TOKEN` × ``max_len`` characters: too long for any tokenizer, found without one."""
    out = []
    for uid, scenario in scenarios:
        for role in roles:
            text = env.system_prompt(scenario, role)
            if len(text) > PROMPT_CHARS_PER_TOKEN * max_len:
                out.append((uid, role, len(text)))
    return out


def first_turns_overflowing(
    env: DialogueEnv,
    scenarios: Sequence[tuple[str, Any]],
    tokenizers: Mapping[str, Sequence[Any]],
    max_new_tokens: int,
    max_len: int,
) -> list[tuple[str, str, int]]:
    """(uid, role, prompt tokens) of every first prompt that breaks :func:`context_full`: each scenario's system
    prompt of each role, rendered with each of the role's tokenizers (the engine-served policies that may take its
    seat; a text player has none), before any turn. Any seat can open (seats rotate), so every role is checked.
    Prompts :func:`overlong_system_prompts` finds are not tokenized (they are that function's to report)."""
    out = []
    for uid, scenario in scenarios:
        for role in env.roles:
            text = env.system_prompt(scenario, role)
            if len(text) > PROMPT_CHARS_PER_TOKEN * max_len:
                continue
            for tok in tokenizers.get(role, ()):
                view = RoleView(tok, text)
                if context_full(view, max_new_tokens, max_len):
                    out.append((uid, role, len(view.generation_prompt())))
    return out


def seats_for(roles: Sequence[str], scenario_index: int, sample_index: int) -> list[str]:
    """Seat order of a dialogue: rotate the roles so openers alternate across a batch."""
    shift = (scenario_index + sample_index) % len(roles)
    return list(roles[shift:]) + list(roles[:shift])


class DialogueRunner:
    def __init__(
        self,
        env: DialogueEnv,
        reward_fns: Mapping[str, Callable[[Trajectory, str, Any], float]],
        sampling: Mapping[str, Any],
        max_len: int,
        max_resamples: int = 2,
        reward_workers: int = 4,
        reward_timeouts: Mapping[str, float] | None = None,
        reward_names: Mapping[str, str] | None = None,
    ):
        """``reward_timeouts``: per role, the seconds one call of its reward may take (``--train.reward_timeout``,
        a user's reward; a role absent: no bound). Past it the dialogue has no reward for that role (kind
        ``timeout``, the call left running on its own thread), and a call that took half of it or more is named in a
        warning (``reward_names``: each role's reward as configured, e.g. ``my_module:my_fn``):
        :mod:`marti_ibrl.rollout.reward_pool`."""
        self.env = env
        self.reward_fns = dict(reward_fns)
        self.sampling = dict(sampling)
        self.max_len = max_len
        self.max_resamples = max_resamples
        self.reward_workers = reward_workers
        self.reward_timeouts = dict(reward_timeouts or {})
        self.reward_names = dict(reward_names or {})
        self._unreadable: set[type] = set()  # exception types env.step raised on a turn (logged once each)

    def run(
        self,
        requests: Sequence[Request],
        n_samples: int,
        progress: bool = False,
        seed: int = 0,
        max_live: int | None = None,
        on_done: Callable[[int, Trajectory], None] | None = None,
        before_pass: Callable[[int], None] | None = None,
    ) -> list[Trajectory]:
        """Play ``n_samples`` dialogues per :class:`Request` (its policies in their seats, its speaking order, its
        pass). ``seed`` makes the sampling reproducible (docs/training.md, "The rollout"); trajectories come back in request
        order: request by request, sample by sample.

        ``max_live``: at most this many dialogues in play at once; a finished one is replaced by the next waiting one
        at the following turn, so the engines' batches stay full (default: all at once). ``on_done(i, trajectory)``:
        called (on this thread) as soon as a dialogue of ``requests[i]`` has ended and its rewards are in, in the
        order they end: what a caller that stores episodes needs to lose none when it is killed (``marti-ibrl
        eval``). ``before_pass(p)``: given, the passes play one after another in ascending order, the hook called
        before each (e.g. to load a pool snapshot into engines: :attr:`Policy.weights`); else all at once. Either
        way the same dialogues come out (with ``max_live`` None: every dialogue of a pass starts at its first turn).
        """
        if max_live is not None and max_live < 1:
            raise ValueError(f"max_live must be >= 1, got {max_live}")
        waiting = [
            self._request(si, r.uid, r.scenario, g, r.policies, seed, order, r.pass_)
            for si, r in enumerate(requests)
            for g in range(n_samples)
            for order in [
                list(r.seats) if r.seats is not None else self._seats(si if r.rotation is None else r.rotation, g)
            ]
        ]
        request_order = {id(item.traj): i for i, item in enumerate(waiting)}
        total = len(waiting)
        cap = total if max_live is None else max_live
        if before_pass is None:  # every pass at once
            rounds = [(None, waiting)]
        else:
            numbers = sorted({item.pass_ for item in waiting})
            rounds = [(p, [item for item in waiting if item.pass_ == p]) for p in numbers]
        done: list[Trajectory] = []
        scoring: list[tuple[Trajectory, dict[str, Future]]] = []
        bar = progress_bar(total=total, desc="rollout", unit="dlg", disable=not progress, leave=False)
        pool, warned = RewardPool(self.reward_workers), set()  # (warned: the roles whose slow reward was named)
        with ThreadPoolExecutor(4) as players:

            def hand_over(wait: bool) -> None:
                """Rewards into the trajectories scored so far (all of them when ``wait``, else those scored), each
                then handed to ``on_done``."""
                nonlocal scoring
                is_ready = [wait or all(f.done() for f in futures.values()) for _, futures in scoring]
                ready = [s for s, r in zip(scoring, is_ready) if r]
                scoring = [s for s, r in zip(scoring, is_ready) if not r]
                for traj, futures in ready:
                    self._collect(traj, futures, pool, warned)
                    if on_done is not None:
                        on_done(request_order[id(traj)] // n_samples, traj)

            def end(item: _Live) -> None:
                done.append(item.traj)
                scoring.append((item.traj, self._score_async(pool, item.traj)))
                bar.update(1)

            for number, queue in rounds:
                if number is not None:
                    before_pass(number)
                after_turn = (lambda: hand_over(wait=False)) if on_done is not None else None
                try:
                    self._play(queue, cap, players, seed, end, after_turn)
                except BaseException:
                    pool.shutdown()
                    raise
            try:
                hand_over(wait=True)
            finally:
                pool.shutdown()
        bar.close()
        return sorted(done, key=lambda t: request_order[id(t)])

    def _seats(self, rotation: int, g: int) -> list[str]:
        """The speaking order of sample g of the scenario at ``rotation``: the env's fixed seats, or rotated."""
        fixed = getattr(self.env, "fixed_seats", None)
        return list(fixed or seats_for(list(self.env.roles), rotation, g))

    def _request(
        self, si: int, uid: str, scenario: Any, g: int, policies: Mapping[str, Policy], seed: int, order, pass_: int
    ) -> _Live:
        """Sample g of ``scenarios[si]``: its trajectory (each role's view), session (run seed, scenario, sample)."""
        roles = list(self.env.roles)
        traj = Trajectory(
            scenario_uid=uid,
            scenario=scenario,
            seats=order,
            policies={r: policies[r].name for r in roles},
            state=self.env.new_state(scenario, order),
            views={
                r: RoleView(policies[r].tokenizer, self.env.system_prompt(scenario, r))
                for r in roles
                if policies[r].player is None
            },
            sample_index=g,
        )
        session = hashlib.sha1(f"{seed}/{si}/{uid}/{g}".encode()).hexdigest()
        return _Live(traj, session, policies, pass_=pass_)

    def _play(
        self,
        queue: list[_Live],
        cap: int,
        players: ThreadPoolExecutor,
        seed: int,
        end: Callable[[_Live], None],
        after_turn: Callable[[], None] | None,
    ) -> None:
        """Play the dialogues of ``queue`` (request order) turn by turn, at most ``cap`` live at once (a finished
        one is replaced at the next turn); ``end(item)`` as each ends, ``after_turn()`` after each turn."""
        queue = queue[::-1]  # popped from the end: request order
        live: list[_Live] = []
        for turn in itertools.count():
            while queue and len(live) < cap:
                item = queue.pop()
                if self._end_if_context_full(item.traj):  # the opener's first prompt already leaves no room
                    end(item)  # never sent to an engine; its views hold only the system prompt
                else:
                    live.append(item)
            if not live:
                return
            still_live, ended = [], []
            for (role, *_), (items, refs) in self._dispatch(live, players, seed, turn).items():
                outputs = refs.result() if isinstance(refs, Future) else [o for c in ray.get(refs) for o in c]
                for item, out in zip(items, outputs):
                    if self._apply(item, role, out):
                        still_live.append(item)
                    else:
                        ended.append(item)
                        end(item)
            live = still_live
            self._end_sessions(ended)
            if after_turn is not None:
                after_turn()

    # -- one turn ------------------------------------------------------------------------------------------------

    def _dispatch(
        self,
        live: list[_Live],
        players: ThreadPoolExecutor,
        seed: int,
        turn: int,
    ) -> dict[tuple[str, str, int], tuple[list[_Live], list | Future]]:
        """Group live dialogues by (speaker, its policy, pass) and send every group off, all in flight together."""
        groups: dict[tuple[str, str, int], list[_Live]] = {}
        for item in live:
            role = self.env.current_role(item.traj.state)
            groups.setdefault((role, item.policies[role].name, item.pass_), []).append(item)
        batches: dict[tuple[str, str, int], tuple[list[_Live], list | Future]] = {}
        for (role, name, pass_), items in groups.items():
            policy = items[0].policies[role]
            if policy.player is not None:
                future = players.submit(policy.player.respond, self.env, role, [i.traj for i in items])
                batches[role, name, pass_] = (items, future)
                continue
            engines = policy.engines
            shards: dict[int, list[_Live]] = {}
            for item in items:
                shards.setdefault(_engine_index(item, len(engines)), []).append(item)
            ordered, refs = [], []
            for e, shard in sorted(shards.items()):
                prompts = [item.traj.views[role].generation_prompt() for item in shard]
                call = f"{seed}/{turn}/{role}/{name}/{e}" + (f"/pass{pass_}" if pass_ else "")
                call_seed = zlib.crc32(call.encode())
                sampling = {**self.sampling, "seed": call_seed}
                sessions = [_cache_key(i, role) for i in shard]
                if policy.adapter is None:
                    refs.append(engines[e].generate_batch.remote(prompts, sampling, sessions))
                else:  # a LoRA policy: its adapter, per request, on engines that may serve others too
                    adapter = policy.adapter.as_dict()
                    refs.append(engines[e].generate_batch.remote(prompts, sampling, sessions, adapter=adapter))
                ordered += shard
            batches[role, name, pass_] = (ordered, refs)
        return batches

    @staticmethod
    def _end_sessions(ended: list[_Live]) -> None:
        """Tell each engine which of its prefix caches belong to dialogues that just ended (engines that keep no
        cache, like vLLM's content-addressed one, may lack ``end_sessions``); fire and forget."""
        per_engine: dict[int, tuple[Any, list[str]]] = {}
        for item in ended:
            for role, policy in item.policies.items():
                if policy.engines:
                    engine = policy.engines[_engine_index(item, len(policy.engines))]
                    per_engine.setdefault(id(engine), (engine, []))[1].append(_cache_key(item, role))
        for engine, keys in per_engine.values():
            if hasattr(engine, "end_sessions"):
                engine.end_sessions.remote(keys)

    def _apply(self, item: _Live, role: str, out: dict | str | None) -> bool:
        """Feed one turn (engine output, or a player's text) to the env and the views; False when it ended."""
        traj = item.traj
        if out is None:  # a text player could not produce the turn (after its own retries)
            traj.failed = True
            self.env.abort(traj.state, COUNTERPART_FAILURE)
            return False
        view = traj.views.get(role)
        if isinstance(out, str):
            text, out = out.strip(), {"token_ids": [], "logprobs": [], "finish_reason": "stop"}
        else:
            text = view.tokenizer.decode(out["token_ids"], skip_special_tokens=True).strip()
        result = self._step(traj, role, text)
        if not result.valid and item.attempts < self.max_resamples:
            item.attempts += 1  # re-sample this turn; the attempt is kept aside, outside the dialogue
            if view is not None:
                traj.discarded.append(
                    Attempt(
                        role,
                        text,
                        view.generation_prompt(),
                        list(out["token_ids"]),
                        list(out["logprobs"]),
                        out["finish_reason"] == "stop",
                        result.reason,
                    )
                )
            return True
        if view is not None:
            view.add_own(out["token_ids"], out["logprobs"], finished=out["finish_reason"] == "stop")
        for other, shown in shown_after(self.env, role, text, traj.scenario, result.shown).items():
            if other in traj.views:
                traj.views[other].add_counterpart(shown)
        turn = Turn(
            role, text, list(out["token_ids"]), list(out["logprobs"]), result.valid, item.attempts, result.shown
        )
        traj.turns.append(turn)
        item.attempts = 0
        if not result.valid:
            self.env.finish_malformed(traj.state, role)
        elif not result.done:
            self._end_if_context_full(traj)
        return not getattr(traj.state, "done", False)

    def _step(self, traj: Trajectory, role: str, text: str) -> TurnResult:
        """``env.step``; a turn it raises on (a counterpart's or an endpoint's reply no parser foresaw) is malformed,
        logged once per exception type, and leaves the other dialogues playing. (The envs raise before they change
        the state: they parse the whole turn first.)"""
        try:
            return self.env.step(traj.state, role, text)
        except UserCodeError:  # an environment of your own that raised (--env.step_errors stop): the code's fault
            raise
        except Exception as e:  # whatever a reply does to a parser, it is that turn's fault
            if type(e) not in self._unreadable:
                self._unreadable.add(type(e))
                log.warning("a %s turn of %r could not be read; malformed", role, traj.scenario_uid, exc_info=True)
            detail = f"{type(e).__name__}: {e}"
            return TurnResult(valid=False, done=False, reason=f"malformed: unreadable turn ({detail[:200]})")

    def _end_if_context_full(self, traj: Trajectory) -> bool:
        """End the dialogue as ``context_limit`` (truncated, no deal) when the next speaker's prompt breaks
        :func:`context_full`; before the first turn as after any other. True when it ended."""
        nxt = self.env.current_role(traj.state)
        if nxt not in traj.views:  # a text player: its context is its own business
            return False
        if not context_full(traj.views[nxt], int(self.sampling["max_new_tokens"]), self.max_len):
            return False
        traj.truncated = True
        self.env.abort(traj.state, CONTEXT_LIMIT)
        return True

    def _collect(self, traj: Trajectory, futures: Mapping[str, Future], pool: RewardPool, warned: set[str]) -> None:
        """The scored rewards into ``traj`` (waiting for them, a call with a timeout at most that long from its
        start); a role without one gets its reason."""
        for role, future in futures.items():
            try:
                traj.rewards[role] = float(reward_result(future, pool, self._reward_name(role), role, traj, warned))
            except RewardUnavailable as missing:  # a judge failing after its retries, a NaN, a raise, a timeout
                traj.reward_failures[role] = f"{missing.kind}: {missing.reason}"

    def _reward_name(self, role: str) -> str:
        fn = self.reward_fns[role]
        return self.reward_names.get(role) or getattr(fn, "__qualname__", repr(fn))

    def _score_async(self, pool: RewardPool, traj: Trajectory) -> dict[str, Future]:
        traj.outcome = self.env.outcome(traj.state)
        return {
            role: pool.submit(score, fn, traj, role, traj.scenario, limit=self.reward_timeouts.get(role))
            for role, fn in self.reward_fns.items()
        }
