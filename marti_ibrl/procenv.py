"""Environment for the processes we start (Ray actors, engines, the SFT trainer)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def torch_extensions_dir() -> str:
    """Where DeepSpeed JIT-builds its CPU ops: per virtualenv (``$TORCH_EXTENSIONS_DIR`` wins).

    The default ``~/.cache/torch_extensions`` is shared by every environment, and two venvs rebuild
    the op over each other (about a minute each time on 2 cores). ``make install`` builds it once here.
    """
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(sys.prefix, "torch_extensions")


def child_env_vars() -> dict[str, str]:
    return {"TORCH_EXTENSIONS_DIR": torch_extensions_dir(), "TOKENIZERS_PARALLELISM": "false"}


PASS_THROUGH_ENV = ("NCCL_CUMEM_ENABLE",)
"""Variables handed to every Ray process only as the user set them: a cluster's workers do not inherit the driver's
environment. ``NCCL_CUMEM_ENABLE`` is never set otherwise: OpenRLHF's policy actor sets it to 0 itself where its vLLM
needs it (vLLM < 0.16); with newer vLLM (we pin 0.29) and NCCL 2.27+ it makes ``ncclCommInitRank`` fail."""


def ray_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``runtime_env`` variables of every Ray process we start: :func:`child_env_vars`, plus the user's own
    values of :data:`PASS_THROUGH_ENV` (``environ``, default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    return {**child_env_vars(), **{k: environ[k] for k in PASS_THROUGH_ENV if k in environ}}


SHARE_ONE_GPU_ENV = "MARTI_IBRL_SHARE_ONE_GPU"
"""``1``: every device slot of a local Ray is the one visible GPU (benchmarks/gpu_smoke.sh on a single-GPU machine)."""


def share_one_gpu() -> bool:
    return os.environ.get(SHARE_ONE_GPU_ENV) == "1"
