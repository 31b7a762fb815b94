"""The environment of a test's own torch.distributed / DeepSpeed subprocess: what a user's shell would hand it.

A pytest-xdist worker has run other tests before (Ray, in-process DeepSpeed, torch.distributed) and its
``os.environ`` may carry what they set (RANK, MASTER_PORT, LOCAL_SIZE, Ray's and DeepSpeed's variables). A
subprocess that inherits them does not run what a user runs; twice in CI (not reproducible alone) a DeepSpeed
subprocess beside them did not behave as it does alone. So it gets the shell's basics, the venv's DeepSpeed op
(:func:`marti_ibrl.procenv.child_env_vars`) and one OpenMP thread, nothing else."""

from __future__ import annotations

import os

KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "USER", "TERM")


def child_env() -> dict[str, str]:
    from marti_ibrl.procenv import child_env_vars

    return {**{k: os.environ[k] for k in KEPT if k in os.environ}, **child_env_vars(), "OMP_NUM_THREADS": "1"}


# How a test's torch.distributed subprocess script ends once it has printed its result. destroy_process_group() is
# not enough: DeepSpeed keeps the gloo group alive, and its run-loop thread may still be destroying the last
# collective's work (which holds a Python tensor) while the interpreter finalizes; taking the GIL then ends that
# thread with a forced unwind through a noexcept destructor, "terminate called without an active exception" and
# SIGABRT after a correct result (3 of 12 runs with both cores busy; the gdb backtrace: ProcessGroupGloo::runLoop ->
# ~AsyncAllgatherWork -> decref_pyobject -> take_gil -> pthread_exit). pytorch/pytorch#190489 (open) is this bug.
# So the script flushes and leaves without finalizing the interpreter.
END_OF_SCRIPT = """
torch.distributed.destroy_process_group()
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
"""
