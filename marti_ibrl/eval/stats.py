"""Significance tests for held-out evaluation (paper §5.2: "logistic GEE, Holm-corrected").

Every binary outcome (Success@1, DoND agreement, ...) is modelled with a logistic GEE: an exchangeable working
correlation within each cluster (profile for TeleSales, scenario for DoND) and robust ("sandwich") standard errors, so
repeated conversations on the same scenario are not treated as independent.  Each non-reference method gets an odds
ratio against the reference method; p-values are Holm-adjusted within each comparison family (e.g. per held-out
counterpart).

    res = compare(df, reference="ibrl_9b", family_col="counterpart", outcome="agreed", cluster="scenario_uid")
    print(format_table(res))

When the methods are *trained* policies, the replicated unit is the training run, not the conversation: scenarios
clustered within one run say how precisely that run was measured, not how another run of the same method would do.
:func:`runs_vs_reference` is the test at that level: one value per run (e.g. its held-out agreement), Welch's
two-sample t-test of each method's runs against the reference's, the difference in means with its 95% Welch CI, Holm
across methods. (Welch, not a permutation test: with 5 runs per arm the exact permutation p cannot go below 2/252 =
0.008, which Holm over six comparisons lifts to 0.048, so nothing could be shown; run means over thousands of
conversations are close to normal, and Welch does not assume equal run-to-run spread, which differs between arms.)

``statsmodels`` / ``pandas`` / ``scipy`` are imported lazily so that importing this module never requires them.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

__all__ = ["compare", "format_runs_table", "format_table", "gee_vs_reference", "holm", "runs_vs_reference"]

# Internal column names (kept out of the way of the caller's covariate terms).
_Y, _M, _G = "_ibrl_y", "_ibrl_method", "_ibrl_cluster"

RESULT_COLUMNS = ("method", "reference", "n", "rate", "coef", "se", "odds_ratio", "ci_low", "ci_high", "p_value")
COMPARE_COLUMNS = ("family", "method", "odds_ratio", "ci_low", "ci_high", "p_value", "p_holm", "significant", "n")


def _formula_names(term: str) -> set[str] | None:
    """Bare variable names a covariate term refers to (``"C(seed)"`` -> {"seed"}); None if it is not parseable as
    Python (patsy operators such as ``a:b``), in which case statsmodels does the checking."""
    try:
        tree = ast.parse(term, mode="eval")
    except SyntaxError:
        return None
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            skip.add(id(node.func))
        elif isinstance(node, ast.Attribute):
            skip.add(id(node.value))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in skip}


def gee_vs_reference(
    df: pd.DataFrame,
    outcome: str = "agreed",
    method: str = "method",
    reference: Any = None,
    cluster: str = "scenario_uid",
    covariates: Sequence[str] = (),
    family: str = "binomial",
) -> pd.DataFrame:
    """Logistic GEE of ``outcome`` on method (treatment-coded against ``reference``), clustered by ``cluster``.

    Model: ``outcome ~ C(method, Treatment(reference=REF)) [+ covariates...]`` with a Binomial family (logit link),
    exchangeable working correlation within clusters and robust (sandwich) covariance.  ``covariates`` are extra
    formula terms, e.g. ``("C(seed)",)`` to adjust for the run/seed while clustering by scenario; ``cluster`` may be
    any column, including one the caller built (e.g. ``df["scenario_seed"] = df.scenario_uid + "/" + df.seed``).

    Returns one row per non-reference method (in order of first appearance) with columns ``method, reference, n
    (rows of that method), rate (observed outcome rate), coef (log-OR), se (robust), odds_ratio, ci_low, ci_high (95%
    Wald on the log-OR scale, exponentiated), p_value (Wald, two-sided)``.  ``result.attrs`` holds the formula, the
    number of observations/clusters, the reference's n and rate and the estimated working correlation.
    """
    import pandas as pd
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    if family != "binomial":
        raise ValueError(f"family={family!r}: only 'binomial' (logistic GEE, odds ratios) is supported")
    if reference is None:
        raise ValueError("reference method is required")
    covariates = (covariates,) if isinstance(covariates, str) else tuple(covariates)
    d, ref, levels, n_clusters = _gee_frame(df, outcome, method, reference, cluster, covariates)

    formula = " + ".join([f"{_Y} ~ C({_M}, Treatment(reference={ref!r}))", *covariates])
    model = smf.gee(
        formula,
        groups=_G,
        data=d,
        family=sm.families.Binomial(),
        cov_struct=sm.cov_struct.Exchangeable(),
    )
    res = model.fit(cov_type="robust")  # sandwich SEs (the statsmodels default, stated explicitly)
    if int(res.nobs) != len(d):
        raise ValueError(f"{len(d) - int(res.nobs)} rows dropped by the formula (missing covariate values?)")

    rows = _method_rows(res, d, levels, ref)
    out = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    ref_sel = d[_M] == ref
    out.attrs.update(
        formula=formula.replace(_Y, outcome).replace(_M, method),
        cluster=cluster,
        n_obs=int(res.nobs),
        n_clusters=n_clusters,
        reference_n=int(ref_sel.sum()),
        reference_rate=float(d.loc[ref_sel, _Y].mean()),
        working_correlation=float(model.cov_struct.dep_params),
        cov_type="robust",
    )
    return out


def _gee_frame(
    df: pd.DataFrame, outcome: str, method: str, reference: Any, cluster: str, covariates: tuple[str, ...]
) -> tuple[pd.DataFrame, str, list[str], int]:
    """:func:`gee_vs_reference`'s input checked (one ``ValueError`` with the reason for each way it can be unfit) and
    its working frame: ``(frame with the method as text, the 0/1 outcome and integer cluster ids, the reference as
    text, the methods in order of first appearance, the number of clusters)``."""
    import pandas as pd

    missing = [c for c in (outcome, method, cluster) if c not in df.columns]
    for term in covariates:
        names = _formula_names(term)
        missing += sorted((names or set()) - set(df.columns))
    if missing:
        raise ValueError(f"missing columns: {missing} (have {list(df.columns)})")
    nulls = {c: int(df[c].isna().sum()) for c in (outcome, method, cluster) if df[c].isna().any()}
    if nulls:
        raise ValueError(f"missing values (NaN/None) in {nulls}; drop or impute them before testing")

    d = df.copy()
    d[_M] = d[method].astype(str)
    ref = str(reference)
    levels = list(pd.unique(d[_M]))
    if ref not in levels:
        raise ValueError(f"reference {reference!r} not among methods {levels} in column {method!r}")
    if len(levels) < 2:
        raise ValueError(f"only one method ({ref!r}) in column {method!r}: nothing to compare against the reference")

    y = d[outcome]
    try:
        y = y.astype(float)
    except (TypeError, ValueError):
        y = None
    if y is None or not set(y.unique()) <= {0.0, 1.0}:
        vals = sorted(map(repr, set(d[outcome].unique())))[:10]
        raise ValueError(f"outcome {outcome!r} must be binary (bool or 0/1); got values {vals}")
    if y.nunique() < 2:
        raise ValueError(
            f"outcome {outcome!r} is constant (all {int(y.iloc[0])}): a logistic GEE cannot estimate odds ratios "
            "when every observation has the same outcome"
        )
    d[_Y] = y.astype(int)
    d[_G] = pd.factorize(d[cluster])[0]
    n_clusters = int(d[_G].nunique())
    if n_clusters < 2:
        raise ValueError(
            f"need at least 2 clusters in {cluster!r} for robust (sandwich) standard errors; got {n_clusters}"
        )
    return d, ref, levels, n_clusters


def _method_rows(res: Any, d: pd.DataFrame, levels: list[str], ref: str) -> list[dict]:
    """One result row per non-reference method of a fitted GEE (:data:`RESULT_COLUMNS`)."""
    import numpy as np

    names = list(res.params.index)
    ci = np.asarray(res.conf_int(alpha=0.05))  # DataFrame or array depending on the statsmodels wrapper
    rows = []
    for level in levels:
        if level == ref:
            continue
        key = f"C({_M}, Treatment(reference={ref!r}))[T.{level}]"
        if key not in names:  # pragma: no cover - patsy naming guard
            raise RuntimeError(f"coefficient {key!r} not found in {names}")
        i = names.index(key)
        sel = d[_M] == level
        coef, se = float(res.params.iloc[i]), float(res.bse.iloc[i])
        rows.append(
            {
                "method": level,
                "reference": ref,
                "n": int(sel.sum()),
                "rate": float(d.loc[sel, _Y].mean()),
                "coef": coef,
                "se": se,
                "odds_ratio": math.exp(coef),
                "ci_low": math.exp(float(ci[i][0])),
                "ci_high": math.exp(float(ci[i][1])),
                "p_value": float(res.pvalues.iloc[i]),
            }
        )
    return rows


def holm(p_values: Sequence[float], alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Holm step-down adjustment: ``(p_adjusted, reject)`` with reject = p_adjusted <= alpha (``multipletests``)."""
    import numpy as np
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p_values, dtype=float).ravel()
    if p.size == 0:
        return np.zeros(0), np.zeros(0, dtype=bool)
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError(f"p-values must lie in [0, 1] without NaN; got {p.tolist()}")
    reject, p_adj, _, _ = multipletests(p, alpha=alpha, method="holm")
    return p_adj, reject


def compare(
    df: pd.DataFrame,
    reference: Any,
    family_col: str | None = None,
    alpha: float = 0.05,
    **gee_kwargs: Any,
) -> pd.DataFrame:
    """``gee_vs_reference`` per family (``family_col``, e.g. ``"counterpart"``), Holm-adjusted within each family.

    ``reference`` is a method name, or a mapping family -> reference method (e.g. the best same-scale unilateral
    baseline differs per counterpart).  ``gee_kwargs`` go to :func:`gee_vs_reference` (outcome, method, cluster,
    covariates).  Returns one tidy frame: ``family, method, odds_ratio, ci_low, ci_high, p_value, p_holm,
    significant, n`` followed by ``reference, rate, coef, se``; family is ``"all"`` when ``family_col`` is None.
    """
    import pandas as pd

    if family_col is not None and family_col not in df.columns:
        raise ValueError(f"missing family column {family_col!r} (have {list(df.columns)})")
    groups = [("all", df)] if family_col is None else list(df.groupby(family_col, sort=False, dropna=False))
    frames = []
    for fam, sub in groups:
        fam = fam[0] if isinstance(fam, tuple) and len(fam) == 1 else fam
        if isinstance(reference, Mapping):
            if fam not in reference:
                raise ValueError(f"no reference method given for family {fam!r}")
            ref = reference[fam]
        else:
            ref = reference
        try:
            res = gee_vs_reference(sub, reference=ref, **gee_kwargs)
        except ValueError as e:
            raise ValueError(f"family {fam!r}: {e}") from e
        res["p_holm"], res["significant"] = holm(res["p_value"].to_numpy(), alpha=alpha)
        res.insert(0, "family", fam)
        frames.append(res)
    out = pd.concat(frames, ignore_index=True)
    extra = [c for c in out.columns if c not in COMPARE_COLUMNS]
    out = out[list(COMPARE_COLUMNS) + extra]
    out["significant"] = out["significant"].astype(bool)
    out.attrs.update(alpha=alpha, correction="holm", family_col=family_col)
    return out


def _fmt_p(p: float) -> str:
    if p != p:  # NaN
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def format_table(df: pd.DataFrame, digits: int = 2) -> str:
    """Markdown table: [Family |] Method | vs | n | OR [95% CI] | p | p_holm (the latter when present; ``*`` marks
    Holm-significant rows).  Accepts the output of :func:`compare` or :func:`gee_vs_reference`."""
    has_family = "family" in df.columns and not (df["family"] == "all").all()
    has_holm = "p_holm" in df.columns
    header = (
        (["Family"] if has_family else [])
        + ["Method", "vs", "n", "OR [95% CI]", "p"]
        + (["p_holm"] if has_holm else [])
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for r in df.to_dict("records"):
        cells = [str(r["family"])] if has_family else []
        cells += [
            str(r["method"]),
            str(r.get("reference", "")),
            str(r["n"]),
            f"{r['odds_ratio']:.{digits}f} [{r['ci_low']:.{digits}f}, {r['ci_high']:.{digits}f}]",
            _fmt_p(r["p_value"]),
        ]
        if has_holm:
            cells.append(_fmt_p(r["p_holm"]) + ("*" if r.get("significant") else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


RUNS_COLUMNS = ("method", "reference", "runs", "mean", "sd", "ref_runs", "ref_mean", "diff", "ci_low", "ci_high")


def runs_vs_reference(
    df: pd.DataFrame,
    reference: Any,
    value: str = "value",
    method: str = "method",
    alpha: float = 0.05,
) -> pd.DataFrame:
    """Each method's runs against the reference's (one row of ``df`` per training run, its ``value``).

    Returns per non-reference method: ``runs, mean, sd`` (over its runs), ``ref_runs, ref_mean``, ``diff`` = mean −
    ref_mean with the 95% Welch confidence interval ``ci_low, ci_high``, Welch's ``t``, ``df``, ``p_value``, and
    ``p_holm`` / ``significant`` (Holm over the methods at ``alpha``). Rejects methods with fewer than two runs (no
    run-to-run variance to test against) and values that are not finite.
    """
    import numpy as np
    import pandas as pd
    from scipy import stats

    for col in (value, method):
        if col not in df.columns:
            raise ValueError(f"missing column {col!r} (have {list(df.columns)})")
    values = pd.to_numeric(df[value], errors="coerce")
    if not np.isfinite(values.to_numpy(dtype=float)).all():
        raise ValueError(f"column {value!r} must be finite numbers, got {df[value].tolist()}")
    runs = {m: values[df[method] == m].to_numpy(dtype=float) for m in dict.fromkeys(df[method])}
    if reference not in runs:
        raise ValueError(f"reference method {reference!r} has no runs (methods: {list(runs)})")
    few = {m: len(x) for m, x in runs.items() if len(x) < 2}
    if few:
        raise ValueError(f"every method needs at least two runs for a run-level test; got {few}")
    ref = runs[reference]
    rows = []
    for m, x in runs.items():
        if m == reference:
            continue
        if x.std() == 0 and ref.std() == 0:
            raise ValueError(f"{m!r} and {reference!r} have no run-to-run variance: a t-test is undefined")
        res = stats.ttest_ind(x, ref, equal_var=False)
        ci = res.confidence_interval(1 - alpha)
        rows.append(
            {
                "method": m,
                "reference": reference,
                "runs": len(x),
                "mean": float(x.mean()),
                "sd": float(x.std(ddof=1)),
                "ref_runs": len(ref),
                "ref_mean": float(ref.mean()),
                "diff": float(x.mean() - ref.mean()),
                "ci_low": float(ci.low),
                "ci_high": float(ci.high),
                "t": float(res.statistic),
                "df": float(res.df),
                "p_value": float(res.pvalue),
            }
        )
    out = pd.DataFrame(rows, columns=[*RUNS_COLUMNS, "t", "df", "p_value"])
    out["p_holm"], out["significant"] = holm(out["p_value"].to_numpy(), alpha=alpha)
    out["significant"] = out["significant"].astype(bool)
    out.attrs.update(alpha=alpha, correction="holm", test="welch")
    return out


def format_runs_table(df: pd.DataFrame, scale: float = 100.0, unit: str = "points", digits: int = 1) -> str:
    """Markdown table of :func:`runs_vs_reference`: Method | vs | runs | mean ± sd | Δ [95% CI] | t (df) | p | p_holm
    (``*``: Holm-significant); means and differences multiplied by ``scale`` (rates as points by default) and shown
    with ``digits`` decimals (3 for a utility in [0, 1], whose differences are hundredths)."""
    header = ["Method", "vs", "runs", "mean ± sd", f"Δ {unit} [95% CI]", "t (df)", "p", "p_holm"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    d = digits
    for r in df.to_dict("records"):
        cells = [
            str(r["method"]),
            f"{r['reference']} ({r['ref_runs']} runs, {r['ref_mean'] * scale:.{d}f})",
            str(r["runs"]),
            f"{r['mean'] * scale:.{d}f} ± {r['sd'] * scale:.{d}f}",
            f"{r['diff'] * scale:+.{d}f} [{r['ci_low'] * scale:+.{d}f}, {r['ci_high'] * scale:+.{d}f}]",
            f"{r['t']:.2f} ({r['df']:.1f})",
            _fmt_p(r["p_value"]),
            _fmt_p(r["p_holm"]) + ("*" if r["significant"] else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
