"""Issue 50: a checkpoint directory without weights, with truncated weights or with a config.json that is not JSON is
one line naming the file, for every command that takes one (marti_ibrl/checkpoints.py), before any process starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from marti_ibrl.checkpoints import checkpoint_problem, safetensors_problem


def _model(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    save_file({"w": torch.zeros(64, 64), "b": torch.ones(3)}, str(path / "model.safetensors"))
    return path


def test_a_whole_model_and_adapter_pass(tmp_path) -> None:
    assert checkpoint_problem(_model(tmp_path / "m")) is None
    adapter = tmp_path / "a"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    save_file({"lora_A": torch.zeros(2, 8)}, str(adapter / "adapter_model.safetensors"))
    assert checkpoint_problem(adapter) is None


def _truncate(m: Path) -> None:
    data = (m / "model.safetensors").read_bytes()
    (m / "model.safetensors").write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda m: (m / "model.safetensors").unlink(), "holds no weights (model.safetensors, "),
        (_truncate, "model.safetensors is truncated ("),
        (lambda m: (m / "model.safetensors").write_bytes(b"\x01"), "model.safetensors is truncated (1 bytes: not even"),
        (lambda m: (m / "config.json").write_text("nope{"), "config.json is not JSON (JSONDecodeError"),
        (lambda m: (m / "config.json").write_text("[1, 2]"), "config.json is not a JSON object (a list)"),
        (lambda m: (m / "config.json").unlink(), "is not a model (no config.json or adapter_config.json there)"),
    ],
)
def test_a_broken_checkpoint_is_named(tmp_path, breakage, message) -> None:
    m = _model(tmp_path / "m")
    breakage(m)
    why = checkpoint_problem(m)
    assert why is not None and message in why, why


def test_a_sharded_checkpoint_needs_every_shard(tmp_path) -> None:
    m = _model(tmp_path / "m")
    (m / "model.safetensors").rename(m / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"w": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (m / "model.safetensors.index.json").write_text(json.dumps(index))
    assert checkpoint_problem(m) == f"{m / 'model-00002-of-00002.safetensors'} is missing (its index lists it)"
    save_file({"b": torch.ones(3)}, str(m / "model-00002-of-00002.safetensors"))
    assert checkpoint_problem(m) is None


def test_a_header_that_is_not_json(tmp_path) -> None:
    f = tmp_path / "x.safetensors"
    f.write_bytes((4).to_bytes(8, "little") + b"nope")
    assert safetensors_problem(f) == f"{f} is not a safetensors file (its header is not JSON)"


def _broken(tmp_path: Path) -> Path:
    m = _model(tmp_path / "broken")
    _truncate(m)
    return m


def test_train_refuses_a_truncated_pretrain_in_one_line(tmp_path, capsys) -> None:
    from marti_ibrl.cli import main

    m = _broken(tmp_path)
    code = main(["train", "--config", "recipes/dond/tiny-cpu.yaml", "--role1.pretrain", str(m), "--role2.pretrain",
                 "recipes/dond/tiny-sft", "--ckpt.path", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"marti-ibrl train: error: --role1.pretrain: {m / 'model.safetensors'} is truncated"), err
    assert not (tmp_path / "run").exists()


def test_eval_refuses_a_truncated_policy_in_one_line(tmp_path, capsys) -> None:
    from marti_ibrl.cli import main

    m = _broken(tmp_path)
    code = main(["eval", "--policy", f"p={m}", "--self-play", "-n", "2", "--out", str(tmp_path / "eval")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"--policy p: {m / 'model.safetensors'} is truncated" in err[0], err
    assert not (tmp_path / "eval").exists()


def test_play_refuses_a_checkpoint_without_weights_in_one_line(tmp_path, capsys) -> None:
    pytest.importorskip("fastapi")
    from marti_ibrl.cli import main

    m = _model(tmp_path / "m")
    (m / "model.safetensors").unlink()
    code = main(["play", "--policy", str(m), "--env", "dond", "--db", str(tmp_path / "p.sqlite"), "--port", "8765"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"marti-ibrl play: error: --policy {m}: {m} holds no weights"), err


def test_eval_refuses_a_truncated_in_system_checkpoint_in_one_line(tmp_path, capsys) -> None:
    from marti_ibrl.cli import main

    m = _broken(tmp_path)
    sft = "recipes/dond/tiny-sft"
    argv = ["eval", "--policy", f"p={sft}", "--in-system", f"p=checkpoint:{m}", "--counterpart", "heldout:hardliner"]
    code = main([*argv, "-n", "2", "--out", str(tmp_path / "eval")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"--in-system in-system: {m / 'model.safetensors'} is truncated" in err[0], err
    assert not (tmp_path / "eval").exists()
