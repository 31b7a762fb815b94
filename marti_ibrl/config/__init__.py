"""Configuration: one schema, documented once per field, validated before Ray starts.

``from marti_ibrl.config import load_config, Config, ...`` is how the package and its users read a run's settings:

* :mod:`~marti_ibrl.config.schema` — the dataclasses (one per section) and the values a field may take; it imports
  nothing else of the package, so the modules below this one (environments, rewards, ablations) import it directly;
* :mod:`~marti_ibrl.config.load` — defaults < ``--config FILE.yaml`` < dotted flags, into a :class:`Config`;
* :mod:`~marti_ibrl.config.validate` — the cross-section checks, above environments and rewards.

Every error is a :class:`ConfigError` naming the offending flag; no value is silently changed.
"""

from marti_ibrl.config.load import load_config
from marti_ibrl.config.schema import (
    ESTIMATORS,
    CkptConfig,
    Config,
    ConfigError,
    DsConfig,
    EnvConfig,
    JudgeConfig,
    LoggerConfig,
    PoolConfig,
    RayConfig,
    RoleConfig,
    RolloutConfig,
    TrainConfig,
    to_yaml,
)
from marti_ibrl.config.validate import Existence, env_roles, env_spec, validate

__all__ = [
    "ESTIMATORS",
    "CkptConfig",
    "Config",
    "ConfigError",
    "DsConfig",
    "EnvConfig",
    "Existence",
    "JudgeConfig",
    "LoggerConfig",
    "PoolConfig",
    "RayConfig",
    "RoleConfig",
    "RolloutConfig",
    "TrainConfig",
    "env_roles",
    "env_spec",
    "load_config",
    "to_yaml",
    "validate",
]
