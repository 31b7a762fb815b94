"""``marti-ibrl plan``: a recipe's GPU placement and per-GPU memory, with no GPU, no Ray and no torch.

``marti-ibrl plan --config X.yaml [train flags...] [--nodes 4 --gpus-per-node 8 --gpu-memory 80]`` parses the flags
exactly as ``train`` does (:func:`marti_ibrl.config.load_config`), lists every component ``train`` would start
(:func:`marti_ibrl.cluster.placement.placement`, the same function that sizes ``train``'s Ray start-up), estimates each one's
memory per GPU, and exits 2 with one message when the job does not fit the allocation (GPU count or memory).

Without ``--strict``, paths and environment variables that only exist on the cluster (checkpoints, ``env.data``,
``judge.api_key_env``) are assumed present and listed; the model sizes then come from ``--model-config`` or from
the built-in table (:data:`marti_ibrl.cluster.sizing.MODEL_TABLE`) matched by name. With ``--strict`` (the Slurm recipes' preflight), every
check of ``train`` applies.

The estimate is split in three: model sizes (:mod:`marti_ibrl.cluster.sizing`), memory per process and per phase
(:mod:`marti_ibrl.cluster.memory`, whose docstring states the memory model), and the printed plan
(:mod:`marti_ibrl.cluster.plan_format`). The runtime asks one question of it: :func:`roles_update_together`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from marti_ibrl.cluster.memory import (
    LORA_RANK,
    MAX_GPU_MEMORY_GIB,
    VLLM_RUNTIME,
    GiB,
    PhaseUsage,
    Usage,
    gib,
    group_gpus,
    parts_text,
    phase_usages,
    updates_fit_together,
    usage,
)
from marti_ibrl.cluster.placement import (
    ACTOR,
    POOL_ENGINES,
    REFERENCE,
    Component,
    colocated,
    placement,
)
from marti_ibrl.cluster.sizing import ModelSpec, lora_params, resolve_model
from marti_ibrl.config import Config


@dataclass
class Plan:
    cfg: Config
    components: list[Component]
    usages: list[Usage]
    nodes: int
    gpus_per_node: int
    gpu_memory: int
    models: dict[str, ModelSpec]
    assumed: list[str]
    """Paths / variables not checked here (plan without --strict)."""
    problems: list[str]

    lora: list = field(default_factory=list)
    """:class:`LoRASummary` per LoRA role."""
    phases: list[PhaseUsage] = field(default_factory=list)
    """Colocated (``--train.colocate role|all``): memory per GPU of each GPU group in each phase."""
    updates_together: bool | None = None
    """Colocated: the roles' log-prob passes and updates run at once (``role``: always, their GPUs are apart;
    ``all``: when that fits the GPU), else one role after the other."""
    together_bytes: int = 0
    """``all`` with the updates one after the other: what both at once would need per GPU."""

    @property
    def total_gpus(self) -> int:
        return sum(c.gpus for c in self.components)


def make_plan(
    cfg: Config,
    *,
    nodes: int | None = None,
    gpus_per_node: int = 8,
    gpu_memory_gib: float = 80.0,
    model_config: str | None = None,
    config_file: str | None = None,
    assumed: list[str] | None = None,
) -> Plan:
    """Placement, memory per GPU and the reasons the job does not fit (``problems``, empty when it fits)."""
    components = placement(cfg)
    total = sum(c.gpus for c in components)
    if not 0 < gpu_memory_gib <= MAX_GPU_MEMORY_GIB:  # NaN fails too
        raise ValueError(
            f"gpu_memory_gib: expected a number > 0 and <= {MAX_GPU_MEMORY_GIB:g} GiB, got {gpu_memory_gib}"
        )
    gpu_memory = int(gpu_memory_gib * GiB)
    problems = []
    if nodes is None:
        nodes = max(1, math.ceil(total / gpus_per_node))
    if total > nodes * gpus_per_node:
        problems.append(
            f"the job needs {total} GPUs, the allocation has {nodes} × {gpus_per_node} = {nodes * gpus_per_node}"
        )
    gpu_device = cfg.train.device != "cpu"
    models = {}
    for c in components:
        if c.model not in models:
            models[c.model] = resolve_model(c.model, model_config, config_file)
    usages, hint = [], False
    for c in components:
        u = usage(cfg, c, models[c.model], gpu_memory) if gpu_device else Usage(c, models[c.model])
        usages.append(u)
        if not gpu_device:
            continue
        where = f"{c.role} {c.kind}"
        if c.kind in (ACTOR, REFERENCE) and u.total > gpu_memory:
            problems.append(f"{where} needs {gib(u.total)} GiB per GPU > {gib(gpu_memory)} GiB ({parts_text(u)})")
            hint = True
        elif c.kind not in (ACTOR, REFERENCE):
            role = next(r for r in cfg.roles if r.name == c.role)
            flag = f"--role{cfg.roles.index(role) + 1}"
            if not 0 < role.gpu_memory_utilization <= 1:
                problems.append(f"{flag}.gpu_memory_utilization must be in (0, 1], got {role.gpu_memory_utilization}")
            elif not u.sequences:
                problems.append(
                    f"{where}: {role.gpu_memory_utilization} × {gib(gpu_memory)} GiB leaves no KV cache for one "
                    f"{cfg.rollout.max_len}-token sequence after the weights ({gib(u.parts['weights'])} GiB per GPU) "
                    f"and the runtime ({gib(VLLM_RUNTIME)} GiB); raise {flag}.gpu_memory_utilization or "
                    f"{flag}.tensor_parallel_size"
                )
            if c.gpus_each > gpus_per_node:
                problems.append(
                    f"{where}: tensor parallel size {c.gpus_each} exceeds the {gpus_per_node} GPUs of a node"
                )
    if hint:
        problems.append(
            f"for the DeepSpeed ranks try {', '.join(_remedies(cfg))}, more ranks (--roleN.num_gpus_per_node) or "
            "smaller --train.micro_batch_size / --rollout.micro_batch_size"
        )
    plan = Plan(cfg, components, usages, nodes, gpus_per_node, gpu_memory, models, list(assumed or []), problems)
    if gpu_device and colocated(cfg):
        _plan_phases(plan)
    plan.problems = list(dict.fromkeys(problems))  # a role's engines and pool engines share its settings
    plan.lora = lora_summary(cfg, models)
    return plan


def _remedies(cfg) -> list[str]:
    """The memory-saving settings for DeepSpeed ranks that ``cfg`` does not use yet (a hint never suggests what the
    job already sets): ZeRO-3, gradient checkpointing, LoRA adapters (``plan --fit`` lists whole layouts)."""
    out = []
    if cfg.ds.zero_stage != 3:
        out.append("--ds.zero_stage 3")
    if not cfg.ds.gradient_checkpointing:
        out.append("--ds.gradient_checkpointing true")
    if any(not r.lora_rank and not r.frozen for r in cfg.roles):  # (a frozen role has no DeepSpeed ranks)
        out.append(f"LoRA roles (--roleN.lora_rank {LORA_RANK}: no optimizer state for the base weights)")
    return out


def _plan_phases(p: Plan) -> None:
    """Colocated: each phase's memory per GPU; ``all`` updates the roles at once when that fits, else in turn."""
    cfg, limit = p.cfg, p.gpu_memory
    p.updates_together, peak = updates_fit_together(cfg, p.usages, limit)
    if not p.updates_together:
        p.together_bytes = peak
    p.phases = phase_usages(cfg, p.usages, together=p.updates_together)
    for pu in p.phases:
        if pu.total <= limit:
            continue
        where = f"{pu.phase.name} on {group_gpus(pu.group)}"
        how = (
            "lower --roleN.gpu_memory_utilization, or --ds.zero_stage 3 to split the weights that stay"
            if pu.phase.engines_awake
            else f"try {', '.join([*_remedies(p.cfg), 'smaller micro-batches'])}"
        )
        p.problems.append(f"{where} needs {gib(pu.total)} GiB per GPU > {gib(limit)} GiB ({parts_text(pu)}); {how}")


@dataclass
class LoRASummary:
    """A LoRA role against the same role on full weights (``lora_rank 0``): its adapter and what it saves."""

    role: str
    rank: int
    params: int
    snapshot_bytes: int
    """One pool snapshot (``pool.dtype``): the adapter, vs ``full_snapshot_bytes`` for the whole model."""
    full_snapshot_bytes: int
    gpus_saved: int
    """Devices the role's full-weight stack (same flags, ``lora_rank 0``) would take more: its reference ranks and
    pool engines (``reference_gpus`` + ``pool_gpus``)."""
    reference_gpus: int = 0
    pool_gpus: int = 0


def lora_summary(cfg: Config, models: dict[str, ModelSpec]) -> list[LoRASummary]:
    import copy

    out = []
    for i, role in enumerate(cfg.roles):
        if role.frozen or role.lora_rank == 0:
            continue
        full = copy.deepcopy(cfg)
        full.roles[i].lora_rank = 0
        if full.pool.num_engines == 0:
            full.pool.num_engines = None
        gpus = {c.kind: c.gpus for c in placement(full) if c.role == role.name}
        saved = sum(gpus.values()) - sum(c.gpus for c in placement(cfg) if c.role == role.name)
        m = models[role.pretrain]
        n = lora_params(m, role.lora_rank, role.target_modules)
        w = 4 if cfg.pool.dtype == "fp32" else 2
        ref, pool = gpus.get(REFERENCE, 0), gpus.get(POOL_ENGINES, 0)
        out.append(LoRASummary(role.name, role.lora_rank, n, n * w, m.params * w, saved, ref, pool))
    return out


def roles_update_together(cfg: Config, gpu_memory_gib: float) -> bool:
    """Colocated ``all``: whether every role's log-prob pass and update fit a GPU of ``gpu_memory_gib`` at once
    (:func:`~marti_ibrl.cluster.memory.updates_fit_together`; what ``marti-ibrl plan`` prints for the recipe)."""
    gpu_memory = int(gpu_memory_gib * GiB)
    models: dict[str, ModelSpec] = {}
    usages = []
    for c in placement(cfg):
        models.setdefault(c.model, resolve_model(c.model, None, None))
        usages.append(usage(cfg, c, models[c.model], gpu_memory))
    return updates_fit_together(cfg, usages, gpu_memory)[0]
