"""Opponent-pool snapshot cost: a snapshot vs. writing the weights once, and a projection to 4B / 9B.

A pool snapshot (``RolePolicyActorBase.export_weights``) writes the policy's parameters once as bf16
safetensors (to ``.tmp``, then renamed) and hashes the file for the manifest. This script times, on
this machine's disk, in one run: (a) ``save_file`` of N GiB of bf16 tensors — "writing the weights
once" — and (b) the full snapshot path (save + sha256 + rename), and prints their ratio and the
projected snapshot time and disk cost per checkpoint for Qwen3.5-4B / 9B-sized policies. In training
the export runs on the role's actor while the next iteration rolls out, so the driver only waits for
what is left of it (``timing/snapshot_wait``).

    .venv/bin/python benchmarks/snapshot_io.py --gib 1 --dir /tmp
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from safetensors.torch import save_file

from marti_ibrl.algorithm.pool import file_sha256

PARAMS = {"Qwen3.5-4B (≈4.0e9 params)": 4.0e9, "Qwen3.5-9B (≈9.0e9 params)": 9.0e9}


def tensors(gib: float) -> dict[str, torch.Tensor]:
    n = int(gib * 2**30 / 2)  # bf16: 2 bytes per parameter
    rows = 4096
    per = rows * rows  # 16.7M params per tensor, like a 4096x4096 projection
    out, i = {}, 0
    while n > 0:
        k = min(per, n)
        out[f"layers.{i}.weight"] = torch.empty(k, dtype=torch.bfloat16).normal_()
        n -= k
        i += 1
    return out


def snapshot(state: dict[str, torch.Tensor], path: str) -> None:
    """The export's disk path: save to .tmp, sha256 the file, rename."""
    tmp = path + ".tmp"
    save_file(state, tmp)
    file_sha256(tmp)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="size of the synthetic bf16 weights")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir; use the pool's disk)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    state = tensors(args.gib)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        write, snap = [], []
        for r in range(args.repeats):
            p = os.path.join(d, f"w{r}.safetensors")
            t0 = time.perf_counter()
            save_file(state, p)
            write.append(time.perf_counter() - t0)
            os.remove(p)
            p = os.path.join(d, f"s{r}.safetensors")
            t0 = time.perf_counter()
            snapshot(state, p)
            snap.append(time.perf_counter() - t0)
            os.remove(p)
    w, s = min(write), min(snap)
    gbps = nbytes / s / 1e9
    print(f"{nbytes / 2**30:.2f} GiB bf16: write once {w:.2f} s, snapshot (write + sha256 + rename) {s:.2f} s")
    print(f"ratio snapshot / write-once: {s / w:.2f}x   snapshot throughput {gbps:.2f} GB/s")
    for name, n in PARAMS.items():
        size = n * 2
        print(f"{name}: {size / 1e9:.1f} GB per snapshot on disk; projected snapshot {size / 1e9 / gbps:.1f} s here")


if __name__ == "__main__":
    main()
