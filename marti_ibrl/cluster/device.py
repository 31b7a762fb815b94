"""The device a run uses (``--train.device``), checked before anything heavy is imported or started.

Only torch is imported here: ``marti-ibrl train`` and ``demo`` call :func:`resolve_device` before the trainer (Ray,
DeepSpeed, OpenRLHF), so a run asking for a device this machine lacks fails in one line, not a traceback.
``marti-ibrl plan`` takes the flag too but never calls this: it sizes GPU jobs from machines without one.
"""

from __future__ import annotations

import torch

from marti_ibrl.config import ConfigError


def resolve_device(requested: str, flag: str = "--train.device") -> str:
    """The device a ``--train.device`` value (or an evaluation's ``--device``: ``flag``) runs on: ``auto`` is cuda
    when torch sees a CUDA device, else cpu; ``cuda`` without one is a :class:`~marti_ibrl.config.ConfigError`
    naming the flag. Every command that picks a device asks here, and hands the answer on (the engines take it)."""
    cuda = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if cuda else "cpu"
    if requested == "cuda" and not cuda:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(
            f"{flag}: cuda, but torch ({torch.__version__}, {build}) sees no CUDA device here; "
            "use cpu (or auto) on this machine"
        )
    return requested


CPU_DTYPES = ("fp32", "bf16")
"""``--ds.param_dtype`` values that train on CPU: DeepSpeed's fp16 path (loss scaling, fused fp16 optimizer) is GPU
only, so fp16 on CPU would fail in DeepSpeed after Ray and every rank started."""


def check_device_dtype(param_dtype: str, device: str) -> None:
    """A ConfigError naming ``--ds.param_dtype`` when ``device`` (resolved) cannot train in it."""
    if device == "cpu" and param_dtype not in CPU_DTYPES:
        raise ConfigError(
            f"--ds.param_dtype: {param_dtype} does not train on CPU (DeepSpeed's fp16 mixed precision is GPU only); "
            f"use fp32 (the fastest on CPU) or bf16"
        )
