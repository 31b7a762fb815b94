"""Re-record golden trajectories (tests/golden.py) after a change that is meant to move what a seeded run learns.

    .venv/bin/python scripts/record_golden.py --why "what changed and why the new trajectories are right" [PATH ...]

Runs the e2e tests that make each PATH's run (default: every path) with the references written instead of checked,
then appends one line to tests/references/CHANGES.md: the date, the commit the runs were made at (``+dirty`` with
uncommitted changes), the paths whose references changed, and the reason as given (never generated). Nothing is
written to CHANGES.md when the runs fail or no reference changed. Commit the references with the change.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from golden import LEARNING, PATHS, RECORD_ENV, REFERENCES, machine  # noqa: E402

TESTS = {  # the test that checks each path; pytest runs the module fixture (or session fixture) that makes its run
    "hf": "tests/e2e/test_e2e_ibrl.py::test_golden_trajectory",
    "separate": "tests/e2e/test_e2e_colocate.py::test_golden_trajectory",
    "colocate_all": "tests/e2e/test_e2e_colocate.py::test_golden_trajectory",
    "async1": "tests/e2e/test_e2e_async.py::test_golden_trajectory",
    "lora": "tests/e2e/test_e2e_lora.py::test_golden_trajectory",
    "vllm_zero3": "tests/e2e/test_e2e_tiny_cluster.py::test_golden_trajectory",
    # the learning references: one test per path, its run made in the test (tests/learning_runs.py)
    **{p: f"tests/e2e/test_e2e_learning.py::test_learning_reference[{p.removeprefix('learn_')}]" for p in LEARNING},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--why", required=True, help="why the trajectories change (goes into CHANGES.md as written)")
    parser.add_argument("paths", nargs="*", metavar="PATH", help=f"of {', '.join(PATHS)} (default: all)")
    args = parser.parse_args(argv)
    if not args.why.strip():
        parser.error("--why: say why the trajectories change")
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown:
        parser.error(f"no golden path {', '.join(unknown)} (paths: {', '.join(PATHS)})")
    paths = args.paths or list(PATHS)
    here = machine()  # a reference is for one machine (tests/golden.py "Machines"): PATH.json or PATH@<machine>.json

    def files() -> dict[str, bytes]:
        return {
            f.name: f.read_bytes()
            for p in paths
            for f in (REFERENCES / f"{p}.json", REFERENCES / f"{p}@{here}.json")
            if f.exists()
        }

    before = files()
    tests = sorted({TESTS[p] for p in paths})
    env = {**os.environ, RECORD_ENV: ",".join(paths)}
    print(f"record_golden: running {len(tests)} test(s) for {', '.join(paths)} (minutes: each makes its training run)")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=ROOT, env=env)
    if done.returncode:
        print(
            "record_golden: the runs failed; CHANGES.md not written (references may be partly written)", file=sys.stderr
        )
        return done.returncode
    after = files()
    changed = [p for p in paths if any(after.get(n) != before.get(n) for n in (f"{p}.json", f"{p}@{here}.json"))]
    if not changed:
        print("record_golden: every reference is as recorded; nothing to write")
        return 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    at = commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    line = (
        f"- {datetime.date.today().isoformat()} at {at} on machine {here}: {', '.join(changed)}: {args.why.strip()}\n"
    )
    with open(REFERENCES / "CHANGES.md", "a") as f:
        f.write(line)
    print(f"record_golden: re-recorded {', '.join(changed)}; tests/references/CHANGES.md: {line.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
