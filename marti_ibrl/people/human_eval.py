"""``marti-ibrl eval --human-db FILE --out DIR``: the Deal-or-No-Deal games people played (``marti-ibrl play``) as
an evaluation directory, with the automatic evaluation's tables and statistics.

Each finished game becomes one episode record of :func:`marti_ibrl.eval.evaluator.episode_record`'s layout, with the
person as the counterpart ``human`` and ``participant`` added, in ``DIR/episodes/POLICY__human.jsonl`` (pair kind
``held-out``). Then the evaluation's own code: ``tables.md`` / ``summary.json``
(:func:`~marti_ibrl.eval.report.write_tables`: agreement / own utility / joint value, seat-averaged) and, with at
least two policies, the logistic GEE of :func:`~marti_ibrl.eval.report.gee_markdown` twice, clustered by participant
and by scenario (``statistics.md``). Abandoned games are left out (they are neither a deal nor a no-deal); a game
the policy ended with a malformed turn counts as no deal, a policy that failed to answer as ``failed``, as in the
automatic evaluation.

The finished TeleSales calls (the person as the customer) become ``telesales eval`` episode records
(:func:`marti_ibrl.eval.telesales.evaluator.episode_record`, simulator ``human``, ``participant`` added; a profile's
calls with one policy are its samples) in ``DIR/telesales/episodes/POLICY__human.jsonl``, and ``DIR/telesales/
results.md`` is :func:`~marti_ibrl.eval.telesales.evaluator.write_results`' Table 1 (Success@n with Wilson intervals,
how the calls ended, the GEE of per-call success clustered by profile). A person's turn carries no rubric code, so
the willingness / patience deltas are 0 by construction. These episode files are also what ``marti-ibrl annotate``
reads: people's own calls can be annotated blind too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from marti_ibrl.people.store import FINISHED, Store

HUMAN = "human"
ROLES = ("agent1", "agent2")


def dond_episodes(store: Store) -> list[dict[str, Any]]:
    """The finished DoND games as episode records (oldest first)."""
    out = []
    for g in store.games("dond", FINISHED):
        o = g["outcome"]
        out.append({
            "episode_id": f"human-{g['id']}",
            "scenario_uid": g["scenario_uid"],
            "scenario": g["scenario"],
            "roles": list(ROLES),
            "policy": g["policy"],
            "counterpart": HUMAN,
            "participant": g["participant"],
            "policy_role": g["policy_role"],
            "seats": g["seats"],
            "sample_index": 0,
            "policies": {g["policy_role"]: g["policy"], g["human_role"]: HUMAN},
            "transcript": [{k: t[k] for k in ("role", "text", "valid", "resamples")} for t in g["turns"]],
            "agreed": bool(o["agreed"]),
            "malformed": bool(o["malformed"]),
            "failed": bool(o["failed"]),
            "truncated": False,
            "reason": o["info"]["reason"],
            "utilities": o["utilities"],
            "allocations": o["info"]["allocations"],
            "rewards": {},
            "created": g["created"],
            "ended": g["ended"],
        })  # fmt: skip
    return out


def telesales_records(store: Store) -> list[dict[str, Any]]:
    """The finished TeleSales calls as ``telesales eval`` episode records (oldest first), replayed through the
    environment the call was played in."""
    from marti_ibrl.eval.telesales.env import EvalCase
    from marti_ibrl.eval.telesales.evaluator import episode_record
    from marti_ibrl.people.games import COUNTERPART_FAILURE, PERSON_STORY, HumanCallEnv
    from marti_ibrl.rollout.dialogue import Trajectory, Turn

    env, samples, out = HumanCallEnv(), {}, []
    for g in store.games("telesales", FINISHED):
        case = EvalCase(g["scenario"], PERSON_STORY)
        sample = samples[g["policy"], case.uid] = samples.get((g["policy"], case.uid), -1) + 1
        traj = Trajectory(scenario_uid=case.uid, scenario=case, seats=g["seats"], sample_index=sample,
                          policies={g["policy_role"]: g["policy"], g["human_role"]: HUMAN})  # fmt: skip
        state = env.new_state(case, g["seats"])
        for t in g["turns"]:
            if t["valid"]:
                env.step(state, t["role"], t["text"])
            else:
                env.finish_malformed(state, t["role"])
            traj.turns.append(Turn(t["role"], t["text"], [], [], t["valid"], t["resamples"]))
        if not state.done:  # the policy gave no turn (an endpoint after its retries)
            env.abort(state, COUNTERPART_FAILURE)
        traj.state, traj.outcome = state, env.outcome(state)
        out.append({**episode_record(traj, g["policy"], HUMAN), "participant": g["participant"]})
    return out


def write_human_eval(db: str | Path, out: str | Path, reference: str | None = None) -> str:
    """Write the evaluation directory ``out`` from the database ``db``; the markdown of its tables and statistics."""
    db, out = Path(db), Path(out)
    if not db.is_file():
        raise FileNotFoundError(f"{db}: no such database (made by `marti-ibrl play --db FILE`)")
    store = Store(db)
    episodes, calls = dond_episodes(store), telesales_records(store)
    if not episodes and not calls:
        raise ValueError(f"{db}: no finished game")
    parts = []
    if episodes:
        parts.append(_dond(episodes, out, reference))
    if calls:
        from marti_ibrl.eval.telesales.evaluator import write_results

        runs: dict[str, list[dict]] = {}
        for rec in calls:
            runs.setdefault(rec["policy"], []).append(rec)
        (out / "telesales" / "episodes").mkdir(parents=True, exist_ok=True)
        for policy, recs in runs.items():
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
            (out / "telesales" / "episodes" / f"{policy}__{HUMAN}.jsonl").write_text(text, encoding="utf-8")
        meta = {"customers": f"people (`marti-ibrl play`, {db.name})", "calls": len(calls)}
        parts.append(write_results(out / "telesales", runs, meta))
    return "\n".join(parts)


def _dond(episodes: list[dict[str, Any]], out: Path, reference: str | None) -> str:
    """The DoND evaluation directory (module doc); its markdown."""
    from marti_ibrl.eval.report import gee_markdown, load_pairs, write_tables

    (out / "episodes").mkdir(parents=True, exist_ok=True)
    pairs = []
    for policy in dict.fromkeys(e["policy"] for e in episodes):
        name = f"{policy}__{HUMAN}.jsonl"
        mine = [e for e in episodes if e["policy"] == policy]
        (out / "episodes" / name).write_text("".join(json.dumps(e) + "\n" for e in mine))
        pairs.append({"policy": policy, "counterpart": HUMAN, "kind": "held-out", "file": name})
    (out / "pairs.json").write_text(json.dumps(pairs, indent=1))
    tables = write_tables(out)
    loaded = load_pairs(out)
    stats = "\n\n".join(
        f"### Clustered by {what}\n\n" + gee_markdown(loaded, reference, cluster=cluster)
        for what, cluster in (("participant", "participant"), ("scenario", "scenario_uid"))
    )
    (out / "statistics.md").write_text(stats + "\n")
    return f"{tables}\n## Statistics (logistic GEE on agreement)\n\n{stats}\n"
