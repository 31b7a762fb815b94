"""Environment for the processes we start (Ray actors, engines, the SFT trainer)."""

from __future__ import annotations

import os
import random
import socket
import sys
from collections.abc import Mapping


def torch_extensions_dir() -> str:
    """Where DeepSpeed JIT-builds its CPU ops: per virtualenv (``$TORCH_EXTENSIONS_DIR`` wins).

    The default ``~/.cache/torch_extensions`` is shared by every environment, and two venvs rebuild
    the op over each other (about a minute each time on 2 cores). ``make install`` builds it once here.
    """
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(sys.prefix, "torch_extensions")


def child_env_vars() -> dict[str, str]:
    from marti_ibrl.quiet import pythonwarnings

    return {
        "TORCH_EXTENSIONS_DIR": torch_extensions_dir(),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": pythonwarnings(os.environ.get("PYTHONWARNINGS", "")),
    }


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


EPHEMERAL_FALLBACK = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range
LISTEN_PORTS_FROM = 20000  # above Ray's default worker ports (10002-19999) and its fixed ones below them


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's ephemeral port range (``net.ipv4.ip_local_port_range``; Linux's default where unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return EPHEMERAL_FALLBACK


def listen_port(host: str = "", rng: random.Random | None = None, tries: int = 200) -> int:
    """A free TCP port for a listener that starts *later* than it is chosen (a torch.distributed rendezvous, a server).

    The usual ``bind(port 0)`` hands out a port from the kernel's ephemeral range, the same range every outgoing
    connection and every other ``bind(0)`` listener (gloo's pairs, Ray's gRPC) draws from; in the seconds until the
    listener binds, one of them can take it (seen: ``DistNetworkError EADDRINUSE`` on a reference actor's
    rendezvous while another test process started its actors). So the port is drawn at random from between Ray's
    worker ports and the ephemeral range, where only an explicit choice like this one lands, and checked free on
    ``host`` (``""``: every address). Where that gap is too small (a kernel tuned otherwise), ``bind(0)`` as before.
    """
    rng = rng or random.SystemRandom()
    low = LISTEN_PORTS_FROM
    high = ephemeral_ports()[0] - 1
    if high - low >= 1000:
        for _ in range(tries):
            port = rng.randint(low, high)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
