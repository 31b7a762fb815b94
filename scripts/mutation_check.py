"""Do the learning references (tests/golden.py, ``learn_<path>``) catch a wrong reward, penalty or advantage?

    .venv/bin/python scripts/mutation_check.py [--mutations reward penalty sign] [--no-baseline] [--keep]

Three one-line mutations (:data:`MUTATIONS`), each made in a scratch copy of this tree (its working files, tracked
and untracked but not ignored, copied into a temporary directory; the live tree is never touched), and in that copy
the learning reference test(s) each one targets (tests/e2e/test_e2e_learning.py) run with this tree's virtual
environment and the copy's code (its ``marti_ibrl`` first on the path, in the Ray workers too):

* ``reward``: DoND's deal utility off by one (``envs/dond/game.py`` ``utility``): caught by ``learn_hf``;
* ``penalty``: a penalised re-sampled attempt's reward 0 instead of ``env.invalid_penalty``
  (``algorithm/advantages.py`` ``penalized_attempts``, what ``--train.penalize_resamples`` trains on): ``learn_hf``;
* ``sign``: the advantage's sign flipped in Eq. 5's loss (``algorithm/loss.py`` ``IsolatedPolicyLoss``, which every
  path's actors train with, the vLLM path's 2 ZeRO-3 ranks included): ``learn_vllm_zero3``.

A mutation is killed when its reference test fails on a recorded value (tests/golden.py's "learned something else
than recorded", with the values that moved); a test that errors otherwise (the copy broken, a crash) is no kill. A
mutated run stops at the first iteration that moved (tests/golden.py's ``watch``): the reward and penalty mutations
at iteration 1; the sign at the last, 3 (``learn_vllm_zero3``'s first update with non-zero advantages is iteration
2's, whose effect iteration 3 plays). Measured 2026-12-07 on 2 busy cores: 91 s, 99 s and 193 s, 6.4 min in all,
where the whole runs took 7.1 min.
First, unless ``--no-baseline``, the unmutated copy runs the same references and must pass. Prints one line per run
and exits 1 when a mutation survives, a baseline fails or a run errors, 3 when this machine has no learning references
(tests/golden.py "Machines": the runs are then skips, and no verdict is possible). Minutes: each run is a training
run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/e2e/test_e2e_learning.py::test_learning_reference"
FAILED_REFERENCE = "learned something else than recorded"  # tests/golden.py's message for a moved value
NO_REFERENCE = "tests/golden.py, Machines: the references are one machine's; record_golden.py records another's"


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    file: str
    line: str  # the line as it is (exactly once in the file)
    mutated: str
    references: tuple[str, ...]  # the learning paths whose reference must fail


MUTATIONS = (
    Mutation(
        "reward",
        "the deal utility off by one",
        "marti_ibrl/envs/dond/game.py",
        "    return sum(n * v for n, v in zip(alloc, values, strict=True))\n",
        "    return sum(n * v for n, v in zip(alloc, values, strict=True)) + 1\n",
        ("hf",),
    ),
    Mutation(
        "penalty",
        "a penalised re-sampled attempt's reward 0",
        "marti_ibrl/algorithm/advantages.py",
        "                    rewards={role: float(penalty)},\n",
        "                    rewards={role: 0.0},\n",
        ("hf",),
    ),
    Mutation(
        "sign",
        "the advantage's sign flipped in the policy loss",
        "marti_ibrl/algorithm/loss.py",
        "            isolate(advantages, action_mask),\n",
        "            -isolate(advantages, action_mask),\n",
        ("vllm_zero3",),
    ),
)


def scratch_copy(dest: Path) -> Path:
    """This tree's working files (tracked, and untracked but not ignored) copied to ``dest``, with the package's
    compiled modules (a mutated module's own is stale by its source's new mtime, so Python compiles it again)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    # the package's compiled modules too (valid while copy2 keeps each source's mtime): no compiling in every process
    cached = [p.relative_to(ROOT) for p in (ROOT / "marti_ibrl").rglob("__pycache__/*.pyc")]
    for name in [*map(os.fsdecode, filter(None, listed)), *cached]:
        src = ROOT / name
        if src.is_file():  # (a tracked file deleted in the working tree is not copied)
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def mutate(copy: Path, m: Mutation) -> int:
    """Make ``m`` in ``copy``; the line number it changed."""
    path = copy / m.file
    lines = path.read_text().splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line == m.line]
    if len(at) != 1:
        raise SystemExit(
            f"mutation_check: {m.name}: {m.file} has the line {m.line.strip()!r} {len(at)} times, not once"
        )
    lines[at[0]] = m.mutated
    path.write_text("".join(lines))
    return at[0] + 1


def _env(copy: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "IBRL_RECORD_GOLDEN"}  # never record in a copy
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def check_imports_from(copy: Path) -> None:
    """The copy's ``marti_ibrl`` is the one its runs import (not this tree's editable install)."""
    done = subprocess.run(
        [sys.executable, "-c", "import marti_ibrl; print(marti_ibrl.__file__)"],
        cwd=copy,
        env=_env(copy),
        capture_output=True,
        text=True,
        check=True,
    )
    if not Path(done.stdout.strip()).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"mutation_check: the scratch copy imports marti_ibrl from {done.stdout.strip()}, not {copy}")


def run_references(copy: Path, paths: tuple[str, ...]) -> tuple[str, list[str], float]:
    """Run the learning reference tests of ``paths`` in ``copy``: ``passed``, ``failed`` (a recorded value moved:
    the differences) or ``error`` (its last lines), and the seconds it took."""
    tests = [f"{TEST}[{p}]" for p in paths]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tests],
        cwd=copy,
        env=_env(copy),
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    out = done.stdout + done.stderr
    if done.returncode == 0 and re.search(r"\b\d+ skipped\b", out) and not re.search(r"\b\d+ passed\b", out):
        return "skipped", re.findall(r"^SKIPPED .*$", out, re.M) or out.strip().splitlines()[-3:], seconds
    if done.returncode == 0:
        return "passed", [], seconds
    moved = re.findall(r"^  (learn_\w+: .*)$", out, re.M)
    if FAILED_REFERENCE in out and moved:
        return "failed", moved, seconds
    return "error", out.strip().splitlines()[-15:], seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [m.name for m in MUTATIONS]
    parser.add_argument("--mutations", nargs="+", choices=names, default=names, help="which (default: all)")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the unmutated copy's run (e.g. where this tree's own run of "
        "the same references passes in the same session, as in make test)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies (printed)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if m.name in args.mutations]
    scratch = Path(tempfile.mkdtemp(prefix="mutation-check-"))
    print(f"mutation_check: scratch copies of {ROOT} in {scratch}, run with {sys.executable}", flush=True)
    baseline_failed, verdicts = False, {}
    try:
        if not args.no_baseline:
            copy = scratch_copy(scratch / "baseline")
            check_imports_from(copy)
            paths = tuple(dict.fromkeys(p for m in chosen for p in m.references))
            status, lines, seconds = run_references(copy, paths)
            refs = ", ".join(f"learn_{p}" for p in paths)
            print(f"{'baseline':<8} unmutated: {refs} {status} ({seconds:.0f} s)", flush=True)
            print("\n".join(f"    {line}" for line in lines), flush=True)
            baseline_failed = status != "passed"
        for m in chosen:
            copy = scratch_copy(scratch / m.name)
            check_imports_from(copy)
            line = mutate(copy, m)
            status, lines, seconds = run_references(copy, m.references)
            verdicts[m.name] = {
                "failed": "killed",
                "passed": "SURVIVED",
                "error": "ERROR (no verdict)",
                "skipped": "no verdict (no reference of this machine)",
            }[status]
            refs = ", ".join(f"learn_{p}" for p in m.references)
            print(f"{m.name:<8} {m.what} ({m.file}:{line}): {refs} {status}: {verdicts[m.name]} ({seconds:.0f} s)")
            print("\n".join(f"    {line}" for line in lines[:6]), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    killed = sum(v == "killed" for v in verdicts.values())
    if verdicts and all(v.startswith("no verdict") for v in verdicts.values()):
        print(f"mutation_check: no learning reference of this machine ({NO_REFERENCE}): no verdict", flush=True)
        return 3
    summary = f"{killed} of {len(chosen)} mutations killed by a learning reference"
    if not args.no_baseline:
        summary += f"; the unmutated copy {'FAILED' if baseline_failed else 'passed'}"
    print(f"mutation_check: {summary}", flush=True)
    return 0 if killed == len(chosen) and not baseline_failed else 1


if __name__ == "__main__":
    sys.exit(main())
