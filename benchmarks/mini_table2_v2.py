"""Mini Table 2, version 2 (issue 39): can the miniature tell co-evolution from counterpart variety?

The design, the primary test and every secondary test were fixed before the first run in
``benchmarks/results/mini_table2_v2_plan.md`` (the pre-registration); this script carries it out and changes none of
it. What differs from version 1 (``benchmarks/mini_table2.py``, whose stages, recipe, SFT init and records this script
reuses) is the held-out side: counterparts from outside the training bots' family.

Units, each skipped once kept (``--keep``, default ``benchmarks/results/mini_table2_v2_runs``), so the run spans
sessions and machines and an interruption costs at most the unit it stopped:

1. **Panel** (``panel``): six dedicated training runs whose final agent1 policies are the *learned* held-out
   counterparts (seeds 100-105, outside the evaluated seeds; :data:`PANEL`). Their HF checkpoints are kept in
   ``KEEP/panel/NAME`` (≈ 3 MB each), since every later evaluation plays them.
2. **Runs** (``run``): per seed, per arm (``ibrl``, ``uni_pool``, ``uni_sft``): train (``marti-ibrl train``, the v1
   recipe) then evaluate at once (:func:`eval_command`): in-system, self-play, the v1 held-out bots (conceders
   recalibrated), the strategy-disjoint scripted families, their phrased variants, and the panel; then the SFT init
   once, against the same counterparts.
3. **Report** (``report``): written once, when every unit is kept (the stopping rule: no interim look at outcomes;
   until then it prints which units are finished).

    setsid nohup benchmarks/yield_to_ci.sh .venv/bin/python benchmarks/mini_table2_v2.py --out runs/v2 > v2.log 2>&1 &
    .venv/bin/python benchmarks/mini_table2_v2.py --stage status
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mini_table2 as v1  # noqa: E402  (the v1 benchmark's stages, reused as they are)

ROOT = v1.ROOT
KEEP = ROOT / "benchmarks" / "results" / "mini_table2_v2_runs"
PLAN = ROOT / "benchmarks" / "results" / "mini_table2_v2_plan.md"

SEEDS = tuple(range(10))
ARMS = ("ibrl", "uni_pool", "uni_sft")
ITERATIONS = 40  # as v1 (the recipe)
EVAL_SCENARIOS = 150  # per pair, × 2 seats


@dataclass(frozen=True)
class PanelMember:
    """A learned held-out counterpart: the final agent1 of a dedicated run (``arm``, ``seed``)."""

    name: str
    arm: str
    seed: int


PANEL = (
    PanelMember("L_ibrl", "ibrl", 100),
    PanelMember("L_shared_reward", "shared_reward", 101),
    PanelMember("L_joint_norm", "joint_norm", 102),
    PanelMember("L_uni_pool", "uni_pool", 103),
    PanelMember("L_uni_sft", "uni_sft", 104),
    PanelMember("L_uni_bot", "uni_bot", 105),
)
V1_HELDOUT = ("hardliner", "tit_for_tat", "slow_conceder", "fast_conceder")  # family of the training bots
SCRIPTED = ("utility_search", "split_difference", "random_aspiration", "picky_then_fold")  # family A
PHRASED = tuple(f"{b}+phrased" for b in SCRIPTED)  # family B
FAMILIES = {"scripted": list(SCRIPTED), "surface": list(PHRASED), "learned": [m.name for m in PANEL]}
"""The three families of the primary outcome (equal weights), by counterpart name as ``pairs.json`` records it (a
held-out bot by its bare name, a panel member by its ``NAME=``)."""


def _log(msg: str) -> None:
    v1.tqdm.write(f"[mini_table2_v2] {msg}")


def panel_dir(keep: Path, member: PanelMember) -> Path:
    return keep / "panel" / member.name


PANEL_RECORD = "panel.json"


def stage_panel(out: Path, keep: Path, table: dict[str, v1.Arm], sft: str) -> None:
    """Train each panel run not yet kept, and keep its final agent1 (the files, the record last)."""
    for member in v1.tqdm(PANEL, desc="panel", unit="run"):
        dest = panel_dir(keep, member)
        if (dest / PANEL_RECORD).exists():
            continue
        run = v1.train_unit(out, keep, table[member.arm], member.seed, sft, ITERATIONS)
        hf = run / "agent1" / "hf"
        dest.mkdir(parents=True, exist_ok=True)
        files = sorted(f for f in hf.iterdir() if f.is_file())
        for f in files:
            shutil.copy2(f, dest / f.name)
        record = {"arm": member.arm, "seed": member.seed, "iterations": ITERATIONS, "files": [f.name for f in files]}
        v1._write_atomic(dest / PANEL_RECORD, json.dumps(record, indent=1))
        _log(f"panel {member.name} kept in {dest}")


def counterpart_args(keep: Path) -> list[str]:
    """Every held-out counterpart of v2 as ``--counterpart`` arguments (the panel by name)."""
    specs = [f"heldout:{b}" for b in (*V1_HELDOUT, *SCRIPTED, *PHRASED)]
    specs += [f"{m.name}=checkpoint:{panel_dir(keep, m)}" for m in PANEL]
    return [x for s in specs for x in ("--counterpart", s)]


def eval_command(out: Path, keep: Path, table: dict[str, v1.Arm], sft: str, seed: int, name: str) -> list[str]:
    """The ``marti-ibrl eval`` of one policy (an arm's final agent1 of ``seed``, or ``"sft"``)."""
    env = v1.recipe_env()
    cmd = [sys.executable, "-m", "marti_ibrl.cli", "eval", "--seed", str(seed)]
    cmd += ["--prompt-style", env["prompt_style"], "--max-rounds", str(env["max_rounds"])]
    cmd += ["--bot-speech", env["bot_speech"], "--max-new-tokens", str(env["max_new_tokens"])]
    cmd += ["--max-len", str(env["max_len"]), "--num-engines", "1", "--batch", "1024"]
    cmd += ["--show-complement"] if env["show_complement"] else []
    path = sft if name == "sft" else v1._policy_path(out, name, seed)
    cmd += ["--policy", f"{name}={path}", "--self-play", "-n", str(EVAL_SCENARIOS)]
    if name != "sft":
        run = out / "runs" / name / f"seed{seed}"
        cmd += [x for spec in table[name].in_system for x in ("--in-system", f"{name}={spec.format(run=run)}")]
    cmd += counterpart_args(keep)
    return cmd + ["--out", str(out / "eval" / f"seed{seed}" / name)]


def _portable(cmd: list[str], out: Path, keep: Path, sft: str) -> str:
    return v1._portable(cmd, out, sft).replace(str(keep), "{KEEP}")


def is_kept(keep: Path, seed: int, name: str, cmd: list[str], out: Path, sft: str) -> bool:
    path = v1.kept_eval(keep, seed, name)
    return path.exists() and json.loads(v1.gzip.decompress(path.read_bytes()))["command"] == _portable(
        cmd, out, keep, sft
    )


def eval_unit(out: Path, keep: Path, cmd: list[str], seed: int, name: str, sft: str) -> None:
    """v1's evaluation unit, its record's command made portable over ``KEEP`` too."""
    v1.eval_unit(out, keep, cmd, seed, name, sft)
    path = v1.kept_eval(keep, seed, name)
    record = json.loads(v1.gzip.decompress(path.read_bytes()))
    record["command"] = _portable(cmd, out, keep, sft)
    v1._write_atomic(path, v1.gzip.compress(json.dumps(record).encode(), mtime=0))


def stage_runs(out: Path, keep: Path, table: dict[str, v1.Arm], sft: str, seeds: Sequence[int]) -> None:
    """Per seed, per arm: train (unless evaluated already), evaluate at once; then the SFT init once (seed 0)."""
    for seed in seeds:
        for arm in v1.tqdm(ARMS, desc=f"seed {seed}", unit="arm"):
            cmd = eval_command(out, keep, table, sft, seed, arm)
            if is_kept(keep, seed, arm, cmd, out, sft):
                continue
            v1.train_unit(out, keep, table[arm], seed, sft, ITERATIONS)
            eval_unit(out, keep, cmd, seed, arm, sft)
    cmd = eval_command(out, keep, table, sft, 0, "sft")
    if not is_kept(keep, 0, "sft", cmd, out, sft):
        eval_unit(out, keep, cmd, 0, "sft", sft)


def units(keep: Path) -> dict[str, bool]:
    """Every unit of the pre-registered run and whether it is kept."""
    done = {f"panel {m.name}": (panel_dir(keep, m) / PANEL_RECORD).exists() for m in PANEL}
    for seed in SEEDS:
        for arm in ARMS:
            done[f"train {arm}/seed{seed}"] = (keep / "runs" / arm / f"seed{seed}.json").exists()
            done[f"eval seed{seed}/{arm}"] = v1.kept_eval(keep, seed, arm).exists()
    done["eval seed0/sft"] = v1.kept_eval(keep, 0, "sft").exists()
    return done


def status(keep: Path) -> str:
    """Which units are finished (no outcomes: the stopping rule allows no interim look)."""
    done = units(keep)
    ledger = json.loads((keep / v1.TIMES).read_text()) if (keep / v1.TIMES).exists() else {}
    hours = sum(ledger.values()) / 3600
    left = [k for k, v in done.items() if not v]
    head = f"{sum(done.values())} of {len(done)} units kept, {hours:.2f} h of compute in the ledger"
    return head + (f"; next: {', '.join(left[:4])}{' ...' if len(left) > 4 else ''}" if left else "; complete")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/mini_table2_v2", help="work directory (checkpoints, logs, episodes)")
    p.add_argument("--keep", default=None, help="kept records (default benchmarks/results/mini_table2_v2_runs)")
    p.add_argument("--sft-dir", default="runs/mini_table2/sft", help="the v1 SFT init (copied from v1's kept one)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="evaluated seeds to run (default 0-9)")
    p.add_argument("--stage", default="all", choices=["all", "panel", "run", "status", "report"])
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    keep = (ROOT / args.keep).resolve() if args.keep else KEEP
    out = (ROOT / args.out).resolve()
    bad = sorted(set(args.seeds) - set(SEEDS))
    if bad:
        raise SystemExit(f"--seeds {bad}: the pre-registered seeds are {list(SEEDS)}")
    if args.stage in ("all", "panel", "run"):
        t0 = time.perf_counter()
        sft_dir = (ROOT / args.sft_dir).resolve()
        v1.stage_sft(sft_dir, v1.FULL, v1.KEEP)  # the kept v1 init, copied (a stale one is refused)
        sft = str(sft_dir)
        table = v1.arms(sft, v1.FULL.single_bot)
        stage_panel(out, keep, table, sft)
        if args.stage in ("all", "run"):
            stage_runs(out, keep, table, sft, args.seeds)
        _log(f"this invocation: {(time.perf_counter() - t0) / 60:.1f} min")
    print(status(keep))
    if args.stage in ("all", "report"):
        if not all(units(keep).values()):
            print("report: not yet (the pre-registered stopping rule: no outcome is shown before every unit is kept)")
            return 0 if args.stage == "all" else 1
        raise SystemExit("report: to be written with the pre-registered analysis (mini_table2_v2_plan.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
