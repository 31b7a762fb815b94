"""Opponent pools and opponent-configuration sampling (paper §4.2, Eq. 6).

Each trained role i keeps a pool P_i of up to K historical checkpoints of itself. Every iteration
samples one configuration c (Eq. 6, generalised to any number of roles):

* ``"both"`` (p_both): every role faces the *current* policies of the others;
* ``role_i`` (p_i): role i's current policy faces a historical checkpoint of every other trained role,
  one checkpoint per role sampled uniformly from its pool for the iteration.

A historical checkpoint only plays the environment: its tokens get no gradient and its trajectories
are not in its role's advantage groups (``acted_with_current_policy`` in advantages.py). A pool that is
still empty (before the role's first snapshot) lends the current policy instead.

On disk, one directory per role: ``v{version:06d}.safetensors`` (bf16 by default) and ``manifest.json``
(role, version = the role's update count at the snapshot, iteration, path, sha256, size). The
trainer commits manifests together with everything else in ``trainer_state.json``; files no committed
or current manifest references are garbage-collected, so a resumed run finds exactly its pool.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

BOTH = "both"
MANIFEST = "manifest.json"


def configurations(roles: Sequence[str]) -> list[str]:
    """The configurations of Eq. 6, in ``pool.probs`` order: ``both``, then one per role."""
    return [BOTH, *roles]


def sample_configuration(rng: random.Random, roles: Sequence[str], probs: Sequence[float]) -> str:
    """One draw of Eq. 6: ``both`` with probs[0], role i (facing history) with probs[i]."""
    return rng.choices(configurations(roles), weights=list(probs))[0]


def faces_history(configuration: str, role: str, other: str) -> bool:
    """Whether ``other``'s seat is played by a historical checkpoint when ``role`` is the learner facing history."""
    return configuration == role and other != role


def file_sha256(path: str | Path) -> str:
    """sha256 of a snapshot file, as recorded in the manifest (``sha256sum`` gives the same)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Snapshot:
    role: str
    version: int  # the role's update count when the snapshot was taken
    iteration: int
    file: str  # relative to the pool directory
    sha256: str
    bytes: int
    seconds: float  # time to gather + write the weights


class OpponentPool:
    """P_i: up to ``size`` historical checkpoints of one role, on disk with a manifest."""

    def __init__(self, root: str | Path, role: str, size: int, eviction: str = "oldest"):
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        if eviction not in ("oldest", "random"):
            raise ValueError(f"eviction must be 'oldest' or 'random', got {eviction!r}")
        self.dir = Path(root) / role
        self.role, self.size, self.eviction = role, size, eviction
        self.members: list[Snapshot] = []

    def __len__(self) -> int:
        return len(self.members)

    def path_for(self, version: int) -> Path:
        return self.dir / f"v{version:06d}.safetensors"

    def path(self, snapshot: Snapshot) -> Path:
        return self.dir / snapshot.file

    def add(self, snapshot: Snapshot, rng: random.Random) -> Snapshot | None:
        """Add a written snapshot; returns the evicted member, if any (its file is removed later by :meth:`gc`)."""
        if snapshot.role != self.role:
            raise ValueError(f"snapshot of {snapshot.role!r} added to the pool of {self.role!r}")
        self.members.append(snapshot)
        if len(self.members) <= self.size:
            return None
        i = 0 if self.eviction == "oldest" else rng.randrange(len(self.members) - 1)  # never the newest
        return self.members.pop(i)

    def sample(self, rng: random.Random) -> Snapshot:
        """π_θi^(<k): a uniformly sampled historical checkpoint."""
        if not self.members:
            raise LookupError(f"the pool of {self.role!r} is empty")
        return self.members[rng.randrange(len(self.members))]

    # -- persistence -------------------------------------------------------------------------------------------

    def manifest(self) -> dict:
        return {
            "role": self.role,
            "size": self.size,
            "eviction": self.eviction,
            "members": [asdict(m) for m in self.members],
        }

    def load_manifest(self, manifest: dict) -> None:
        if manifest["role"] != self.role:
            raise ValueError(f"manifest of {manifest['role']!r} loaded into the pool of {self.role!r}")
        self.members = [Snapshot(**m) for m in manifest["members"]]
        missing = [m.file for m in self.members if not self.path(m).is_file()]
        if missing:
            raise FileNotFoundError(f"pool {self.dir}: manifest lists missing snapshots {missing}")

    def write_manifest(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest(), indent=1))
        tmp.replace(self.dir / MANIFEST)

    def gc(self, keep: set[str]) -> list[str]:
        """Delete snapshot files that neither the current members nor ``keep`` (committed manifests) reference."""
        keep = keep | {m.file for m in self.members}
        removed = []
        for f in sorted(self.dir.glob("v*.safetensors*")):
            if f.name not in keep:
                f.unlink()
                removed.append(f.name)
        return removed
