"""Why a DoND run learns or stalls, per iteration (issue 62, item 2): read from a finished run's directory.

For each iteration: agreement; per trained role its advantage groups and how many carry a signal
(``ROLE/informative_groups``: members of unequal reward); deals per group (of the groups of the iteration's dialogues,
by scenario and pairing: how many hold no deal, one, or more); acceptances proposed (answers to the counterpart's
``<try>`` that select its complement, the move that closes a deal) and how many of them the proposer then
confirmed; the role's KL to its reference, entropy and learning rate when it updated. Needs every dialogue in
``transcripts.jsonl`` (``--logger.transcripts -1``); with a sample the per-group counts are of the sample.

    .venv/bin/python benchmarks/demo_diagnosis.py RUN [RUN ...] [--every 5] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marti_ibrl.envs.dond.protocol import parse_utterance  # noqa: E402
from marti_ibrl.eval.figures import load_history, roles_in_history  # noqa: E402
from marti_ibrl.rollout.transcripts import TRANSCRIPTS_FILE  # noqa: E402

ACTOR = ("kl", "entropy", "actor_lr", "policy_loss", "grad_norm")
"""The actor's numbers read from the history when present (``ROLE/<name>``)."""


def moves(record: dict) -> dict[str, int]:
    """A dialogue's valid moves per role: ``ROLE/offers`` (``<try>``), ``ROLE/selections_after_try`` (a
    ``<selection>`` answering the counterpart's ``<try>``: an acceptance when it selects the try's complement, which
    the dialogue's ending tells, ``deal`` against ``selections_not_complementary``) and ``ROLE/confirmed`` (a
    ``<selection>`` answering the counterpart's selection)."""
    out: Counter = Counter()
    previous = None  # the last valid turn's (role, kind)
    for turn in record["turns"]:
        if not turn["valid"]:
            continue
        role, kind = turn["role"], parse_utterance(turn["text"]).kind
        if kind == "try":
            out[f"{role}/offers"] += 1
        elif kind == "selection" and previous is not None and previous[0] != role:
            out[f"{role}/{'confirmed' if previous[1] == 'selection' else 'selections_after_try'}"] += 1
        previous = (role, kind)
    return dict(out)


def group_deals(records: list[dict]) -> Counter:
    """Of an iteration's groups (scenario, who played each seat), how many hold 0, 1, 2-3, 4+ deals."""
    groups: dict[tuple, int] = defaultdict(int)
    for r in records:
        groups[(r["scenario_uid"], json.dumps(r["policies"], sort_keys=True))] += int(r["agreed"])
    bins: Counter = Counter()
    for n in groups.values():
        bins["0" if n == 0 else "1" if n == 1 else "2-3" if n <= 3 else "4+"] += 1
    return bins


def diagnose(run: Path) -> list[dict]:
    """One row per iteration of ``run``: the history's numbers and the transcripts' counts."""
    history = load_history(run)
    roles = roles_in_history(history)
    by_k: dict[int, list[dict]] = defaultdict(list)
    path = run / TRANSCRIPTS_FILE
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                by_k[int(r["iteration"])].append(r)
    rows = []
    for m in history:
        k = int(m["iteration"])
        recs = by_k.get(k, [])
        row = {"iteration": k, "agreement": m["rollout/agreement"], "malformed": m["rollout/malformed"]}
        row["kept"] = len(recs)
        row["groups_by_deals"] = dict(group_deals(recs))
        counts: Counter = Counter()
        for r in recs:
            counts.update(moves(r))
        reasons = Counter(r["reason"] for r in recs)
        row["endings"] = dict(reasons)
        for role in roles:
            row[role] = {
                "updated": bool(m.get(f"{role}/updated")),
                "groups": m.get(f"{role}/groups"),
                "informative": m.get(f"{role}/informative_groups"),
                "reward": m.get(f"{role}/reward"),
                "offers": counts.get(f"{role}/offers", 0),
                "selections_after_try": counts.get(f"{role}/selections_after_try", 0),
                "confirmed": counts.get(f"{role}/confirmed", 0),
                **{a: m.get(f"{role}/{a}") for a in ACTOR},
            }
        rows.append(row)
    return rows


def _f(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def table(run: Path, rows: list[dict], every: int) -> str:
    roles = [k for k in rows[0] if isinstance(rows[0][k], dict) and "updated" in rows[0][k]]
    head = ["it", "agree", "malf", "groups 0/1/2-3/4+ deals", "endings (deal/mismatch/limit/other)"]
    for r in roles:
        head += [f"{r}: inf/grp", "offers", "sel-after-try", "confirmed", "kl", "entropy", "lr"]
    lines = [f"## {run}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        if row["iteration"] % every and row["iteration"] != 1 and row is not rows[-1]:
            continue
        g = row["groups_by_deals"]
        e = row["endings"]
        other = sum(v for k, v in e.items() if k not in ("deal", "selections_not_complementary", "turn_limit"))
        cells = [
            str(row["iteration"]),
            f"{row['agreement']:.2f}",
            f"{row['malformed']:.2f}",
            "/".join(str(g.get(b, 0)) for b in ("0", "1", "2-3", "4+")),
            f"{e.get('deal', 0)}/{e.get('selections_not_complementary', 0)}/{e.get('turn_limit', 0)}/{other}",
        ]
        for r in roles:
            x = row[r]
            inf = f"{_f(x['informative'], '.0f')}/{_f(x['groups'], '.0f')}" if x["updated"] else "-"
            cells += [
                inf,
                str(x["offers"]),
                str(x["selections_after_try"]),
                str(x["confirmed"]),
                _f(x["kl"], ".4f") if x["updated"] else "-",
                _f(x["entropy"], ".3f") if x["updated"] else "-",
                _f(x["actor_lr"], ".1e") if x["updated"] else "-",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (RUN/trainer_state.json, transcripts.jsonl)")
    p.add_argument("--every", type=int, default=1, help="print every N-th iteration (the first and last always)")
    p.add_argument("--json", type=Path, help="also write every row of every run here")
    args = p.parse_args()
    out = {}
    for run in args.runs:
        rows = diagnose(run)
        out[str(run)] = rows
        print(table(run, rows, args.every), end="\n\n")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
