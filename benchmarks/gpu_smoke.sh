#!/usr/bin/env bash
# GPU smoke test: one IB-RL iteration of a tiny model on CUDA — DeepSpeed on the GPU, vLLM engines when vllm is
# installed (HF generate otherwise) — with timings: start-up (Ray, engines, DeepSpeed models, first weight sync) and
# the iteration's timing/* metrics. Config: recipes/dond/tiny-cpu.yaml with --train.device cuda and bf16. Then the
# same iteration colocated (--train.colocate all, vLLM only): the GPU memory its engines' sleep frees (mem_get_info
# with the engines asleep, awake, asleep), the seconds to wake and to sleep, and the phase record's violations. Before
# it, 3 iterations synchronous and with --train.async_rollout: seconds per iteration, overlap, staleness.
#
#   bash benchmarks/gpu_smoke.sh [extra --section.key VALUE flags]      (OUT=DIR keeps the run; default: a temp dir)
#
# Exit 2 within seconds, before Ray starts, on a machine without a usable CUDA GPU (no nvidia-smi, or torch without
# CUDA). One GPU is enough: MARTI_IBRL_SHARE_ONE_GPU=1 runs every device slot of the job (actors, references,
# engines: 8 here) on the one visible GPU (backend/cluster.py start_ray), vLLM engines with a small
# gpu_memory_utilization each. The whole run is capped at SMOKE_TIMEOUT seconds (default 540).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[[ -x "$PY" ]] || PY=python3
die() {
    echo "gpu_smoke: error: $*" >&2
    exit 2
}
command -v nvidia-smi >/dev/null 2>&1 ||
    die "no NVIDIA GPU here (nvidia-smi not found); this smoke test needs a CUDA GPU"
nvidia-smi -L >/dev/null 2>&1 || die "nvidia-smi fails: no usable NVIDIA GPU/driver; this smoke test needs a CUDA GPU"
info=$("$PY" -W ignore -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu", torch.__version__)' \
    2>&1 | tail -n 1) || true
case $info in
cuda\ *) ;;
cpu\ *) die "torch.cuda.is_available() is False (torch ${info#cpu }): a CUDA build of torch is needed" \
    '(pip install -e ".[gpu]")' ;;
*) die "cannot import torch with $PY: $info" ;;
esac

OUT=${OUT:-$(mktemp -d -t ibrl-gpu-smoke-XXXXXX)}
export MARTI_IBRL_SHARE_ONE_GPU=1 RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1
echo "gpu_smoke: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1); output in $OUT"
exec timeout --signal=INT --kill-after=30 "${SMOKE_TIMEOUT:-540}" "$PY" - "$OUT" "$@" <<'EOF'
import importlib.util
import sys
import time

t0 = time.perf_counter()
import torch

from marti_ibrl.config import load_config
from marti_ibrl.tiny import build_tiny_dond_model

out, extra = sys.argv[1], sys.argv[2:]
# head_dim 64 (vLLM's attention kernels do not take the demo model's 16)
model = build_tiny_dond_model(f"{out}/tiny", hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256)
flags = ["--config", "recipes/dond/tiny-cpu.yaml", "--train.device", "cuda", "--ds.param_dtype", "bf16"]
flags += ["--train.iterations", "1", "--ckpt.path", f"{out}/run", "--ray.log_to_driver", "true"]
flags += ["--role1.pretrain", model, "--role2.pretrain", model]
flags += ["--role1.gpu_memory_utilization", "0.08", "--role2.gpu_memory_utilization", "0.08"]
cfg = load_config(flags + extra)
engines = "vLLM" if importlib.util.find_spec("vllm") else "HF generate (vllm not installed)"
print(f"gpu_smoke: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}; "
      f"engines: {engines}; model built in {time.perf_counter() - t0:.1f}s", flush=True)

import ray

from marti_ibrl.cluster.placement import device_slots
from marti_ibrl.trainer import IBRLTrainer

t1 = time.perf_counter()
trainer = IBRLTrainer(cfg)
startup = time.perf_counter() - t1
t2 = time.perf_counter()
m = trainer.fit()[-1]
fit = time.perf_counter() - t2
ray.shutdown()
print(f"\ngpu_smoke: OK, {device_slots(cfg)} device slots on one GPU")
print(f"  {'start-up (Ray, engines, DeepSpeed models, first weight sync)':<62} {startup:8.1f} s")
for key in sorted(k for k in m if k.startswith("timing/")):
    print(f"  {key:<62} {m[key]:8.2f} s")
print(f"  {'iteration + final checkpoint (fit)':<62} {fit:8.1f} s")
print(f"  {'total':<62} {time.perf_counter() - t0:8.1f} s")
keys = ("rollout/turns", "rollout/malformed", "agent1/updated", "agent2/updated")
print("  " + ", ".join(f"{k} {m[k]:.2f}" for k in keys))

# --train.async_rollout (issue 38): 3 iterations synchronous, then asynchronous (staleness 1), same seed: the wall
# time per iteration, the generation that overlapped the previous iteration's updates, the data's staleness
from marti_ibrl.cluster.phases import read_phases, violations

timed = {}
for mode, more in (("sync", []), ("async", ["--train.async_rollout", "true"])):
    run = load_config(flags + extra + ["--train.iterations", "3", "--ckpt.path", f"{out}/run-{mode}", *more])
    trainer = IBRLTrainer(run)
    timed[mode] = trainer.fit()
    ray.shutdown()
print("\ngpu_smoke: --train.async_rollout vs synchronous, 3 iterations (seconds per iteration)")
for mode, history in timed.items():
    print(f"  {mode:<6} " + " ".join(f"{m['timing/iteration']:6.2f}" for m in history)
          + (f"   overlap {[round(m['async/overlap_seconds'], 2) for m in history]}, agent1 staleness "
             f"{[m['agent1/async/staleness'] for m in history]}" if mode == "async" else ""))
records = read_phases(f"{out}/run-async")
print(f"  async phases.jsonl: violations: {violations(records, {0: ['agent1', 'agent2'], 1: ['agent1'], 2: ['agent1', 'agent2'], 3: ['agent1']}, colocated=False) or 'none'}")

# --train.colocate all (issue 37): both roles' engines, actors and references on the same GPU. The driver sees the
# one GPU (MARTI_IBRL_SHARE_ONE_GPU), so torch.cuda.mem_get_info measures what sleeping frees on the device.
if not importlib.util.find_spec("vllm"):
    print("\ngpu_smoke: colocated: skipped (HF engines cannot sleep; install vllm)")
    sys.exit(0)

colocated = load_config(flags + extra + ["--train.colocate", "all", "--ckpt.path", f"{out}/run-colocated",
                                         "--pool.num_engines", "0", "--role1.num_engines", "1",
                                         "--role2.num_engines", "1"])
t3 = time.perf_counter()
trainer = IBRLTrainer(colocated)
startup = time.perf_counter() - t3
hybrid, free = trainer.hybrid, lambda: torch.cuda.mem_get_info()[0] / 2**30
asleep = free()
t4 = time.perf_counter()
for role in trainer.stacks:
    hybrid.wake(0, role)
woken, wake_s = free(), time.perf_counter() - t4
t5 = time.perf_counter()
for role in trainer.stacks:
    hybrid.sleep(0, role)
slept, sleep_s = free(), time.perf_counter() - t5
t6 = time.perf_counter()
m = trainer.fit()[-1]
fit = time.perf_counter() - t6
records = read_phases(f"{out}/run-colocated")
ray.shutdown()
print(f"\ngpu_smoke: colocated (--train.colocate all), {device_slots(colocated)} device slot(s)")
print(f"  {'start-up':<62} {startup:8.1f} s")
print(f"  {'free GPU memory: engines asleep / awake / asleep again':<62} {asleep:.2f} / {woken:.2f} / {slept:.2f} GiB")
print(f"  {'both roles: wake, then sleep':<62} {wake_s:8.2f} / {sleep_s:.2f} s")
for key in sorted(k for k in m if k.startswith("timing/")):
    print(f"  {key:<62} {m[key]:8.2f} s")
print(f"  {'iteration + final checkpoint (fit)':<62} {fit:8.1f} s")
print(f"  phases.jsonl: {len(records)} records; violations: {violations(records, {0: list(trainer.stacks), 1: ['agent1']}) or 'none'}")
EOF
