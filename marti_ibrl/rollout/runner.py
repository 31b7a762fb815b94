"""Batched multi-role dialogue rollout (paper §4.1: shared trajectories).

Every turn, the live dialogues are grouped by the policy that speaks next; each group's prompts go
to that policy's engines as one batch (split across its engines), and the batches of *all* policies
are in flight at once — seat order alternates across dialogues, so at any turn every role has turns
to generate and both roles' engines work concurrently. Each role renders its own view of every
dialogue with its own tokenizer (:class:`RoleView`); the tokens a role's engine generated become
that role's action span. Rewards are scored as soon as a dialogue ends, on a thread pool, while the
other dialogues keep generating.

Malformed turns (the env says ``valid=False``) are re-sampled up to ``max_resamples`` times; the
discarded attempts leave no trace. A turn still malformed after that ends the dialogue as
malformed (no deal, the env's invalid penalty for its speaker). A dialogue whose next turn could not
fit a role's context (``max_len``) ends without a deal (``context_limit``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import ray
from tqdm import tqdm

from marti_ibrl.envs.base import DialogueEnv
from marti_ibrl.rollout.dialogue import Trajectory, Turn
from marti_ibrl.rollout.render import RoleView

CONTEXT_LIMIT = "context_limit"


@dataclass
class Policy:
    """A policy that can take a seat: a name and the engines serving it, with its tokenizer."""

    name: str  # "current" | "pool:<version>" | "frozen:<name>"
    engines: Sequence[Any]  # Ray actor handles implementing generate_batch
    tokenizer: Any


@dataclass
class _Live:
    traj: Trajectory
    attempts: int = 0
    session: str = field(default_factory=lambda: uuid.uuid4().hex)  # the engines' prefix-cache key


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
    ):
        self.env = env
        self.reward_fns = dict(reward_fns)
        self.sampling = dict(sampling)
        self.max_len = max_len
        self.max_resamples = max_resamples
        self.reward_workers = reward_workers

    def run(
        self,
        scenarios: Sequence[tuple[str, Any]],
        n_samples: int,
        policies: Mapping[str, Policy],
        progress: bool = False,
    ) -> list[Trajectory]:
        """Play ``n_samples`` dialogues per (uid, scenario); ``policies[role]`` plays ``role``'s seat."""
        roles = list(self.env.roles)
        live: list[_Live] = []
        for si, (uid, scenario) in enumerate(scenarios):
            for g in range(n_samples):
                seats = seats_for(roles, si, g)
                traj = Trajectory(
                    scenario_uid=uid,
                    scenario=scenario,
                    seats=seats,
                    policies={r: policies[r].name for r in roles},
                    state=self.env.new_state(scenario, seats),
                    views={r: RoleView(policies[r].tokenizer, self.env.system_prompt(scenario, r)) for r in roles},
                    sample_index=g,
                )
                live.append(_Live(traj))
        done: list[Trajectory] = []
        scoring: list[tuple[Trajectory, dict[str, Future]]] = []
        bar = tqdm(total=len(live), desc="rollout", unit="dlg", disable=not progress, leave=False)
        with ThreadPoolExecutor(max_workers=self.reward_workers) as pool:
            while live:
                batches = self._dispatch(live, policies)
                still_live = []
                for role, (items, refs) in batches.items():
                    outputs = [o for chunk in ray.get(refs) for o in chunk]
                    for item, out in zip(items, outputs):
                        if self._apply(item, role, out):
                            still_live.append(item)
                        else:
                            done.append(item.traj)
                            scoring.append((item.traj, self._score_async(pool, item.traj)))
                            bar.update(1)
                live = still_live
            for traj, futures in scoring:
                traj.rewards = {role: float(f.result()) for role, f in futures.items()}
        bar.close()
        return sorted(done, key=lambda t: (t.scenario_uid, t.sample_index))

    # -- one turn ------------------------------------------------------------------------------------------------

    def _dispatch(self, live: list[_Live], policies: Mapping[str, Policy]) -> dict[str, tuple[list[_Live], list]]:
        """Group live dialogues by speaker and send every group to its engines, all in flight together."""
        by_role: dict[str, list[_Live]] = {}
        for item in live:
            by_role.setdefault(self.env.current_role(item.traj.state), []).append(item)
        batches = {}
        for role, items in by_role.items():
            engines = policies[role].engines
            # a dialogue always goes to the same engine (its prefix cache lives there)
            shards: dict[int, list[_Live]] = {}
            for item in items:
                shards.setdefault(int(item.session, 16) % len(engines), []).append(item)
            ordered, refs = [], []
            for e, shard in sorted(shards.items()):
                prompts = [item.traj.views[role].generation_prompt() for item in shard]
                refs.append(engines[e].generate_batch.remote(prompts, self.sampling, [i.session for i in shard]))
                ordered += shard
            batches[role] = (ordered, refs)
        return batches

    def _apply(self, item: _Live, role: str, out: dict) -> bool:
        """Feed one generated turn to the env and the views; returns whether the dialogue goes on."""
        traj, view = item.traj, item.traj.views[role]
        text = view.tokenizer.decode(out["token_ids"], skip_special_tokens=True).strip()
        result = self.env.step(traj.state, role, text)
        if not result.valid and item.attempts < self.max_resamples:
            item.attempts += 1  # re-sample this turn; the failed attempt leaves no trace
            return True
        view.add_own(out["token_ids"], out["logprobs"], finished=out["finish_reason"] == "stop")
        for other, other_view in traj.views.items():
            if other != role:
                other_view.add_counterpart(text)
        traj.turns.append(Turn(role, text, list(out["token_ids"]), list(out["logprobs"]), result.valid, item.attempts))
        item.attempts = 0
        if not result.valid:
            self.env.finish_malformed(traj.state, role)
        elif not result.done and self._context_full(traj):
            traj.truncated = True
            self.env.abort(traj.state, CONTEXT_LIMIT)
        return not getattr(traj.state, "done", False)

    def _context_full(self, traj: Trajectory) -> bool:
        nxt = self.env.current_role(traj.state)
        return len(traj.views[nxt].generation_prompt()) + int(self.sampling["max_new_tokens"]) > self.max_len

    def _score_async(self, pool: ThreadPoolExecutor, traj: Trajectory) -> dict[str, Future]:
        traj.outcome = self.env.outcome(traj.state)
        return {role: pool.submit(fn, traj, role, traj.scenario) for role, fn in self.reward_fns.items()}
