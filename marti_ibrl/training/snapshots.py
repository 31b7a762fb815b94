"""Each trained role's opponent pool (Eq. 6) and the snapshots around it (Alg. 1 line 13): written while the next
rollout runs, added to the pool before anyone is seated from it, loaded into pool engines before generation, and
collected when a commit no longer names them (:mod:`marti_ibrl.commit`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import ray

from marti_ibrl.algorithm.pool import OpponentPool, Snapshot
from marti_ibrl.cluster.placement import uses_pool
from marti_ibrl.config import Config
from marti_ibrl.training.records import stream


class SnapshotBook:
    """The pools (``pools``: role -> :class:`~marti_ibrl.algorithm.pool.OpponentPool`, empty when pools are off),
    the exports in flight (``pending``), the snapshot each role's pool engines hold (``loaded``: role -> version) and
    the files the last commit names (``committed_files``: never collected before the next commit)."""

    def __init__(self, cfg: Config, run_dir: Path, trained: Sequence[str], stacks: dict):
        self.seed, self.every, self.dtype = cfg.train.seed, cfg.pool.snapshot_every, cfg.pool.dtype
        self.stacks = stacks
        self.pools: dict[str, OpponentPool] = {}
        if uses_pool(cfg):
            self.pools = {
                r: OpponentPool(run_dir / "pool", r, cfg.pool.size, cfg.pool.eviction, adapters=stacks[r].lora)
                for r in trained
            }
        self.loaded: dict[str, int] = {}
        self.pending: list[tuple[str, int, int, list]] = []  # (role, version, iteration, export refs)
        self.committed_files: dict[str, set[str]] = {r: set() for r in self.pools}

    def start(self, k: int, updated: Sequence[str], updates: dict[str, int]) -> None:
        """Start writing a snapshot of every updated role whose update count hits ``pool.snapshot_every``."""
        for r in updated:
            if r in self.pools and updates[r] % self.every == 0:
                version = updates[r]
                path = self.pools[r].path_for(version)
                path.parent.mkdir(parents=True, exist_ok=True)
                stack = self.stacks[r]
                export = stack.export_adapter_async if stack.lora else stack.export_weights_async
                self.pending.append((r, version, k, export(str(path), self.dtype)))

    def finish(self) -> None:
        """Wait for started snapshots and add them to their pools (manifest on disk; evicted files collected)."""
        for r, version, k, refs in self.pending:
            info = next(x for x in ray.get(refs) if x is not None)
            pool = self.pools[r]
            snap = Snapshot(r, version, k, pool.path_for(version).name, **info)
            pool.add(snap, stream(self.seed, f"evict/{r}", k))
            pool.write_manifest()
            pool.gc(self.committed_files[r])
        self.pending = []

    def pick(self, role: str, rng: random.Random, older_than: int) -> Snapshot | None:
        """A snapshot of ``role`` strictly older than its current policy (update count ``older_than``), drawn from
        its pool; None when it has no pool or nothing older yet."""
        pool = self.pools.get(role)
        try:
            return pool.sample(rng, older_than=older_than) if pool is not None else None
        except LookupError:
            return None

    def load_pool_engines(self, loads: Sequence[tuple[str, Snapshot]]) -> None:
        """Each (role, snapshot) seated on pool engines: the role's pool engines load it, unless they hold it."""
        for role, snap in loads:
            if self.loaded.get(role) != snap.version:
                path = str(self.pools[role].path(snap))
                ray.get([e.load_weights_file.remote(path) for e in self.stacks[role].pool_engines])
                self.loaded[role] = snap.version

    def manifests(self) -> dict[str, list]:
        """What the commit record keeps of every pool."""
        return {r: pool.manifest() for r, pool in self.pools.items()}

    def committed(self, manifests: dict[str, list] | None = None) -> None:
        """After a commit (or, with ``manifests``, on resume: the pools as the commit recorded them): the files it
        names are kept, the others collected (snapshots written after a resumed commit are written again)."""
        for r, pool in self.pools.items():
            if manifests is not None:
                pool.load_manifest(manifests[r])
                pool.write_manifest()
            self.committed_files[r] = {m.file for m in pool.members}
            pool.gc(set())
