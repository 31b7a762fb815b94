"""Held-out evaluation statistics: logistic GEE vs a reference method (robust SEs), Holm within families."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf
from statsmodels.stats.multitest import multipletests

from marti_ibrl.eval.stats import COMPARE_COLUMNS, compare, format_table, gee_vs_reference, holm


def _clustered(
    n_clusters: int = 300,
    effects: dict[str, float] | None = None,
    reps: int = 2,
    sd: float = 0.5,
    seed: int = 0,
    family: str | None = None,
) -> pd.DataFrame:
    """Binary outcomes with a per-scenario random intercept (sd) and per-method conditional log-ORs vs "A"."""
    effects = effects if effects is not None else {"A": 0.0, "B": 1.0, "C": 0.0}
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n_clusters):
        u = rng.normal(0.0, sd)
        for m, b in effects.items():
            for s in range(reps):
                p = 1.0 / (1.0 + math.exp(-(u + b)))
                rows.append({"scenario_uid": f"s{c}", "method": m, "seed": s, "agreed": bool(rng.random() < p)})
    df = pd.DataFrame(rows)
    if family is not None:
        df["counterpart"] = family
    return df


@pytest.fixture(scope="module")
def data() -> pd.DataFrame:
    return _clustered()


@pytest.fixture(scope="module")
def result(data: pd.DataFrame) -> pd.DataFrame:
    return gee_vs_reference(data, reference="A")


# -- (a) identical to a direct statsmodels fit -------------------------------------------------------------------------


def _direct(df: pd.DataFrame, formula: str, groups: str):
    d = df.assign(y=df["agreed"].astype(int))
    return smf.gee(
        formula, groups=groups, data=d, family=sm.families.Binomial(), cov_struct=sm.cov_struct.Exchangeable()
    ).fit(cov_type="robust")


def _check_matches(ours: pd.DataFrame, fit) -> None:
    ci = np.asarray(fit.conf_int(alpha=0.05))
    names = list(fit.params.index)
    for row in ours.to_dict("records"):
        i = names.index(f"C(method, Treatment(reference='A'))[T.{row['method']}]")
        assert row["coef"] == pytest.approx(fit.params.iloc[i], abs=1e-8)
        assert row["se"] == pytest.approx(fit.bse.iloc[i], abs=1e-8)
        assert row["p_value"] == pytest.approx(fit.pvalues.iloc[i], abs=1e-8, rel=1e-8)
        assert row["odds_ratio"] == pytest.approx(math.exp(fit.params.iloc[i]), rel=1e-8)
        assert row["ci_low"] == pytest.approx(math.exp(ci[i][0]), rel=1e-8)
        assert row["ci_high"] == pytest.approx(math.exp(ci[i][1]), rel=1e-8)


def test_matches_direct_statsmodels_gee(data: pd.DataFrame, result: pd.DataFrame) -> None:
    fit = _direct(data, "y ~ C(method, Treatment(reference='A'))", "scenario_uid")
    assert list(result["method"]) == ["B", "C"]
    assert list(result["n"]) == [600, 600]
    assert result.attrs["n_clusters"] == 300 and result.attrs["n_obs"] == 1800 and result.attrs["reference_n"] == 600
    assert result.attrs["cov_type"] == "robust"
    _check_matches(result, fit)
    # robust (sandwich) SEs, not the model-based ones
    assert not np.allclose(fit.bse, fit.standard_errors(cov_type="naive"))


def test_covariates_and_caller_built_cluster_match_direct_fit(data: pd.DataFrame) -> None:
    df = data[data["scenario_uid"].isin([f"s{i}" for i in range(100)])]  # a subset keeps the file fast
    df = df.assign(scenario_seed=df["scenario_uid"] + "/" + df["seed"].astype(str))
    ours = gee_vs_reference(df, reference="A", covariates=("C(seed)",), cluster="scenario_seed")
    fit = _direct(df, "y ~ C(method, Treatment(reference='A')) + C(seed)", "scenario_seed")
    assert ours.attrs["n_clusters"] == 200
    assert ours.attrs["formula"] == "agreed ~ C(method, Treatment(reference='A')) + C(seed)"
    _check_matches(ours, fit)


# -- (b) recovers the known effect ---------------------------------------------------------------------------------------


def test_recovers_known_effect(result: pd.DataFrame) -> None:
    b, c = (result.set_index("method").loc[m] for m in ("B", "C"))
    # conditional log-OR 1.0; the population-averaged (GEE) one is attenuated by ~4% for sd=0.5, plus sampling noise
    assert abs(math.log(b["odds_ratio"]) - 1.0) < 0.4
    assert b["ci_low"] < b["odds_ratio"] < b["ci_high"] and b["ci_low"] > 1.0
    assert b["p_value"] < 1e-6
    assert c["p_value"] > 0.05 and c["ci_low"] < 1.0 < c["ci_high"]


def test_integer_outcome_equals_bool_outcome(data: pd.DataFrame, result: pd.DataFrame) -> None:
    ints = gee_vs_reference(data.assign(agreed=data["agreed"].astype(int)), reference="A")
    pd.testing.assert_frame_equal(ints, result)


# -- (c) Holm -----------------------------------------------------------------------------------------------------------


def test_holm_equals_multipletests_and_is_monotone() -> None:
    p = np.array([0.01, 0.04, 0.03, 0.2, 0.005, 0.04])
    adj, rej = holm(p, alpha=0.05)
    ref_rej, ref_adj, _, _ = multipletests(p, alpha=0.05, method="holm")
    np.testing.assert_allclose(adj, ref_adj, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(rej, ref_rej)
    assert (adj >= p).all() and (adj <= 1).all()
    order = np.argsort(p, kind="stable")
    assert (np.diff(adj[order]) >= 0).all()  # step-down: adjusted p non-decreasing in raw p
    np.testing.assert_allclose(adj[order][0], p.min() * len(p))
    np.testing.assert_array_equal(rej, adj <= 0.05)
    adj0, rej0 = holm([])
    assert adj0.size == 0 and rej0.size == 0
    with pytest.raises(ValueError, match="p-values"):
        holm([0.1, float("nan")])


# -- (d) per-family Holm ------------------------------------------------------------------------------------------------


def test_holm_is_applied_within_each_family() -> None:
    df = pd.concat(
        [
            _clustered(120, {"A": 0.0, "B": 1.0, "C": 0.0}, seed=1, family="glm"),
            _clustered(120, {"A": 0.0, "B": 0.4, "C": 0.6}, seed=2, family="deepseek"),
        ],
        ignore_index=True,
    )
    # per-family reference (e.g. the best baseline differs per counterpart)
    out = compare(df, reference={"glm": "A", "deepseek": "C"}, family_col="counterpart", alpha=0.05)
    assert tuple(out.columns[: len(COMPARE_COLUMNS)]) == COMPARE_COLUMNS
    assert list(out["family"]) == ["glm", "glm", "deepseek", "deepseek"]
    assert list(out["method"]) == ["B", "C", "A", "B"]
    assert list(out["reference"]) == ["A", "A", "C", "C"]
    # the GEE is fitted on the family's rows only
    direct = gee_vs_reference(df[df["counterpart"] == "deepseek"], reference="C")
    np.testing.assert_allclose(out["p_value"].iloc[2:], direct["p_value"], rtol=1e-12)
    for fam in ("glm", "deepseek"):
        sub = out[out["family"] == fam]
        rej, adj, _, _ = multipletests(sub["p_value"], alpha=0.05, method="holm")
        np.testing.assert_allclose(sub["p_holm"], adj, rtol=1e-12)
        np.testing.assert_array_equal(sub["significant"], rej)
    pooled = multipletests(out["p_value"], alpha=0.05, method="holm")[1]
    assert not np.allclose(out["p_holm"], pooled)
    assert (out["p_holm"].to_numpy() <= pooled + 1e-15).all()
    table = format_table(out)
    assert table.splitlines()[0] == "| Family | Method | vs | n | OR [95% CI] | p | p_holm |"
    assert (
        len(table.splitlines()) == 2 + 4 and "| glm | B | A | 240 |" in table and "| deepseek | A | C | 240 |" in table
    )


def test_compare_without_families(data: pd.DataFrame, result: pd.DataFrame) -> None:
    out = compare(data, reference="A")
    assert set(out["family"]) == {"all"}
    np.testing.assert_allclose(out["p_value"], result["p_value"])
    np.testing.assert_allclose(out["p_holm"], multipletests(result["p_value"], method="holm")[1])
    assert list(out["significant"]) == [True, False]
    table = format_table(out)
    lines = table.splitlines()
    assert lines[0] == "| Method | vs | n | OR [95% CI] | p | p_holm |"
    b = out.iloc[0]
    assert lines[2].startswith(
        f"| B | A | 600 | {b['odds_ratio']:.2f} [{b['ci_low']:.2f}, {b['ci_high']:.2f}] | <0.001 |"
    )
    assert lines[2].endswith("<0.001* |")
    assert "p_holm" not in format_table(result)


# -- (e) errors ---------------------------------------------------------------------------------------------------------


def test_errors(data: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="reference 'Z' not among methods"):
        gee_vs_reference(data, reference="Z")
    with pytest.raises(ValueError, match="only one method"):
        gee_vs_reference(data[data["method"] == "A"], reference="A")
    with pytest.raises(ValueError, match="missing columns.*'success'"):
        gee_vs_reference(data, outcome="success", reference="A")
    with pytest.raises(ValueError, match="missing columns.*'run'"):
        gee_vs_reference(data, reference="A", covariates=("C(run)",))
    with pytest.raises(ValueError, match="missing columns.*'scenario'"):
        gee_vs_reference(data, reference="A", cluster="scenario")
    for value in (True, False):
        with pytest.raises(ValueError, match=f"constant \\(all {int(value)}\\).*cannot estimate"):
            gee_vs_reference(data.assign(agreed=value), reference="A")
    with pytest.raises(ValueError, match="at least 2 clusters"):
        gee_vs_reference(data.assign(scenario_uid="s0"), reference="A")
    with pytest.raises(ValueError, match="binary"):
        gee_vs_reference(data.assign(agreed=data["seed"] + 1), reference="A")
    with pytest.raises(ValueError, match="binary"):
        gee_vs_reference(data.assign(agreed="yes"), reference="A")
    with pytest.raises(ValueError, match="missing values"):
        gee_vs_reference(data.assign(agreed=data["agreed"].where(data["seed"] == 0)), reference="A")
    with pytest.raises(ValueError, match="only 'binomial'"):
        gee_vs_reference(data, reference="A", family="gaussian")
    with pytest.raises(ValueError, match="family 'x'.*reference 'Z'"):
        compare(data.assign(counterpart="x"), reference="Z", family_col="counterpart")
    with pytest.raises(ValueError, match="missing family column"):
        compare(data, reference="A", family_col="counterpart")


# -- run-level test (the replicated unit is the training run) ---------------------------------------------------------


RUNS = pd.DataFrame(
    {
        "method": ["ibrl"] * 5 + ["uni_sft"] * 5 + ["uni_bot"] * 4,
        "value": [0.80, 0.70, 0.75, 0.90, 0.60, 0.60, 0.62, 0.58, 0.65, 0.55, 0.76, 0.71, 0.79, 0.74],
    }
)


def test_runs_vs_reference_is_welchs_t_test_over_runs_with_holm() -> None:
    from scipy import stats

    from marti_ibrl.eval.stats import format_runs_table, runs_vs_reference

    res = runs_vs_reference(RUNS, "ibrl")
    assert list(res["method"]) == ["uni_sft", "uni_bot"]
    ib = RUNS.value[:5].to_numpy()
    for (name, sl), row in zip((("uni_sft", slice(5, 10)), ("uni_bot", slice(10, 14))), res.to_dict("records")):
        x = RUNS.value[sl].to_numpy()
        direct = stats.ttest_ind(x, ib, equal_var=False)
        assert row["method"] == name and row["runs"] == len(x) and row["ref_runs"] == 5
        assert row["diff"] == pytest.approx(x.mean() - ib.mean())
        assert row["p_value"] == pytest.approx(direct.pvalue) and row["t"] == pytest.approx(direct.statistic)
        # Welch's CI by hand: diff ± t_{0.975, df} * sqrt(s1²/n1 + s2²/n2)
        se = math.sqrt(x.var(ddof=1) / len(x) + ib.var(ddof=1) / 5)
        half = stats.t.ppf(0.975, row["df"]) * se
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((row["diff"] - half, row["diff"] + half))
    assert list(res["p_holm"]) == pytest.approx(list(holm(res["p_value"].to_numpy())[0]))
    sft, bot = res.to_dict("records")
    assert sft["p_value"] < 0.05 and sft["ci_high"] < 0  # uni_sft's runs are lower: -15 points
    assert bot["p_value"] > 0.5 and bot["ci_low"] < 0 < bot["ci_high"]  # uni_bot's are not
    sft_line, bot_line = format_runs_table(res).splitlines()[2:]
    assert sft_line.startswith("| uni_sft | ibrl (5 runs, 75.0) | 5 | 60.0 ± 3.8 | -15.0 [")
    assert sft_line.endswith("*" * (sft["p_holm"] < 0.05) + " |") and not bot_line.endswith("* |")
    # a utility in [0, 1]: unscaled, three decimals (one would print its hundredths as 0.0)
    sft_line = format_runs_table(res, scale=1.0, unit="utility", digits=3).splitlines()[2]
    assert sft_line.startswith("| uni_sft | ibrl (5 runs, 0.750) | 5 | 0.600 ± 0.038 | -0.150 [")


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (RUNS[RUNS.method != "ibrl"], "reference method 'ibrl' has no runs"),
        (RUNS.iloc[:11], "every method needs at least two runs for a run-level test; got {'uni_bot': 1}"),
        (RUNS.assign(value=[*RUNS.value[:13], float("nan")]), "column 'value' must be finite numbers"),
        (
            pd.DataFrame({"method": ["ibrl", "ibrl", "b", "b"], "value": [0.5, 0.5, 0.5, 0.5]}),
            "'b' and 'ibrl' have no run-to-run variance",
        ),
        (RUNS.rename(columns={"value": "agreement"}), "missing column 'value'"),
    ],
)
def test_runs_vs_reference_rejects_what_it_cannot_test(frame: pd.DataFrame, why: str) -> None:
    from marti_ibrl.eval.stats import runs_vs_reference

    with pytest.raises(ValueError) as err:
        runs_vs_reference(frame, "ibrl")
    assert why in str(err.value)
