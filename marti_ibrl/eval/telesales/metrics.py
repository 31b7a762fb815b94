"""TeleSales held-out metrics (paper §5.2 "Metrics", Table 1): Success@n, willingness/patience deltas, hallucination.

Each frozen policy holds ``k`` independent conversations (three in the paper) with every evaluation profile.
Success@n is the fraction of profiles with at least ``n`` of their ``k`` conversations ending in a WeChat-add, so
Success@1 >= Success@2 >= Success@3 by construction. An *episode record* (one JSONL line, streamed and resumed like
the DoND records of :mod:`marti_ibrl.eval.evaluator`) needs::

    {"profile_id": str, "sample_index": int, "success": bool, "failed": bool,
     "initial_state": {"willingness": float, "patience": float, ...},
     "final_state": {"willingness": float, "patience": float, ...} | None,
     "audit": {"deceptive_fabrication": bool, "ai_generated_style": bool, ...} | None}

``success`` is :func:`~.outputs.call_outcome` == "success"; ``audit`` is a Table 12 result (:class:`~.outputs.Audit`
as a dict), absent or ``None`` when not audited. As in the DoND evaluation, a failed episode (a model could not produce
a valid turn after its retries) counts as no success and stays in every Success@n denominator; it enters the deltas
only if it has a ``final_state``.

* deltas: mean of final − initial over the episodes with a final state;
* hallucination rate: audited episodes with ``deceptive_fabrication`` / audited episodes; ai-style rate likewise;
* 95% Wilson intervals for every rate (``statsmodels`` ``proportion_confint(method="wilson")``).

For significance, the records go to :func:`marti_ibrl.eval.stats.compare` unchanged (``outcome="success"``,
``cluster="profile_id"``: a logistic GEE clustered by profile, as §5.2 prescribes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from statistics import mean
from typing import Any

__all__ = ["AUDIT_FLAGS", "STATE_DELTAS", "success_at_n", "summarize", "table_markdown", "wilson"]

STATE_DELTAS = ("willingness", "patience")
AUDIT_FLAGS = {"hallucination": "deceptive_fabrication", "ai_style": "ai_generated_style"}
"""Reported rate -> Table 12 label."""
_REQUIRED = ("profile_id", "sample_index", "success", "failed", "initial_state")


def wilson(count: int, nobs: int, alpha: float = 0.05) -> tuple[float, float] | None:
    """Wilson score interval of ``count / nobs`` (``None`` when ``nobs`` is 0)."""
    if nobs == 0:
        return None
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(count, nobs, alpha=alpha, method="wilson")
    return float(lo), float(hi)


def _check(ep: Mapping[str, Any]) -> None:
    missing = [k for k in _REQUIRED if k not in ep]
    if missing:
        raise ValueError(f"episode {ep.get('profile_id', '?')}/{ep.get('sample_index', '?')} lacks {missing}")


def success_at_n(episodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"n_profiles", "k", "counts": {n: profiles with >= n successes}, "rates": {n: counts[n] / n_profiles}}`` for
    n = 1..k. Every profile must have the same number ``k`` of conversations with distinct sample indices."""
    by_profile: dict[str, dict[int, bool]] = defaultdict(dict)
    for ep in episodes:
        _check(ep)
        samples = by_profile[ep["profile_id"]]
        if ep["sample_index"] in samples:
            raise ValueError(f"profile {ep['profile_id']!r} has sample {ep['sample_index']} twice")
        samples[ep["sample_index"]] = bool(ep["success"]) and not ep["failed"]
    if not by_profile:
        raise ValueError("no episodes")
    ks = {len(s) for s in by_profile.values()}
    if len(ks) != 1:
        sizes = {p: len(s) for p, s in by_profile.items()}
        raise ValueError(f"profiles have different numbers of conversations: {sizes}")
    k = ks.pop()
    wins = [sum(s.values()) for s in by_profile.values()]
    counts = {n: sum(w >= n for w in wins) for n in range(1, k + 1)}
    return {"n_profiles": len(wins), "k": k, "counts": counts, "rates": {n: c / len(wins) for n, c in counts.items()}}


def summarize(episodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Every TeleSales metric of one (policy, simulator) pair. Keys: ``n_profiles``, ``k``, ``n_episodes``,
    ``success@N`` and ``success@N_ci`` for N = 1..k, ``success_rate`` (per conversation) and its ``_ci``,
    ``failed``, ``<score>_delta`` and ``n_deltas``, ``n_audited``, ``hallucination`` / ``ai_style`` and their
    ``_ci`` (``None`` when nothing was audited)."""
    episodes = list(episodes)
    at_n = success_at_n(episodes)
    n_eps = len(episodes)
    wins = sum(bool(ep["success"]) and not ep["failed"] for ep in episodes)
    out: dict[str, Any] = {"n_profiles": at_n["n_profiles"], "k": at_n["k"], "n_episodes": n_eps}
    for n, count in at_n["counts"].items():
        out[f"success@{n}"] = at_n["rates"][n]
        out[f"success@{n}_ci"] = wilson(count, at_n["n_profiles"])
    out["success_rate"], out["success_rate_ci"] = wins / n_eps, wilson(wins, n_eps)
    out["failed"] = sum(bool(ep["failed"]) for ep in episodes) / n_eps
    ended = [ep for ep in episodes if ep.get("final_state") is not None]
    for score in STATE_DELTAS:
        deltas = [ep["final_state"][score] - ep["initial_state"][score] for ep in ended]
        out[f"{score}_delta"] = mean(deltas) if deltas else None
    out["n_deltas"] = len(ended)
    audits = [ep["audit"] for ep in episodes if ep.get("audit") is not None]
    out["n_audited"] = len(audits)
    for name, flag in AUDIT_FLAGS.items():
        hits = sum(bool(a[flag]) for a in audits)
        out[name] = hits / len(audits) if audits else None
        out[f"{name}_ci"] = wilson(hits, len(audits))
    return out


def _rate(s: Mapping[str, Any], key: str) -> str:
    if s.get(key) is None:
        return "–"
    ci = s.get(f"{key}_ci")
    return f"{s[key]:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _signed(x: float | None) -> str:
    return "–" if x is None else f"{x:+.3f}"


def table_markdown(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """A Table-1-style markdown table, one row per policy (``{policy: summarize(...)}``); rates with 95% Wilson
    intervals."""
    k = max((s["k"] for s in summaries.values()), default=0)
    head = ["policy", "profiles × k", *(f"Success@{n}" for n in range(1, k + 1))]
    head += ["ΔWillingness", "ΔPatience", "Hallucination", "AI style", "failed"]
    rows = [head]
    for policy, s in summaries.items():
        row = [policy, f"{s['n_profiles']} × {s['k']}", *(_rate(s, f"success@{n}") for n in range(1, k + 1))]
        row += [_signed(s["willingness_delta"]), _signed(s["patience_delta"])]
        row += [_rate(s, "hallucination"), _rate(s, "ai_style"), f"{s['failed']:.3f}"]
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    body = "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
    return body + "\n\nRates with 95% Wilson intervals; Δ = final − initial score, mean over conversations.\n"
