"""SFT training: ``python -m openrlhf.cli.train_sft`` as a single-rank subprocess (DeepSpeed, gloo on CPU), its
progress streamed, its loss curve read back from TensorBoard."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.procenv import child_env_vars, listen_port

_STEP_BAR = re.compile(r"Train step of epoch (\d+):\s*\d+%.*?\|\s*(\d+)/(\d+)")
TENSORBOARD_SUBDIR = "tensorboard"


def sft_command(
    pretrain: str,
    data: str,
    out_dir: str,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    micro_batch_size: int,
    max_len: int,
    zero_stage: int = 2,
    seed: int = 42,
    param_dtype: str = "fp32",  # CPU: bf16 matmuls are emulated, 3-5x slower (patch 0007 adds fp32)
) -> list[str]:
    """The ``openrlhf.cli.train_sft`` command line for multiturn chat records under the ``messages`` key."""
    return [
        sys.executable,
        "-m",
        "openrlhf.cli.train_sft",
        "--model.model_name_or_path", pretrain,
        "--data.dataset", data,
        "--data.input_key", "messages",
        "--data.apply_chat_template",
        "--data.multiturn",
        "--data.max_len", str(max_len),
        "--train.max_epochs", str(epochs),
        "--train.batch_size", str(batch_size),
        "--train.micro_batch_size", str(micro_batch_size),
        "--train.seed", str(seed),
        "--adam.lr", str(lr),
        "--ds.zero_stage", str(zero_stage),
        "--ds.param_dtype", param_dtype,
        "--ds.attn_implementation", "sdpa",
        "--ckpt.output_dir", out_dir,
        "--ckpt.path", os.path.join(out_dir, "ds_ckpt"),
        "--ckpt.disable_ds",
        "--logger.tensorboard_dir", os.path.join(out_dir, TENSORBOARD_SUBDIR),
        "--logger.wandb.run_name", "sft",
    ]  # fmt: skip


def _stream(
    proc: subprocess.Popen,
    log: Any,
    tail: deque[str],
    progress: Callable[[str], None] | None,
    accumulation: int,
    start: float,
) -> int:
    """Copy the trainer's output to ``log`` (timestamped), keep its tail, report optimizer steps; returns its exit code."""
    assert proc.stdout is not None
    last_step: tuple[int, int] | None = None
    buf = b""
    while chunk := proc.stdout.read1(65536):
        *lines, buf = re.split(rb"[\r\n]", buf + chunk)  # tqdm redraws with \r
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").rstrip()
            if not line:
                continue
            elapsed = time.monotonic() - start
            log.write(f"[{elapsed:7.1f}s] {line}\n")
            tail.append(line)
            match = _STEP_BAR.search(line)
            if match is None or progress is None:
                continue
            epoch, done, total = (int(g) for g in match.groups())
            if done > 0 and (done % accumulation == 0 or done == total) and (epoch, done) != last_step:
                last_step = (epoch, done)
                progress(f"sft epoch {epoch} micro-batch {done}/{total} ({elapsed:.0f}s)")
    if buf:
        log.write(buf.decode("utf-8", errors="replace") + "\n")
    return proc.wait()


def sft_threads(pretrain: str) -> int:
    """CPU threads of the SFT trainer when ``OMP_NUM_THREADS`` is not set: one for a tiny model
    (:func:`~marti_ibrl.sft.presets.is_tiny`), whose small matrices gain nothing from a second thread and lose to its
    waits (split_coins' warm start from ``model tiny``, 37 micro-batches on 2 cores beside another run: 29 s with one
    thread, 143 s with two, 2026-12-07; another game's about 3x), else up to 8."""
    from marti_ibrl.sft.presets import is_tiny

    return 1 if is_tiny(pretrain) else min(os.cpu_count() or 1, 8)


def run_sft(
    pretrain: str,
    data: str,
    out_dir: str,
    *,
    log_file: str | None = None,
    progress: Callable[[str], None] | None = None,
    extra_args: Sequence[str] = (),
    **hparams: Any,
) -> str:
    """Fine-tune ``pretrain`` on the JSONL ``data`` with OpenRLHF's SFT CLI (one rank); returns ``out_dir``.

    ``hparams`` are :func:`sft_command`'s keywords (epochs, lr, batch_size, micro_batch_size, max_len, zero_stage,
    seed). The whole output goes to ``log_file`` (default ``out_dir/sft.log``); ``progress`` (e.g. ``print``) gets one
    line per optimizer step; ``extra_args`` are appended to the CLI (e.g. ``["--lr_scheduler", "constant"]``).
    Raises ``RuntimeError`` with the log's tail if the trainer fails. The HF checkpoint in ``out_dir`` includes the
    tokenizer and its chat template; the per-step losses are in :func:`sft_loss_curve`.
    """
    os.makedirs(out_dir, exist_ok=True)
    log_path = log_file or os.path.join(out_dir, "sft.log")
    cmd = sft_command(pretrain, data, out_dir, **hparams) + list(extra_args)
    env = dict(os.environ)
    env.update(
        child_env_vars(),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(listen_port("127.0.0.1")),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", str(sft_threads(pretrain))),
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
    )
    accumulation = max(hparams["batch_size"] // hparams["micro_batch_size"], 1)
    tail: deque[str] = deque(maxlen=40)
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        # own session: on an interruption the trainer and its dataset-map workers are stopped together
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = _stream(proc, log, tail, progress, accumulation, start)
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise

    if rc != 0 or not os.path.exists(os.path.join(out_dir, "config.json")):
        raise RuntimeError(
            f"OpenRLHF SFT failed (exit code {rc}); full log: {log_path}\n--- last lines ---\n" + "\n".join(tail)
        )
    if progress is not None:
        curve = sft_loss_curve(out_dir)
        if curve:
            progress(f"sft done: {len(curve)} steps, loss {curve[0][1]:.3f} -> {curve[-1][1]:.3f}")
    return out_dir


def sft_loss_curve(out_dir: str, tag: str = "train/loss_mean") -> list[tuple[int, float]]:
    """``(step, loss)`` per optimizer step of a :func:`run_sft` run, from its TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: dict[int, float] = {}
    for events in sorted(Path(out_dir, TENSORBOARD_SUBDIR).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            points.update({int(e.step): float(e.value) for e in acc.Scalars(tag)})
    return sorted(points.items())
