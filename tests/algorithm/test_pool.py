"""Opponent pools (Eq. 6): configuration sampling frequencies, FIFO/random eviction, uniform sampling, manifests, gc."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from scipy.stats import chisquare  # scipy is a dependency (statsmodels'): no fallback that could pass vacuously

from marti_ibrl.algorithm.pool import (
    BOTH,
    MANIFEST,
    OpponentPool,
    Pairing,
    Snapshot,
    configurations,
    file_sha256,
    pairings,
    sample_configuration,
    verify_snapshots,
)

CRIT_999_2DOF = 13.816  # chi-square 99.9% quantile, 2 degrees of freedom
ROLES = ("agent1", "agent2")


def _chi2(observed: list[int], probs: list[float]) -> tuple[float, float]:
    """(statistic, p-value) of a goodness-of-fit test of ``observed`` counts against ``probs``."""
    n = sum(observed)
    res = chisquare(observed, [n * p for p in probs])
    return float(res.statistic), float(res.pvalue)


def _draw_counts(roles: tuple[str, ...], probs: list[float], n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    counts = Counter(sample_configuration(rng, roles, probs) for _ in range(n))
    assert set(counts) <= set(configurations(roles))
    return [counts[c] for c in configurations(roles)]


def _snap(version: int, role: str = "agent1") -> Snapshot:
    return Snapshot(
        role=role,
        version=version,
        iteration=10 * version,
        file=f"v{version:06d}.safetensors",
        sha256=f"{version:064x}",
        bytes=100 + version,
        seconds=0.5 * version,
    )


# -- configurations / sample_configuration ---------------------------------------------------------------------------


def test_configurations_order_matches_pool_probs() -> None:
    assert configurations(ROLES) == [BOTH, "agent1", "agent2"]
    assert configurations(("a", "b", "c")) == ["both", "a", "b", "c"]


def test_pairings_give_each_role_its_own_opponent_as_eq6_writes() -> None:
    """Eq. 6, p_agent1: (π_opp¹, π_opp²) = (π_θ2^(<k), π_θ1^(k)): agent1 (current) faces a historical agent2 and
    learns from that pairing; agent2 (current) faces the *current* agent1 and learns from that one."""
    assert pairings(BOTH, ROLES) == [Pairing(("agent1", "agent2"), ())]
    assert pairings("agent1", ROLES) == [Pairing(("agent1",), ("agent2",)), Pairing(("agent2",), ())]
    assert pairings("agent2", ROLES) == [Pairing(("agent2",), ("agent1",)), Pairing(("agent1",), ())]
    # N roles: the configuration's role faces every other's history; every other role plays all-current
    assert pairings("b", ("a", "b", "c")) == [Pairing(("b",), ("a", "c")), Pairing(("a", "c"), ())]
    assert pairings("a", ("a",)) == [Pairing(("a",), ())]  # nobody else to learn from the current pairing
    for c in configurations(ROLES):  # every trained role learns from exactly one pairing
        learners = [r for p in pairings(c, ROLES) for r in p.learners]
        assert sorted(learners) == sorted(ROLES)
        assert all(not set(p.learners) & set(p.history) for p in pairings(c, ROLES))


def test_pairings_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="'agent3' is neither 'both' nor a trained role"):
        pairings("agent3", ROLES)
    with pytest.raises(ValueError, match="must be distinct"):
        pairings(BOTH, ("agent1", "agent1"))


def test_sample_configuration_matches_eq6_probabilities() -> None:
    probs = [0.7, 0.2, 0.1]
    observed = _draw_counts(ROLES, probs, 10_000, seed=1234)
    stat, p = _chi2(observed, probs)
    assert p > 1e-3 and stat < CRIT_999_2DOF, (observed, stat, p)
    # the same draws against a wrong expectation are rejected: the test can fail
    stat_bad, p_bad = _chi2(observed, [0.5, 0.3, 0.2])
    assert p_bad < 1e-6 and stat_bad > 100 * CRIT_999_2DOF, (observed, stat_bad, p_bad)


def test_sample_configuration_three_roles_four_probs() -> None:
    roles = ("a", "b", "c")
    probs = [0.4, 0.3, 0.2, 0.1]
    observed = _draw_counts(roles, probs, 10_000, seed=7)
    _, p = _chi2(observed, probs)
    assert p > 1e-3, observed
    _, p_bad = _chi2(observed, [0.25, 0.25, 0.25, 0.25])
    assert p_bad < 1e-6, observed


def test_zero_probability_configurations_are_never_drawn() -> None:
    assert _draw_counts(ROLES, [1.0, 0.0, 0.0], 2000, seed=0) == [2000, 0, 0]
    counts = _draw_counts(ROLES, [0.0, 0.5, 0.5], 2000, seed=0)
    assert counts[0] == 0 and counts[1] > 0 and counts[2] > 0


def test_sample_configuration_is_seed_deterministic() -> None:
    def seq(seed: int) -> list[str]:
        rng = random.Random(seed)
        return [sample_configuration(rng, ROLES, [0.7, 0.2, 0.1]) for _ in range(200)]

    assert seq(3) == seq(3)
    assert seq(3) != seq(4)
    assert set(seq(3)) == {BOTH, "agent1", "agent2"}


# -- OpponentPool ----------------------------------------------------------------------------------------------------


def test_pool_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="size must be >= 1"):
        OpponentPool(tmp_path, "agent1", 0)
    with pytest.raises(ValueError, match="eviction must be"):
        OpponentPool(tmp_path, "agent1", 2, eviction="lifo")
    pool = OpponentPool(tmp_path, "agent1", 2)
    assert pool.dir == tmp_path / "agent1"
    assert pool.path_for(7) == tmp_path / "agent1" / "v000007.safetensors"
    assert pool.path(_snap(7)) == pool.path_for(7)


def test_oldest_eviction_is_fifo(tmp_path: Path) -> None:
    pool = OpponentPool(tmp_path, "agent1", size=2)
    rng = random.Random(0)
    assert pool.add(_snap(1), rng) is None
    assert pool.add(_snap(2), rng) is None
    assert len(pool) == 2
    assert pool.add(_snap(3), rng) == _snap(1)
    assert [m.version for m in pool.members] == [2, 3]
    assert pool.add(_snap(4), rng) == _snap(2)
    assert [m.version for m in pool.members] == [3, 4]


def test_add_refuses_another_roles_snapshot(tmp_path: Path) -> None:
    pool = OpponentPool(tmp_path, "agent1", size=2)
    with pytest.raises(ValueError, match="'agent2' added to the pool of 'agent1'"):
        pool.add(_snap(1, role="agent2"), random.Random(0))
    assert len(pool) == 0


def _random_evictions(seed: int, n: int = 40, size: int = 3) -> tuple[list[int], OpponentPool]:
    pool = OpponentPool("unused", "agent1", size=size, eviction="random")
    rng = random.Random(seed)
    evicted = []
    for v in range(1, n + 1):
        out = pool.add(_snap(v), rng)
        assert pool.members[-1].version == v  # the newest snapshot always stays
        assert len(pool) == min(v, size)
        if v <= size:
            assert out is None
        else:
            assert out is not None and out.version != v
            assert out.version not in {m.version for m in pool.members}
            evicted.append(out.version)
    return evicted, pool


def test_random_eviction_never_evicts_the_newest_and_is_seeded() -> None:
    evicted, pool = _random_evictions(seed=5)
    again, pool2 = _random_evictions(seed=5)
    assert evicted == again and pool.members == pool2.members
    other, _ = _random_evictions(seed=6)
    assert other != evicted
    # not FIFO: some evictions leave an older member in the pool (FIFO would evict 1, 2, 3, ... in order)
    assert evicted != list(range(1, len(evicted) + 1))
    assert sorted(evicted + [m.version for m in pool.members]) == list(range(1, 41))


def test_sample_is_uniform_over_members(tmp_path: Path) -> None:
    pool = OpponentPool(tmp_path, "agent1", size=3)
    rng = random.Random(0)
    for v in (4, 5, 6):
        pool.add(_snap(v), rng)
    srng = random.Random(11)
    counts = Counter(pool.sample(srng).version for _ in range(3000))
    assert set(counts) == {4, 5, 6}
    for v in (4, 5, 6):  # binomial sd ~ 26: +-150 is ~6 sd
        assert abs(counts[v] - 1000) < 150, counts
    _, p = _chi2([counts[v] for v in (4, 5, 6)], [1 / 3] * 3)
    assert p > 1e-3, counts


def test_sample_of_an_empty_pool_raises(tmp_path: Path) -> None:
    pool = OpponentPool(tmp_path, "agent2", size=3)
    with pytest.raises(LookupError, match="the pool of 'agent2' has no snapshot \\(it holds 0\\)"):
        pool.sample(random.Random(0))


def test_sample_older_than_leaves_out_the_current_policys_snapshot(tmp_path: Path) -> None:
    """A snapshot of version v is the role's weights after its v-th update: with 6 updates done, v6 is the current
    policy, so history (π^(<k)) is v4 and v5, uniformly; with nothing older the pool has no history to offer."""
    pool = OpponentPool(tmp_path, "agent1", size=3)
    for v in (4, 5, 6):
        pool.add(_snap(v), random.Random(0))
    rng = random.Random(3)
    counts = Counter(pool.sample(rng, older_than=6).version for _ in range(2000))
    assert set(counts) == {4, 5} and abs(counts[4] - 1000) < 120, counts
    assert {pool.sample(rng, older_than=7).version for _ in range(200)} == {4, 5, 6}
    with pytest.raises(LookupError, match="no snapshot of a version below 4 \\(it holds 3\\)"):
        pool.sample(rng, older_than=4)


def _touch(pool: OpponentPool, *versions: int) -> None:
    pool.dir.mkdir(parents=True, exist_ok=True)
    for v in versions:
        pool.path_for(v).write_bytes(b"x" * v)


def test_manifest_round_trip(tmp_path: Path) -> None:
    pool = OpponentPool(tmp_path, "agent1", size=3, eviction="random")
    rng = random.Random(0)
    for v in (1, 2, 3):
        pool.add(_snap(v), rng)
    _touch(pool, 1, 2, 3)
    pool.write_manifest()
    path = tmp_path / "agent1" / MANIFEST
    assert path.is_file() and not (tmp_path / "agent1" / (MANIFEST + ".tmp")).exists()
    on_disk = json.loads(path.read_text())
    assert on_disk == pool.manifest()
    assert on_disk["role"] == "agent1" and on_disk["size"] == 3 and on_disk["eviction"] == "random"
    assert [m["version"] for m in on_disk["members"]] == [1, 2, 3]

    fresh = OpponentPool(tmp_path, "agent1", size=3, eviction="random")
    fresh.load_manifest(on_disk)
    assert fresh.members == pool.members
    assert fresh.manifest() == pool.manifest()
    # sampling from the reloaded pool replays the original pool's draws
    assert [fresh.sample(random.Random(9)) for _ in range(3)] == [pool.sample(random.Random(9)) for _ in range(3)]


def test_load_manifest_with_a_missing_file_raises(tmp_path: Path) -> None:
    pool = OpponentPool(tmp_path, "agent1", size=3)
    rng = random.Random(0)
    for v in (1, 2):
        pool.add(_snap(v), rng)
    _touch(pool, 1)  # v2's file is missing
    manifest = json.loads(json.dumps(pool.manifest()))
    fresh = OpponentPool(tmp_path, "agent1", size=3)
    with pytest.raises(FileNotFoundError, match="v000002.safetensors"):
        fresh.load_manifest(manifest)


def test_load_manifest_of_another_role_raises(tmp_path: Path) -> None:
    pool = OpponentPool(tmp_path, "agent1", size=3)
    with pytest.raises(ValueError, match="'agent1' loaded into the pool of 'agent2'"):
        OpponentPool(tmp_path, "agent2", size=3).load_manifest(pool.manifest())


def test_gc_removes_only_unreferenced_snapshots(tmp_path: Path) -> None:
    pool = OpponentPool(tmp_path, "agent1", size=2)
    rng = random.Random(0)
    for v in (1, 2, 3, 4, 5):
        pool.add(_snap(v), rng)
    assert [m.version for m in pool.members] == [4, 5]
    _touch(pool, 1, 2, 3, 4, 5)
    (pool.dir / "v000006.safetensors.tmp").write_bytes(b"partial")  # an interrupted write
    pool.write_manifest()
    (pool.dir / "notes.txt").write_text("not a snapshot")
    removed = pool.gc(keep={"v000002.safetensors"})  # v2: referenced by a committed manifest
    assert removed == ["v000001.safetensors", "v000003.safetensors", "v000006.safetensors.tmp"]
    assert sorted(p.name for p in pool.dir.iterdir()) == [
        MANIFEST,
        "notes.txt",
        "v000002.safetensors",
        "v000004.safetensors",
        "v000005.safetensors",
    ]
    assert pool.gc(keep={"v000002.safetensors"}) == []  # idempotent
    assert pool.gc(keep=set()) == ["v000002.safetensors"]
    assert all(pool.path(m).is_file() for m in pool.members)


def _written_pool(tmp_path: Path) -> tuple[Path, dict]:
    """Three snapshot files of equal size with their true size and sha256 in a manifest, as the trainer commits it."""
    pool = OpponentPool(tmp_path, "agent2", size=4)
    for v in (1, 2, 3):
        path = pool.path_for(v)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([v]) * 4096)
        pool.add(Snapshot("agent2", v, v, path.name, file_sha256(path), 4096, 0.1), random.Random(0))
    return pool.dir, json.loads(json.dumps(pool.manifest()))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_flip_a_byte, r"v000002\.safetensors \(v2\) has sha256 [0-9a-f]{12}…, its manifest says [0-9a-f]{12}…$"),
        (  # another snapshot's bytes (same size)
            lambda p: p.write_bytes((p.parent / "v000001.safetensors").read_bytes()),
            r"v000002\.safetensors \(v2\) has sha256 ",
        ),
        (
            lambda p: p.write_bytes(p.read_bytes()[:1000]),
            r"v000002\.safetensors \(v2\) is 1000 bytes, its manifest says 4096$",
        ),
        (lambda p: p.unlink(), r"v000002\.safetensors \(v2\) is missing$"),
    ],
    ids=["sha256", "another_snapshots_bytes", "truncated", "missing"],
)
def test_verify_snapshots_names_the_snapshot_that_differs_from_its_manifest(tmp_path: Path, damage, message) -> None:
    """Resume checks every committed snapshot (size, then sha256) before it plays one: a changed, swapped, truncated
    or missing file is named, not loaded (it would play other weights, or crash iterations later)."""
    pool_dir, manifest = _written_pool(tmp_path)
    verify_snapshots(pool_dir, manifest)  # as written: accepted
    damage(pool_dir / "v000002.safetensors")
    with pytest.raises(ValueError, match=message) as err:
        verify_snapshots(pool_dir, manifest)
    assert str(pool_dir / "v000002.safetensors") in str(err.value)
    (pool_dir / "v000003.safetensors").unlink()  # a snapshot no manifest lists any more is none of its business
    verify_snapshots(pool_dir, {**manifest, "members": manifest["members"][:1]})


def test_verify_snapshots_checks_lora_adapter_directories(tmp_path: Path) -> None:
    """A LoRA role's members are adapter directories: the sha256 of their weights, the bytes of the directory."""
    from marti_ibrl.lora import ADAPTER_WEIGHTS, adapter_info

    pool = OpponentPool(tmp_path, "agent1", size=2, adapters=True)
    d = pool.path_for(1)
    d.mkdir(parents=True)
    (d / ADAPTER_WEIGHTS).write_bytes(b"w" * 512)
    (d / "adapter_config.json").write_text("{}")
    pool.add(Snapshot("agent1", 1, 1, d.name, **adapter_info(d), seconds=0.1), random.Random(0))
    verify_snapshots(pool.dir, pool.manifest())
    assert pool.members[0].bytes == 514
    (d / ADAPTER_WEIGHTS).write_bytes(b"v" * 512)
    with pytest.raises(ValueError, match=r"v000001 \(v1\) has sha256 "):
        verify_snapshots(pool.dir, pool.manifest())
