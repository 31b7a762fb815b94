"""The training run an evaluation's policies come from (``--run RUN``): its ``config.yaml``, read once per command."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_run_config(run: str) -> tuple[Path, Any]:
    """``RUN/config.yaml`` and its contents (an omegaconf ``DictConfig``); ``ValueError`` naming ``--run`` when it is
    missing or unreadable (one line, not a traceback)."""
    from omegaconf import OmegaConf

    path = Path(run) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"--run {run}: no config.yaml there (not a training run directory)")
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # a damaged file
        reason = " ".join(str(e).split())  # YAML's errors span lines
        raise ValueError(f"--run {run}: cannot read {path}: {reason}") from None
    if not OmegaConf.is_dict(cfg):
        raise ValueError(f"--run {run}: {path} is not a training config (a YAML {type(cfg).__name__}, not a mapping)")
    return path, cfg


def env_name(cfg: Any) -> str:
    """The environment a run's config trained on (``env.name``; the schema's default when unset)."""
    from omegaconf import OmegaConf

    from marti_ibrl.config.schema import EnvConfig

    return OmegaConf.select(cfg, "env.name", default=EnvConfig.name)


def run_env_name(run: str) -> str:
    """The environment ``--run RUN`` trained on (:func:`env_name` of its ``config.yaml``)."""
    return env_name(read_run_config(run)[1])
