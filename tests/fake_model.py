"""A directory that passes for a model before anything loads it (marti_ibrl/checkpoints.py): a config.json and a
whole, tiny model.safetensors. For tests that check flags and configs, not models."""

from __future__ import annotations

import json
from pathlib import Path


def fake_checkpoint(path: str | Path, config: dict | None = None) -> Path:
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or {}))
    save_file({"w": torch.zeros(2)}, str(path / "model.safetensors"))
    return path
