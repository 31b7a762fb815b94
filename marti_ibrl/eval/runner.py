"""``marti-ibrl eval``: frozen policies against counterparts, seat-averaged, streamed to JSONL (paper §5.2).

A *policy* is an HF checkpoint served by the same rollout engines as training (vLLM on GPU, HF generate
on CPU). A *counterpart* is another checkpoint, an OpenAI-compatible endpoint, a scripted bot, or a
held-out scripted bot (``heldout:NAME``, code and strategies disjoint from every training bot).
Each scenario is played with the policy in both seats (as ``agent1`` with agent1's private values and as
``agent2``), openers alternating across scenarios; malformed turns are re-sampled twice and then scored
as no deal, exactly as in training (the same :class:`~marti_ibrl.rollout.runner.DialogueRunner`).

Every finished episode is appended to ``OUT/episodes/POLICY__COUNTERPART.jsonl`` at once (one line:
scenario, seats, transcript, outcome, per-role utilities, malformed/failed flags); a re-run skips the
episodes already there, so an interrupted eval resumes where it stopped. Episodes whose endpoint
counterpart failed after its retries are written with ``failed: true`` and stay in every denominator.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.rollout.runner import DialogueRunner, Policy

SELF = "self"
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True)
class Named:
    """``NAME=SPEC`` from the command line (the name labels tables and files)."""

    name: str
    spec: str


def parse_named(text: str, default_prefix: str = "") -> Named:
    """``NAME=SPEC`` or a bare ``SPEC`` (named after its last path component / bot name)."""
    name, eq, spec = text.partition("=")
    if not eq or ":" in name or "/" in name:
        spec = text
        if spec.startswith("endpoint:"):  # endpoint:MODEL@URL: the model, not the URL's last path component
            tail = spec.removeprefix("endpoint:").split("@")[0]
        else:
            tail = spec.rstrip("/").split("/")[-1].split(":")[-1]
        name = f"{default_prefix}{tail}" if default_prefix else tail
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", name)
    if not _NAME.match(name):
        raise ValueError(f"bad name in {text!r}: use NAME=SPEC with NAME of letters, digits, _ . + -")
    return Named(name, spec)


def episode_id(uid: str, policy_role: str, sample: int) -> str:
    return f"{uid}|{policy_role}|{sample}"


def read_episodes(path: Path) -> list[dict]:
    """Episodes of a JSONL file; a truncated last line (killed mid-write) is ignored."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def episode_record(traj: Trajectory, policy: str, counterpart: str, policy_role: str, roles: Sequence[str]) -> dict:
    """One JSONL line: everything needed to recompute every metric without the models."""
    outcome = traj.outcome
    scenario = traj.scenario.to_json() if hasattr(traj.scenario, "to_json") else traj.scenario
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
        "utilities": dict(outcome.utilities),
        "allocations": outcome.info.get("allocations", {}),
        "rewards": dict(traj.rewards),
    }


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
        flush_every: int = 8,
    ):
        """``chunk`` episodes are played at once (finished ones replaced by waiting ones); results are appended
        to the episode files every ``flush_every * chunk`` episodes (what an interrupted run can lose)."""
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

    def work(self, done: set[str], samples: int) -> Iterator[tuple[int, str, Any, str]]:
        """(scenario index, uid, scenario, policy_role) still to play: every scenario in both seats."""
        for si, (uid, scenario) in enumerate(self.scenarios):
            for role in self.roles:
                if any(episode_id(uid, role, g) not in done for g in range(samples)):
                    yield si, uid, scenario, role

    def run_pair(
        self, policy: Named, counterpart: Named, out: Path, samples: int = 1, progress: bool = True
    ) -> list[dict]:
        """Play ``policy`` against ``counterpart`` (``self``: the policy in both seats), appending to ``out``."""
        out.parent.mkdir(parents=True, exist_ok=True)
        episodes = read_episodes(out)
        done = {e["episode_id"] for e in episodes}
        todo = list(self.work(done, samples))
        if not todo:  # all played: no engines to start
            return episodes
        p = self.policy(policy)
        c = p if counterpart.spec == SELF else self.policy(counterpart)
        if c is not p and c.name == p.name:  # the runner batches turns by policy name: they would be merged
            raise ValueError(f"{policy.spec} and {counterpart.spec} are both named {p.name!r}; name them apart")
        bar = tqdm(
            total=len(todo) * samples, desc=f"{policy.name} vs {counterpart.name}", unit="ep", disable=not progress
        )
        bar.update(0)
        with out.open("a") as f:
            if _ends_mid_line(out):  # killed mid-write: start on a fresh line (the partial one is ignored)
                f.write("\n")
            per_run = max(1, self.chunk * self.flush_every // samples)  # scenario-seats per runner call
            for start in range(0, len(todo), per_run):
                batch = todo[start : start + per_run]
                scenarios = [(uid, scenario) for _, uid, scenario, _ in batch]
                seat_policies = [{r: (p if r == role else c) for r in self.roles} for _, _, _, role in batch]
                # the policy opens in one of its two seats and answers in the other, alternating by scenario
                seats = [self._seats(si, role) for si, _, _, role in batch]
                key = f"{self.seed}/{policy.name}/{counterpart.name}/{batch[0][1]}/{batch[0][3]}"
                seed = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
                trajs = self.runner.run(scenarios, samples, seat_policies, seed=seed, seats=seats, max_live=self.chunk)
                for (_, _, _, role), group in zip(batch, _by_scenario(trajs, samples)):
                    for t in group:
                        rec = episode_record(t, policy.name, counterpart.name, role, self.roles)
                        if rec["episode_id"] in done:
                            continue
                        f.write(json.dumps(rec) + "\n")
                        episodes.append(rec)
                f.flush()
                bar.update(len(batch) * samples)
        bar.close()
        return episodes

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
        if policy is not None and policy.engines:
            self.engines.stop(list(policy.engines))

    def _seats(self, scenario_index: int, policy_role: str) -> list[str]:
        """Seat order: agent1 opens on even scenarios, agent2 on odd ones (so each seat opens half the time)."""
        shift = scenario_index % len(self.roles)
        return self.roles[shift:] + self.roles[:shift]


def _ends_mid_line(path: Path) -> bool:
    """Whether a non-empty file's last line has no newline."""
    if path.stat().st_size == 0:
        return False
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def _by_scenario(trajs: Sequence[Trajectory], samples: int) -> Iterator[list[Trajectory]]:
    """Trajectories in the order they were requested (the runner returns them per (request, sample))."""
    for i in range(0, len(trajs), samples):
        yield list(trajs[i : i + samples])
