"""Warm start: SFT on scripted bot-vs-bot DoND dialogues with OpenRLHF's own SFT trainer.

Each dialogue gives one chat record per role, seen from that role's side exactly as the RL rollout renders it
(:class:`marti_ibrl.rollout.render.RoleView`; :func:`marti_ibrl.envs.base.role_messages`): its system prompt
(private input), the counterpart's turns as ``user``, its own turns as ``assistant``. A role that opens the dialogue has no ``user`` message before its first
``assistant`` turn, as in the rollout; OpenRLHF's multiturn SFT dataset handles that (the prompt of that turn is
``[system]`` + the generation header). Records end with the role's own last turn: OpenRLHF's multiturn
``preprocess_data`` builds the full text as ``render(messages[:-1], add_generation_prompt=True)`` + the rest, which
garbles a trailing ``user`` message (its header is replaced by an assistant header); trailing counterpart turns
carry no loss anyway.

Training runs ``python -m openrlhf.cli.train_sft`` as a single-rank subprocess (DeepSpeed, gloo on CPU).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.envs.base import role_messages
from marti_ibrl.envs.dond import DondEnv, DondScenario, make_bot, parse_utterance, play_dialogue
from marti_ibrl.envs.dond.game import is_complementary
from marti_ibrl.procenv import child_env_vars, listen_port

Record = dict[str, Any]

# Demo warm start (tiny model: DEMO_TINY_MODEL, dond_corpus + compact prompts; compact prompts, max_rounds=10).
# Measured on 2 shared CPU cores: 1280 records, 144 optimizer steps, loss 6.31 -> 0.25-0.32; ~2 min wall in fp32
# (~4 min in bf16, 12 min under heavy load); protocol validity of sampled opening turns 0% -> ~40-60%
# (max_new_tokens=64). It does NOT reach 90% within the ~3 min budget: small batches (many steps) matter most.
DEMO_SFT: dict[str, Any] = dict(
    n_scenarios=640,  # one bot dialogue per scenario -> 2 records each
    epochs=1,
    lr=1e-2,
    batch_size=8,
    micro_batch_size=4,
    max_len=1024,  # longer records (~5%) are dropped by OpenRLHF's dataset
)
# SmolLM2-135M-Instruct's warm start (``marti-ibrl demo --model smollm2-135m-instruct``, recipes/dond/smollm2-cpu.yaml:
# compact prompt, natural-language bot turns, offers shown with their complement). A micro-batch of 4 records takes
# ≈ 28 s on 2 cores, so 160 scenarios (320 records, 40 steps) ≈ 37 min; lr 1e-4, a usual rate for teaching a 135M
# instruct model a format in few steps (2 steps at 2e-5 left it at 0% valid turns). The time and validity reached
# are in benchmarks/results/smollm2_dond.md.
SMOLLM2_SFT: dict[str, Any] = {**DEMO_SFT, "n_scenarios": 160, "lr": 1e-4}
# The tiny model the demo warm-starts (keyword arguments of marti_ibrl.tiny.build_tiny_model).
DEMO_TINY_MODEL: dict[str, Any] = dict(hidden_size=64, num_layers=2, intermediate_size=128)
# Its heads when vLLM serves it (``rollout.engine: vllm``): vLLM's CPU attention needs head_dim >= 32 (64 / 2).
VLLM_TINY_HEADS: dict[str, Any] = dict(num_heads=2, num_kv_heads=1)
# Generation cap of the validity check. Scripted-bot turns are 30-60 tokens with the tiny tokenizer (mean ~45),
# so rollout.max_new_tokens=48 truncates many well-formed turns.
VALIDITY_MAX_NEW_TOKENS = 64


# ---------------------------------------------------------------------------------------------------------------
# data


def sft_records(env: DondEnv, scenarios: Iterable[DondScenario], bots: list[str], seed: int) -> list[Record]:
    """One scripted dialogue per scenario, two records (one per role) each: ``{"messages": [...]}``.

    Dialogue ``i`` is played by the ordered bot pair ``i mod len(pairs)`` (every ordered pair of ``bots``, self-play
    included), assigned to ``env.roles`` in that order; the opening seat alternates from one dialogue to the next and
    flips every full cycle of pairs, so each pair plays both seatings. Deterministic in ``seed``.
    """
    if not bots:
        raise ValueError("sft_records needs at least one bot name")
    pairs = list(itertools.product(bots, repeat=2))
    rng = random.Random(seed)
    roles = tuple(env.roles)
    records: list[Record] = []
    for i, scenario in enumerate(scenarios):
        first, second = pairs[i % len(pairs)]
        flip = (i + i // len(pairs)) % 2
        seats = roles[::-1] if flip else roles
        bots_by_role = {roles[0]: make_bot(first), roles[1]: make_bot(second)}
        state, _ = play_dialogue(env, scenario, bots_by_role, seed=rng.randrange(2**31), seats=seats)
        for role in roles:
            messages = role_messages(env, scenario, state.history, role)
            if len(messages) > 1:
                records.append({"messages": messages})
    return records


def write_sft_data(path: str | os.PathLike[str], records: Iterable[Record]) -> str:
    """Write ``records`` as JSON lines; returns the path as str."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return str(out)


# ---------------------------------------------------------------------------------------------------------------
# training


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
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", str(min(os.cpu_count() or 1, 8))),
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


# ---------------------------------------------------------------------------------------------------------------
# checks


def _load(model_dir: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    return model, tokenizer


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    return ids, attn


def _last_offer(state: Any, role: str) -> tuple[int, int, int] | None:
    """The allocation of the counterpart's last turn when it was a ``<try>``/``<selection>``, else None."""
    if not state.history or state.history[-1][0] == role:
        return None
    return parse_utterance(state.history[-1][1]).alloc


def validity_report(
    model_dir: str,
    env: DondEnv,
    scenarios: Sequence[DondScenario],
    n_turns: int,
    seed: int,
    *,
    max_new_tokens: int = VALIDITY_MAX_NEW_TOKENS,
    batch_size: int = 64,
) -> dict[str, float]:
    """Self-play the first ``n_turns`` turns of each scenario with the model in both roles and check them.

    Turns are sampled like the RL rollout (HF ``generate``, temperature 1, top_p 1, no top-k) from
    ``RoleView.generation_prompt()``; the opener alternates by scenario. Fractions of the sampled turns:

    * ``valid``: the env accepts the turn (``env.step(...).valid``). Any text without markers is a valid "chat"
      turn, so even an untrained model scores ~1.0 here;
    * ``protocol``: valid, ended with eos within ``max_new_tokens``, and a move (``<try>``, ``<selection>`` or
      ``<disagree>``), as every scripted-bot turn is; ``turn{t}``: the same for turn ``t`` only;
    * ``truncated``: cut at ``max_new_tokens``;
    * ``complement``: of the ``<selection>`` turns answering the counterpart's ``<try>``/``<selection>``
      (``n_answers`` of them), the fraction that would close the deal (the exact complement of that offer).

    A turn that is not a protocol move ends its dialogue (later turns are not sampled); ``n`` counts the turns.
    """
    import torch

    from marti_ibrl.rollout.render import RoleView

    model, tokenizer = _load(model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos_id = tokenizer.eos_token_id
    roles = tuple(env.roles)
    live = []
    for i, scenario in enumerate(scenarios):
        seats = roles if i % 2 == 0 else roles[::-1]
        views = {r: RoleView(tokenizer, env.system_prompt(scenario, r)) for r in roles}
        live.append((env.new_state(scenario, seats), views))
    sampled = valid = protocol = truncated = answers = completes = 0
    per_turn: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for t in range(n_turns):
            if not live:
                break
            still = []
            turn_ok = 0
            for start in range(0, len(live), batch_size):
                chunk = live[start : start + batch_size]
                prompts = [views[state.next_role].generation_prompt() for state, views in chunk]
                ids, attn = _left_pad(prompts, pad_id)
                out = model.generate(
                    input_ids=ids,
                    attention_mask=attn,
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=eos_id,
                    pad_token_id=pad_id,
                )
                for (state, views), row in zip(chunk, out[:, ids.shape[1] :].tolist()):
                    finished = eos_id in row
                    gen = row[: row.index(eos_id) + 1] if finished else row
                    text = tokenizer.decode(gen, skip_special_tokens=True).strip()
                    role = state.next_role
                    offer = _last_offer(state, role)
                    result = env.step(state, role, text)
                    action = parse_utterance(text)
                    if offer is not None and action.kind == "selection":
                        answers += 1
                        completes += int(is_complementary(state.scenario.counts, offer, action.alloc))
                    sampled += 1
                    truncated += int(not finished)
                    valid += int(result.valid)
                    if not (result.valid and finished and parse_utterance(text).kind != "chat"):
                        continue
                    protocol += 1
                    turn_ok += 1
                    views[role].add_own(gen, None, finished=finished)
                    for other, view in views.items():
                        if other != role:
                            view.add_counterpart(env.counterpart_text(role, text, state.scenario))
                    if not result.done:
                        still.append((state, views))
            per_turn[f"turn{t}"] = turn_ok / len(live)
            live = still
    return {
        "valid": valid / max(sampled, 1),
        "protocol": protocol / max(sampled, 1),
        "truncated": truncated / max(sampled, 1),
        "n": float(sampled),
        "complement": completes / max(answers, 1),
        "n_answers": float(answers),
        **per_turn,
    }


def protocol_validity(
    model_dir: str, env: DondEnv, scenarios: Sequence[DondScenario], n_turns: int, seed: int
) -> float:
    """Fraction of self-played opening turns that are valid protocol moves (``protocol`` of :func:`validity_report`)."""
    return validity_report(model_dir, env, scenarios, n_turns, seed)["protocol"]


def assistant_nll(model_dir: str, records: Sequence[Record], *, max_len: int = 2048, batch_size: int = 8) -> float:
    """Mean negative log-likelihood per own-turn token of ``records`` (the RL rollout's tokenization, RoleView)."""
    import torch

    from marti_ibrl.rollout.render import RoleView

    model, tokenizer = _load(model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    seqs: list[tuple[list[int], Any]] = []
    for record in records:
        messages = record["messages"]
        view = RoleView(tokenizer, messages[0]["content"])
        for msg in messages[1:]:
            if msg["role"] == "assistant":
                ids = tokenizer(msg["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                view.add_own(ids, None, finished=True)
            else:
                view.add_counterpart(msg["content"])
        seqs.append((view.ids[:max_len], view.action_mask()[:max_len]))
    total = count = 0.0
    with torch.no_grad():
        for start in range(0, len(seqs), batch_size):
            chunk = seqs[start : start + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attn = torch.zeros_like(ids)
            mask = torch.zeros_like(ids, dtype=torch.bool)
            for i, (seq, action) in enumerate(chunk):
                ids[i, : len(seq)] = torch.tensor(seq)
                attn[i, : len(seq)] = 1
                mask[i, : len(seq)] = action
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            target = mask[:, 1:]
            total += float(-(logp * target).sum())
            count += float(target.sum())
    return total / max(count, 1.0)
