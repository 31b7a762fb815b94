"""Environment for the processes we start (Ray actors, engines, the SFT trainer)."""

from __future__ import annotations

import os
import sys


def torch_extensions_dir() -> str:
    """Where DeepSpeed JIT-builds its CPU ops: per virtualenv (``$TORCH_EXTENSIONS_DIR`` wins).

    The default ``~/.cache/torch_extensions`` is shared by every environment, and two venvs rebuild
    the op over each other (about a minute each time on 2 cores). ``make install`` builds it once here.
    """
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(sys.prefix, "torch_extensions")


def child_env_vars() -> dict[str, str]:
    return {"TORCH_EXTENSIONS_DIR": torch_extensions_dir(), "TOKENIZERS_PARALLELISM": "false"}


SHARE_ONE_GPU_ENV = "MARTI_IBRL_SHARE_ONE_GPU"
"""``1``: every device slot of a local Ray is the one visible GPU (benchmarks/gpu_smoke.sh on a single-GPU machine)."""


def share_one_gpu() -> bool:
    return os.environ.get(SHARE_ONE_GPU_ENV) == "1"
