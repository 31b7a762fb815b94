"""``topology``: the record of what a run started, from fake stacks (no Ray, no models)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from fake_model import fake_checkpoint

from marti_ibrl.backend.args import role_args
from marti_ibrl.cluster.topology import TOPOLOGY_FILE, topology, write_topology
from marti_ibrl.config import load_config
from marti_ibrl.procenv import SHARE_ONE_GPU_ENV
from marti_ibrl.rollout.runner import Policy

NODES = [
    {
        "NodeID": "a1",
        "NodeName": "gpu-node-01",
        "NodeManagerAddress": "10.0.0.1",
        "Alive": True,
        "Resources": {"CPU": 16.0, "GPU": 8.0, "memory": 1e11, "node:10.0.0.1": 1.0},
    },
    {"NodeID": "b2", "NodeManagerAddress": "10.0.0.2", "Alive": False, "Resources": {"CPU": 4.0}},
]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ckpt")
    fake_checkpoint(path)
    return str(path)


def _stack(cfg, role, device: str, engines: int, pool_engines: int, with_ref: bool) -> SimpleNamespace:
    """A started RoleStack's fields that the record reads: real OpenRLHF args, placeholder handles."""
    return SimpleNamespace(
        role=role,
        args=role_args(cfg, role, device),
        engines=[object()] * engines,
        pool_engines=[object()] * pool_engines,
        ref=object() if with_ref else None,
        engine_kind="hf",
    )


def test_two_trained_roles(model: str, tmp_path) -> None:
    cfg = load_config(
        [
            *("--role1.pretrain", model, "--role2.pretrain", model, "--ds.zero_stage", "3", "--ds.param_dtype", "fp32"),
            *("--role1.num_nodes", "2", "--role1.num_gpus_per_node", "4", "--role1.colocate_ref", "true"),
            *("--role1.num_engines", "3", "--role1.tensor_parallel_size", "2", "--pool.num_engines", "2"),
            *("--role2.kl_coef", "0", "--role2.num_gpus_per_node", "2"),
        ]
    )
    r1, r2 = cfg.roles
    stacks = {"agent2": _stack(cfg, r2, "cpu", 1, 2, False), "agent1": _stack(cfg, r1, "cpu", 3, 2, True)}
    got = topology(cfg, stacks, {}, "cpu", NODES)
    assert got == {
        "device": "cpu",
        "trained": {
            "agent1": {
                "ranks": 8,
                "zero_stage": 3,
                "param_dtype": "fp32",
                "engine_kind": "hf",
                "engines": 3,
                "pool_engines": 2,
                "reference": "colocated",
                "weight_sync": "object_store",
                "lora_rank": 0,
                "tensor_parallel_size": 2,
                "engines_of": "agent1",
            },
            "agent2": {
                "ranks": 2,
                "zero_stage": 3,
                "param_dtype": "fp32",
                "engine_kind": "hf",
                "engines": 1,
                "pool_engines": 2,
                "reference": "none",
                "weight_sync": "object_store",
                "lora_rank": 0,
                "tensor_parallel_size": 1,
                "engines_of": "agent2",
            },
        },
        "frozen": {},
        "nodes": [
            {
                "node_id": "a1",
                "name": "gpu-node-01",
                "address": "10.0.0.1",
                "alive": True,
                "resources": {"CPU": 16.0, "GPU": 8.0},
            },
            {
                "node_id": "b2",
                "name": "10.0.0.2",
                "address": "10.0.0.2",
                "alive": False,
                "resources": {"CPU": 4.0, "GPU": 0.0},
            },
        ],
    }
    assert list(got["trained"]) == ["agent1", "agent2"]  # seat order, not the stacks' order
    path = write_topology(tmp_path, got)
    assert path == tmp_path / TOPOLOGY_FILE and json.loads(path.read_text()) == got
    assert [p.name for p in tmp_path.iterdir()] == [TOPOLOGY_FILE]  # no temporary file left behind
    # with the nodes each process was placed on (RoleStack.node_ids, asked of the running actors)
    placed = {
        "agent1": {"actor": ["a1"] * 8, "reference": ["a1"] * 8, "engines": ["b2"] * 3, "pool_engines": ["b2"] * 2},
        "agent2": {"actor": ["b2", "b2"], "reference": [], "engines": ["a1"], "pool_engines": ["a1", "b2"]},
    }
    with_nodes = topology(cfg, stacks, {}, "cpu", NODES, placed=placed)
    assert {r: v.pop("placed_on") for r, v in with_nodes["trained"].items()} == placed
    assert with_nodes == got


def test_frozen_role_lists_its_counterparts(model: str, monkeypatch) -> None:
    monkeypatch.delenv(SHARE_ONE_GPU_ENV, raising=False)  # a real GPU layout: NCCL weight sync
    cfg = load_config(["--role1.pretrain", model, "--role2.frozen", f"bot:greedy,checkpoint:{model}"])
    r1, _ = cfg.roles
    stacks = {"agent1": _stack(cfg, r1, "cuda", 1, 0, True)}
    tok = SimpleNamespace()
    frozen = {
        "agent2": [
            Policy("frozen:bot:greedy", player=SimpleNamespace()),
            Policy(f"frozen:checkpoint:{model}", [object(), object()], tok),
        ]
    }
    got = topology(cfg, stacks, frozen, "cuda", NODES[:1], frozen_engine_kind="vllm")
    assert got["device"] == "cuda"
    assert got["trained"]["agent1"]["reference"] == "separate"
    assert got["trained"]["agent1"]["weight_sync"] == "nccl"  # role_args on cuda: NCCL broadcast to the engines
    assert got["frozen"] == {
        "agent2": {
            "counterparts": [
                {"name": "frozen:bot:greedy", "engine_kind": None, "engines": 0},
                {"name": f"frozen:checkpoint:{model}", "engine_kind": "vllm", "engines": 2},
            ]
        }
    }
    assert [n["node_id"] for n in got["nodes"]] == ["a1"]


def test_shared_engines_name_their_owner(model: str) -> None:
    """--rollout.share_engines: agent2's rollouts run on agent1's engines, and the record says so (the same
    processes appear under both roles' ``engines``: count them once)."""
    flags = [f"--role{i}.{k}={v}" for i in (1, 2) for k, v in (("pretrain", model), ("lora_rank", 8))]
    for share, owners in ((False, ["agent1", "agent2"]), (True, ["agent1", "agent1"])):
        cfg = load_config([*flags, "--rollout.share_engines", str(share).lower()])
        stacks = {r.name: _stack(cfg, r, "cpu", 1, 0, False) for r in cfg.roles}
        got = topology(cfg, stacks, {}, "cpu", NODES)["trained"]
        assert [got[r]["engines_of"] for r in ("agent1", "agent2")] == owners
        assert [got[r]["weight_sync"] for r in ("agent1", "agent2")] == ["adapter", "adapter"]
