"""``RUN/topology.json``: what a training run actually started, written once the roles' stacks are up.

:func:`topology` is a pure function of the resolved config, the started stacks, the frozen roles' counterparts,
the device and Ray's node list; :func:`write_topology` writes it atomically. ``marti-ibrl plan`` says what a job
*would* start; this record says what it did (ranks, ZeRO stage, engines, reference placement, weight sync).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.config import Config

TOPOLOGY_FILE = "topology.json"


def reference_placement(stack: Any) -> str:
    """``none`` (no π_ref: kl_coef 0), ``colocated`` (on the actor's devices), ``separate`` (devices of its own) or
    ``base_adapter_off`` (a LoRA role: its actor with the adapter disabled)."""
    if stack.ref is None:
        lora = getattr(stack.role, "lora_rank", 0) > 0
        return "base_adapter_off" if lora and stack.role.kl_coef > 0 else "none"
    return "colocated" if stack.role.colocate_ref else "separate"


def trained_role(stack: Any) -> dict:
    """One trained role's stack as it runs: DeepSpeed ranks and ZeRO stage, engines, reference, weight sync."""
    a = stack.args
    return {
        "ranks": a.actor.num_nodes * a.actor.num_gpus_per_node,
        "zero_stage": a.ds.zero_stage,
        "param_dtype": a.ds.param_dtype,
        "engine_kind": stack.engine_kind,
        "engines": len(stack.engines),
        "pool_engines": len(stack.pool_engines),
        "reference": reference_placement(stack),
        # nccl | gloo | object_store: actor -> engines after each update; "adapter" for a LoRA role (adapter only)
        "weight_sync": "adapter" if a.ds.lora.rank > 0 else a.vllm.sync_backend,
        "lora_rank": a.ds.lora.rank,
        "tensor_parallel_size": a.vllm.tensor_parallel_size,
    }


def engines_owner(cfg: Config, role: Any) -> str:
    """The role whose engine set serves ``role``'s rollouts: itself, or with ``--rollout.share_engines`` the first
    trained role (whose ``engines`` count the same processes: count them once)."""
    from marti_ibrl.cluster.placement import shares_engines, trained_roles

    return trained_roles(cfg)[0].name if shares_engines(cfg, role) else role.name


def ray_node(node: Mapping[str, Any]) -> dict:
    """One entry of ``ray.nodes()``: its id, name (``ray start --node-name``: recipes/slurm-ray.sh gives each
    node its Slurm host name; Ray's default is the address), address, liveness and CPU/GPU resources."""
    resources = node.get("Resources", {})
    return {
        "node_id": node["NodeID"],
        "name": node.get("NodeName") or node["NodeManagerAddress"],
        "address": node["NodeManagerAddress"],
        "alive": bool(node["Alive"]),
        "resources": {"CPU": resources.get("CPU", 0.0), "GPU": resources.get("GPU", 0.0)},
    }


def topology(
    cfg: Config,
    stacks: Mapping[str, Any],
    frozen: Mapping[str, Sequence[Any]],
    device: str,
    nodes: Sequence[Mapping[str, Any]],
    frozen_engine_kind: str = "hf",
    placed: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
) -> dict:
    """The run's topology: per trained role its stack (:func:`trained_role`), the role whose engines serve it
    (``engines_of``, :func:`engines_owner`) and, given ``placed`` (role -> ``RoleStack.node_ids()``), the Ray node of
    each of its processes; per frozen role its counterparts (``Policy`` objects: name, engine kind —
    ``frozen_engine_kind`` for checkpoints, None for a text player — and engine count), the Ray nodes
    (:func:`ray_node`) and the device. Roles appear in the config's seat order."""
    frozen_out = {
        r: {
            "counterparts": [
                {
                    "name": p.name,
                    "engine_kind": frozen_engine_kind if p.engines else None,
                    "engines": len(p.engines),
                }
                for p in frozen[r]
            ]
        }
        for r in (role.name for role in cfg.roles)
        if r in frozen
    }
    return {
        "device": device,
        "trained": {
            r.name: {
                **trained_role(stacks[r.name]),
                "engines_of": engines_owner(cfg, r),
                **({"placed_on": dict(placed[r.name])} if placed else {}),
            }
            for r in cfg.roles
            if r.name in stacks
        },
        "frozen": frozen_out,
        "nodes": [ray_node(n) for n in nodes],
    }


def write_topology(run_dir: str | Path, record: dict) -> Path:
    """Write ``run_dir/topology.json`` (to a temporary name, then renamed: never half-written)."""
    path = Path(run_dir) / TOPOLOGY_FILE
    tmp = path.with_name(TOPOLOGY_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return path
