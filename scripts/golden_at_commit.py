"""Play a golden path's seeded run (tests/golden.py) with another checkout's code and say how it differs.

    .venv/bin/python scripts/golden_at_commit.py CHECKOUT [--path separate] [--out FILE] [--against FILE]

For finding the commit that moved what a run learns (a bisect over checkouts made with ``git worktree add``):
the run is the one this tree's e2e tests make for the path (``hf``: tests/e2e/test_e2e_ibrl.py; ``separate``:
tests/same_iterations.py's ``none``), with CHECKOUT's ``marti_ibrl`` and toy reward and this tree's virtual
environment; its trajectory is compared with ``--against FILE`` (one saved by ``--out``) or, by default, with this
tree's reference. Prints one line per difference (path, iteration, value) and exits 1 when there is any. Only the
paths that need neither vLLM nor Slurm (a checkout of any age runs them): ``hf``, ``separate``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]  # helpers; the e2e modules
from golden import REFERENCES, differences, trajectory  # noqa: E402

CHILD = """
import json, sys
import ray
from marti_ibrl.config import load_config
from marti_ibrl.tiny import build_tiny_dond_model
from marti_ibrl.trainer import IBRLTrainer
spec = json.loads(sys.argv[1])
model = str(build_tiny_dond_model(spec["tmp"] + "/tiny"))
trainer = IBRLTrainer(load_config([model if f == "{model}" else f for f in spec["flags"]]))
history = trainer.fit()
digests = {r: s.weights_digest() for r, s in trainer.stacks.items()}
ray.shutdown()
print("GOLDEN " + json.dumps({"history": history, "roles": list(trainer.roles), "digests": digests}))
"""


def flags(path: str, run_dir: str) -> list[str]:
    """The path's flags as this tree's tests give them (the model as ``{model}``: the child builds it)."""
    from test_e2e_ibrl import tiny_flags

    if path == "hf":  # tests/e2e/test_e2e_ibrl.py's run
        return [*tiny_flags("{model}", run_dir, 3), "--role2.update_every", "2", "--role1.colocate_ref", "true"]
    from same_iterations import RUNS  # tests/same_iterations.py's "none" run

    extra = ["--role1.kl_coef", "0.01", "--role2.kl_coef", "0.01", "--pool.probs", "[0.0,0.0,1.0]"]
    return [*tiny_flags("{model}", run_dir, 4), "--role2.update_every", "2", *RUNS["none"], *extra]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a checkout of the project (e.g. git worktree add DIR COMMIT)")
    parser.add_argument("--path", choices=("hf", "separate"), default="separate")
    parser.add_argument("--out", type=Path, help="save the run's trajectory here (JSON)")
    parser.add_argument("--against", type=Path, help="compare with this saved trajectory (default: the reference)")
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    if not (checkout / "marti_ibrl").is_dir():
        parser.error(f"{checkout}: not a checkout of marti-ibrl (no marti_ibrl/)")
    against = args.against or REFERENCES / f"{args.path}.json"
    if not against.is_file() and (args.against or not args.out):
        parser.error(f"{against}: no such trajectory")
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        spec = {"tmp": tmp, "flags": flags(args.path, f"{tmp}/run")}
        env_path = f"{checkout}:{checkout / 'tests'}:{checkout / 'tests' / 'e2e'}"  # a flat tests/ (older) or by room
        done = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(spec)],
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": env_path},
            capture_output=True,
            text=True,
        )
    line = next((x for x in done.stdout.splitlines() if x.startswith("GOLDEN ")), None)
    if done.returncode or line is None:
        sys.stderr.write(done.stderr[-3000:])
        print(f"golden_at_commit: the run at {checkout} failed (exit {done.returncode})", file=sys.stderr)
        return 2
    run = json.loads(line.removeprefix("GOLDEN "))
    got = json.loads(json.dumps(trajectory(run["history"], run["roles"], run["digests"])))
    if args.out:
        args.out.write_text(json.dumps(got, indent=1) + "\n")
    if not against.is_file():  # --out alone, before this tree has a reference
        print(f"{args.path}: saved to {args.out}")
        return 0
    diff = differences(args.path, json.loads(against.read_text()), got)
    print("\n".join(diff) if diff else f"{args.path}: the same trajectory as {against}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
