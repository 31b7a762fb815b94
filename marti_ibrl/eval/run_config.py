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


TRAINED_SETTINGS = {
    # eval flag's dest: the training config's key
    "max_rounds": "env.max_rounds",
    "max_resamples": "env.max_resamples",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "max_new_tokens": "rollout.max_new_tokens",
    "max_len": "rollout.max_len",
}
"""What a policy's training fixed that every evaluation keeps: the rounds, the re-samples of a malformed turn, the
sampling (``--run``'s; flags override them). DoND adds its protocol (:data:`marti_ibrl.eval.dond.command.RUN_SETTINGS`)."""


def setting_defaults(settings: dict[str, str]) -> dict[str, Any]:
    """``{flag dest: training config key}``'s values in the training schema (:class:`marti_ibrl.config.Config`): one
    source for the defaults of ``train`` and ``eval``."""
    from omegaconf import OmegaConf

    from marti_ibrl.config import Config

    schema = OmegaConf.structured(Config)
    return {dest: OmegaConf.select(schema, key) for dest, key in settings.items()}


def apply_run_settings(args, settings: dict[str, str], wanted: str) -> str | None:
    """Fill every flag of ``settings`` (``{flag dest: training config key}``) not given: from ``--run RUN``'s
    ``config.yaml`` (``ValueError`` unless it is a run of the environment ``wanted``), else training's default.
    Returns the line saying where each came from (None without ``--run``)."""
    from omegaconf import OmegaConf

    defaults = setting_defaults(settings)
    if getattr(args, "run", None) is None:
        for dest, default in defaults.items():
            if getattr(args, dest) is None:
                setattr(args, dest, default)
        return None
    path, cfg = read_run_config(args.run)
    env = env_name(cfg)
    if env != wanted:
        raise ValueError(f"--run {args.run}: a {env} run; marti-ibrl eval --env {wanted} evaluates {wanted}")
    taken, overridden = [], []
    for dest, key in settings.items():
        try:
            trained = OmegaConf.select(cfg, key, default=defaults[dest])
        except Exception as e:  # e.g. env a list: select cannot walk it
            raise ValueError(
                f"--run {args.run}: {path}: {key} cannot be read ({' '.join(str(e).split())[:120]})"
            ) from None
        kind = type(defaults[dest])
        if defaults[dest] is not None and not (
            isinstance(trained, kind) or (kind is float and isinstance(trained, int) and not isinstance(trained, bool))
        ):
            raise ValueError(
                f"--run {args.run}: {path} has {key}: {trained!r}, not of type {kind.__name__} (edited by hand?)"
            )
        flag = "--" + dest.replace("_", "-")
        given = getattr(args, dest)
        if given is None:
            setattr(args, dest, trained)
            taken.append(f"{flag} {trained}")
        elif given != trained:
            overridden.append(f"{flag} {given} (trained: {trained})")
    line = f"[eval] from {path}: {', '.join(taken) or 'nothing'}"
    return line + (f"; overridden by flags: {', '.join(overridden)}" if overridden else "")
