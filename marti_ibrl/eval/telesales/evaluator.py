"""TeleSales held-out evaluation end to end (paper §5.2 "Vehicle TeleSales", Table 1; Appendix D, Tables 8-12).

For every evaluation profile the story is compiled once (Table 8, cached), then each frozen sales policy holds
``samples`` independent calls with the user simulator (three in the paper), played by the
:class:`~marti_ibrl.rollout.runner.DialogueRunner` on :class:`~.env.TeleSalesEvalEnv`
(turn-batched, at most ``concurrency`` calls in play). Every finished call is audited (Table 12, on a worker thread
while the other calls play on) and appended at once, as one JSON line, to ``OUT/episodes/POLICY.jsonl`` (written and
flushed as its audit returns, fsynced after each runner call); a rerun skips the episode ids already there
(``PROFILE|SAMPLE``), so a killed run loses only the calls in play and the audits in flight. At the end :func:`write_results` writes ``OUT/results.md`` (the
Table 1 metrics of :mod:`.metrics`: Success@n with Wilson intervals, willingness/patience
deltas, hallucination rate; how the calls ended; with several policies, a logistic GEE of per-call success against
the first, clustered by profile, Holm-adjusted), ``OUT/summary.json`` and ``OUT/success_at_n.png``.

A policy is a checkpoint (served by rollout engines, as ``marti-ibrl eval`` does; it sees its Table 15 training
format) or an endpoint (the Table 10 prompted baseline, :class:`~.agents.PromptedSalesAgent`).

Episode record (one line; the keys :func:`~.metrics.summarize` needs, and the call)::

    {"episode_id": "ts-eval-0-00003|1", "policy", "simulator", "profile_id", "sample_index", "difficulty",
     "success": bool, "outcome": "success" | "hang_up" | "turn_limit" | None (call_outcome of a rule ending),
     "reason": "success" | "hang_up" | "agent_end" | "turn_limit" | "malformed" | "context_limit"
               | "counterpart_failure" | "story_failure",
     "failed": bool, "failure": {"role", "kind", "detail"} | None, "malformed": bool, "truncated": bool,
     "n_turns", "initial_state": {w, t, p}, "final_state": {w, t, p} | None (None when failed),
     "trace": [{"rubric_hits", "willingness", "trust", "patience", "intent", "action"}, ...],
     "tool_calls": [...], "agent_actions": [...], "transcript": [{"role", "text", "valid", "resamples"}, ...],
     "audit": Table 12 labels | None, "audit_error": str | None}

``failed`` episodes (the simulator, or the story compiler, failed after the client's retries; the sales endpoint
unreachable) count as no success and stay in every Success@n denominator, with their reason; they are not audited.
``--retry-failed`` plays them again on a rerun (the newest record of an episode id wins).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from marti_ibrl.envs.telesales.profiles import profile_id
from marti_ibrl.eval.episodes import read_episodes, resume_episodes
from marti_ibrl.eval.telesales.agents import Auditor, PromptedSalesAgent, UserSimulator, compile_stories
from marti_ibrl.eval.telesales.env import EvalCase, TeleSalesEvalEnv
from marti_ibrl.eval.telesales.metrics import summarize, table_markdown
from marti_ibrl.eval.telesales.outputs import StoryCache
from marti_ibrl.eval.telesales.rubric import SCORES
from marti_ibrl.llm import AsyncChatClient, ChatFailure
from marti_ibrl.progress import bar as progress_bar
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.rollout.runner import COUNTERPART_FAILURE, DialogueRunner, Policy, requests

EPISODES, RESULTS, SUMMARY, FIGURE = "episodes", "results.md", "summary.json", "success_at_n.png"
STORY_FAILURE = "story_failure"
REASONS = ("success", "hang_up", "agent_end", "turn_limit", "malformed", "context_limit", COUNTERPART_FAILURE,
           STORY_FAILURE)  # fmt: skip


def episode_id(profile: str, sample: int) -> str:
    return f"{profile}|{sample}"


def load_episodes(path: Path) -> dict[str, dict]:
    """episode_id -> record of a JSONL file, the newest line of an id winning (a truncated last line is ignored)."""
    return {rec["episode_id"]: rec for rec in read_episodes(path)}


def _initial(profile: dict) -> dict[str, float]:
    return {s: float(profile["runtime_state"]["initial_state"][s]) for s in SCORES}


def episode_record(
    traj: Trajectory, policy: str, simulator: str, audit: Any = None, audit_error: str | None = None
) -> dict[str, Any]:
    """One JSONL line for a finished call (module doc); ``audit`` a Table 12 :class:`~.outputs.Audit` or None."""
    info = traj.outcome.info
    profile = traj.scenario.profile
    failed = info["reason"] == COUNTERPART_FAILURE
    return {
        "episode_id": episode_id(traj.scenario_uid, traj.sample_index),
        "policy": policy,
        "simulator": simulator,
        "profile_id": traj.scenario_uid,
        "sample_index": traj.sample_index,
        "difficulty": profile["case_control"].get("difficulty"),
        "success": bool(traj.outcome.agreed) and not failed,
        "outcome": info["outcome"],
        "reason": info["reason"],
        "failed": failed,
        "failure": info["failure"] if failed or traj.outcome.malformed else None,
        "malformed": bool(traj.outcome.malformed),
        "truncated": bool(traj.truncated),
        "n_turns": info["n_turns"],
        "initial_state": info["initial"],
        "final_state": None if failed else info["final"],
        "trace": info["trace"],
        "tool_calls": info["tool_calls"],
        "agent_actions": info["agent_actions"],
        "transcript": [
            {"role": t.role, "text": t.text, "valid": t.valid, "resamples": t.resamples} for t in traj.turns
        ],
        "audit": dataclasses.asdict(audit) if audit is not None else None,
        "audit_error": audit_error,
    }


def story_failure_record(
    profile: dict, sample: int, policy: str, simulator: str, failure: ChatFailure
) -> dict[str, Any]:
    """A failed episode for a profile whose story could not be compiled (nothing was played)."""
    uid = profile_id(profile)
    return {
        "episode_id": episode_id(uid, sample),
        "policy": policy,
        "simulator": simulator,
        "profile_id": uid,
        "sample_index": sample,
        "difficulty": profile["case_control"].get("difficulty"),
        "success": False,
        "outcome": None,
        "reason": STORY_FAILURE,
        "failed": True,
        "failure": {"role": "story_compiler", "kind": failure.kind, "detail": f"story compiler: {failure}"},
        "malformed": False,
        "truncated": False,
        "n_turns": 0,
        "initial_state": _initial(profile),
        "final_state": None,
        "trace": [],
        "tool_calls": [],
        "agent_actions": [],
        "transcript": [],
        "audit": None,
        "audit_error": None,
    }


class TeleSalesEvaluator:
    """Plays sales policies against one user simulator on a fixed list of evaluation profiles (module doc).

    ``engines``: a :class:`~marti_ibrl.backend.stack.FrozenEngines` for checkpoints (None: endpoints only).
    ``sampling``: the policy's sampling (temperature, top_p, max_new_tokens; engines and endpoints alike).
    ``batch``: episodes per runner call (its sampling seed; default ``4 * concurrency``); each call is written as it ends.
    """

    def __init__(
        self,
        profiles: Sequence[dict],
        stories: StoryCache,
        compiler: AsyncChatClient,
        simulator: UserSimulator,
        auditor: Auditor | None,
        *,
        samples: int = 3,
        concurrency: int = 16,
        batch: int | None = None,
        seed: int = 0,
        lang: str = "en",
        max_turns: int | None = None,
        sampling: Mapping[str, Any] | None = None,
        compiler_sampling: Mapping[str, Any] | None = None,
        max_len: int = 4096,
        max_resamples: int = 2,
        engines: Any = None,
        retry_failed: bool = False,
        progress: bool = True,
    ) -> None:
        if samples < 1 or concurrency < 1 or (batch is not None and batch < 1):
            raise ValueError(f"samples, concurrency and batch must be >= 1, got {samples}, {concurrency}, {batch}")
        self.profiles = list(profiles)
        self.cache, self.compiler, self.simulator, self.auditor = stories, compiler, simulator, auditor
        self.samples, self.concurrency = samples, concurrency
        self.batch = batch or 4 * concurrency
        self.seed, self.lang, self.max_turns = seed, lang, max_turns
        self.sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 256, **(sampling or {})}
        self.compiler_sampling = dict(compiler_sampling or {})
        self.max_len, self.max_resamples = max_len, max_resamples
        self.engines, self.retry_failed, self.progress = engines, retry_failed, progress
        self._stories: dict[str, Any] = {}

    # -- stories -------------------------------------------------------------------------------------------------

    def stories(self, profiles: Sequence[dict]) -> dict[str, Any]:
        """sample_id -> Story or ChatFailure for ``profiles`` (compiled once per run, cached on disk)."""
        missing = [p for p in profiles if profile_id(p) not in self._stories]
        if missing:
            got = compile_stories(missing, self.cache, self.compiler, self.compiler_sampling, self.progress)
            self._stories.update(got)
        return {profile_id(p): self._stories[profile_id(p)] for p in profiles}

    # -- one policy ----------------------------------------------------------------------------------------------

    def run_policy(self, name: str, sales: PromptedSalesAgent | str, out: Path) -> dict[str, dict]:
        """Play policy ``name`` (a prompted endpoint agent, or a checkpoint directory) on every profile, ``samples``
        calls each, appending to ``out``; returns every record of ``out`` (episode_id -> record)."""
        out.parent.mkdir(parents=True, exist_ok=True)
        records = {rec["episode_id"]: rec for rec in resume_episodes(out)}  # (a line torn by a crash moved aside)
        done = {eid for eid, rec in records.items() if not (self.retry_failed and rec["failed"])}
        todo = [p for p in self.profiles if any(episode_id(profile_id(p), g) not in done for g in range(self.samples))]
        if not todo:
            return records
        stories = self.stories(todo)
        playable = [p for p in todo if not isinstance(stories[profile_id(p)], ChatFailure)]
        bar = progress_bar(total=len(todo) * self.samples, desc=name, unit="call", disable=not self.progress)
        policy, env = self._policy(name, sales) if playable else (None, None)
        try:
            with out.open("a", encoding="utf-8") as f:
                for p in todo:
                    failure = stories[profile_id(p)]
                    if isinstance(failure, ChatFailure):
                        for g in range(self.samples):
                            self._write(
                                f, records, done, story_failure_record(p, g, name, self.simulator.name, failure)
                            )
                        bar.update(self.samples)
                f.flush()
                if policy is None:
                    return records
                per_run = max(1, self.batch // self.samples)
                runner = DialogueRunner(env, {}, self.sampling, self.max_len, self.max_resamples)
                seats = {"sales": policy, "customer": Policy(self.simulator.name, player=self.simulator)}
                lock = threading.Lock()

                def finish(traj: Trajectory) -> None:  # a call ended: audited (on a worker), then on disk at once
                    [rec] = self._records(env, [traj], name)
                    with lock:
                        self._write(f, records, done, rec)
                        f.flush()

                with ThreadPoolExecutor(self.concurrency, thread_name_prefix="audit") as audits:
                    for start in range(0, len(playable), per_run):
                        chunk = playable[start : start + per_run]
                        cases = [(profile_id(p), EvalCase(p, stories[profile_id(p)])) for p in chunk]
                        key = f"{self.seed}/{name}/{cases[0][0]}"
                        seed = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
                        ended: list[Future] = []
                        runner.run(
                            requests(cases, seats),
                            self.samples,
                            seed=seed,
                            max_live=self.concurrency,
                            on_done=lambda i, traj, ended=ended: ended.append(audits.submit(finish, traj)),
                        )
                        for future in ended:  # this call's audits are in (and an error in one surfaces here)
                            future.result()
                        os.fsync(f.fileno())
                        bar.update(len(chunk) * self.samples)
        finally:
            bar.close()
            if policy is not None and policy.engines:
                self.engines.stop(list(policy.engines))
        return records

    def _policy(self, name: str, sales: PromptedSalesAgent | str) -> tuple[Policy, TeleSalesEvalEnv]:
        if isinstance(sales, PromptedSalesAgent):
            env = TeleSalesEvalEnv("prompted", self.lang, max_turns=self.max_turns)
            return Policy(name, player=sales), env
        from transformers import AutoTokenizer

        if self.engines is None:
            raise ValueError(f"{name}: no engine factory to serve the checkpoint {sales}")
        env = TeleSalesEvalEnv("checkpoint", self.lang, max_turns=self.max_turns)
        tokenizer = AutoTokenizer.from_pretrained(str(sales))  # before the engines: nothing to stop if it fails
        return Policy(name, self.engines.start(str(sales)), tokenizer), env

    def _records(self, env: TeleSalesEvalEnv, trajs: Sequence[Trajectory], name: str) -> list[dict]:
        """Episode records of finished calls, audited (failed calls are not)."""
        audited = [t for t in trajs if t.outcome.info["reason"] != COUNTERPART_FAILURE and t.turns]
        audits: dict[int, Any] = {}
        if self.auditor is not None and audited:
            calls = [(t.scenario.profile, Auditor.dialogue(env, t)) for t in audited]
            audits = dict(zip(map(id, audited), self.auditor.audit_many(calls)))
        out = []
        for t in trajs:
            audit = audits.get(id(t))
            if isinstance(audit, ChatFailure):
                out.append(episode_record(t, name, self.simulator.name, None, f"auditor: {audit}"))
            else:
                out.append(episode_record(t, name, self.simulator.name, audit))
        return out

    @staticmethod
    def _write(f: Any, records: dict[str, dict], done: set[str], rec: dict) -> None:
        if rec["episode_id"] in done:
            return
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        records[rec["episode_id"]] = rec
        done.add(rec["episode_id"])


# ---- results ----
def current_records(records: Mapping[str, dict], profiles: Sequence[dict], samples: int) -> list[dict]:
    """The records of this evaluation: the given profiles, sample indices below ``samples``."""
    wanted = {episode_id(profile_id(p), g) for p in profiles for g in range(samples)}
    return [rec for eid, rec in records.items() if eid in wanted]


def write_results(out: Path, runs: Mapping[str, Sequence[dict]], meta: Mapping[str, Any]) -> str:
    """``results.md``, ``summary.json`` and the Success@n figure for ``{policy: records}``; returns the markdown."""
    summaries: dict[str, dict] = {}
    problems: dict[str, str] = {}
    for name, recs in runs.items():
        try:
            summaries[name] = summarize(recs)
        except ValueError as e:  # e.g. an interrupted run: profiles with fewer calls than the others
            problems[name] = str(e)
    lines = [
        "# TeleSales held-out evaluation",
        "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        "",
        table_markdown(summaries) if summaries else "(no complete results)\n",
    ]
    lines += [f"- {name}: incomplete ({why})" for name, why in problems.items()]
    lines += ["", "How the calls ended (episodes):", "", "| policy | " + " | ".join(REASONS) + " |"]
    lines.append("|" + "---|" * (len(REASONS) + 1))
    for name, recs in runs.items():
        counts = Counter(rec["reason"] for rec in recs)
        lines.append(f"| {name} | " + " | ".join(str(counts.get(r, 0)) for r in REASONS) + " |")
    lines += ["", *significance(runs, [n for n in runs if n in summaries])]
    markdown = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS).write_text(markdown, encoding="utf-8")
    summary = {"meta": dict(meta), "policies": summaries, "incomplete": problems}
    (out / SUMMARY).write_text(json.dumps(summary, indent=1, ensure_ascii=False), encoding="utf-8")
    if summaries:
        plot_success(summaries, out / FIGURE)
    return markdown


def significance(runs: Mapping[str, Sequence[dict]], policies: Sequence[str]) -> list[str]:
    """Markdown lines: every policy's per-call success against the first one's, a logistic GEE clustered by profile
    with Holm-adjusted p-values (§5.2; :func:`marti_ibrl.eval.stats.compare`). Failed calls count as no success,
    as in Success@n. Nothing for fewer than two complete policies; a model that cannot be fitted is reported."""
    if len(policies) < 2:
        return []
    import pandas as pd

    from marti_ibrl.eval.stats import compare, format_table

    rows = [
        {"policy": name, "profile_id": rec["profile_id"], "success": int(bool(rec["success"]))}
        for name in policies
        for rec in runs[name]
    ]
    head = [f"Per-call success vs {policies[0]} (logistic GEE clustered by profile, Holm-adjusted):", ""]
    try:
        table = compare(pd.DataFrame(rows), policies[0], outcome="success", method="policy", cluster="profile_id")
    except (ValueError, ArithmeticError) as e:  # e.g. no success at all: the odds ratio is not estimable
        return [*head, f"(not estimable: {e})"]
    return [*head, format_table(table)]


def plot_success(summaries: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Grouped bars: Success@1..k per policy with their 95% Wilson intervals."""
    import numpy as np

    from marti_ibrl.eval.figures import _figure, _save

    k = max(s["k"] for s in summaries.values())
    names = list(summaries)
    fig = _figure((max(5.0, 1.2 * len(names) * k / 2 + 2.5), 4.0))
    ax = fig.add_subplot()
    width = 0.8 / k
    x = np.arange(len(names))
    for n in range(1, k + 1):
        rates = [summaries[p].get(f"success@{n}", float("nan")) for p in names]
        cis = [summaries[p].get(f"success@{n}_ci") or (r, r) for p, r in zip(names, rates)]
        err = np.array([[r - lo for r, (lo, _) in zip(rates, cis)], [hi - r for r, (_, hi) in zip(rates, cis)]])
        ax.bar(x + (n - 1 - (k - 1) / 2) * width, rates, width, yerr=err, capsize=3, label=f"Success@{n}")
    ax.set_xticks(x, names, rotation=20 if len(names) > 3 else 0, ha="right" if len(names) > 3 else "center")
    ax.set_ylim(0, 1)
    ax.set_ylabel("fraction of profiles")
    ax.set_title("TeleSales held-out: Success@n (95% Wilson intervals)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return _save(fig, path)
