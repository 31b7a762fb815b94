"""The runs that must play the same iterations in other layouts and schedules, made once per test session and read by
``tests/e2e/test_e2e_colocate.py`` and ``tests/e2e/test_e2e_async.py`` (one pytest-xdist unit: ``tests/conftest.py``).

One tiny two-role DoND (Ray + DeepSpeed + HF engines on CPU), 4 iterations, one seed: KL reference on, role2 at half
frequency (not due at k=1 and 3), opponent pools on with every iteration agent2's current policy facing agent1's
history, which first exists at k=4. Runs:

* ``none``: the separate layout, synchronous (the reference);
* ``role``, ``all``: ``--train.colocate``; ``role`` stops after k=3 and is resumed for k=4 (a new session);
* ``async0``, ``async1``: the separate layout with ``--train.async_rollout`` at ``--train.max_staleness`` 0 and 1.
"""

from __future__ import annotations

import json

import pytest
from rollouts import record_rollouts
from test_e2e_ibrl import tiny_flags

from marti_ibrl.cluster.phases import read_phases

RUNS = {
    "none": ["--train.colocate", "none"],
    "role": ["--train.colocate", "role"],
    "all": ["--train.colocate", "all"],
    "async0": ["--train.async_rollout", "true", "--train.max_staleness", "0"],
    "async1": ["--train.async_rollout", "true", "--train.max_staleness", "1"],
}


class SameIterations(dict):
    """The runs by name, each made at its first use: a test's time limit (pytest.ini) holds only the runs it is the
    first to read, never all five at the first test. A run that failed fails every test that reads it, with its own
    error, and is not made again."""

    def __init__(self, tmp):
        super().__init__()
        from marti_ibrl.tiny import build_tiny_dond_model

        self.tmp, self.model, self.failed = tmp, build_tiny_dond_model(tmp / "tiny"), {}

    def __missing__(self, name: str) -> dict:
        if name in self.failed:
            raise RuntimeError(f"the {name!r} run failed earlier in this session") from self.failed[name]
        try:
            self[name] = _run(self.tmp / name, self.model, RUNS[name], resumed=name == "role")
        except BaseException as e:
            self.failed[name] = e
            raise
        return self[name]


def _run(run_dir, model, extra: list[str], resumed: bool) -> dict:
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    flags = [*tiny_flags(model, run_dir, 4), "--role2.update_every", "2", *extra]
    flags += ["--role1.kl_coef", "0.01", "--role2.kl_coef", "0.01", "--pool.probs", "[0.0,0.0,1.0]"]
    # `role` stops after k=3 and resumes for k=4 (a new session: processes, engines and pools start anew)
    sessions = [[*flags, "--train.iterations", "3"], [*flags, "--ckpt.load_enable", "true"]]
    recorded = []
    for session in sessions if resumed else [flags]:
        trainer = IBRLTrainer(load_config(session))
        recorded.append(record_rollouts(trainer))  # (filled as the trainer plays)
        slots = ray.cluster_resources()["GPU"]
        try:
            trainer.fit()
            digests = {r: (s.weights_digest(), s.engine_digests()) for r, s in trainer.stacks.items()}
        finally:
            trainer.close()  # (a failed asynchronous run's rollout thread ends before Ray does)
            ray.shutdown()
    state = json.loads((run_dir / "trainer_state.json").read_text())
    played = [traj for session in recorded for traj in session]
    return {
        "history": state["history"],
        "rollout_log": state["rollout_log"],
        "digests": digests,
        "dialogues": [
            [(t.role, tuple(t.token_ids), tuple(t.logprobs)) for t in traj.turns]
            + [sorted(traj.rewards.items()), sorted(traj.policies.items())]
            for traj in played
        ],
        "phases": read_phases(run_dir),
        "slots": slots,
        "topology": json.loads((run_dir / "topology.json").read_text()),
        "dir": run_dir,
    }


@pytest.fixture(scope="session")
def same_iterations(tmp_path_factory) -> SameIterations:
    """Per run (made at its first use): its history, final actor/engine digests, every dialogue played (turns with
    token ids and log-probs, rewards, seats), its phase records, Ray's device slots and ``topology.json``."""
    return SameIterations(tmp_path_factory.mktemp("same_iterations"))
