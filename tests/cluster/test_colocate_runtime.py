"""marti_ibrl.cluster.colocate without Ray: the GPU shares of a shared bundle, and the order the hybrid
engine calls OpenRLHF's sleep/wake/offload/reload in (the roles in turn, as ``all`` does when both updates do not
fit). The end-to-end runs are tests/e2e/test_e2e_colocate.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray
from fake_model import fake_checkpoint

from marti_ibrl.cluster import colocate
from marti_ibrl.cluster.phases import PhaseLog, read_phases, violations
from marti_ibrl.config import load_config


@pytest.fixture
def tiny(tmp_path) -> str:
    fake_checkpoint(tmp_path, {"model_type": "qwen2"})
    return str(tmp_path)


def _cfg(tiny, mode, *flags):
    base = ["--role1.pretrain", tiny, "--role2.pretrain", tiny, "--train.device", "cpu", "--rollout.engine", "hf"]
    return load_config([*base, "--train.colocate", mode, *flags])


@pytest.mark.parametrize(
    ("mode", "flags", "share"),
    [
        ("role", ["--role1.kl_coef", "0.01", "--role2.kl_coef", "0.01"], 0.2),  # engine, actor, reference: 0.6
        ("all", ["--role1.kl_coef", "0.01", "--role2.kl_coef", "0.01"], 0.15),  # 2 engines 0.4 + 4 ranks 0.6
        ("all", ["--role1.kl_coef", "0", "--role2.kl_coef", "0"], 0.2),  # 2 engines + 2 actors: 0.8
        ("all", ["--role1.kl_coef", "0.01", "--role2.kl_coef", "0"], 0.2),  # 0.4 + 3 × 0.2
    ],
)
def test_every_process_of_a_bundle_fits_in_its_gpu(tiny, mode, flags, share):
    cfg = _cfg(tiny, mode, "--pool.probs", "[1.0,0,0]", *flags)
    assert colocate.ds_share(cfg) == share
    engines = 2 if mode == "all" else 1
    ranks = sum(1 + (r.kl_coef > 0) for r in cfg.roles) if mode == "all" else 2
    assert engines * colocate.ENGINE_SHARE + ranks * share <= 1.0 + 1e-9


def test_updates_together_unless_all_does_not_fit(tiny):
    cfg = _cfg(tiny, "all", "--pool.probs", "[1.0,0,0]")
    assert colocate.updates_together(cfg, None)  # CPU: nothing to free
    assert colocate.updates_together(_cfg(tiny, "role", "--pool.probs", "[1.0,0,0]"), 1.0)  # apart: always


class _Remote:
    def __init__(self, calls, who, method):
        self.calls, self.who, self.method = calls, who, method

    def remote(self, *args, **kwargs):
        self.calls.append((self.who, self.method, kwargs))
        return self.method


class _Handle:
    def __init__(self, calls, who):
        self.calls, self.who = calls, who

    def __getattr__(self, method):
        return _Remote(self.calls, self.who, method)


class _Group:
    def __init__(self, calls, who):
        self.calls, self.who = calls, who

    def async_run_method(self, method_name, **kwargs):
        self.calls.append((self.who, method_name, kwargs))
        return [method_name]


def test_all_in_turn_reloads_trains_and_offloads_one_role_at_a_time(tiny, tmp_path, monkeypatch):
    """``all`` when both updates do not fit: agent1 reload → fit → offload, then agent2; the record says so and
    breaks no rule; a sync wakes only the weights; the next generation wakes only the KV cache there."""
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    calls: list = []
    stacks = {
        r: SimpleNamespace(engines=[_Handle(calls, f"{r}/engine")], actor=_Group(calls, f"{r}/actor"))
        for r in ("agent1", "agent2")
    }
    cfg = _cfg(tiny, "all", "--pool.probs", "[1.0,0,0]")
    hybrid = colocate.ColocationPhases(cfg, stacks, PhaseLog(tmp_path, effect=colocate.CPU_EFFECT), together=False)
    hybrid.record_start()
    hybrid.sync(0, ["agent1", "agent2"], lambda r: [f"{r} synced"])
    with hybrid.generation(1):
        pass
    status, splits = hybrid.update(1, ["agent1", "agent2"], lambda r: ([{"role": r}], f"split {r}"))
    assert status == {"agent1": {"role": "agent1"}, "agent2": {"role": "agent2"}}
    assert splits == {"agent1": "split agent1", "agent2": "split agent2"}
    assert hybrid.sync(1, ["agent2"], lambda r: [f"{r} synced"]) == {"agent2": ["agent2 synced"]}
    with hybrid.generation(2):
        pass
    made = [(who, method, kw.get("tags")) for who, method, kw in calls]
    assert made == [
        ("agent1/engine", "wake_up", ["weights"]),
        ("agent2/engine", "wake_up", ["weights"]),
        ("agent1/engine", "wake_up", ["kv_cache"]),
        ("agent2/engine", "wake_up", ["kv_cache"]),
        ("agent1/engine", "sleep", None),
        ("agent2/engine", "sleep", None),
        ("agent1/actor", "reload_states", None),
        ("agent1/actor", "offload_states", None),
        ("agent2/actor", "reload_states", None),
        ("agent2/actor", "offload_states", None),
        ("agent2/engine", "wake_up", ["weights"]),
        ("agent1/engine", "wake_up", ["weights", "kv_cache"]),
        ("agent2/engine", "wake_up", ["kv_cache"]),
        ("agent1/engine", "sleep", None),
        ("agent2/engine", "sleep", None),
    ]
    records = read_phases(tmp_path)
    assert violations(records, {0: ["agent1", "agent2"], 1: ["agent1", "agent2"], 2: []}) == []
    trained = [(r["role"], r["event"]) for r in records if r["iteration"] == 1 and r["component"] == "actor"]
    assert trained[:6] == [
        ("agent1", "reload"),
        ("agent1", "train"),
        ("agent1", "offload"),
        ("agent2", "reload"),
        ("agent2", "train"),
        ("agent2", "offload"),
    ]
    # the same in one turn would train agent2 while agent1's states are loaded: fine for violations (the states
    # of both are loaded while no engine is awake); what it catches is an engine woken in between
    bad = records + [
        {"iteration": 3, "role": "agent1", "component": "engines", "event": "wake", "start": 99, "end": 99.1},
        {"iteration": 3, "role": "agent2", "component": "actor", "event": "reload", "start": 99.2, "end": 99.3},
        {"iteration": 3, "role": "agent2", "component": "actor", "event": "train", "start": 99.4, "end": 99.5},
    ]
    for r in bad[-3:]:
        r["session"] = records[0]["session"]
    assert violations(bad, {0: ["agent1", "agent2"], 1: ["agent1", "agent2"], 3: ["agent2"]}) == [
        "iteration 3, agent2 actor train at 99.400-99.500s: trained while engines of agent1 were awake"
    ]


def test_the_separate_layout_only_records(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    calls: list = []
    stacks = {"agent1": SimpleNamespace(engines=[_Handle(calls, "e")], actor=_Group(calls, "a"))}
    hybrid = colocate.ColocationPhases(_cfg(tiny, "none"), stacks, PhaseLog(tmp_path))
    hybrid.record_start()
    with hybrid.generation(1):
        pass
    hybrid.update(1, ["agent1"], lambda r: (None, "nothing to train"))
    hybrid.wake_for_reading(1, ["agent1"])
    assert calls == []  # no sleep, wake, offload or reload outside a colocated layout
    assert [(r["component"], r["event"]) for r in read_phases(tmp_path)] == [("engines", "generate")]


def test_topology_says_what_sleeping_does(tiny):
    cfg = _cfg(tiny, "all", "--pool.probs", "[1.0,0,0]")
    assert colocate.sleep_summary(cfg, "cpu", "hf").startswith("unsupported on cpu")
    assert colocate.sleep_summary(cfg, "cuda", "vllm").startswith("vllm sleep level 1")
    assert colocate.sleep_summary(_cfg(tiny, "none"), "cpu", "hf").startswith("off")
