"""``marti-ibrl annotate --report``: agreement between annotators, and between each annotator and the simulator
(the paper's §5.4 table: percent agreement and Cohen's κ).

For every pair of raters (two annotators, or an annotator and ``simulator``, the recorded outcome) over the calls
both labelled: the 3 × 3 contingency table over ``yes / no / unclear`` (rows: the first rater), the percent agreement
(its diagonal share) and Cohen's κ with its asymptotic standard error and 95% confidence interval, from statsmodels'
:func:`~statsmodels.stats.inter_rater.cohens_kappa` (not recomputed here). The simulator never says ``unclear``: an
annotator's ``unclear`` is a disagreement with it.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from marti_ibrl.people.store import LABELS, Store

SIMULATOR = "simulator"


def contingency(first: Sequence[str], second: Sequence[str]) -> list[list[int]]:
    """``table[i][j]``: calls the first rater labelled ``LABELS[i]`` and the second ``LABELS[j]``."""
    if len(first) != len(second):
        raise ValueError(f"the raters labelled {len(first)} and {len(second)} calls: pair them call by call")
    table = [[0] * len(LABELS) for _ in LABELS]
    for a, b in zip(first, second, strict=True):
        table[LABELS.index(a)][LABELS.index(b)] += 1
    return table


def agreement(first: Sequence[str], second: Sequence[str]) -> dict[str, Any]:
    """``{"n", "table", "percent", "kappa", "se", "ci_low", "ci_high"}`` of two raters' labels of the same calls;
    κ and its interval are ``None`` where undefined (no calls, or both raters always giving one same label)."""
    import numpy as np
    from statsmodels.stats.inter_rater import cohens_kappa

    table = contingency(first, second)
    n = len(first)
    out: dict[str, Any] = {"n": n, "table": table, "percent": None, "kappa": None, "se": None}
    out |= {"ci_low": None, "ci_high": None}
    if n == 0:
        return out
    out["percent"] = 100.0 * sum(table[i][i] for i in range(len(LABELS))) / n
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # one label throughout: κ is 0/0, reported as None
        warnings.simplefilter("ignore", RuntimeWarning)
        res = cohens_kappa(np.asarray(table, dtype=float), return_results=True)
    if math.isfinite(res.kappa):
        out |= {"kappa": float(res.kappa), "se": float(res.std_kappa)}
        out |= {"ci_low": float(res.kappa_low), "ci_high": float(res.kappa_upp)}
    return out


def report(store: Store) -> dict[str, Any]:
    """Every annotator pair and every annotator against the simulator, on the calls both labelled."""
    sim = {c["id"]: c["simulator_label"] for c in store.calls()}
    by: dict[str, dict[str, str]] = {}
    for row in store.labels():
        by.setdefault(row["annotator"], {})[row["call_id"]] = row["label"]
    rows = []
    pairs = [*itertools.combinations(sorted(by), 2), *((a, SIMULATOR) for a in sorted(by))]
    for a, b in pairs:
        second = sim if b == SIMULATOR else by[b]
        common = sorted(set(by[a]) & set(second))
        rows.append({"first": a, "second": b, **agreement([by[a][c] for c in common], [second[c] for c in common])})
    return {"calls": len(sim), "annotators": {a: len(labels) for a, labels in sorted(by.items())}, "pairs": rows}


def _num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def report_markdown(result: Mapping[str, Any]) -> str:
    """The report as markdown: one summary table, then each pair's contingency table."""
    labelled = ", ".join(f"{a}: {n}" for a, n in result["annotators"].items()) or "none"
    lines = [
        f"{result['calls']} calls registered; labelled per annotator: {labelled}.",
        "",
        "| raters | n | agreement | Cohen's κ | 95% CI |",
        "|---|---|---|---|---|",
    ]
    for p in result["pairs"]:
        ci = f"[{_num(p['ci_low'])}, {_num(p['ci_high'])}]" if p["kappa"] is not None else "–"
        lines.append(
            f"| {p['first']} vs {p['second']} | {p['n']} | {_num(p['percent'], 1)}% | {_num(p['kappa'])} | {ci} |"
        )
    for p in result["pairs"]:
        lines += ["", f"{p['first']} (rows) vs {p['second']} (columns):", "",
                  "| | " + " | ".join(LABELS) + " |", "|---|" + "---|" * len(LABELS)]  # fmt: skip
        lines += [f"| {label} | " + " | ".join(map(str, row)) + " |" for label, row in zip(LABELS, p["table"])]
    lines += ["", "κ, its standard error and interval: statsmodels.stats.inter_rater.cohens_kappa (asymptotic)."]
    return "\n".join(lines) + "\n"
