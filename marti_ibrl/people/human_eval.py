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


def write_human_eval(db: str | Path, out: str | Path, reference: str | None = None) -> str:
    """Write the evaluation directory ``out`` from the database ``db``; the markdown of its tables and statistics."""
    from marti_ibrl.eval.report import gee_markdown, load_pairs, write_tables

    db, out = Path(db), Path(out)
    if not db.is_file():
        raise FileNotFoundError(f"{db}: no such database (made by `marti-ibrl play --db FILE`)")
    episodes = dond_episodes(Store(db))
    if not episodes:
        raise ValueError(f"{db}: no finished Deal-or-No-Deal game")
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
