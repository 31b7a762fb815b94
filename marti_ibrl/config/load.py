"""Reading a configuration: the defaults of :mod:`marti_ibrl.config.schema` < ``--config FILE.yaml`` (omegaconf) <
dotted command-line flags in OpenRLHF style (``--rollout.n_samples_per_prompt 4``, ``--train.iterations 10``), with one
section per role: ``--role1.lr 1e-6 --role2.update_every 2`` (``roleN`` is the N-th entry of ``roles``; their names
come from the environment, e.g. DoND's ``agent1``/``agent2``). :func:`load_config` then validates
(:mod:`marti_ibrl.config.validate`) and applies the ablation's changes, once, before Ray starts.
"""

from __future__ import annotations

import re
import sys
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from marti_ibrl.algorithm.ablations import resolve as resolve_ablation
from marti_ibrl.config.schema import Config, ConfigError, EnvConfig
from marti_ibrl.config.validate import Existence, env_roles, validate, validate_start

_ROLE_FLAG = re.compile(r"^role(\d+)\.(.+)$")
VERBATIM = frozenset({"judge.structured", "train.colocate"})
"""Flags whose value is a word taken as written: YAML (omegaconf's grammar) would read ``on`` / ``off`` as booleans."""


def _flags_to_dotlist(argv: list[str]) -> list[tuple[str, str, str]]:
    """``--a.b 1 --c.d=2 --flag`` -> [(flag, key, value)]; a bare flag means ``true``."""
    out = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r} (flags look like --section.key VALUE)")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
                i += 1
            else:
                value = "true"
        out.append((arg.split("=")[0], key.replace("-", "_"), value))
        i += 1
    return out


def load_config(argv: list[str], assumed: list[str] | None = None) -> Config:
    """Parse ``[--config FILE.yaml] --section.key value ...`` into a validated :class:`Config`. ``assumed``: a
    list to run the existence checks leniently (:class:`Existence`)."""
    argv = list(argv)
    config_file = None
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("--config: expected a YAML file path")
        config_file = argv[i + 1]
        del argv[i : i + 2]
    schema = OmegaConf.structured(Config)
    merged = schema
    file_cfg: dict[str, Any] = {}
    if config_file:
        if not Path(config_file).is_file():
            raise ConfigError(f"--config: no such file {config_file}")
        file_cfg = _read_config_file(config_file)
    flags = _flags_to_dotlist(argv)
    env_name = next(
        (v for f, k, v in flags if k == "env.name"), (file_cfg.get("env") or {}).get("name", EnvConfig.name)
    )
    names = env_roles(env_name)
    # roles: the file may give a list (or a role1/role2 mapping); flags address roleN.
    file_roles = file_cfg.pop("roles", None) or []
    for key in [k for k in list(file_cfg) if _ROLE_FLAG.match(k + ".x")]:
        idx = int(key[4:]) - 1
        file_roles += [{}] * (idx + 1 - len(file_roles))
        file_roles[idx] = file_cfg.pop(key)
    if len(file_roles) > len(names):
        raise ConfigError(f"--config: {len(file_roles)} roles given, environment {env_name} has {len(names)}")
    roles = [dict(file_roles[i]) if i < len(file_roles) else {} for i in range(len(names))]
    for i, name in enumerate(names):
        roles[i].setdefault("name", name)
    try:
        merged = OmegaConf.merge(schema, {**file_cfg, "roles": roles})
    except OmegaConfBaseException as e:
        raise ConfigError(f"--config {config_file}: {_first_line(e)}") from None
    for flag, key, value in flags:
        m = _ROLE_FLAG.match(key)
        if m:
            idx = int(m.group(1)) - 1
            if not 0 <= idx < len(names):
                raise ConfigError(f"{flag}: environment {env_name} has roles role1..role{len(names)}")
            key = f"roles.{idx}.{m.group(2)}"
            if m.group(2) == "frozen":  # specs hold ':', '/', '@', '#': a comma list, never omegaconf grammar
                items = [v.strip() for v in value.strip().removeprefix("[").removesuffix("]").split(",")]
                OmegaConf.update(merged, key, [v for v in items if v], merge=False)
                continue
        if key in VERBATIM:
            OmegaConf.update(merged, key, value, merge=False)
            continue
        try:
            OmegaConf.update(merged, key, OmegaConf.from_dotlist([f"v={value}"]).v, merge=False)
        except OmegaConfBaseException as e:
            raise ConfigError(f"{flag}: {_first_line(e)}") from None
        except Exception as e:  # omegaconf parses a value as YAML: '@', ':', '=' are YAML's own errors
            why = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(f"{flag} {value!r}: not a value ({type(e).__name__}: {why})") from None
    try:
        cfg: Config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(f"missing value: --{_flag_name(e.full_key)} ({_first_line(e)})") from None
    validate(cfg, Existence(assumed))
    validate_start(cfg)
    cfg, changes = resolve_ablation(cfg)  # once, here: trainer, plan and placement all see the effective config
    for line in changes:
        print(f"--ablation {cfg.ablation}: {line}", file=sys.stderr)
    return cfg


def _read_config_file(config_file: str) -> dict[str, Any]:
    """A ``--config`` file's settings: a mapping of sections (``env:``, ``train:``, ...), each a mapping too, ``roles:``
    a list of mappings (or ``role1:``, ``role2:``... mappings); any other shape is a ConfigError naming the key."""
    import yaml

    where = f"--config {config_file}"
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(config_file))
    except (OSError, UnicodeDecodeError, OmegaConfBaseException, yaml.YAMLError) as e:  # a scalar, binary, not YAML
        mark = getattr(e, "problem_mark", None)
        why = f"{e.problem}, line {mark.line + 1} column {mark.column + 1}" if mark else str(e).strip().splitlines()[0]
        raise ConfigError(f"{where}: not a YAML mapping of sections ({why})") from None
    loaded = {} if loaded is None else loaded
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where}: expected a mapping of sections (env:, train:, ...), got a {type(loaded).__name__}")
    defaults = Config()
    for key, value in list(loaded.items()):
        if key == "roles":
            if value is not None and not (isinstance(value, list) and all(isinstance(r, dict) for r in value)):
                raise ConfigError(f"{where}: roles must be a list of mappings (- pretrain: PATH ...), got {value!r}")
        elif _ROLE_FLAG.match(f"{key}.x") or (
            key in Config.__dataclass_fields__ and is_dataclass(getattr(defaults, key))
        ):
            if value is None:  # an empty `train:` sets nothing
                del loaded[key]
            elif not isinstance(value, dict):
                raise ConfigError(
                    f"{where}: {key} must be a mapping of {key}.* settings (key: value lines), got {value!r}"
                )
    return loaded


def _first_line(e: OmegaConfBaseException) -> str:
    """OmegaConf's message without the ``full_key:``/``object_type=`` lines it appends (one-line CLI errors)."""
    return (str(e.msg).strip().splitlines() or [""])[0]


def _flag_name(key: str | None) -> str:
    m = re.match(r"roles\[?\.?(\d+)\]?\.(.+)", key or "")
    return f"role{int(m.group(1)) + 1}.{m.group(2)}" if m else str(key)
