"""Weight digests: equal digests mean equal weights, across processes, dtypes and delivery order.

A light module (hashlib and torch only): vLLM workers (:mod:`marti_ibrl.rollout.vllm_worker`), HF engines, actors
and the trainer's ``--train.check_sync`` hash weights the same way without importing each other's heavy modules.
"""

from __future__ import annotations

import hashlib


def params_digest(named_params) -> str:
    """sha256 over (name, fp32 value) pairs in name order: equal digests mean equal weights, across processes,
    dtypes and the order a file or a broadcast delivered them in. Each value is hashed as it comes (a ZeRO-3
    parameter is whole only while it is gathered)."""
    return combine_param_hashes(param_hashes(named_params))


def param_hashes(named_params) -> dict[str, bytes]:
    """name -> sha256 of the parameter's fp32 value: what :func:`params_digest` combines (an engine keeps these, not
    a copy of the weights it loaded)."""
    return {
        name: hashlib.sha256(p.detach().float().cpu().contiguous().numpy().tobytes()).digest()
        for name, p in named_params
    }


def combine_param_hashes(hashes: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name, value in sorted(hashes.items()):
        h.update(name.encode())
        h.update(value)
    return h.hexdigest()
