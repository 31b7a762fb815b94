"""The :class:`Evaluator` of ``marti-ibrl eval`` (DoND's command line: :mod:`.dond.command`; any other environment's:
:mod:`.generic`): frozen policies against counterparts, streamed to JSONL (paper §5.2).

A *policy* is an HF checkpoint served by the same rollout engines as training (vLLM on GPU, HF generate
on CPU). A *counterpart* is another checkpoint, an OpenAI-compatible endpoint, a scripted bot, or a
held-out scripted bot (``heldout:NAME``, code and strategies disjoint from every training bot).
Each scenario is played with the policy in each of its roles (``policy_roles``; default every role: DoND's policy
as ``agent1`` with agent1's private values and as ``agent2``), openers alternating across scenarios unless the env
fixes the seats; malformed turns are re-sampled (``max_resamples``) and then scored as the env scores a malformed
ending, exactly as in training (the same :class:`~marti_ibrl.rollout.runner.DialogueRunner`).

Every finished episode is appended to ``OUT/episodes/POLICY__COUNTERPART.jsonl`` as soon as it ends (one line:
scenario, seats, transcript, outcome, per-role utilities, malformed/failed flags; written and flushed at once, so a
killed process loses none, and fsynced after each runner call, so a crashed machine loses at most those); a re-run
skips the episodes already there, so an interrupted eval resumes where it stopped. Lines are in the order the
episodes ended. Episodes whose endpoint
counterpart failed after its retries are written with ``failed: true`` and stay in every denominator; each endpoint's
request counts of this run (requests, retries, failures, per fault kind) are in ``OUT/endpoints.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.eval.episodes import SELF, Named, read_episodes, resume_episodes
from marti_ibrl.progress import bar as progress_bar
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.rollout.runner import DialogueRunner, Policy, Request


def episode_id(uid: str, policy_role: str, sample: int) -> str:
    return f"{uid}|{policy_role}|{sample}"


def scenario_json(scenario: Any) -> Any:
    """A scenario as JSON: its ``to_json()``, a dataclass's fields, the value itself when JSON takes it, else its
    ``repr`` (an environment of your own may use any object)."""
    import dataclasses

    if hasattr(scenario, "to_json"):
        return scenario.to_json()
    if dataclasses.is_dataclass(scenario) and not isinstance(scenario, type):
        return dataclasses.asdict(scenario)
    try:
        json.dumps(scenario)
    except (TypeError, ValueError):
        return repr(scenario)
    return scenario


def episode_record(traj: Trajectory, policy: str, counterpart: str, policy_role: str, roles: Sequence[str]) -> dict:
    """One JSONL line: everything needed to recompute every metric without the models."""
    outcome = traj.outcome
    scenario = scenario_json(traj.scenario)
    return {
        "episode_id": episode_id(traj.scenario_uid, policy_role, traj.sample_index),
        "scenario_uid": traj.scenario_uid,
        "scenario": scenario,
        "roles": list(roles),
        "policy": policy,
        "counterpart": counterpart,
        "policy_role": policy_role,
        "seats": list(traj.seats),
        "sample_index": traj.sample_index,
        "policies": dict(traj.policies),
        "transcript": [
            {"role": t.role, "text": t.text, "valid": t.valid, "resamples": t.resamples} for t in traj.turns
        ],
        "agreed": bool(outcome.agreed),
        "malformed": bool(outcome.malformed),
        "failed": bool(traj.failed),
        "truncated": bool(traj.truncated),
        "reason": outcome.info.get("reason", ""),
        "fault_role": outcome.info.get("fault_role"),
        "utilities": dict(outcome.utilities),
        "allocations": outcome.info.get("allocations", {}),
        "rewards": dict(traj.rewards),
    }


def mirror_record(rec: dict, policy: str, counterpart: str, roles: Sequence[str]) -> dict:
    """The same two-role episode seen from the other seat: ``policy`` (the record's counterpart) in the other role."""
    (other,) = [r for r in roles if r != rec["policy_role"]]
    mirrored = dict(rec, policy=policy, counterpart=counterpart, policy_role=other, mirror_of=rec["episode_id"])
    mirrored["policies"] = {other: policy, rec["policy_role"]: counterpart}
    mirrored["episode_id"] = episode_id(rec["scenario_uid"], other, rec["sample_index"])
    return mirrored


class Evaluator:
    """Plays policies against counterparts on a fixed scenario list; owns the engines it starts."""

    def __init__(
        self,
        env: Any,
        scenarios: Sequence[tuple[str, Any]],
        sampling: dict,
        max_len: int,
        max_resamples: int = 2,
        engines=None,
        seed: int = 0,
        chunk: int = 64,
        flush_every: int = 2,
        policy_roles: dict[str, Sequence[str]] | None = None,
    ):
        """``chunk`` episodes are played at once (finished ones replaced by waiting ones); one runner call plays
        ``flush_every * chunk`` episodes (sampling seeds are drawn per call; each call drains the dialogues in play,
        which costs little: ``benchmarks/eval_refill.py``). Each episode is written as it ends, the files fsynced
        after every call."""
        from marti_ibrl.rewards import env_reward

        self.env = env
        self.roles = list(env.roles)
        self.scenarios = list(scenarios)
        self.runner = DialogueRunner(env, {r: env_reward(env) for r in self.roles}, sampling, max_len, max_resamples)
        self.sampling = dict(sampling)
        self.engines = engines  # FrozenEngines (start(path) / stop(engines)) for checkpoints
        self.seed = seed
        self.chunk = chunk
        self.flush_every = flush_every
        self._cache: dict[str, Policy] = {}
        self.policy_roles = dict(policy_roles or {})  # policy name -> the roles it plays (default: every role)
        self.endpoint_stats: dict[str, dict[str, int]] = {}  # counterpart name -> its client's counts (this run)

    def policy(self, named: Named) -> Policy:
        """The Policy serving ``named`` (engines are started once per checkpoint path and shared)."""
        from marti_ibrl.rollout.players import make_player, parse_player_spec

        if named.spec in self._cache:
            return self._cache[named.spec]
        spec = parse_player_spec(named.spec)
        if spec["kind"] == "checkpoint":
            from transformers import AutoTokenizer

            if self.engines is None:
                raise ValueError(f"{named.spec}: no engine factory to serve checkpoints")
            policy = Policy(named.name, self.engines.start(spec["path"]), AutoTokenizer.from_pretrained(spec["path"]))
        else:
            if spec["kind"] == "endpoint":
                spec["sampling"] = dict(self.sampling)
            elif spec["kind"] in ("bot", "heldout"):
                spec["seed"] = self.seed
            policy = Policy(named.name, player=make_player(spec))
        self._cache[named.spec] = policy
        return policy

    def work(
        self, done: set[str], samples: int, roles: Sequence[str] | None = None
    ) -> Iterator[tuple[int, str, Any, str]]:
        """(scenario index, uid, scenario, policy_role) still to play: every scenario in each of ``roles`` (default:
        every role)."""
        for si, (uid, scenario) in enumerate(self.scenarios):
            for role in roles or self.roles:
                if any(episode_id(uid, role, g) not in done for g in range(samples)):
                    yield si, uid, scenario, role

    def run_pair(
        self, policy: Named, counterpart: Named, out: Path, samples: int = 1, progress: bool = True
    ) -> list[dict]:
        """Play ``policy`` against ``counterpart`` (``self``: the policy in both seats), appending to ``out``."""
        return self.run_pairs(policy, [(counterpart, out)], samples, progress)[0]

    def run_pairs(
        self, policy: Named, counterparts: Sequence[tuple[Named, Path]], samples: int = 1, progress: bool = True
    ) -> list[list[dict]]:
        """Play ``policy`` against every ``(counterpart, file)`` in one stream of dialogues; the episodes per file.

        One stream keeps the policy's batches full across pairs: its turns against every counterpart go to its
        engines together, and a pair's last long dialogues overlap the next pair's first ones.
        """
        played = [resume_episodes(out) for _, out in counterparts]  # (a line torn by a crash moved aside)
        done = [{e["episode_id"] for e in episodes} for episodes in played]
        todo = []  # (pair index, scenario index, uid, scenario, policy_role)
        for k in range(len(counterparts)):
            todo += [(k, *item) for item in self.work(done[k], samples, self.policy_roles.get(policy.name))]
        if not todo:  # all played: no engines to start
            return played
        p = self.policy(policy)
        opponents = [p if c.spec == SELF else self.policy(c) for c, _ in counterparts]
        by_name: dict[str, tuple[Policy, str]] = {}
        for c, spec in [(p, policy.spec), *((c, named.spec) for c, (named, _) in zip(opponents, counterparts))]:
            seen, seen_spec = by_name.setdefault(c.name, (c, spec))
            if seen is not c:  # the runner batches turns by policy name: they would be merged
                raise ValueError(f"{seen_spec} and {spec} are both named {c.name!r}; name them apart")
        names = [c.name for c, _ in counterparts]
        what = names[0] if len(names) == 1 else f"{len(names)} counterparts"
        bar = progress_bar(total=len(todo) * samples, desc=f"{policy.name} vs {what}", unit="ep", disable=not progress)
        bar.update(0)
        for _, out in counterparts:
            out.parent.mkdir(parents=True, exist_ok=True)
        files = [out.open("a") for _, out in counterparts]
        try:
            per_run = max(1, self.chunk * self.flush_every // samples)  # scenario-seats per runner call
            for start in range(0, len(todo), per_run):
                batch = todo[start : start + per_run]
                scenarios = [(uid, scenario) for _, _, uid, scenario, _ in batch]
                seat_policies = [{r: (p if r == role else opponents[k]) for r in self.roles} for k, *_, role in batch]
                # the policy opens in one of its two seats and answers in the other, alternating by scenario
                seats = [self._seats(si, role) for _, si, _, _, role in batch]
                k0, _, uid0, _, role0 = batch[0]
                key = f"{self.seed}/{policy.name}/{names[k0]}/{uid0}/{role0}"
                seed = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)

                def write(i: int, traj: Trajectory, batch=batch) -> None:  # an episode ended: on disk at once
                    k, *_, role = batch[i]
                    rec = episode_record(traj, policy.name, names[k], role, self.roles)
                    if rec["episode_id"] in done[k]:
                        return
                    files[k].write(json.dumps(rec) + "\n")
                    files[k].flush()
                    done[k].add(rec["episode_id"])
                    played[k].append(rec)

                self.runner.run(
                    [Request(*s, ps, order) for s, ps, order in zip(scenarios, seat_policies, seats, strict=True)],
                    samples,
                    progress=progress,
                    seed=seed,
                    max_live=self.chunk,
                    on_done=write,
                )  # its own bar counts the dialogues of this call as they end
                for f in files:
                    os.fsync(f.fileno())
                bar.update(len(batch) * samples)
        finally:
            for f in files:
                f.close()
        bar.close()
        return played

    def mirror_pair(self, played: Path, policy: str, counterpart: str, out: Path) -> list[dict]:
        """``policy`` vs ``counterpart`` read off the episodes of the reverse pair (``played``), without playing.

        Two policies A and B meet in the same games whichever is "the policy": A in seat agent1 against B in
        agent2 on a scenario is B's agent2 episode of that scenario (the opener depends on the scenario only, see
        :meth:`_seats`). So B vs A is A vs B's episodes with the policy's seat swapped; ``out`` is rewritten whole,
        each record marked ``mirror_of`` (the played episode's id).
        """
        if len(self.roles) != 2:
            raise ValueError(f"mirrored pairs need a two-role game, not {self.roles}")
        records = [mirror_record(e, policy, counterpart, self.roles) for e in read_episodes(played)]
        tmp = out.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        tmp.replace(out)
        return records

    def close(self) -> None:
        """Stop every engine this evaluator started and close its text players (endpoint connections)."""
        for spec in list(self._cache):
            policy = self._cache[spec]
            if policy.player is not None and hasattr(policy.player, "close"):
                policy.player.close()
            self.release(Named(policy.name, spec))

    def release(self, named: Named) -> None:
        """Stop the engines serving ``named`` (a checkpoint, placement group included) and forget it."""
        policy = self._cache.pop(named.spec, None)
        if policy is not None and isinstance(getattr(policy.player, "stats", None), dict):
            self.endpoint_stats[policy.name] = dict(policy.player.stats)  # requests, retries, failures, per fault
        if policy is not None and policy.engines:
            self.engines.stop(list(policy.engines))

    def _seats(self, scenario_index: int, policy_role: str) -> list[str]:
        """Seat order: the env's ``fixed_seats`` where it has one; else the first role opens on even scenarios, the
        second on odd ones (so each seat opens half the time)."""
        fixed = getattr(self.env, "fixed_seats", None)
        if fixed:
            return list(fixed)
        shift = scenario_index % len(self.roles)
        return self.roles[shift:] + self.roles[:shift]
