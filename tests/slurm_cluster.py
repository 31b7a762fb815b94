"""A two-node Slurm on this machine (``recipes/local-slurm.sh``) for the tests that ``sbatch`` a recipe.

One cluster serves the whole session (``conftest.local_slurm``): n1 at 127.0.0.2, n2 at 127.0.0.3, 8 fake GPUs
each. Where it cannot run (not root, Debian's packages missing: ``make test`` installs them as root) the fixture
gives ``None`` and :data:`SLURM_REASON` says why; the tests then train with a local Ray instead
(``IBRL_TESTS_NO_SLURM=1`` picks that path on a machine with Slurm).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCAL_SLURM = ROOT / "recipes" / "local-slurm.sh"
TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel")
N2_ADDRESS = "127.0.0.3"  # recipes/local-slurm.sh: n1 at 127.0.0.2, n2 at 127.0.0.3
WAIT = 900  # seconds, at most, for any one step of a Slurm run
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def slurm_unavailable() -> str | None:
    if os.environ.get("IBRL_TESTS_NO_SLURM"):
        return "IBRL_TESTS_NO_SLURM is set"
    if os.geteuid() != 0:
        return "the local Slurm needs root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing {' '.join(missing)} (make slurm installs Debian's slurmctld slurmd slurm-client munge)"
    return None


SLURM_REASON = slurm_unavailable()
needs_slurm = pytest.mark.skipif(SLURM_REASON is not None, reason=f"no local Slurm: {SLURM_REASON}")


def until(what: str, check, timeout: float = WAIT, every: float = 2.0):
    """``check()``'s first truthy value, polled every ``every`` seconds; TimeoutError naming ``what``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"waited {timeout:.0f}s for {what}")


def committed(run_dir: Path) -> int:
    """The last iteration a run directory holds as committed (``trainer_state.json``), 0 before the first."""
    try:
        return json.loads((run_dir / "trainer_state.json").read_text())["iteration"]
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def _free_ports(n: int, consecutive: int = 1, exclude: Iterable[int] = ()) -> list[int]:
    """n free ports (each the start of ``consecutive`` free ones, none overlapping) for listeners that start minutes
    later: Slurm's daemons and every job's Ray head, dashboard and agents. Drawn where only explicit choices land,
    between Ray's worker ports and the kernel's ephemeral range (:func:`marti_ibrl.procenv.listen_port`): a ``bind(0)``
    port is an ephemeral one, which the other test worker's Ray processes (gRPC, outgoing connections) can take in
    the meantime (seen: the dashboard agent's port "already in use" on the head, so no job could be submitted)."""
    from marti_ibrl.procenv import listen_port

    found: list[int] = []
    taken: set[int] = set(exclude)  # chosen already, not yet listening
    while len(found) < n:
        base = listen_port("")
        ports = range(base, base + consecutive)
        if base + consecutive <= 65000 and not taken.intersection(ports) and all(_free(p) for p in ports):
            found.append(base)
            taken.update(ports)
    return found


def _free(port: int) -> bool:
    """Free on every address (the local Slurm's nodes listen on 127.0.0.2 and 127.0.0.3)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


class LocalSlurm:
    """The cluster, started in ``scratch`` (its state, logs and every job's output file)."""

    def __init__(self, scratch: Path):
        ports = _free_ports(6)
        self.env = {
            **os.environ,
            "IBRL_SLURM_DIR": str(scratch / "slurm"),
            "IBRL_SLURM_PORT": str(_free_ports(1, 3, exclude=ports)[0]),
        }
        # at nice -10 (root only, as is Slurm here), which every job inherits: with ``pytest -n`` the other worker's
        # tests share the two cores (tests/conftest.py), and a starved job start-up waits longer for its Ray head
        # (the head's own deadlines: recipes/slurm-ray.sh). Ray starts its workers 15 nicer than their raylet: the
        # jobs' actors (+5) yield to the other worker's tests
        up = subprocess.run(
            ["nice", "-n", "-10", "bash", str(LOCAL_SLURM), "up"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert up.returncode == 0, up.stdout + up.stderr
        self.env["SLURM_CONF"] = str(scratch / "slurm" / "slurm.conf")
        self.env.update(  # recipes/slurm-ray.sh's Ray ports: free ones, not Ray's defaults
            RAY_WAIT_TIMEOUT="180",
            **dict(zip(("RAY_PORT", "RAY_DASHBOARD_PORT", "RAY_CLIENT_PORT", "RAY_AGENT_PORT"), map(str, ports))),
            RAY_WORKER_AGENT_PORT=str(ports[4]),
            RAY_RUNTIME_ENV_AGENT_PORT=str(ports[5]),
        )
        self.scratch, self.logs = scratch, {}

    def submit(self, name: str, recipe: Path, *args: str, sbatch: tuple[str, ...] = (), **env: str) -> str:
        """``sbatch [sbatch options] recipe args...`` with ``env`` added; the job's output goes to
        ``scratch/NAME-JOBID.out``."""
        out = self.scratch / f"{name}-%j.out"
        cmd = ["sbatch", "--parsable", f"--output={out}", *sbatch, str(recipe), *args]
        done = subprocess.run(cmd, env={**self.env, **env}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        job = done.stdout.strip().split(";")[0]
        self.logs[name] = Path(str(out).replace("%j", job))
        return job

    def log(self, name: str) -> str:
        return self.logs[name].read_text() if self.logs[name].exists() else ""

    def job(self, job: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ...)."""
        out = subprocess.run(["scontrol", "show", "job", job], env=self.env, capture_output=True, text=True).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def until_job(self, job: str, what: str, check, every: float = 2.0):
        """``until`` for a step of a running job: gives up at once, with the job's log, if the job ends first."""

        asked = [0.0]  # when scontrol was last asked (every 2 s at most, however often ``check`` runs)

        def poll():
            got = check()
            if got or time.monotonic() - asked[0] < 2.0:
                return got
            asked[0] = time.monotonic()
            if (state := self.job(job).get("JobState")) in ENDED:
                log = next((p.read_text() for p in self.logs.values() if p.name.endswith(f"-{job}.out")), "")
                raise AssertionError(f"job {job} ended {state} before {what}; its log ends:\n{log[-3000:]}")
            return got

        return until(what, poll, every=every)

    def final_state(self, job: str, timeout: float = WAIT) -> str:
        return until(f"job {job} to end", lambda: (s := self.job(job).get("JobState")) in ENDED and s, timeout)

    def run(self, *cmd: str) -> None:
        subprocess.run(cmd, env=self.env, check=True)

    def down(self) -> None:
        subprocess.run(["bash", str(LOCAL_SLURM), "down"], env=self.env, capture_output=True, text=True, timeout=60)
