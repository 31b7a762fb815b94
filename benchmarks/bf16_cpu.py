"""bf16 vs fp32 on this CPU (the evidence for OpenRLHF patch 0007, ``--ds.param_dtype fp32``).

A 512^3 matmul and a forward + backward of a 2-layer transformer encoder (d 256, 8 x 128 tokens), one thread, best
of five. CPUs without AVX512-BF16 / AMX run bf16 through emulation: to see that on a CPU that has them, limit oneDNN
(``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` or ``AVX2``). The last line is ``bf16/fp32 time ratio: X.XX (forward+backward)``.

    ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/bf16_cpu.py
"""

from __future__ import annotations

import os
import time

import torch


def best_of(fn, repeat: int = 5) -> float:
    fn()  # warm-up (oneDNN primitive creation)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "default")
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(512, 512, dtype=dtype), torch.randn(512, 512, dtype=dtype)
        layer = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True), num_layers=2
        ).to(dtype)
        x = torch.randn(8, 128, 256, dtype=dtype)

        def step(layer=layer, x=x) -> None:
            layer.zero_grad()
            layer(x).float().square().mean().backward()

        results[dtype] = (best_of(lambda a=a, b=b: a @ b), best_of(step))
        print(f"ISA {isa} {dtype}: matmul {results[dtype][0] * 1e3:.1f} ms, fwd+bwd {results[dtype][1] * 1e3:.1f} ms")
    ratio = [results[torch.bfloat16][i] / results[torch.float32][i] for i in (0, 1)]
    print(f"bf16/fp32 time ratio: {ratio[1]:.2f} (forward+backward; matmul {ratio[0]:.2f}), ISA {isa}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
