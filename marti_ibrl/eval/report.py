"""Tables and ``report.md`` (paper §5.2-5.4): Table-2-style results, Δmismatch, cross-play, GEE, figures.

``write_tables(EVAL_DIR)`` reads what ``marti-ibrl eval`` wrote (``pairs.json`` + ``episodes/*.jsonl``) and
writes ``summary.json`` and ``tables.md``. ``write_report(RUN_DIR)`` (``marti-ibrl report RUN_DIR``) adds
the training diagnostics of a run (reward curves from ``trainer_state.json``) and, when an eval directory
is there (``RUN_DIR/eval`` or ``--eval``), its tables and logistic-GEE comparisons, into ``report.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

from marti_ibrl.eval.dond.metrics import mismatch, summarize_seat_averaged
from marti_ibrl.eval.episodes import read_episodes
from marti_ibrl.eval.pairs import KINDS  # noqa: F401 (the kinds of pairs, in table order; imported from here too)


def load_pairs(eval_dir: Path) -> list[dict]:
    """Every (policy, counterpart) pair of an eval directory with its episodes and seat-averaged summary."""
    eval_dir = Path(eval_dir)
    index = eval_dir / "pairs.json"
    if not index.exists():
        raise FileNotFoundError(f"{index}: not an eval directory (run `marti-ibrl eval --out {eval_dir}` first)")
    pairs = json.loads(index.read_text())
    for p in pairs:
        p["episodes"] = read_episodes(eval_dir / "episodes" / p["file"])
        p["summary"] = summarize_seat_averaged(p["episodes"])
    return pairs


def _fmt(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _cell(s: dict) -> str:
    """Table 2 cell: agreement / own utility / joint value (utility terms on agreed allocations only)."""
    return f"{_fmt(s['agreement'])} / {_fmt(s['own_utility'])} / {_fmt(s['joint_value'])}"


def _md(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def mismatch_rows(pairs: list[dict]) -> list[dict]:
    """Per policy: J_train (in-system agreement; the mean over a pool of training counterparts), J_deploy (mean
    held-out agreement), Δ = J_train − J_deploy."""
    out = []
    for policy in dict.fromkeys(p["policy"] for p in pairs):
        mine = [p for p in pairs if p["policy"] == policy]
        train = [p["summary"]["averaged"]["agreement"] for p in mine if p["kind"] == "in-system"]
        deploy = [p["summary"]["averaged"]["agreement"] for p in mine if p["kind"] == "held-out"]
        selfplay = [p["summary"]["averaged"]["agreement"] for p in mine if p["kind"] == "self-play"]
        row = {
            "policy": policy,
            "in_system": mean(train) if train else None,
            "self_play": selfplay[0] if selfplay else None,
        }
        row["held_out"] = mean(deploy) if deploy else None
        row["delta_mismatch"] = mismatch(row["in_system"], row["held_out"]) if train and deploy else None
        out.append(row)
    return out


def tables_markdown(pairs: list[dict]) -> str:
    policies = list(dict.fromkeys(p["policy"] for p in pairs))
    parts = ["Cells: agreement / own utility / joint value, seat-averaged (utility terms on agreed allocations only)."]
    for kind in KINDS:
        mine = [p for p in pairs if p["kind"] == kind]
        if not mine:
            continue
        columns = list(dict.fromkeys(p["counterpart"] for p in mine))
        rows = [["policy", *columns]]
        for policy in policies:
            by = {p["counterpart"]: p for p in mine if p["policy"] == policy}
            rows.append([policy, *(_cell(by[c]["summary"]["averaged"]) if c in by else "" for c in columns)])
        parts.append(f"### {kind}\n\n" + _md(rows))
    rows = [["policy", "in-system", "self-play", "held-out (mean)", "Δmismatch"]]
    for r in mismatch_rows(pairs):
        rows.append(
            [r["policy"], _fmt(r["in_system"]), _fmt(r["self_play"]), _fmt(r["held_out"]), _fmt(r["delta_mismatch"])]
        )
    parts.append(
        "### Δmismatch = J_train − J_deploy (agreement; J_deploy = mean over held-out counterparts)\n\n" + _md(rows)
    )
    rows = [["counterpart", "n", "agreement", "own utility", "joint value", "expected utility", "malformed", "failed"]]
    for p in pairs:
        s = p["summary"]["averaged"]
        rows.append(
            [f"{p['policy']} vs {p['counterpart']}", str(s["n"])]
            + [
                _fmt(s[k])
                for k in ("agreement", "own_utility", "joint_value", "expected_utility", "malformed", "failed")
            ]
        )
    parts.append("### All pairs\n\n" + _md(rows))
    return "\n\n".join(parts) + "\n"


def write_tables(eval_dir: str | Path) -> str:
    eval_dir = Path(eval_dir)
    pairs = load_pairs(eval_dir)
    summary = [{k: v for k, v in p.items() if k != "episodes"} for p in pairs]
    (eval_dir / "summary.json").write_text(json.dumps({"pairs": summary, "mismatch": mismatch_rows(pairs)}, indent=1))
    text = tables_markdown(pairs)
    (eval_dir / "tables.md").write_text(text)
    return text


def gee_markdown(pairs: list[dict], reference: str | None, cluster: str = "scenario_uid") -> str:
    """Logistic GEE on agreement (clustered by ``cluster``, an episode field: the scenario, or the participant of
    human games) of every policy vs ``reference``, per held-out counterpart, Holm-corrected within each counterpart
    (paper §5.2)."""
    import pandas as pd

    from marti_ibrl.eval.stats import compare, format_table

    held = [p for p in pairs if p["kind"] == "held-out"]
    policies = list(dict.fromkeys(p["policy"] for p in held))
    if len(policies) < 2:
        return "_GEE needs at least two policies evaluated against the same held-out counterparts._\n"
    reference = reference or policies[0]
    rows = [
        {
            "method": p["policy"],
            "counterpart": p["counterpart"],
            cluster: e[cluster],
            "agreed": e["agreed"],
        }
        for p in held
        for e in p["episodes"]
    ]
    try:
        table = compare(pd.DataFrame(rows), reference, family_col="counterpart", outcome="agreed", cluster=cluster)
    except ValueError as e:
        return f"_GEE not estimable: {e}_\n"
    return (
        f"Reference: **{reference}**. Odds ratios of agreement, 95% CI, Holm within each counterpart.\n\n"
        + format_table(table)
    )


def diagnose_markdown(run_dir: Path, result: dict) -> str:
    """The section of one ``marti-ibrl diagnose`` result: Fig. 5 and Fig. 6 analogues with their numbers."""
    role = result["role"]
    rows = [["checkpoint", "agreement vs in-system", f"agreement vs fixed ({result['fixed']})"]]
    rows += [[str(p["checkpoint"]), _fmt(p["in_system"]), _fmt(p["fixed"])] for p in result["points"]]
    text = f"## Checkpoint diagnostics: {role}\n\n" + _md(rows)
    fig5 = run_dir / "figures" / f"insystem_vs_fixed_{role}.png"
    if fig5.exists():
        text += f"\n\n![in-system vs fixed]({fig5.relative_to(run_dir)})"
    fig6 = run_dir / "figures" / f"similarity_{role}.png"
    if fig6.exists():
        text += (
            f"\n\n![semantic similarity]({fig6.relative_to(run_dir)})\n\nMean cosine similarity (all-MiniLM-L6-v2) "
            f"of {role}'s utterances across checkpoints, generated against the fixed step-0 counterpart."
        )
    elif "similarity_skipped" in result:
        text += f"\n\n_Similarity heatmap skipped: {result['similarity_skipped']}._"
    return text


def write_report(run_dir: str | Path, eval_dir: str | Path | None = None, reference: str | None = None) -> Path:
    """``RUN_DIR/report.md``: training curves, evaluation tables, statistics; figures beside it."""
    from marti_ibrl.eval.figures import STATE_FILE, load_history, outcome_curves, reward_curves, roles_in_history

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    figures = run_dir / "figures"
    parts = [f"# Report: {run_dir.name}"]
    if (run_dir / STATE_FILE).exists():
        history = load_history(run_dir)
        roles = roles_in_history(history)
        png = reward_curves(history, roles, figures / "reward_curves.png")
        outcomes = outcome_curves(history, figures / "outcome_curves.png")
        last = history[-1]
        parts.append(
            "## Training\n\n"
            f"{len(history)} iterations, roles {', '.join(roles)}. Final iteration: "
            + ", ".join(f"{r} reward {last[f'{r}/reward']:.3f}" for r in roles)
            + f", agreement {last['rollout/agreement']:.3f}, malformed {last['rollout/malformed']:.3f}.\n\n"
            f"![reward curves]({png.relative_to(run_dir)})\n\n"
            "Per-role reward per iteration, raw (thin) and EMA-smoothed (α = 0.2, bold).\n\n"
            f"![outcome curves]({outcomes.relative_to(run_dir)})\n\n"
            "Share of each iteration's dialogues that ended in a deal, and on a malformed turn."
        )
    said = said_markdown(run_dir)
    if said:
        parts.append(said)
    for diag in sorted((run_dir / "diagnostics").glob("*.json")):
        parts.append(diagnose_markdown(run_dir, json.loads(diag.read_text())))
    if not eval_dir:  # RUN_DIR/eval, or RUN_DIR itself when it is what `marti-ibrl eval --out` wrote
        eval_dir = run_dir if (run_dir / "pairs.json").exists() else run_dir / "eval"
    eval_dir = Path(eval_dir)
    spec = _own_evaluation_missing(run_dir) if (eval_dir / "pairs.json").exists() else None
    if (eval_dir / "pairs.json").exists() and spec is not None:  # an env evaluated by its rewards (eval/generic.py)
        from marti_ibrl.eval.generic import write_tables as rewards_tables

        text = rewards_tables(eval_dir, list(spec.roles), spec.interchangeable_roles)
        parts.append(f"## Evaluation\n\nFrom `{eval_dir}`.\n\n{text}")
    elif (eval_dir / "pairs.json").exists():
        pairs = load_pairs(eval_dir)
        n = max((p["summary"]["averaged"]["n"] for p in pairs), default=0)
        parts.append(f"## Evaluation\n\nFrom `{eval_dir}` (up to {n} episodes per pair).\n\n" + tables_markdown(pairs))
        parts.append("## Statistics\n\n" + gee_markdown(pairs, reference))
    elif len(parts) == 1:
        raise FileNotFoundError(
            f"{run_dir}: nothing to report: no trainer_state.json, diagnostics/ or eval directory ({eval_dir})"
        )
    out = run_dir / "report.md"
    out.write_text("\n\n".join(parts) + "\n")
    return out


def refresh_report(run_dir: str | Path, command: str) -> str | None:
    """After ``eval --run RUN --out RUN/eval`` or ``diagnose RUN``: RUN's ``report.md`` (written when its training
    ended) rewritten with what ``command`` just added, so it never lags behind the run's results; the line that says
    so, or None when RUN has no report.md. A report that cannot be written is said, never fatal."""
    run_dir = Path(run_dir)
    if not (run_dir / "report.md").is_file():
        return None
    try:
        return f"report: {write_report(run_dir)} updated with the {command}"
    except Exception as e:  # a report is a view of results that are complete either way
        return f"report not updated ({type(e).__name__}: {' '.join(str(e).split())}); marti-ibrl report {run_dir}"


def said_markdown(run_dir: Path, shown: int = 1) -> str | None:
    """``report.md``'s "What they said": ``shown`` kept dialogues of the first and of the last iteration
    (``RUN/transcripts.jsonl``, ``--logger.transcripts``), and the command that shows the rest; None without any."""
    from marti_ibrl.rollout import transcripts

    kept = transcripts.read(run_dir, which="ends")
    if not kept:
        return None
    first, last = kept[0]["iteration"], kept[-1]["iteration"]
    picks = [r for r in kept if r["iteration"] == first][:shown]
    if last != first:
        picks += [r for r in kept if r["iteration"] == last][:shown]
    blocks = "\n\n".join(f"```\n{transcripts.format_dialogue(r)}\n```" for r in picks)
    return (
        f"## What they said\n\n{kept.seen} dialogues kept (iterations {first}-{last}); every one: `marti-ibrl show "
        f"{run_dir}` (`--iteration K`, `--malformed`). The first and the last iteration:\n\n{blocks}"
    )


def _own_evaluation_missing(run_dir: Path):
    """The run's environment spec when it has no evaluation of its own (its eval directory holds the tables of
    :mod:`marti_ibrl.eval.generic`), else None (DoND's, or a directory with no training config: an eval directory).
    An environment the config names that does not load here is a ``ValueError`` saying so: its evaluation is read
    through it (before, the report fell back to DoND's tables and failed in DoND's scenario parser)."""
    from marti_ibrl.envs import registry
    from marti_ibrl.eval.run_config import run_env_name

    try:
        name = run_env_name(str(run_dir))
    except ValueError:
        return None
    try:
        spec = registry.get(name)
    except (ValueError, ImportError, AttributeError, TypeError) as e:
        reason = " ".join(str(e).split())
        raise ValueError(
            f"{run_dir}: the run's environment {name} does not load here ({reason}); its evaluation is read through "
            "it: make it importable as for train (e.g. PYTHONPATH=DIR marti-ibrl report ...)"
        ) from None
    return spec if spec.evaluate is None else None


def learning_summary(history: list[dict], k: int = 3) -> str:
    """What the run learned, in one line: agreement and malformed shares, mean of the first ``k`` iterations → the
    last ``k``."""
    k = max(1, min(k, len(history) // 2))

    def mean(key: str, part: list[dict]) -> float:
        return sum(m[key] for m in part) / len(part)

    first, last = history[:k], history[-k:]
    parts = [
        f"{label} {mean(key, first):.2f} -> {mean(key, last):.2f}"
        for key, label in (("rollout/agreement", "agreement"), ("rollout/malformed", "malformed"))
    ]
    return f"first {k} -> last {k} iterations: " + ", ".join(parts)


def finished_lines(cfg, history: list[dict]) -> list[str]:
    """What a finished training run says last (``train`` and ``demo``): where the run is, its ``report.md`` (written
    here; a report that cannot be written is said, never fatal), what it learned, and the command to try next."""
    from marti_ibrl.envs import registry

    run = cfg.ckpt.path
    lines = [f"run directory: {run} (HF checkpoints: {run}/<role>/hf; tensorboard: {run}/tensorboard)"]
    try:
        lines.append(f"report: {write_report(run)} (curves in {run}/figures)")
    except Exception as e:  # a report is a view of the run, which is complete either way
        lines.append(f"report not written ({type(e).__name__}: {e}); the run is complete")
    if history:
        lines.append(learning_summary(history))
    lines.append(f"what they said: marti-ibrl show {run} (--malformed: where malformed turns came from)")
    if registry.get(cfg.env.name).evaluate is not None:  # this run's pair, on the protocol it trained on (--run)
        a, b = [r.name for r in cfg.roles]
        lines.append(
            f"evaluate it: marti-ibrl eval --run {run} --policy {a}={run}/{a}/hf "
            f"--in-system {a}=checkpoint:{run}/{b}/hf --counterpart heldout:hardliner -n 50 --out {run}/eval"
        )
    return lines
