"""`marti-ibrl diagnose` on a run with two tiny checkpoints: Fig. 5 / Fig. 6 analogues through real engines."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from safetensors.torch import load_file, save_file

    from marti_ibrl.config import load_config, to_yaml
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("diag")
    model = build_tiny_dond_model(tmp / "tiny")
    run = tmp / "run"
    cfg = load_config(
        [
            *("--role1.pretrain", model, "--role2.pretrain", model, "--ckpt.path", str(run)),
            *("--env.prompt_style", "compact", "--env.max_rounds", "2"),
            *("--rollout.max_new_tokens", "12", "--rollout.max_len", "384"),
        ]
    )
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(cfg))
    for step, scale in ((1, 0.0), (2, 0.5)):  # step 2: the same model with perturbed weights
        for role in ("agent1", "agent2"):
            d = run / role / "ckpt" / f"global_step{step}_hf"
            shutil.copytree(model, d)
            weights = load_file(str(d / "model.safetensors"))
            g = torch.Generator().manual_seed(step)
            weights = {k: v + scale * torch.randn(v.shape, generator=g).to(v.dtype) for k, v in weights.items()}
            save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    return run


def test_diagnose_writes_heatmap_curve_and_numbers(run_dir, capsys):
    import ray

    from marti_ibrl.cli import main
    from marti_ibrl.eval.report import write_report

    assert main(["diagnose", str(run_dir), "--role", "agent1", "-n", "3"]) == 0
    ray.shutdown()
    result = json.loads((run_dir / "diagnostics" / "agent1.json").read_text())
    assert [p["checkpoint"] for p in result["points"]] == [1, 2]
    assert all(0.0 <= p["fixed"] <= 1.0 and 0.0 <= p["in_system"] <= 1.0 for p in result["points"])
    sim = result["similarity"]
    assert sim["labels"] == ["step 1", "step 2"]
    m = torch.tensor(sim["matrix"])
    assert m.shape == (2, 2) and torch.allclose(m, m.T) and bool(((m > -1) & (m <= 1)).all())
    for name in ("similarity_agent1.png", "insystem_vs_fixed_agent1.png"):
        assert (run_dir / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    episodes = (run_dir / "diagnostics" / "episodes" / "agent1-step1__fixed.jsonl").read_text().splitlines()
    assert len(episodes) == 6  # 3 scenarios, both seats
    report = write_report(run_dir).read_text()
    assert "## Checkpoint diagnostics: agent1" in report and "figures/similarity_agent1.png" in report


def test_diagnose_errors(tmp_path, capsys):
    from marti_ibrl.cli import main

    assert main(["diagnose", str(tmp_path), "--role", "agent1"]) == 2
    assert "not a training run directory" in capsys.readouterr().err


def test_a_truncated_checkpoint_is_one_line_before_ray(run_dir, tmp_path, capsys):
    """Issue 63: a truncated ``global_stepK_hf`` was a SafetensorError after 2 minutes (Ray, engines, a first game)."""
    import time

    from marti_ibrl.cli import main

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    weights = run / "agent1" / "ckpt" / "global_step2_hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    shutil.rmtree(run / "diagnostics", ignore_errors=True)  # the module's run may have been diagnosed already
    t0 = time.monotonic()
    assert main(["diagnose", str(run), "--role", "agent1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"marti-ibrl diagnose: error: {run}: {weights} is truncated") and len(err.splitlines()) == 1
    assert time.monotonic() - t0 < 30 and not (run / "diagnostics").exists()
