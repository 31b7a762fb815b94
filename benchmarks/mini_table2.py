"""The paper's Table 2 in miniature on 2 CPU cores: the static-counterpart mismatch, end to end.

Every arm runs through the real pipeline (``marti-ibrl train``: Ray + DeepSpeed + the HF rollout engines) from one
SFT initialisation, with the same budget (iterations × scenarios × G); the frozen final policies are evaluated with
``marti-ibrl eval`` (seat-averaged, held-out scenarios). The work is split into units, each skipped once finished;
they go seed by seed and, within a seed, arm by arm (train, then evaluate), so an interruption costs at most the
unit it stopped (a training run resumes from its last committed iteration, an evaluation from its episodes):

1. **SFT init** (``--sft-dir``): a tiny Qwen-architecture model, trained with OpenRLHF's SFT trainer on dialogues
   between the *training* scripted bots (``marti_ibrl.sft``), bots speaking markers only (``env.bot_speech``), offers
   shown with the units they leave the listener (``env.show_complement``). A stale init (other env settings or data
   size) is refused.
2. **Training run** per arm × seed (``OUT/runs/ARM/seedS``), recipe ``recipes/dond/mini-table2.yaml``:
   ``ibrl`` (opponent pool, staggered updates), ``uni_sft`` (vs the frozen SFT policy), ``uni_bot`` (vs one
   frozen training bot), ``uni_pool`` (vs a frozen pool of the training bots, §5.4), and the ablations
   ``shared_reward``, ``joint_norm``, ``no_stabilization``.
3. **Evaluation** per arm × seed, right after its training (``OUT/eval/seedS/ARM``): the arm's agent1 policy against
   its training counterpart(s) (in-system), itself (self-play) and the held-out bots (``envs/dond/heldout.py``); per
   seed, the SFT init as a reference row (``OUT/eval/seedS/sft``) and, on fewer scenarios, every arm's policy against
   every other of the same seed (cross-play, ``OUT/eval/seedS/cross``).
4. **Report** (``--results``, default ``benchmarks/results/mini_table2.md``): Table-2-style cells (agreement / own
   utility / joint value) per counterpart, mean ± sd over seeds; Δmismatch per arm; the cross-play matrix; the
   **primary** test at the level of training runs (one value per arm × seed: Welch's t-test against IB-RL's runs,
   Δ with 95% CI, Holm; held-out and self-play agreement and expected utility); the **secondary** logistic GEE of
   held-out agreement clustered by scenario with seed fixed effects, Holm-adjusted; the issue's goals, judged on
   the primary test; a figure of held-out agreement per run and the reward curves; the rollout engine; the exact
   command, this invocation's wall time and the whole run's compute time (the ledger, below).

**What is kept** (``--keep``, default ``benchmarks/results/mini_table2_runs`` for the full run, ``OUT/keep`` for
``--quick``). The full run takes ≈ 14 h of compute on 2 cores and spans sessions, and a session's machine may be a
new one, with ``OUT`` gone. So every finished unit leaves a small record that is committed with the repository and
is all the report reads: the SFT init itself (≈ 4 MB: retraining it costs 47 min, and every arm and seed must share
it), ``times.json`` (the ledger of seconds per unit), ``runs/ARM/seedS.json`` (the reward curves and rollout engine
of a training run) and ``eval/seedS/NAME.json.gz`` (an evaluation's episodes without their transcripts, ≈ 100 KB).
Trained checkpoints are not kept (≈ 7 MB a run): an evaluated run is never trained again, and a seed's cross-play,
which needs every arm's checkpoint of that seed at once, is played only where they are all on this machine; a seed
whose arms were trained on different machines has no cross-play, and the report says which seeds have it. To carry
the record over, copy ``KEEP`` from the benchmark's clone into the main checkout and commit it.

Seeds: the four main arms train on ``seeds`` (5), the three ablations on ``ablation_seeds`` (3); each seed's
evaluation (and cross-play) covers the arms trained on it.

    .venv/bin/python benchmarks/mini_table2.py --quick          # 1 seed, fewer iterations and scenarios
    .venv/bin/python benchmarks/mini_table2.py                  # the full run (5 seeds), see the results file
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from marti_ibrl.envs.dond.bots import TRAINING_BOTS as _TRAINING_BOT_REGISTRY
from marti_ibrl.envs.dond.heldout import HELDOUT_BOTS as _HELDOUT_BOT_REGISTRY

if TYPE_CHECKING:
    import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "dond" / "mini-table2.yaml"
KEEP = ROOT / "benchmarks" / "results" / "mini_table2_runs"  # what the full run keeps in the repository: see below
TIMES = "times.json"  # KEEP/times.json: seconds of every finished unit (SFT, training run, evaluation)
TRAINING_BOTS = tuple(sorted(_TRAINING_BOT_REGISTRY))  # conceder, fair, greedy, stubborn
# v1's held-out bots, named: the registry has grown since (mini_table2_v2.py's strategy-disjoint families)
HELDOUT_BOTS = ("hardliner", "tit_for_tat", "slow_conceder", "fast_conceder")
assert set(HELDOUT_BOTS) <= set(_HELDOUT_BOT_REGISTRY)
UNILATERAL = ("uni_sft", "uni_bot", "uni_pool")
ABLATIONS = ("shared_reward", "joint_norm", "no_stabilization")
SINGLE_COUNTERPART = ("uni_sft", "uni_bot")  # the goal compares IB-RL with the best of these


@dataclass(frozen=True)
class Profile:
    """One benchmark size; everything else comes from the recipe."""

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    ablation_seeds: tuple[int, ...] = (0, 1, 2)  # the ablations (ABLATIONS) train on these seeds only
    iterations: int = 40
    eval_scenarios: int = 500
    cross_play_scenarios: int = 200
    sft_dialogues: int = 16000  # bot-vs-bot dialogues -> two SFT records each
    sft_epochs: int = 1
    single_bot: str = "conceder"  # the uni_bot arm's counterpart
    arms: tuple[str, ...] = (
        "ibrl",
        "uni_sft",
        "uni_bot",
        "uni_pool",
        "shared_reward",
        "joint_norm",
        "no_stabilization",
    )


FULL = Profile()


def arms_of(profile: Profile, seed: int) -> tuple[str, ...]:
    """The arms trained and evaluated on ``seed``: the main arms on every seed, the ablations on ``ablation_seeds``."""
    return tuple(a for a in profile.arms if a not in ABLATIONS or seed in profile.ablation_seeds)


# --quick: the four main arms (the ablations only in the full run), 1 seed, 5 iterations, small evaluation; ≈ 20 min
# on 2 cores once the SFT init exists (measured: benchmarks/results/mini_table2_quick.md).
QUICK = replace(
    FULL,
    seeds=(0,),
    ablation_seeds=(0,),
    iterations=5,
    eval_scenarios=50,
    cross_play_scenarios=25,
    arms=("ibrl", "uni_sft", "uni_bot", "uni_pool"),
)

# The SFT init (tiny model + OpenRLHF SFT). Measured settings: see the results file.
TINY_MODEL = dict(hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=256)
SFT = dict(lr=7e-3, batch_size=16, micro_batch_size=16, max_len=512)


@dataclass
class Arm:
    """A training arm: extra ``marti-ibrl train`` flags and the counterparts it trained against (in-system)."""

    name: str
    flags: list[str] = field(default_factory=list)
    in_system: list[str] = field(default_factory=list)  # eval specs; "{run}" = the arm's run directory


def arms(sft: str, single_bot: str) -> dict[str, Arm]:
    """The arms of the benchmark (the issue's list), keyed by name."""
    trained_partner = ["checkpoint:{run}/agent2/hf"]
    pool = [f"bot:{b}" for b in TRAINING_BOTS]
    return {
        a.name: a
        for a in [
            Arm("ibrl", [], trained_partner),
            Arm("uni_sft", ["--role2.frozen", f"checkpoint:{sft}"], [f"checkpoint:{sft}"]),
            Arm("uni_bot", ["--role2.frozen", f"bot:{single_bot}"], [f"bot:{single_bot}"]),
            Arm("uni_pool", ["--role2.frozen", ",".join(pool)], pool),
            Arm("shared_reward", ["--ablation", "shared_reward"], trained_partner),
            Arm("joint_norm", ["--ablation", "joint_norm"], trained_partner),
            Arm("no_stabilization", ["--ablation", "no_stabilization"], trained_partner),
        ]
    }


def recipe_env() -> dict:
    """The recipe's env/rollout settings the evaluation must share with training."""
    from omegaconf import OmegaConf

    r = OmegaConf.load(RECIPE)
    return {
        "prompt_style": r.env.prompt_style,
        "max_rounds": int(r.env.max_rounds),
        "bot_speech": r.env.bot_speech,
        "show_complement": bool(r.env.get("show_complement", False)),
        "max_new_tokens": int(r.rollout.max_new_tokens),
        "max_len": int(r.rollout.max_len),
    }


def _log(msg: str) -> None:
    tqdm.write(f"[mini_table2] {msg}")


ATTEMPTS = "attempts.jsonl"
"""KEEP/attempts.jsonl: one line per invocation of a unit's command, however it ended (``ok``, ``failed``,
``stopped`` by SIGTERM, e.g. benchmarks/yield_to_ci.sh giving way): a unit killed and resumed costs more compute
than its finishing invocation, which is all ``times.json`` holds."""


def stop_on_sigterm() -> None:
    """SIGTERM ends the driver through ``SystemExit`` (its ``finally`` blocks run: the attempt is recorded) rather
    than at once."""
    import signal

    def stop(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)


def record_attempt(keep: Path, unit: str, seconds: float, ended: str) -> None:
    line = json.dumps({"unit": unit, "seconds": round(seconds, 1), "ended": ended, "at": round(time.time())})
    with (keep / ATTEMPTS).open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def attempt_hours(keep: Path) -> tuple[float, float]:
    """(hours of every recorded attempt, hours of those that did not finish their unit)."""
    path = keep / ATTEMPTS
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return sum(r["seconds"] for r in rows) / 3600, sum(r["seconds"] for r in rows if r["ended"] != "ok") / 3600


def _run(cmd: list[str], log: Path, attempt: tuple[Path, str] | None = None) -> float:
    """Run ``cmd`` with its output in ``log``; raise with the log's tail if it fails; returns seconds. ``attempt``:
    (KEEP, unit) to record this invocation in KEEP/attempts.jsonl however it ends."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0, ended = time.perf_counter(), "stopped"
    try:
        with log.open("w") as f:
            f.write("$ " + shlex.join(cmd) + "\n")
            f.flush()
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        ended = "ok" if rc == 0 else "failed"
        if rc != 0:
            tail = log.read_text(errors="replace").splitlines()[-25:]
            raise RuntimeError(f"{shlex.join(cmd[:4])} ... failed (exit {rc}); log {log}:\n" + "\n".join(tail))
        return time.perf_counter() - t0
    finally:
        if attempt is not None:
            record_attempt(attempt[0], attempt[1], time.perf_counter() - t0, ended)


def record_time(keep: Path, key: str, seconds: float) -> None:
    """Add a finished unit's seconds to the ledger ``KEEP/times.json``: the full run spans several invocations
    (sessions, machines), so its compute time is the sum of this ledger, not one invocation's wall time."""
    path = keep / TIMES
    ledger = json.loads(path.read_text()) if path.exists() else {}
    ledger[key] = round(seconds, 1)
    _write_atomic(path, json.dumps(ledger, indent=1, sort_keys=True) + "\n")


def _write_atomic(path: Path, text: str | bytes) -> None:
    """Write ``path`` whole or not at all (a kept record is read as proof that its unit finished)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(text.encode() if isinstance(text, str) else text)
    tmp.replace(path)


# ------------------------------------------------------------------------------------------------------------ stages


def stage_sft(sft_dir: Path, profile: Profile, keep: Path | None = None) -> dict:
    """The SFT init in ``sft_dir``: reused when present, else copied from ``KEEP/sft`` when kept there, else trained
    (and then kept). Returns its record (validity, time, settings)."""
    from marti_ibrl.envs.dond import DondEnv, generate_scenarios
    from marti_ibrl.sft import rendering, run_sft, sft_records, validity_report, write_sft_data
    from marti_ibrl.tiny import build_tiny_dond_model

    record_path = sft_dir / SFT_RECORD
    out = sft_dir.parent
    env_cfg = recipe_env()
    data_env = rendering(env_cfg)
    if not record_path.exists() and keep is not None and (keep / "sft" / SFT_RECORD).exists():
        shutil.copytree(keep / "sft", sft_dir, dirs_exist_ok=True)
        _log(f"SFT init copied from {keep / 'sft'}")
    if record_path.exists():
        record = json.loads(record_path.read_text())
        was = {"env": record.get("env"), "dialogues": record.get("dialogues"), "epochs": record.get("epochs")}
        now = {"env": data_env, "dialogues": profile.sft_dialogues, "epochs": profile.sft_epochs}
        if was != now:
            raise SystemExit(
                f"{sft_dir} was trained with {was}, the benchmark now asks for {now}: pass a new --sft-dir "
                "(or remove that one) to train a matching SFT init"
            )
        if keep is not None and not (keep / "sft" / SFT_RECORD).exists():
            keep_sft(sft_dir, keep)
        return record
    env = DondEnv(
        prompt_style=env_cfg["prompt_style"],
        max_rounds=env_cfg["max_rounds"],
        bot_speech=env_cfg["bot_speech"],
        show_complement=env_cfg["show_complement"],
    )
    t0 = time.perf_counter()
    tiny = build_tiny_dond_model(out / "tiny_init", prompt_style=env_cfg["prompt_style"], n_scenarios=64, **TINY_MODEL)
    # scenario seeds: SFT 1, training = the run seed's generator, evaluation 20260 (marti-ibrl eval's default)
    records = sft_records(env, generate_scenarios(profile.sft_dialogues, 1), list(TRAINING_BOTS), seed=0)
    data = write_sft_data(out / "sft_init_data.jsonl", records)
    _log(f"SFT: {len(records)} records from {profile.sft_dialogues} bot-bot dialogues -> {data}")
    with tqdm(desc="SFT (OpenRLHF)", unit="step") as bar:
        run_sft(tiny, data, str(sft_dir), seed=0, epochs=profile.sft_epochs, progress=lambda _: bar.update(), **SFT)
    seconds = time.perf_counter() - t0
    check = validity_report(str(sft_dir), env, generate_scenarios(200, 2), n_turns=4, seed=0)
    record = {
        "records": len(records),
        "dialogues": profile.sft_dialogues,
        "epochs": profile.sft_epochs,
        "tiny_model": TINY_MODEL,
        "hparams": SFT,
        "env": data_env,
        "seconds": round(seconds, 1),
        "validity": check,
    }
    record_path.write_text(json.dumps(record, indent=1))
    if keep is not None:
        record_time(keep, "sft", seconds)
    _log(f"SFT done in {seconds:.0f}s; protocol-valid self-play turns {check['protocol']:.1%}{_complement_text(check)}")
    if keep is not None:
        keep_sft(sft_dir, keep)
    return record


SFT_RECORD = "mini_table2_sft.json"


def keep_sft(sft_dir: Path, keep: Path) -> None:
    """Copy the SFT init's files (not its subdirectories, optimizer or DeepSpeed state, nor its training log) into
    ``KEEP/sft``, the record last, so a kept record means a whole model."""
    dest = keep / "sft"
    dest.mkdir(parents=True, exist_ok=True)
    files = sorted(f for f in sft_dir.iterdir() if f.is_file() and f.name != SFT_RECORD and f.suffix != ".log")
    for f in files:
        shutil.copy2(f, dest / f.name)
    shutil.copy2(sft_dir / SFT_RECORD, dest / SFT_RECORD)
    _log(f"SFT init kept in {dest} ({sum(f.stat().st_size for f in files) / 1e6:.1f} MB)")


def _complement_text(validity: dict) -> str:
    """ ", accepting selections that close the deal X% (of N)" when the validity record has it."""
    if not validity.get("n_answers"):
        return ""
    return f", accepting selections that close the deal {validity['complement']:.1%} (of {validity['n_answers']:.0f})"


def train_command(arm: Arm, seed: int, run: Path, sft: str, iterations: int) -> list[str]:
    """The ``marti-ibrl train`` command of one (arm, seed)."""
    cmd = [sys.executable, "-m", "marti_ibrl.cli", "train", "--config", str(RECIPE)]
    cmd += ["--train.seed", str(seed), "--train.iterations", str(iterations), "--ckpt.path", str(run)]
    cmd += ["--ckpt.load_enable", "true"]  # an interrupted run resumes from its last committed iteration
    cmd += ["--role1.pretrain", sft]
    if "--role2.frozen" not in arm.flags:
        cmd += ["--role2.pretrain", sft]
    return cmd + arm.flags


def finished(run: Path, iterations: int) -> bool:
    """Whether the training run in ``run`` reached ``iterations`` and saved its final agent1 policy."""
    state = run / "trainer_state.json"
    return (
        state.exists()
        and json.loads(state.read_text())["iteration"] >= iterations
        and (run / "agent1" / "hf" / "config.json").exists()
    )


def run_record(run: Path, seconds: float) -> dict:
    """What is kept of a finished training run: its reward curves and the rollout engine of each trained role."""
    from marti_ibrl.eval.figures import load_history

    history = load_history(run)
    rewards = sorted({k for m in history for k in m if k.endswith("/reward")})
    topo = run / "topology.json"
    trained = json.loads(topo.read_text()).get("trained", {}) if topo.exists() else {}
    return {
        "iterations": len(history),
        "seconds": round(seconds, 1),
        "rewards": {k: [m.get(k) for m in history] for k in rewards},
        "engines": {role: info.get("engine_kind") for role, info in trained.items()},
    }


def train_unit(out: Path, keep: Path, arm: Arm, seed: int, sft: str, iterations: int) -> Path:
    """Train (arm, seed) unless its run in ``OUT`` is finished; keep its record; returns the run directory."""
    run = out / "runs" / arm.name / f"seed{seed}"
    if not finished(run, iterations):
        cmd = train_command(arm, seed, run, sft, iterations)
        unit = f"train {arm.name}/seed{seed}"
        seconds = _run(cmd, out / "logs" / f"train_{arm.name}_seed{seed}.log", (keep, unit))
        record_time(keep, f"train {arm.name}/seed{seed}", seconds)
        _write_atomic(keep / "runs" / arm.name / f"seed{seed}.json", json.dumps(run_record(run, seconds), indent=1))
        _log(f"trained {arm.name} seed {seed} in {seconds:.0f}s")
    return run


def _eval_common(seed: int) -> list[str]:
    env = recipe_env()
    common = [sys.executable, "-m", "marti_ibrl.cli", "eval", "--seed", str(seed)]
    common += ["--prompt-style", env["prompt_style"], "--max-rounds", str(env["max_rounds"])]
    common += ["--bot-speech", env["bot_speech"], "--max-new-tokens", str(env["max_new_tokens"])]
    common += ["--max-len", str(env["max_len"]), "--num-engines", "2", "--batch", "1024"]  # one engine per core
    return common + (["--show-complement"] if env["show_complement"] else [])


def _policy_path(out: Path, arm: str, seed: int) -> Path:
    return out / "runs" / arm / f"seed{seed}" / "agent1" / "hf"


def eval_command(out: Path, profile: Profile, table: dict[str, Arm], sft: str, seed: int, name: str) -> list[str]:
    """The ``marti-ibrl eval`` of one policy of ``seed`` (an arm, or ``"sft"``): in-system (arms only), self-play
    and the held-out bots, on ``eval_scenarios`` scenarios, into ``OUT/eval/seedS/NAME``."""
    path = sft if name == "sft" else _policy_path(out, name, seed)
    cmd = _eval_common(seed) + ["--policy", f"{name}={path}", "--self-play", "-n", str(profile.eval_scenarios)]
    if name != "sft":
        run = out / "runs" / name / f"seed{seed}"
        cmd += [x for spec in table[name].in_system for x in ("--in-system", f"{name}={spec.format(run=run)}")]
    cmd += [x for b in HELDOUT_BOTS for x in ("--counterpart", f"heldout:{b}")]
    return cmd + ["--out", str(out / "eval" / f"seed{seed}" / name)]


def cross_command(out: Path, profile: Profile, seed: int) -> list[str]:
    """The cross-play ``marti-ibrl eval`` of ``seed``: every arm's policy against every other (each pair played
    once, mirrored for the other seat), on ``cross_play_scenarios`` scenarios, into ``OUT/eval/seedS/cross``."""
    cmd = _eval_common(seed)
    for name in arms_of(profile, seed):
        cmd += ["--policy", f"{name}={_policy_path(out, name, seed)}"]
    cmd += ["--cross-play", "-n", str(profile.cross_play_scenarios)]
    return cmd + ["--out", str(out / "eval" / f"seed{seed}" / "cross")]


def _portable(cmd: list[str], out: Path, sft: str) -> str:
    """``cmd`` without the interpreter, with this machine's ``OUT`` and SFT paths as placeholders: the kept record's
    proof of which evaluation it holds, comparable across clones and machines."""
    return shlex.join(cmd[1:]).replace(sft, "{SFT}").replace(str(out), "{OUT}")


def kept_eval(keep: Path, seed: int, name: str) -> Path:
    return keep / "eval" / f"seed{seed}" / f"{name}.json.gz"


def is_kept(keep: Path, seed: int, name: str, cmd: list[str], out: Path, sft: str) -> bool:
    """Whether ``KEEP`` holds this exact evaluation (same arguments) of ``name`` on ``seed``."""
    path = kept_eval(keep, seed, name)
    return path.exists() and json.loads(gzip.decompress(path.read_bytes()))["command"] == _portable(cmd, out, sft)


THIN_DROP = ("transcript",)  # the bulk of an episode record; every metric is computed without it


def eval_unit(out: Path, keep: Path, cmd: list[str], seed: int, name: str, sft: str) -> None:
    """Run one evaluation (resuming from its episodes in ``OUT``) and keep its pairs with thin episodes."""
    from marti_ibrl.eval.episodes import read_episodes

    done = Path(cmd[cmd.index("--out") + 1])
    seconds = _run(cmd, out / "logs" / f"eval_seed{seed}_{name}.log", (keep, f"eval seed{seed}/{name}"))
    pairs = [  # (the summaries are computed from these when the report reads them)
        {k: p[k] for k in ("policy", "counterpart", "kind")}
        | {
            "episodes": [
                {k: v for k, v in e.items() if k not in THIN_DROP} for e in read_episodes(done / "episodes" / p["file"])
            ]
        }
        for p in json.loads((done / "pairs.json").read_text())
    ]
    record = {"command": _portable(cmd, out, sft), "seconds": round(seconds, 1), "pairs": pairs}
    _write_atomic(kept_eval(keep, seed, name), gzip.compress(json.dumps(record).encode(), mtime=0))
    record_time(keep, f"eval seed{seed}/{name}", seconds)
    _log(f"evaluated seed {seed} {name} in {seconds:.0f}s")


def run_seed(out: Path, keep: Path, profile: Profile, table: dict[str, Arm], sft: str, seed: int) -> None:
    """Every unit of ``seed`` not yet kept: per arm train (unless evaluated already) then evaluate; the SFT
    reference; the cross-play when every arm's checkpoint of the seed is on this machine."""
    names = arms_of(profile, seed)
    for name in tqdm(names, desc=f"seed {seed}", unit="arm"):
        cmd = eval_command(out, profile, table, sft, seed, name)
        if is_kept(keep, seed, name, cmd, out, sft):
            if not (keep / "runs" / name / f"seed{seed}.json").exists():  # its curves lost (once git-ignored):
                train_unit(out, keep, table[name], seed, sft, profile.iterations)  # the same seed trains it again
            continue
        train_unit(out, keep, table[name], seed, sft, profile.iterations)
        eval_unit(out, keep, cmd, seed, name, sft)
    cmd = eval_command(out, profile, table, sft, seed, "sft")
    if not is_kept(keep, seed, "sft", cmd, out, sft):
        eval_unit(out, keep, cmd, seed, "sft", sft)
    if len(names) < 2:
        return
    cmd = cross_command(out, profile, seed)
    if is_kept(keep, seed, "cross", cmd, out, sft):
        return
    missing = [n for n in names if not finished(out / "runs" / n / f"seed{seed}", profile.iterations)]
    if missing:
        _log(f"seed {seed}: no cross-play (checkpoints trained on another machine: {', '.join(missing)})")
        return
    eval_unit(out, keep, cmd, seed, "cross", sft)


# ------------------------------------------------------------------------------------------------------------ report


def load_results(keep: Path, seeds: Sequence[int]) -> list[dict]:
    """Every kept evaluated pair of every seed: ``{"seed", "policy", "counterpart", "kind", "episodes", "summary"}``."""
    from marti_ibrl.eval.dond.metrics import summarize_seat_averaged

    pairs = []
    for seed in seeds:
        for path in sorted((keep / "eval" / f"seed{seed}").glob("*.json.gz")):
            for p in json.loads(gzip.decompress(path.read_bytes()))["pairs"]:
                pairs.append(dict(p, seed=seed, summary=summarize_seat_averaged(p["episodes"])))
    return pairs


def _agg(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample sd (None with fewer than two values) over seeds, ignoring Nones."""
    xs = [v for v in values if v is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None)


def _fmt(x: float | None, sd: float | None = None) -> str:
    if x is None:
        return "–"
    return f"{x:.2f}" if sd is None else f"{x:.2f}±{sd:.2f}"


def _md(rows: list[list[str]]) -> str:
    head, *body = rows
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in body]
    )


def per_arm(pairs: list[dict], arm: str, kind: str, counterpart: str | None = None) -> dict[int, dict]:
    """Seed -> seat-averaged summary of ``arm`` against the counterpart(s) of ``kind``, pooling the episodes of
    several counterparts of one kind (held-out bots, a pool of in-system bots) into one summary per seed."""
    from marti_ibrl.eval.dond.metrics import summarize_seat_averaged

    by_seed: dict[int, list] = {}
    for p in pairs:
        if p["policy"] == arm and p["kind"] == kind and counterpart in (None, p["counterpart"]):
            by_seed.setdefault(p["seed"], []).extend(p["episodes"])
    return {s: summarize_seat_averaged(eps)["averaged"] for s, eps in by_seed.items()}


def cell(summaries: dict[int, dict]) -> str:
    """agreement / own utility / joint value, each mean±sd over seeds."""
    return " / ".join(
        _fmt(*_agg([s[k] for s in summaries.values()])) for k in ("agreement", "own_utility", "joint_value")
    )


def main_table(pairs: list[dict], policies: Sequence[str]) -> str:
    columns = [("in-system", "in-system", None), ("self-play", "self-play", None), ("held-out (all)", "held-out", None)]
    columns += [(b, "held-out", b) for b in HELDOUT_BOTS]  # held-out counterparts are named by bot
    rows = [["policy", *(c[0] for c in columns)]]
    for arm in policies:
        rows.append([arm, *(cell(per_arm(pairs, arm, kind, cp)) or "" for _, kind, cp in columns)])
    return _md(rows)


def mismatch_table(pairs: list[dict], policies: Sequence[str]) -> tuple[str, dict[str, dict]]:
    """Δmismatch = J_in-system − J_held-out (agreement), per seed then mean±sd; also returns the numbers."""
    rows = [["policy", "J in-system", "J self-play", "J held-out", "Δmismatch", "malformed (held-out)"]]
    numbers = {}
    for arm in policies:
        ins, slf, held = (per_arm(pairs, arm, k) for k in ("in-system", "self-play", "held-out"))
        deltas = [ins[s]["agreement"] - held[s]["agreement"] for s in ins if s in held]
        numbers[arm] = {
            "in_system": _agg([s["agreement"] for s in ins.values()])[0],
            "self_play": _agg([s["agreement"] for s in slf.values()])[0],
            "held_out": _agg([s["agreement"] for s in held.values()])[0],
            "delta": _agg(deltas)[0],
            "held_out_by_seed": {seed: held[seed]["agreement"] for seed in sorted(held)},
        }
        rows.append(
            [
                arm,
                _fmt(*_agg([s["agreement"] for s in ins.values()])),
                _fmt(*_agg([s["agreement"] for s in slf.values()])),
                _fmt(*_agg([s["agreement"] for s in held.values()])),
                _fmt(*_agg(deltas)),
                _fmt(*_agg([s["malformed"] for s in held.values()])),
            ]
        )
    return _md(rows), numbers


def cross_play_table(pairs: list[dict], policies: Sequence[str]) -> str:
    """Row policy vs column policy: agreement (mean over seeds); the diagonal is self-play."""
    rows = [["policy \\ counterpart", *policies]]
    for a in policies:
        row = [a]
        for b in policies:
            got = per_arm(pairs, a, "self-play") if a == b else per_arm(pairs, a, "cross-play", f"policy:{b}")
            row.append(_fmt(_agg([s["agreement"] for s in got.values()])[0]))
        rows.append(row)
    return _md(rows)


def episode_frame(pairs: list[dict], kind: str):
    """One row per episode of ``kind``: method, seed, scenario, counterpart, agreed."""
    import pandas as pd

    rows = [
        {
            "method": p["policy"],
            "seed": p["seed"],
            "scenario_uid": e["scenario_uid"],
            "counterpart": p["counterpart"],
            "agreed": bool(e["agreed"]) and not e.get("failed", False),
        }
        for p in pairs
        if p["kind"] == kind
        for e in p["episodes"]
    ]
    return pd.DataFrame(rows)


def gee_fit(df: pd.DataFrame, reference: str, family_col: str | None = None) -> tuple[pd.DataFrame | str, tuple]:
    """:func:`marti_ibrl.eval.stats.compare` of agreement vs ``reference`` as every mini Table 2 report fits it:
    scenario clusters, seed fixed effects ``C(seed)`` when there are several seeds. Returns (the table, or the reason
    it is not estimable; the covariates used)."""
    from marti_ibrl.eval.stats import compare

    covariates = ("C(seed)",) if df["seed"].nunique() > 1 else ()
    try:
        res = compare(
            df, reference, family_col=family_col, outcome="agreed", cluster="scenario_uid", covariates=covariates
        )
    except ValueError as e:
        return str(e), covariates
    return res, covariates


def gee_tests(pairs: list[dict], reference: str = "ibrl") -> tuple[str, dict]:
    """Secondary: logistic GEE of agreement vs ``reference``, held-out (pooled, and per held-out bot) and self-play.

    Clusters = scenarios (every arm, seed and seat of a scenario in one cluster, exchangeable working correlation),
    seed fixed effects ``C(seed)`` when there are several seeds; Holm within each family. It says how precisely these
    runs were measured on these scenarios, not how another training run would do: that is :func:`run_level_tests`,
    the primary test."""
    from marti_ibrl.eval.stats import format_table

    parts, verdicts = [], {}
    for kind, family in (("held-out", None), ("held-out", "counterpart"), ("self-play", None)):
        df = episode_frame(pairs, kind)
        if df.empty or reference not in set(df["method"]) or df["method"].nunique() < 2:
            continue
        title = f"{kind}, " + ("per counterpart" if family else "all counterparts pooled")
        res, covariates = gee_fit(df, reference, family)
        if isinstance(res, str):
            parts.append(f"**{title}**: not estimable ({res})")
            continue
        text = f"**{title}** (clusters: scenarios{', seed fixed effects' if covariates else ''})\n\n" + format_table(
            res
        )
        if family is None:
            verdicts[kind] = {r["method"]: r for r in res.to_dict("records")}
        parts.append(text)
    return "\n\n".join(parts), verdicts


RUN_METRICS = {"agreement": "agreement", "expected utility": "expected_utility"}
"""The run-level outcomes: agreement, and expected utility = agreement × own utility over agreed episodes (the mean
own utility per episode, 0 without a deal): a policy that agrees by conceding everything scores high on the first
and low on the second."""


def run_values(pairs: list[dict], kind: str, metric: str, arms: Sequence[str]) -> list[dict]:
    """One row per training run (arm × seed) of ``arms`` evaluated in ``kind``: ``method, seed, value``."""
    rows = []
    for arm in arms:
        for seed, summary in sorted(per_arm(pairs, arm, kind).items()):
            value = summary["agreement"]
            if metric == "expected_utility":
                value = summary["agreement"] * (summary["own_utility"] or 0.0)
            rows.append({"method": arm, "seed": seed, "value": value})
    return rows


def holm_families(arms: Sequence[str]) -> list[list[str]]:
    """The Holm families of the run-level test: the Table 2 arms (IB-RL's rivals: unilateral training) and the
    Table 3 ablations (IB-RL with one piece changed), as the paper keeps the two questions in two tables; empty
    families are dropped. The ablations also run fewer seeds (``ablation_seeds``)."""
    families = [[a for a in arms if a not in ABLATIONS], [a for a in arms if a in ABLATIONS]]
    return [f for f in families if f]


def run_level_tests(pairs: list[dict], arms: Sequence[str], reference: str = "ibrl") -> tuple[str, dict]:
    """Primary: each arm's training runs against IB-RL's (Welch t-test over runs, Δ with 95% CI, Holm within each
    family of :func:`holm_families`; :func:`marti_ibrl.eval.stats.runs_vs_reference`), for held-out and self-play
    agreement and expected utility. Each verdict row also carries ``p_holm_all``, Holm over every compared arm at
    once (the stricter correction, quoted beside the goals). Arms with fewer than two evaluated runs are left out
    (named). The SFT init is one checkpoint, not a training run: it is not tested here."""
    import pandas as pd

    from marti_ibrl.eval.stats import format_runs_table, holm, runs_vs_reference

    parts, verdicts = [], {}
    for kind in ("held-out", "self-play"):
        for label, metric in RUN_METRICS.items():
            rows = run_values(pairs, kind, metric, arms)
            counts = pd.Series([r["method"] for r in rows]).value_counts() if rows else pd.Series(dtype=int)
            testable = [a for a in arms if counts.get(a, 0) >= 2]
            title = f"**{kind} {label}** (one value per training run)"
            if reference not in testable or len(testable) < 2:
                parts.append(f"{title}: not testable (runs per arm: {dict(counts)})")
                continue
            df = pd.DataFrame([r for r in rows if r["method"] in testable])
            compared = [a for a in testable if a != reference]
            res = pd.concat(
                [runs_vs_reference(df[df["method"].isin([reference, *f])], reference) for f in holm_families(compared)],
                ignore_index=True,
            )
            res["p_holm_all"], _ = holm(res["p_value"].to_numpy())
            verdicts[(kind, metric)] = {r["method"]: r for r in res.to_dict("records")}
            scale, unit, digits = (100.0, "points", 1) if metric == "agreement" else (1.0, "utility", 3)
            text = f"{title}\n\n" + format_runs_table(res, scale=scale, unit=unit, digits=digits)
            left_out = [a for a in arms if a not in testable]
            parts.append(text + (f"\n\n_left out (fewer than two runs): {', '.join(left_out)}_" if left_out else ""))
    return "\n\n".join(parts), verdicts


def _gain_line(what: str, arm: str, ib: float, other: float, row: dict | None, goal: float | None) -> str:
    """One verdict: IB-RL's gain over ``arm`` in points, the run-level 95% CI and Holm p, and the goal if any."""
    gain = ib - other
    text = f"{what}: IB-RL {ib:.3f} vs {arm} {other:.3f}: {gain * 100:+.1f} points"
    if row is not None:  # the row is arm − IB-RL: IB-RL's gain is its negation
        text += f" [95% CI {-row['ci_high'] * 100:+.1f}, {-row['ci_low'] * 100:+.1f}]"
        text += f", runs {row['ref_runs']} vs {row['runs']}, Welch t-test over runs, Holm p = {row['p_holm']:.3g}"
        if row.get("p_holm_all") is not None and row["p_holm_all"] != row["p_holm"]:
            text += f" (Holm over every compared arm, ablations included: {row['p_holm_all']:.3g})"
    else:
        text += " (no run-level test: fewer than two runs per arm)"
    if goal is None:
        return text + "."
    ok = gain >= goal and row is not None and row["p_holm"] < 0.05
    return text + f" (goal ≥ +{goal * 100:.0f} points, run-level p < 0.05): **{'met' if ok else 'not met'}**."


def goals(numbers: dict[str, dict], run_verdicts: dict, gee_verdicts: dict | None = None) -> list[str]:
    """The issue's goals, judged on the primary (run-level) test, then the uni_pool control; the secondary
    scenario-clustered GEE's Holm p is quoted beside the held-out goal."""
    if "ibrl" not in numbers:
        return ["IB-RL was not evaluated."]
    ib, lines = numbers["ibrl"], []
    for kind, key, goal in (("held-out", "held_out", 0.05), ("self-play", "self_play", 0.10)):
        singles = {a: numbers[a][key] for a in SINGLE_COUNTERPART if a in numbers and numbers[a][key] is not None}
        if not singles or ib[key] is None:
            continue
        best = max(singles, key=singles.get)
        row = run_verdicts.get((kind, "agreement"), {}).get(best)
        line = _gain_line(
            f"{kind.capitalize()} agreement, best single-counterpart arm ({best})",
            best,
            ib[key],
            singles[best],
            row,
            goal,
        )
        if kind == "held-out":
            line += _seed_spread(numbers, best)
            gee = (gee_verdicts or {}).get("held-out", {}).get(best)
            if gee is not None:
                line += f" Secondary, scenario-clustered GEE: Holm p = {gee['p_holm']:.3g}."
        lines.append(line)
    if "uni_pool" in numbers:  # the control that trains against a diverse frozen pool (§5.4)
        for kind, key in (("held-out", "held_out"), ("self-play", "self_play")):
            if numbers["uni_pool"][key] is not None and ib[key] is not None:
                row = run_verdicts.get((kind, "agreement"), {}).get("uni_pool")
                lines.append(
                    _gain_line(f"Control, {kind} agreement", "uni_pool", ib[key], numbers["uni_pool"][key], row, None)
                )
    return lines


def _seed_spread(numbers: dict[str, dict], arm: str) -> str:
    """The held-out gain of IB-RL over ``arm`` seed by seed."""
    ib, other = numbers["ibrl"].get("held_out_by_seed", {}), numbers[arm].get("held_out_by_seed", {})
    seeds = [s for s in ib if s in other]
    if len(seeds) < 2:
        return ""
    return " Per seed: " + ", ".join(f"{s}: {(ib[s] - other[s]) * 100:+.1f}" for s in seeds) + " points."


def t_interval(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean of ``values`` and the half-width of its 95% t interval (None with fewer than two values)."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def runs_figure(pairs: list[dict], arms: Sequence[str], png: Path) -> Path | None:
    """Held-out agreement per training run: one point per (arm, seed), the arm's mean and its 95% t interval, and the
    SFT init's held-out agreement as a dashed line when it was evaluated. Agreement is a share, so the axis is [0, 1];
    an interval that runs past it is cut at the edge and marked with a triangle."""
    from marti_ibrl.eval.figures import _figure, _save

    rows = run_values(pairs, "held-out", "agreement", arms)
    shown = [a for a in arms if any(r["method"] == a for r in rows)]
    if not shown:
        return None
    fig = _figure((max(5.0, 1.1 * len(shown) + 2), 4.5))
    ax = fig.add_subplot()
    label = "mean over runs, 95% t interval"
    for i, arm in enumerate(shown):
        values = [r["value"] for r in rows if r["method"] == arm]
        seeds = [r["seed"] for r in rows if r["method"] == arm]
        offsets = [(k - (len(values) - 1) / 2) * 0.06 for k in range(len(values))]
        ax.scatter([i + o for o in offsets], values, color=f"C{i}", s=22, alpha=0.8, zorder=3, label="_")
        for x, y, seed in zip(offsets, values, seeds):
            ax.annotate(str(seed), (i + x, y), textcoords="offset points", xytext=(4, 0), fontsize=6, color="0.4")
        mean, half = t_interval(values)
        x = i + 0.25
        if half is None:
            ax.plot(x, mean, "o", color="black", ms=5, zorder=4, label=label)
        else:
            lo, hi = max(0.0, mean - half), min(1.0, mean + half)
            ax.errorbar(
                x, mean, yerr=[[mean - lo], [hi - mean]], fmt="o", color="black", capsize=4, ms=5, zorder=4, label=label
            )
            for edge, cut, marker in ((0.0, mean - half < 0.0, "v"), (1.0, mean + half > 1.0, "^")):
                if cut:
                    ax.plot(x, edge, marker, color="black", ms=6, zorder=4, clip_on=False)
        label = "_"  # one legend entry
    sft = [r["value"] for r in run_values(pairs, "held-out", "agreement", ["sft"])]
    if sft:
        ax.axhline(statistics.fmean(sft), color="0.5", ls="--", lw=1, zorder=1, label="SFT init")
    ax.set_ylim(0.0, 1.0)
    ax.set_xticks(range(len(shown)), shown, rotation=20)
    ax.set_ylabel("held-out agreement (seat-averaged)")
    ax.set_title(
        "Held-out agreement per training run (points: runs, by seed; ▲▼ interval cut at the axis)", fontsize="medium"
    )
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, png)


def _run_records(keep: Path, profile: Profile) -> dict[tuple[str, int], dict]:
    """(arm, seed) -> the kept record of each finished training run (:func:`run_record`)."""
    found = {}
    for s in profile.seeds:
        for a in arms_of(profile, s):
            path = keep / "runs" / a / f"seed{s}.json"
            if path.exists():
                found[(a, s)] = json.loads(path.read_text())
    return found


def engine_note(keep: Path, profile: Profile) -> str:
    """Which rollout engine the training runs used (their ``topology.json``, kept) and the evaluation's default."""
    kinds: dict[str, int] = {}
    for record in _run_records(keep, profile).values():
        for kind in record["engines"].values():
            kinds[kind] = kinds.get(kind, 0) + 1
    found = ", ".join(f"{k} ({n} trained roles)" for k, n in sorted(kinds.items())) or "no training run recorded"
    return f"Rollout engine: {found} in training; `marti-ibrl eval --engine auto` (HF generate on CPU) in evaluation."


def reward_figure(keep: Path, profile: Profile, png: Path) -> Path | None:
    """agent1's training reward per iteration, one line per arm (mean over seeds, EMA-smoothed)."""
    from marti_ibrl.eval.figures import _figure, _save, ema, finish_axes

    records = _run_records(keep, profile)
    fig = _figure((7.5, 4.5))
    ax = fig.add_subplot()
    drawn = False
    for i, arm in enumerate(profile.arms):
        curves = [
            [x for x in r["rewards"].get("agent1/reward", []) if x is not None]
            for (a, _), r in records.items()
            if a == arm
        ]
        curves = [c for c in curves if c]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        mean = [statistics.fmean(c[k] for c in curves) for k in range(n)]
        ax.plot(range(1, n + 1), ema(mean), color=f"C{i}", lw=2, label=f"{arm} ({len(curves)} runs)")
        drawn = True
    if not drawn:
        return None
    finish_axes(ax, "training iteration", "agent1 training reward (EMA, mean over seeds)", "Training reward per arm")
    return _save(fig, png)


def units(profile: Profile) -> list[str]:
    """The ledger keys of every unit of the run, in the order they run."""
    keys = ["sft"]
    for s in profile.seeds:
        names = arms_of(profile, s)
        for a in names:
            keys += [f"train {a}/seed{s}", f"eval seed{s}/{a}"]
        keys += [f"eval seed{s}/sft"] + ([f"eval seed{s}/cross"] if len(names) > 1 else [])
    return keys


def compute_time(keep: Path, profile: Profile) -> tuple[str, str]:
    """The run's compute time from the ledger (:func:`record_time`): a one-line total and a per-unit list."""
    path = keep / TIMES
    ledger = json.loads(path.read_text()) if path.exists() else {}
    stages = {k: ledger.get(k) for k in units(profile)}
    missing = [k for k, v in stages.items() if v is None]
    total = sum(v for v in stages.values() if v is not None)
    runs = sum(len(arms_of(profile, s)) for s in profile.seeds)
    line = f"{total / 3600:.1f} h of compute (SFT, {runs} training runs and the "
    line += "evaluations, summed from the ledger `KEEP/times.json`; a run's last, completing invocation)"
    line += f"; not recorded: {', '.join(missing)}" if missing else ""
    listing = "\n".join(f"- {k}: {'–' if v is None else f'{v:.0f} s'}" for k, v in stages.items())
    return line, listing


def cross_play_note(pairs: list[dict], profile: Profile) -> str:
    """Which seeds have cross-play (it needs every arm's checkpoint of a seed on one machine)."""
    have = sorted({p["seed"] for p in pairs if p["kind"] == "cross-play"})
    want = [s for s in profile.seeds if len(arms_of(profile, s)) > 1]
    lacking = [s for s in want if s not in have]
    text = f"Seeds with cross-play: {', '.join(map(str, have)) or 'none'}"
    return text + (
        f"; without (arms trained on different machines, or not yet): {', '.join(map(str, lacking))}."
        if lacking
        else "."
    )


def write_results(keep: Path, profile: Profile, results: Path, meta: dict) -> str:
    """The report from what ``keep`` holds (the kept records of every finished unit, whichever machine ran it)."""
    pairs = load_results(keep, profile.seeds)
    if not pairs:
        raise FileNotFoundError(f"no kept evaluation under {keep / 'eval'}: run the benchmark first")
    policies = [a for a in (*profile.arms, "sft") if any(p["policy"] == a for p in pairs)]
    mismatch, numbers = mismatch_table(pairs, policies)
    trained = [a for a in policies if a != "sft"]
    primary, run_verdicts = run_level_tests(pairs, trained)
    stats, verdicts = gee_tests(pairs)
    figure = reward_figure(keep, profile, results.with_name(results.stem + "_rewards.png"))
    per_run = runs_figure(pairs, trained, results.with_name(results.stem + "_runs.png"))
    n_eval = max((p["summary"]["averaged"]["n"] for p in pairs if p["kind"] == "held-out"), default=0)
    sft = meta.get("sft", {})
    total, stage_times = compute_time(keep, profile)
    text = [
        f"# Mini Table 2 ({'quick' if meta.get('quick') else 'full'} run, seeds {', '.join(map(str, profile.seeds))})",
        f"Command: `{meta['command']}`  \nWall time: {meta['wall_time']}  \nWhole run: {total}  \n"
        f"Date: {meta['date']}; machine: {meta['machine']}.",
        "Settings: "
        + json.dumps(asdict(profile))
        + f"; recipe `{RECIPE.relative_to(ROOT)}`. "
        + engine_note(keep, profile),
        (
            f"SFT init: {sft['records']} records from {sft['dialogues']} training-bot dialogues, {sft['seconds']} s; "
            f"protocol-valid self-play turns {sft['validity']['protocol']:.1%}"
            + _complement_text(sft["validity"])
            + f"; env {json.dumps(sft.get('env', {}))}."
            if sft
            else "SFT init: no record (`OUT/sft/mini_table2_sft.json`)."
        ),
        "## Goals (judged on the run-level test)\n\n"
        + "\n".join(f"- {g}" for g in goals(numbers, run_verdicts, verdicts)),
        f"## Table 2 (seat-averaged, {n_eval // 2} held-out scenarios × 2 seats per pair)\n\n"
        "Cells: agreement / own utility / joint value (utilities over agreed episodes), mean ± sd over seeds. "
        "`held-out (all)` pools the four held-out bots.\n\n" + main_table(pairs, policies),
        "## Δmismatch (agreement)\n\nΔ = J_in-system − J_held-out per seed, then mean ± sd. In-system for uni_pool "
        "is the mean over its four training bots; `sft` has no training counterpart.\n\n" + mismatch,
        "## Cross-play (agreement; diagonal = self-play)\n\n"
        + cross_play_note(pairs, profile)
        + "\n\n"
        + cross_play_table(pairs, policies),
        "## Primary statistics: training runs vs ibrl\n\nThe replicated unit is the training run: one value per run "
        "(arm × seed), Welch's t-test of each arm's runs against IB-RL's, the difference with its 95% CI, Holm within "
        "each family: the Table 2 arms (unilateral training) and the Table 3 ablations, two questions in two tables "
        "as in the paper (`marti_ibrl.eval.stats.runs_vs_reference`). Δ is arm − IB-RL: negative = IB-RL higher."
        "\n\n" + primary,
        "## Secondary statistics (logistic GEE vs ibrl, odds ratios of agreement)\n\nClustered by scenario: how "
        "precisely these particular runs were measured, not how another run would do.\n\n" + stats,
    ]
    if per_run:
        text.append(f"## Held-out agreement per run\n\n![held-out agreement per run]({per_run.name})")
    if figure:
        text.append(f"## Training reward\n\n![reward curves]({figure.name})")
    text.append("## Stage times\n\n" + stage_times)
    results.parent.mkdir(parents=True, exist_ok=True)
    markdown = "\n\n".join(text) + "\n"
    results.write_text(markdown)
    return markdown


# -------------------------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 main arms, 1 seed, 5 iterations, 50 eval scenarios")
    p.add_argument("--out", default=None, help="work directory (default runs/mini_table2[_quick])")
    p.add_argument("--sft-dir", default="runs/mini_table2/sft", help="the SFT init, built once, shared by quick/full")
    p.add_argument(
        "--keep",
        default=None,
        help="the kept records, all the report reads (default benchmarks/results/mini_table2_runs; OUT/keep --quick)",
    )
    p.add_argument(
        "--results", default=None, help="results markdown (default benchmarks/results/mini_table2[_quick].md)"
    )
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--eval-scenarios", type=int, default=None)
    p.add_argument("--cross-play-scenarios", type=int, default=None)
    p.add_argument("--arms", nargs="+", default=None, choices=FULL.arms)
    p.add_argument("--stage", default="all", choices=["all", "sft", "run", "report"], help="run = train + evaluate")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    profile = QUICK if args.quick else FULL
    overrides = {
        "seeds": tuple(args.seeds) if args.seeds else None,
        "iterations": args.iterations,
        "eval_scenarios": args.eval_scenarios,
        "cross_play_scenarios": args.cross_play_scenarios,
        "arms": tuple(args.arms) if args.arms else None,
    }
    profile = replace(profile, **{k: v for k, v in overrides.items() if v is not None})
    suffix = "_quick" if args.quick else ""
    out = (ROOT / (args.out or f"runs/mini_table2{suffix}")).resolve()
    keep = (ROOT / args.keep).resolve() if args.keep else (out / "keep" if args.quick else KEEP)
    results = (ROOT / (args.results or f"benchmarks/results/mini_table2{suffix}.md")).resolve()
    t0 = time.perf_counter()
    sft_dir = (ROOT / args.sft_dir).resolve()
    sft_record = stage_sft(sft_dir, profile, keep) if args.stage in ("all", "sft", "run") else {}
    sft = str(sft_dir)
    table = arms(sft, profile.single_bot)
    if args.stage in ("all", "run"):
        for seed in profile.seeds:  # seed by seed, arm by arm: each finished unit is kept at once
            run_seed(out, keep, profile, table, sft, seed)
    if args.stage in ("all", "report"):
        kept_sft = keep / "sft" / SFT_RECORD
        if not sft_record and kept_sft.exists():
            sft_record = json.loads(kept_sft.read_text())
        wall = time.perf_counter() - t0
        meta = {
            "command": shlex.join([Path(sys.executable).name, "benchmarks/mini_table2.py", *(argv or sys.argv[1:])]),
            "wall_time": f"{wall / 60:.1f} min (this invocation; units kept by earlier invocations are not counted)",
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{_cpus()} CPU cores, no GPU",
            "quick": args.quick,
            "sft": sft_record,
        }
        print(write_results(keep, profile, results, meta))
        _log(f"wrote {results} in {math.ceil(wall)} s total")
    return 0


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
