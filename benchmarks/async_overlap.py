"""Asynchronous IB-RL on 2 cores: the tiny cluster recipe, synchronous vs ``--train.async_rollout``, in one run.

Question and test, fixed before the first run (issue 38): with generation on one core and training on the other, does
the asynchronous trainer (staleness 1) take at most 0.75 of the synchronous trainer's time per iteration, while
learning no worse within the noise of two seeds?

* The recipe: ``recipes/dond/tiny-cluster-cpu.yaml`` (vLLM-CPU engines, 2 ZeRO-3 ranks and a colocated reference per
  role, a pool engine per role, the paper's 0.7/0.2/0.1), from the demo's SFT warm start of its tiny vLLM-capable
  model (made here once, or ``--sft DIR``); ``--iterations`` (default 12), checkpoints only at the end.
* Cores: every engine process (vLLM's engine actor and the processes it spawned, every thread: ``taskset -a``) and the
  driver, which runs the rollout thread, on core 0; every DeepSpeed rank (actor and reference) on core 1. Every
  process runs one thread (the trainer's ``OMP_NUM_THREADS=1`` on CPU).
* Per seed (``--seeds``, default 0 1), the synchronous run, then the asynchronous one; same flags otherwise.
* Iteration time: ``timing/iteration`` (the wall time of the iteration, whatever overlapped) over iterations 2..N
  (iteration 1 has nothing to overlap in either mode). Ratio: the asynchronous mean over the synchronous mean, over
  all seeds. Learning: ``rollout/agreement``, first 3 iterations -> last 3, per run.
* The timeline figure (``--figure``, default docs/images/async_timeline.png): seed 0's phase records
  (``RUN/phases.jsonl``), per role: generation, experience, update, sync; synchronous above, asynchronous below.

Each finished run stays in ``OUT/`` (its run directory) and is not run again (resumable: a run that did not finish
is started over). Last line::

    async/sync iteration time ratio: X.XX

    .venv/bin/python benchmarks/async_overlap.py [--out runs/async_overlap] [--iterations 12] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "dond" / "tiny-cluster-cpu.yaml"
MODES = {"sync": [], "async": ["--train.async_rollout", "true", "--train.max_staleness", "1"]}
GENERATION_CORE, TRAINING_CORE = 0, 1


def _warm_start(out: Path, sft: str | None) -> str:
    """The demo's SFT warm start of the recipe's tiny model (made once into OUT/sft)."""
    if sft:
        return sft
    from marti_ibrl.config import load_config
    from marti_ibrl.demo import prepare

    sft = out / "sft"
    flags = ["--config", str(RECIPE), "--role1.pretrain", str(sft), "--role2.pretrain", str(sft)]
    env_cfg = load_config(flags, assumed=[]).env  # (the warm start is assumed: it is made next)
    return prepare(
        out, env_cfg, engine="vllm", model="tiny", sft_dir=out / "sft", command="benchmarks/async_overlap.py"
    )


def _pids(handle) -> list[int]:
    import ray

    return [ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))]


def _pin(pid: int, core: int) -> None:
    """``pid``, every process it started and every thread of each on ``core``."""
    import psutil

    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(p.pid)], check=True, capture_output=True)


def _pin_trainer(trainer) -> dict[str, list[int]]:
    placed = {"generation": [os.getpid()], "training": []}
    _pin(os.getpid(), GENERATION_CORE)  # the driver: the rollout thread, rewards, dispatch
    for stack in trainer.stacks.values():
        for kind, handles in stack.processes().items():
            side = "generation" if kind in ("engines", "pool_engines") else "training"
            for h in handles:
                for pid in _pids(h):
                    _pin(pid, GENERATION_CORE if side == "generation" else TRAINING_CORE)
                    placed[side].append(pid)
    return placed


def _train(model: str, run_dir: Path, mode: str, seed: int, iterations: int) -> dict:
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    flags = ["--config", str(RECIPE), "--role1.pretrain", model, "--role2.pretrain", model, *MODES[mode]]
    flags += ["--ckpt.path", str(run_dir), "--ckpt.overwrite", "true", "--ckpt.save_steps", "-1"]
    flags += ["--train.iterations", str(iterations), "--train.seed", str(seed)]
    t0 = time.perf_counter()
    trainer = IBRLTrainer(load_config(flags))
    try:
        placed = _pin_trainer(trainer)
        history = trainer.fit()
    finally:
        ray.shutdown()
    record = {"mode": mode, "seed": seed, "seconds": time.perf_counter() - t0, "pinned": placed, "history": history}
    (run_dir / "benchmark.json").write_text(json.dumps(record, indent=1))
    return record


def _summary(record: dict) -> dict:
    h = record["history"]
    agreement = [m["rollout/agreement"] for m in h]
    return {
        "iteration_seconds": statistics.mean(m["timing/iteration"] for m in h[1:]),
        "overlap_seconds": statistics.mean(m.get("async/overlap_seconds", 0.0) for m in h[1:]),
        "agreement_first3": statistics.mean(agreement[:3]),
        "agreement_last3": statistics.mean(agreement[-3:]),
    }


def _figure(runs: dict[str, Path], path: Path) -> None:
    """Seed 0's phases, per role: generation, experience, update, sync; one panel per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from marti_ibrl.cluster.phases import read_phases

    lanes = [("engines", "generate", "generation"), ("actor", "experience", "experience"), ("actor", "train", "update"),
             ("engines", "sync", "sync")]  # fmt: skip
    colors = dict(zip([name for *_, name in lanes], ["tab:blue", "tab:orange", "tab:red", "tab:green"], strict=True))
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 2.2 * len(runs)), sharex=True)
    for ax, (mode, run_dir) in zip(axes, runs.items(), strict=True):
        records = [r for r in read_phases(run_dir) if r["iteration"] >= 1]
        t0 = min(r["start"] for r in records)
        roles = sorted({r["role"] for r in records})
        rows = [(role, lane) for role in roles for lane in lanes]
        for y, (role, (component, event, name)) in enumerate(rows):
            spans = [(r["start"] - t0, r["end"] - r["start"]) for r in records
                     if r["role"] == role and r["component"] == component and r["event"] == event]  # fmt: skip
            ax.broken_barh(spans, (y - 0.4, 0.8), color=colors[name])
        ax.set_yticks(range(len(rows)), [f"{role} {name}" for role, (*_, name) in rows], fontsize=7)
        ax.set_title(f"{mode}: {run_dir.name}", fontsize=9)
    axes[-1].set_xlabel("seconds since iteration 1 started")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/async_overlap")
    parser.add_argument("--sft", default=None, help="an SFT warm start of the recipe's model (default: made in OUT)")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--figure", default=str(REPO / "docs" / "images" / "async_timeline.png"))
    args = parser.parse_args()
    if args.iterations < 4:
        parser.error("--iterations: at least 4 (first 3 -> last 3, and iteration 1 is not timed)")
    if (os.cpu_count() or 1) < 2:
        parser.error("needs 2 cores: one for generation, one for training")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = _warm_start(out, args.sft)
    records = {}
    for seed in args.seeds:
        for mode in MODES:
            run_dir = out / f"{mode}-seed{seed}"
            done = run_dir / "benchmark.json"
            if done.exists() and json.loads(done.read_text())["history"][-1]["iteration"] == args.iterations:
                print(f"[async_overlap] {run_dir.name}: kept from an earlier run", flush=True)
                records[(mode, seed)] = json.loads(done.read_text())
                continue
            print(f"[async_overlap] {run_dir.name}: {args.iterations} iterations", flush=True)
            records[(mode, seed)] = _train(model, run_dir, mode, seed, args.iterations)
    summaries = {key: _summary(r) for key, r in records.items()}
    for (mode, seed), s in summaries.items():
        print(
            f"{mode:5s} seed {seed}: {s['iteration_seconds']:.1f} s/iteration (iterations 2..), overlap "
            f"{s['overlap_seconds']:.1f} s, agreement first 3 -> last 3: {s['agreement_first3']:.2f} -> "
            f"{s['agreement_last3']:.2f}"
        )
    (out / "summary.json").write_text(json.dumps({f"{m}-seed{s}": v for (m, s), v in summaries.items()}, indent=1))
    _figure({mode: out / f"{mode}-seed{args.seeds[0]}" for mode in MODES}, Path(args.figure))
    print(f"timeline: {args.figure}")
    mean = {m: statistics.mean(summaries[(m, s)]["iteration_seconds"] for s in args.seeds) for m in MODES}
    print(f"async/sync iteration time ratio: {mean['async'] / mean['sync']:.2f}")


if __name__ == "__main__":
    main()
