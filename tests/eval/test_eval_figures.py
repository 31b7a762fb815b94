"""marti_ibrl.eval.figures: EMA, reward curves, in-system vs fixed, cross-checkpoint similarity (real MiniLM)."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from marti_ibrl.eval import figures as d

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path, min_bytes: int = 2000) -> None:
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > min_bytes
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(img[..., :3].std()) > 0.01  # not a blank canvas


# ------------------------------------------------------------------------------------------------ EMA


def test_ema_by_hand() -> None:
    assert d.ema([1.0, 2.0, 3.0, 0.0], alpha=0.5) == pytest.approx([1.0, 1.5, 2.25, 1.125])
    assert d.ema([0.0, 10.0, 10.0]) == pytest.approx([0.0, 2.0, 3.6])  # default alpha = 0.2 (the paper's)
    assert d.ema([4.0, -1.0], alpha=1.0) == [4.0, -1.0]
    assert d.ema([]) == []
    with pytest.raises(ValueError):
        d.ema([1.0], alpha=0.0)


# ------------------------------------------------------------------------------------------------ reward curves


def _history() -> list[dict]:
    a1 = [0.30, 0.32, 0.25, 0.35, 0.40]
    a2 = [0.70, 0.63, 0.70, 0.80, 0.85]
    # out of order on purpose, plus an unrelated metric
    return [
        {"iteration": k + 1, "agent1/reward": a1[k], "agent2/reward": a2[k], "rollout/agreement": 0.5}
        for k in (2, 0, 1, 3, 4)
    ]


def test_reward_series_sorted_and_smoothed() -> None:
    s = d.reward_series(_history(), ["agent1", "agent2"], alpha=0.2)
    assert s["agent1"]["iteration"] == [1, 2, 3, 4, 5]
    assert s["agent1"]["raw"] == pytest.approx([0.30, 0.32, 0.25, 0.35, 0.40])
    # by hand: 0.30, 0.2*0.32+0.8*0.30=0.304, 0.2*0.25+0.8*0.304=0.2932, 0.2*0.35+0.8*0.2932=0.30456, ...
    assert s["agent1"]["ema"] == pytest.approx([0.30, 0.304, 0.2932, 0.30456, 0.323648])
    assert list(d.reward_series(_history()).keys()) == ["agent1", "agent2"]  # roles inferred
    with pytest.raises(KeyError, match="agent3/reward"):
        d.reward_series(_history(), ["agent3"])


def test_reward_curves_draws_raw_and_ema_per_role(tmp_path) -> None:
    fig = d.plot_reward_curves(_history(), ["agent1", "agent2"], alpha=0.2)
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert len(lines) == 4  # 2 per role: raw + EMA
    by_label = {line.get_label(): line for line in lines}
    assert set(by_label) == {"agent1 (raw)", "agent1 (EMA, α=0.2)", "agent2 (raw)", "agent2 (EMA, α=0.2)"}
    ema2 = by_label["agent2 (EMA, α=0.2)"]
    assert list(ema2.get_xdata()) == [1, 2, 3, 4, 5]
    assert list(ema2.get_ydata()) == pytest.approx(d.ema([0.70, 0.63, 0.70, 0.80, 0.85], 0.2))
    assert list(by_label["agent2 (raw)"].get_ydata()) == pytest.approx([0.70, 0.63, 0.70, 0.80, 0.85])
    assert ema2.get_linewidth() > by_label["agent2 (raw)"].get_linewidth()  # bold smoothed, thin raw
    assert by_label["agent2 (raw)"].get_alpha() < 1
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_legend() is not None

    out = d.reward_curves(_history(), ["agent1", "agent2"], tmp_path / "figs" / "rewards.png")
    assert out == tmp_path / "figs" / "rewards.png"
    _assert_png(out)


def test_outcome_curves_draw_agreement_and_malformed_shares(tmp_path) -> None:
    history = [
        {"iteration": k, "rollout/agreement": a, "rollout/malformed": m}
        for k, a, m in [(1, 0.1, 0.6), (2, 0.2, 0.5), (3, 0.5, 0.2)]
    ]
    (ax,) = d.plot_outcome_curves(history, alpha=0.5).axes
    by_label = {line.get_label(): line for line in ax.get_lines()}
    assert set(by_label) == {"agreement (raw)", "agreement (EMA, α=0.5)", "malformed (raw)", "malformed (EMA, α=0.5)"}
    assert list(by_label["agreement (raw)"].get_ydata()) == pytest.approx([0.1, 0.2, 0.5])
    assert list(by_label["malformed (EMA, α=0.5)"].get_ydata()) == pytest.approx([0.6, 0.55, 0.375])
    assert ax.get_ylim() == pytest.approx((-0.02, 1.02))  # shares: the whole [0, 1] range
    with pytest.raises(KeyError, match="rollout/malformed"):
        d.plot_outcome_curves([{"iteration": 1, "rollout/agreement": 0.1}])
    _assert_png(d.outcome_curves(history, tmp_path / "outcomes.png"))


def test_load_history(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        d.load_history(tmp_path)
    (tmp_path / "trainer_state.json").write_text(json.dumps({"iteration": 5, "history": _history()}))
    assert d.load_history(tmp_path) == _history()
    assert d.load_history(tmp_path / "trainer_state.json") == _history()
    (tmp_path / "trainer_state.json").write_text(json.dumps({"iteration": 5}))
    with pytest.raises(ValueError, match="history"):
        d.load_history(tmp_path)


# ------------------------------------------------------------------------------------------------ in-system vs fixed


def test_insystem_vs_fixed(tmp_path) -> None:
    points = [
        {"method": "IB-RL", "checkpoint": 40, "in_system": 0.55, "fixed": 0.50, "n": 200},
        {"method": "IB-RL", "checkpoint": 0, "in_system": 0.30, "fixed": 0.30, "n": 200},
        {"method": "IB-RL", "checkpoint": 20, "in_system": 0.50, "fixed": 0.58, "n": 200},
        {"method": "Unilateral", "checkpoint": 0, "in_system": 0.30, "fixed": 0.30},
        {"method": "Unilateral", "checkpoint": 20, "in_system": 0.60, "fixed": 0.60},
        {"method": "Unilateral", "checkpoint": 40, "in_system": 0.65, "fixed": None},
    ]
    fig = d.plot_insystem_vs_fixed(points)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert len(lines) == 4  # two lines per method
    fixed = lines["IB-RL: vs fixed counterpart"]
    assert list(fixed.get_xdata()) == [0, 20, 40] and list(fixed.get_ydata()) == [0.30, 0.58, 0.50]
    assert fixed.get_linestyle() == "--" and lines["IB-RL: vs in-system counterpart"].get_linestyle() == "-"
    assert list(lines["Unilateral: vs fixed counterpart"].get_xdata()) == [0, 20]  # None skipped
    assert len(ax.collections) == 2  # Wilson bands only for the series with n
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(0.2407, abs=1e-3) and band.max() < 0.63  # Wilson 95% of 60/200 starts at .2407
    _assert_png(d.insystem_vs_fixed(points, tmp_path / "fig5.png"))
    with pytest.raises(ValueError):
        d.insystem_vs_fixed([{"checkpoint": 0, "in_system": 1.5}], tmp_path / "bad.png")


# ------------------------------------------------------------------------------------------------ similarity


class _Fake:
    """Hand-made 2-d 'embeddings' (not normalised: embed() normalises)."""

    vectors = {"a": [1.0, 0.0], "b": [0.0, 3.0], "c": [2.0, 2.0]}

    def encode(self, texts):
        return np.array([self.vectors[t] for t in texts])


def test_similarity_matrix_exact_values_with_a_fake_embedder() -> None:
    labels, m = d.similarity_matrix({"x": ["a", "a", "b"], "y": ["c"]}, embedder=_Fake())
    assert labels == ["x", "y"]
    # within x, distinct pairs: (a,a)=1, (a,b)=0 twice, each both ways -> 2/6
    assert m[0, 0] == pytest.approx(1 / 3)
    assert m[0, 1] == m[1, 0] == pytest.approx(1 / math.sqrt(2))  # every x utterance vs c is at 45°
    assert math.isnan(m[1, 1])  # one utterance: no distinct pair
    _, c = d.similarity_matrix({"x": ["a", "a", "b"], "y": ["c"]}, embedder=_Fake(), method="centroid")
    assert c[0, 1] == pytest.approx(3 / math.sqrt(10)) and c[0, 0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="'y'"):
        d.similarity_matrix({"x": ["a"], "y": []}, embedder=_Fake())
    with pytest.raises(ValueError):
        d.similarity_matrix({}, embedder=_Fake())


def test_load_embedder_missing_dir_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        d.load_embedder(tmp_path / "nope")


@pytest.fixture(scope="module")
def minilm():
    before = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    model = d._default_embedder()  # = load_embedder() on the bundled all-MiniLM-L6-v2, once per module
    assert {k: os.environ.get(k) for k in before} == before  # offline mode only while loading
    return model


def test_minilm_loads_offline_and_ranks_paraphrases(minilm) -> None:
    assert d.default_embedder_path().joinpath("model.safetensors").is_file()
    assert minilm.get_sentence_embedding_dimension() == 384
    para = d.cosine("I want the books.", "Give me the books.", minilm)
    other = d.cosine("I want the books.", "The weather is cold today.", minilm)
    assert para > other + 0.3
    assert para > 0.6 and other < 0.3


def test_similarity_matrix_and_heatmap_with_minilm(minilm, tmp_path) -> None:
    utterances = {
        "step0": ["I want the books.", "Give me the hats, you take the balls.", "Deal, I take the books."],
        "step10": ["I would like the books.", "You take the balls and give me the hats.", "Okay, the books are mine."],
        "step20": ["The weather is cold today.", "My cat sleeps all afternoon.", "Trains are late again."],
    }
    labels, m = d.similarity_matrix(utterances)  # embedder=None -> the cached bundled MiniLM
    assert labels == ["step0", "step10", "step20"]
    assert m.shape == (3, 3) and np.allclose(m, m.T)
    assert m[0, 1] > m[0, 2] + 0.2 and m[0, 1] > m[1, 2] + 0.2  # the near-identical checkpoints are closest
    assert m[0, 1] > m[2, 2]  # closer to each other than the unrelated checkpoint's utterances are among themselves
    assert np.all(np.isfinite(m)) and np.all(m <= 1 + 1e-6)

    fig = d.plot_similarity_heatmap(labels, m, title="user policy")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 9 and texts[1] == f"{m[0, 1]:.2f}"
    assert len(fig.axes) == 2  # heatmap + colorbar
    _assert_png(d.similarity_heatmap(labels, m, tmp_path / "heatmap.png"))
    nan_fig = d.plot_similarity_heatmap(["x", "y"], [[float("nan"), 0.5], [0.5, 1.0]])
    assert [t.get_text() for t in nan_fig.axes[0].texts] == ["n/a", "0.50", "0.50", "1.00"]
