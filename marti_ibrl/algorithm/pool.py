"""Opponent pools and opponent-configuration sampling (paper §4.2, Eq. 6).

Each trained role i keeps a pool P_i of up to K historical checkpoints of itself. Every iteration
samples one configuration c (Eq. 6, generalised to any number of roles), and each configuration is
played as one or two *pairings* (:func:`pairings`), each feeding the groups of its own learners:

* ``"both"`` (p_both): one pairing, every role current; every role learns from it.
* ``role_i`` (p_i): Eq. 6 gives each role its own opponent. Role i's rollouts pair current i with a
  historical checkpoint of every other trained role (one per role, sampled uniformly from its pool
  for the iteration); every other role j's rollouts pair current j with the *current* others,
  current i included. Role i's groups G_{i,q} hold only the first pairing's trajectories, every other
  role's only the second's.

How the batch is split: **both pairings play every scenario of the batch with the full G samples.**
Every role's group for (role, q) then has G members, as in a ``both`` iteration (halving G would make
the history iterations' advantages noisier, halving the scenarios would give the roles fewer samples),
and every role is trained on the same number of dialogues in every iteration. The cost: a history
iteration rolls out twice the dialogues (pool engines serve the snapshots' turns of the first pairing);
with the paper's p = 0.7 / 0.2 / 0.1 that is 30% more dialogues over a run, 15% when the user updates every
second iteration: the trainer skips a pairing none of whose learners is due (:func:`marti_ibrl.training.seating.seat_policies`,
§4.2). When no other role has a snapshot to play (empty pools), the history pairing would be current
play: then the iteration plays one all-current pairing that feeds every role, as ``both`` does.

A historical checkpoint only plays the environment: its tokens get no gradient and its trajectories
are in no group of its role (``acted_with_current_policy`` in advantages.py, and the pairing's
learners). "Historical" means older than the current policy: the newest snapshot, taken right after
the role's latest update, holds the current weights, so :meth:`OpponentPool.sample` draws among
strictly older versions (π^(<k)); a pool with nothing older lends the current policy.

On disk, one directory per role: ``v{version:06d}.safetensors`` (bf16 by default) and ``manifest.json``
(role, version = the role's update count at the snapshot, iteration, path, sha256, size). A LoRA role's pool holds
adapters instead (``adapters=True``, marti_ibrl/lora.py): ``v{version:06d}/`` in peft format, the manifest's sha256
that of its ``adapter_model.safetensors`` and its bytes the directory's. The
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


@dataclass(frozen=True)
class Pairing:
    """One pairing of an Eq. 6 configuration: whose groups its rollouts feed, and who plays from history."""

    learners: tuple[str, ...]  # roles whose current policy plays and whose groups G_{i,q} these rollouts feed
    history: tuple[str, ...]  # trained roles whose seat a pool snapshot plays (environment only)


def pairings(configuration: str, trained: Sequence[str]) -> list[Pairing]:
    """The pairings that play ``configuration`` (see the module doc), learners in ``trained`` order.

    ``both``: [every role current, feeding every role]. ``role_i``: [i current vs the others' history, feeding i;
    everyone current, feeding every role but i] (the second is absent when i is the only trained role).
    """
    trained = tuple(trained)
    if len(set(trained)) != len(trained):
        raise ValueError(f"trained roles must be distinct, got {list(trained)}")
    if configuration == BOTH:
        return [Pairing(trained, ())]
    if configuration not in trained:
        raise ValueError(f"configuration {configuration!r} is neither {BOTH!r} nor a trained role of {list(trained)}")
    others = tuple(r for r in trained if r != configuration)
    return [Pairing((configuration,), others)] + ([Pairing(others, ())] if others else [])


def file_sha256(path: str | Path) -> str:
    """sha256 of a snapshot file, as recorded in the manifest (``sha256sum`` gives the same)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def snapshot_info(path: str | Path) -> dict:
    """{sha256, bytes} of a snapshot on disk, as its manifest entry records them: a safetensors file's, or a LoRA
    adapter directory's (:func:`marti_ibrl.lora.adapter_info`)."""
    if Path(path).is_dir():
        from marti_ibrl.lora import adapter_info

        return adapter_info(path)
    return {"sha256": file_sha256(path), "bytes": Path(path).stat().st_size}


def verify_snapshots(pool_dir: str | Path, manifest: dict, workers: int = 4) -> None:
    """Every member of a committed ``manifest`` (a role's entry of the commit record's ``pools``) is in ``pool_dir``
    exactly as written: present, of its recorded size, of its recorded sha256 (hashed ``workers`` files at a time).
    A ValueError naming the first snapshot that is not: resuming with it would play (or crash on) other weights."""
    from concurrent.futures import ThreadPoolExecutor

    members = [Snapshot(**m) for m in manifest["members"]]
    paths = [Path(pool_dir) / m.file for m in members]
    for m, path in zip(members, paths, strict=True):
        if not path.exists():
            raise ValueError(f"pool snapshot {path} (v{m.version}) is missing")
        size = snapshot_info(path)["bytes"] if path.is_dir() else path.stat().st_size
        if size != m.bytes:  # cheap: a truncated file fails here, before any hashing
            raise ValueError(f"pool snapshot {path} (v{m.version}) is {size} bytes, its manifest says {m.bytes}")
    with ThreadPoolExecutor(max(1, min(workers, len(paths)))) as ex:
        digests = list(ex.map(lambda p: snapshot_info(p)["sha256"], paths))
    for m, path, digest in zip(members, paths, digests, strict=True):
        if digest != m.sha256:
            raise ValueError(
                f"pool snapshot {path} (v{m.version}) has sha256 {digest[:12]}…, its manifest says {m.sha256[:12]}…"
            )


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

    def __init__(self, root: str | Path, role: str, size: int, eviction: str = "oldest", adapters: bool = False):
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        if eviction not in ("oldest", "random"):
            raise ValueError(f"eviction must be 'oldest' or 'random', got {eviction!r}")
        self.dir = Path(root) / role
        self.role, self.size, self.eviction = role, size, eviction
        self.adapters = adapters  # members are peft adapter directories (LoRA roles), not safetensors files
        self.members: list[Snapshot] = []

    def __len__(self) -> int:
        return len(self.members)

    def path_for(self, version: int) -> Path:
        return self.dir / (f"v{version:06d}" if self.adapters else f"v{version:06d}.safetensors")

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

    def sample(self, rng: random.Random, older_than: int | None = None) -> Snapshot:
        """π_θi^(<k): a checkpoint sampled uniformly from the members, or from those with a version below
        ``older_than`` (the role's current update count: the snapshot of that version holds the current weights)."""
        members = self.members if older_than is None else [m for m in self.members if m.version < older_than]
        if not members:
            older = "" if older_than is None else f" of a version below {older_than}"
            raise LookupError(f"the pool of {self.role!r} has no snapshot{older} (it holds {len(self.members)})")
        return members[rng.randrange(len(members))]

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
        missing = [m.file for m in self.members if not self.path(m).exists()]
        if missing:
            raise FileNotFoundError(f"pool {self.dir}: manifest lists missing snapshots {missing}")

    def write_manifest(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest(), indent=1))
        tmp.replace(self.dir / MANIFEST)

    def gc(self, keep: set[str]) -> list[str]:
        """Delete snapshots (files, or adapter directories) that neither the current members nor ``keep`` (committed
        manifests) reference, half-written ones (``.tmp``) included."""
        import shutil

        keep = keep | {m.file for m in self.members}
        removed = []
        for f in sorted(self.dir.glob("v[0-9]*")):
            if f.name not in keep:
                shutil.rmtree(f) if f.is_dir() else f.unlink()
                removed.append(f.name)
        return removed
