"""A run's commit record, ``RUN/trainer_state.json``: what exact resume needs beyond the DeepSpeed checkpoints.

The trainer writes a :class:`Commit` after every role's DeepSpeed checkpoint of iteration k is on disk (atomically:
a temporary file renamed over the old one), so the record never names a checkpoint that is not complete. On
resume (``--ckpt.load_enable``) :meth:`Commit.read` gives it back, :meth:`Commit.check` refuses a run made with
another seed, and :func:`pin_deepspeed_latest` points every role's DeepSpeed ``latest`` at the committed tag, so a
checkpoint written half-way after it (a run killed while saving) is never loaded. Everything random on the driver
is keyed by (seed, stream, iteration) (``IBRLTrainer._rng``), so with this record iteration k+1 is drawn exactly
as it would have been without the interruption. No torch, no Ray: diagnostics and reports read it too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_FILE = "trainer_state.json"


@dataclass
class Commit:
    """The state of a run after iteration ``iteration``, as ``trainer_state.json`` holds it."""

    iteration: int
    seed: int
    updates: dict[str, int] = field(default_factory=dict)
    """Each trained role's update count (its schedule position and its next pool snapshot's version)."""
    sampler: dict = field(default_factory=dict)
    """The scenario sampler's position (epoch, position)."""
    pools: dict[str, dict] = field(default_factory=dict)
    """Each role's opponent-pool manifest (:meth:`marti_ibrl.algorithm.pool.OpponentPool.manifest`)."""
    history: list[dict] = field(default_factory=list)
    """The per-iteration metrics so far."""
    rollout_log: list[dict] = field(default_factory=list)
    """Per iteration: Eq. 6 configuration, the policies in every seat, scenario order."""

    @classmethod
    def read(cls, run_dir: Path) -> Commit | None:
        """The run's last commit, or None before its first."""
        path = Path(run_dir) / STATE_FILE
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def write(self, run_dir: Path) -> None:
        """Atomically replace the run's commit record: a half-written one is never picked up."""
        tmp = Path(run_dir) / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(Path(run_dir) / STATE_FILE)

    def check(self, seed: int) -> None:
        """A run resumes with the seed it was made with (its random streams are keyed by it)."""
        if self.seed != seed:
            raise ValueError(f"resume: the run was made with --train.seed {self.seed}, not {seed}")


def pin_deepspeed_latest(run_dir: Path, actor_checkpoints: list[Path], k: int) -> None:
    """Point every role's DeepSpeed ``latest`` (in ``ROLE/ckpt/_actor``) at the committed tag ``global_step{k}``;
    a FileNotFoundError when a committed checkpoint is missing."""
    tag = f"global_step{k}"
    for ckpt in map(Path, actor_checkpoints):
        if not (ckpt / tag).is_dir():
            raise FileNotFoundError(
                f"resume: {Path(run_dir) / STATE_FILE} commits iteration {k}, but {ckpt / tag} is missing"
            )
        (ckpt / "latest").write_text(tag)
