"""Why a DoND run learns or stalls, per window of iterations (issue 62, item 2), read from finished runs.

Per window: agreement; the iteration's groups by their deals (scenario x who played: none / one / more); and per
role: how many of its advantage groups carry a signal (``ROLE/informative_groups``: members of unequal reward), how
often it answers the counterpart's ``<try>`` with a ``<selection>`` (``sel``) and how often that selection is
exactly the try's complement (``exact``: the units the try leaves it, which ``--env.show_complement`` prints after
the try; anything else ends the dialogue without a deal), its KL to its reference, ``-log π`` of its sampled tokens
(``ROLE/sampled_nll``, an estimate of its per-token entropy) and its learning rate. Needs every dialogue in
``transcripts.jsonl`` (``--logger.transcripts -1``); with a sample the counts are of the sample.

    .venv/bin/python benchmarks/demo_diagnosis.py RUN [RUN ...] [--window 5] [--json OUT.json]

``--json`` keeps, per run, its training settings, the windows and its per-iteration agreement and malformed rates
(``benchmarks/results/demo_tuning/``: the tuning runs behind the demo's recipe).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from statistics import mean

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marti_ibrl.config import load_config  # noqa: E402
from marti_ibrl.envs import make_env  # noqa: E402
from marti_ibrl.envs.dond.protocol import parse_utterance  # noqa: E402
from marti_ibrl.eval.figures import load_history, roles_in_history  # noqa: E402
from marti_ibrl.rollout.transcripts import TRANSCRIPTS_FILE  # noqa: E402

ACTOR = ("informative_groups", "kl", "sampled_nll", "actor_lr")
"""Per-role numbers read from the history (``ROLE/<name>``), averaged over the iterations the role updated."""


def answers(record: dict, counts: tuple[int, ...]) -> Counter:
    """Per answering role: ``ROLE/answers`` (valid turns right after the counterpart's ``<try>``), ``ROLE/sel``
    (those that are a ``<selection>``) and ``ROLE/exact`` (a selection of exactly the try's complement)."""
    out: Counter = Counter()
    turns = [(t["role"], parse_utterance(t["text"])) for t in record["turns"] if t["valid"]]
    for (before, offer), (role, act) in zip(turns, turns[1:]):
        if offer.kind != "try" or before == role:
            continue
        out[f"{role}/answers"] += 1
        if act.kind == "selection":
            out[f"{role}/sel"] += 1
            out[f"{role}/exact"] += act.alloc == tuple(c - a for c, a in zip(counts, offer.alloc, strict=True))
    return out


def scenario_counts(run: Path) -> dict[str, tuple[int, ...]]:
    """Each training scenario's item counts, made again from the run's own config (the env and its seed)."""
    cfg = load_config(["--config", str(run / "config.yaml")], assumed=[])
    _, scenarios = make_env(cfg.env, cfg.train.seed)
    return {s.uid: tuple(s.counts) for _, s in scenarios}


def diagnose(run: Path, window: int) -> list[dict]:
    """One row per window of ``window`` iterations of ``run``."""
    history = load_history(run)
    roles = roles_in_history(history)
    counts = scenario_counts(run)
    by_k: dict[int, list[dict]] = defaultdict(list)
    path = run / TRANSCRIPTS_FILE
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                by_k[int(r["iteration"])].append(r)
    rows = []
    for start in range(0, len(history), window):
        ms = history[start : start + window]
        ks = [int(m["iteration"]) for m in ms]
        recs = [r for k in ks for r in by_k.get(k, [])]
        groups: dict[tuple, int] = defaultdict(int)
        moves: Counter = Counter()
        for r in recs:
            groups[(r["iteration"], r["scenario_uid"], json.dumps(r["policies"], sort_keys=True))] += int(r["agreed"])
            moves.update(answers(r, counts[r["scenario_uid"]]))
        row = {
            "iterations": [ks[0], ks[-1]],
            "agreement": mean(m["rollout/agreement"] for m in ms),
            "malformed": mean(m["rollout/malformed"] for m in ms),
            "dialogues_kept": len(recs),
            "groups_by_deals": {
                b: sum(1 for n in groups.values() if (n == 0, n == 1, n > 1)[i])
                for i, b in enumerate(("none", "one", "more"))
            },
        }
        for role in roles:
            updated = [m for m in ms if m.get(f"{role}/updated")]
            row[role] = {
                "updates": len(updated),
                "answers": moves[f"{role}/answers"],
                "sel": moves[f"{role}/sel"] / max(moves[f"{role}/answers"], 1),
                "exact": moves[f"{role}/exact"] / max(moves[f"{role}/sel"], 1),
                **{
                    a: mean(m[f"{role}/{a}"] for m in updated) if updated and f"{role}/{a}" in updated[0] else None
                    for a in ACTOR
                },  # fmt: skip
            }
        rows.append(row)
    return rows


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(run: Path, rows: list[dict]) -> str:
    roles = [k for k, v in rows[0].items() if isinstance(v, dict) and "updates" in v]
    head = ["iterations", "agree", "malf", "groups: no deal / one / more"]
    for r in roles:
        head += [f"{r}: informative groups", "sel", "exact", "kl", "-log π", "lr"]
    lines = [f"## {run}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        g = row["groups_by_deals"]
        cells = [
            "{}-{}".format(*row["iterations"]),
            f"{row['agreement']:.2f}",
            f"{row['malformed']:.2f}",
            f"{g['none']} / {g['one']} / {g['more']}",
        ]
        for r in roles:
            x = row[r]
            cells += [
                _f(x["informative_groups"], ".1f"),
                f"{x['sel']:.2f}",
                f"{x['exact']:.2f}",
                _f(x["kl"], ".3f"),
                _f(x["sampled_nll"], ".3f"),
                _f(x["actor_lr"], ".1e"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (RUN/trainer_state.json, transcripts.jsonl)")
    p.add_argument("--window", type=int, default=5, help="iterations per row (default 5)")
    p.add_argument("--json", type=Path, help="also write every row of every run here")
    args = p.parse_args()
    out = {}
    for run in args.runs:
        rows = diagnose(run, args.window)
        cfg = json.loads(json.dumps(OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))))
        keep = ("iteration", "rollout/agreement", "rollout/malformed")
        out[run.name if run.name != "ibrl" else run.parent.name] = {
            "config": {k: cfg.get(k) for k in ("train", "roles", "rollout")},
            "windows": rows,
            "history": [{k: m[k] for k in keep} for m in load_history(run)],
        }
        print(table(run, rows), end="\n\n")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
