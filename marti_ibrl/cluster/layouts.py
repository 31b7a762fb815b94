"""``marti-ibrl plan --fit``: the layouts of a job that fit an allocation, each as the flags to add.

Given a run's config and an allocation (nodes × GPUs per node, GiB per GPU), :func:`propose` tries every layout of
the trained roles — the same for each full-weight role, as the paper's recipes have it — over

* ``--train.colocate`` ``none`` (every component on GPUs of its own) or ``all`` (every role's actor, reference and
  engines on the same GPUs, engines asleep while DeepSpeed trains);
* actor ranks per role (1, 2, 4, 8, or whole nodes beyond), ``--roleN.colocate_ref`` (the reference on the actor's
  GPUs), ZeRO stage 2 or 3, gradient checkpointing, the update micro-batch (the recipe's, or 1);
* the roles as the config has them, then every full-weight trained role as a rank-16 LoRA role (adapters on the
  frozen checkpoint: no optimizer state for the base, no reference model, adapter pools; a different training than
  full weights, so these rank after every full-weight layout and the listing says so);
* engines per role and their tensor-parallel size (``none``: every GPU left after the actors, references and pool
  engines; ``all``: one engine GPU per actor GPU, each engine given 0.2-0.4 of a GPU), 1 or 2 pool engines per
  role,

keeps each one that validates as ``train`` would and that :func:`marti_ibrl.cluster.plan.make_plan` finds fitting (no
problem: GPUs, memory per GPU, a KV cache for one sequence), and ranks them: fewest GPUs left idle, then fewest flags
changed (the recipe itself first when it fits), then most rollout-engine GPUs (the part of an iteration more GPUs
shorten; the planner has no time model). The
memory model is the planner's (estimates, not measurements: docs/cluster.md). When nothing fits, :func:`smallest_fit`
finds the smallest allocation (more nodes, or more memory per GPU) for which something does.

Plain enumeration, not a solver: a few thousand candidates, each priced in well under a millisecond.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field

from marti_ibrl.cluster.memory import LORA_RANK
from marti_ibrl.cluster.placement import device_slots, has_reference, uses_pool
from marti_ibrl.config import Config, ConfigError, Existence, validate

RANKS = (1, 2, 4, 8, 16, 32)
TENSOR_PARALLEL = (1, 2, 4, 8)
POOL_ENGINES = (1, 2)
COLOCATED_KV = (0.2, 0.3, 0.4)  # --roleN.gpu_memory_utilization of colocated engines (two roles' on one GPU)


@dataclass
class Layout:
    """One layout that fits: the flags that make it from the run's config, and what the planner says of it."""

    flags: list[str]
    gpus: int
    idle: int
    engine_gpus: int
    peak_gib: float  # the largest memory per GPU of any component (or phase, colocated)
    summary: str = ""
    changed: int = field(default=0)
    lora: bool = False  # the layout makes full-weight roles LoRA roles


def _role_flags(i: int, ranks: int, gpus_per_node: int) -> dict[str, object]:
    """Role i's actor ranks as num_nodes × num_gpus_per_node: on one node, or on whole nodes beyond one."""
    nodes = max(1, ranks // gpus_per_node)
    per_node = ranks // nodes
    return {f"role{i}.num_nodes": nodes, f"role{i}.num_gpus_per_node": per_node}


def _apply(cfg: Config, values: dict[str, object]) -> Config:
    out = copy.deepcopy(cfg)
    for key, value in values.items():
        section, name = key.split(".")
        target = out.roles[int(section[4:]) - 1] if section.startswith("role") else getattr(out, section)
        setattr(target, name, value)
    return out


def _flag_value(value: object) -> str:
    """A value as a command-line flag writes it (``null``: unset, as YAML says it)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def candidates(cfg: Config, nodes: int, gpus_per_node: int):
    """(values, changed config) for every layout of the search space (module doc) on ``nodes × gpus_per_node``: the
    roles as the config has them, then (where some trained role has full weights) every one of them as LoRA roles."""
    yield from _candidates(cfg, {}, nodes, gpus_per_node)
    full = [(i, r) for i, r in enumerate(cfg.roles, start=1) if not r.frozen and r.lora_rank == 0]
    if full:
        lora: dict[str, object] = {f"role{i}.lora_rank": LORA_RANK for i, _ in full}
        lora |= {f"role{i}.colocate_ref": False for i, r in full if r.colocate_ref}  # (a LoRA role has no reference)
        yield from _candidates(_apply(cfg, lora), lora, nodes, gpus_per_node)


def _candidates(cfg: Config, fixed: dict[str, object], nodes: int, gpus_per_node: int):
    total = nodes * gpus_per_node
    trained = [(i, r) for i, r in enumerate(cfg.roles, start=1) if not r.frozen]
    full = [(i, r) for i, r in trained if r.lora_rank == 0]
    frozen_gpus = sum(r.num_engines * r.tensor_parallel_size for r in cfg.roles if r.frozen)
    pools = uses_pool(cfg)
    modes = ("none", "all") if len(trained) >= 1 else ("none",)
    micro = sorted({cfg.train.micro_batch_size, 1})
    for mode, ranks, zero, ckpt, mb, tp in itertools.product(
        modes, RANKS, (2, 3), sorted({cfg.ds.gradient_checkpointing, True}), micro, TENSOR_PARALLEL
    ):
        if tp > gpus_per_node or (ranks > gpus_per_node and ranks % gpus_per_node):
            continue
        base: dict[str, object] = {**fixed, "train.colocate": mode, "ds.zero_stage": zero}
        base |= {"ds.gradient_checkpointing": ckpt, "train.micro_batch_size": mb}
        for i, _ in trained:
            base |= _role_flags(i, ranks, gpus_per_node) | {f"role{i}.tensor_parallel_size": tp}
        if mode == "all":
            if ranks % tp or ranks > total - frozen_gpus:
                continue
            for share in COLOCATED_KV:  # every role's engines awake at once on each GPU, beside resident weights
                values = dict(base)
                for i, _ in trained:  # (a reference sits on its actor's GPUs in this mode, colocate_ref or not)
                    values[f"role{i}.num_engines"] = ranks // tp
                    values[f"role{i}.gpu_memory_utilization"] = share
                values["pool.num_engines"] = None
                yield values, _apply(cfg, values)
            continue
        for colocate_ref, pool_engines in itertools.product((True, False), POOL_ENGINES if pools and full else (None,)):
            values = dict(base)
            used = frozen_gpus
            for i, r in trained:
                ref = has_reference(r)
                if ref:
                    values[f"role{i}.colocate_ref"] = colocate_ref
                used += ranks * (1 if (colocate_ref or not ref) else 2)
            if pool_engines is not None:
                values["pool.num_engines"] = pool_engines
                used += pool_engines * tp * len(full)
            engine_sets = len(trained) if not cfg.rollout.share_engines else 1
            each = (total - used) // (engine_sets * tp)
            if each < 1 or (not any(has_reference(r) for _, r in trained) and not colocate_ref):
                continue  # no GPU left for an engine; (without a reference, colocate_ref is not a choice)
            for i, _ in trained:
                values[f"role{i}.num_engines"] = each
            yield values, _apply(cfg, values)


def propose(
    cfg: Config,
    *,
    nodes: int,
    gpus_per_node: int,
    gpu_memory_gib: float,
    model_config: str | None = None,
    config_file: str | None = None,
    limit: int = 5,
) -> list[Layout]:
    """The ``limit`` best layouts that fit (ranked as in the module doc); empty when none does."""
    from marti_ibrl.cluster.plan import make_plan

    total = nodes * gpus_per_node
    found: dict[tuple, Layout] = {}
    for values, changed in candidates(cfg, nodes, gpus_per_node):
        try:
            validate(changed, Existence(assumed=[]))
        except ConfigError:
            continue
        gpus = device_slots(changed)
        if gpus > total:
            continue
        plan = make_plan(
            changed,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            gpu_memory_gib=gpu_memory_gib,
            model_config=model_config,
            config_file=config_file,
        )
        if plan.problems:
            continue
        flags = []
        for key, value in values.items():
            section, name = key.split(".")
            before = getattr(
                cfg.roles[int(section[4:]) - 1] if section.startswith("role") else getattr(cfg, section), name
            )
            if value != before:
                flags += [f"--{key}", _flag_value(value)]
        engine_gpus = sum(c.gpus for c in plan.components if c.kind in ("engines", "pool engines"))
        engine_gpus += sum(c.count * c.gpus_each for c in plan.components if c.kind == "engines" and c.shared)
        peaks = [u.total for u in plan.usages] + [ph.total for ph in plan.phases]
        layout = Layout(
            flags,
            gpus,
            total - gpus,
            engine_gpus,
            max(peaks, default=0) / 2**30,
            summary=_summary(changed, plan),
            changed=len(flags) // 2,
            lora=any(k.endswith(".lora_rank") for k in values),
        )
        key = tuple(flags)
        if key not in found:
            found[key] = layout
    # the roles' own kind of training first: a LoRA layout only after every full-weight one (it trains less: module doc)
    ranked = sorted(found.values(), key=lambda x: (x.lora, x.idle, x.changed, -x.engine_gpus, x.peak_gib))
    return ranked[:limit]


def _summary(cfg: Config, plan) -> str:
    """One line: colocation, per role ranks / reference / engines × TP, pool engines, ZeRO."""
    parts = []
    for r in cfg.roles:
        if r.frozen:
            continue
        ranks = r.num_nodes * r.num_gpus_per_node
        ref = (
            ""
            if not has_reference(r)
            else (", ref on actor GPUs" if r.colocate_ref or cfg.train.colocate != "none" else f", ref {ranks}")
        )
        engines = f"{r.num_engines} engine{'s' * (r.num_engines != 1)} × TP{r.tensor_parallel_size}"
        lora = f" LoRA r{r.lora_rank}" if r.lora_rank else ""
        parts.append(f"{r.name}:{lora} {ranks} rank{'s' * (ranks != 1)}{ref}, {engines}")
    pool = next((c.count for c in plan.components if c.kind == "pool engines"), 0)
    tail = f"; {pool} pool engine{'s' * (pool != 1)} per role" if pool else ""
    return f"colocate {cfg.train.colocate}, ZeRO-{cfg.ds.zero_stage}: " + "; ".join(parts) + tail


def smallest_fit(
    cfg: Config,
    *,
    nodes: int,
    gpus_per_node: int,
    gpu_memory_gib: float,
    model_config: str | None = None,
    config_file: str | None = None,
) -> tuple[str, Layout] | None:
    """When nothing fits: the smallest change of the allocation that makes a layout fit — more nodes of the same
    GPUs (up to 4 times as many), else the same nodes with 80 GiB GPUs — and that layout; None when neither does."""
    kw = dict(model_config=model_config, config_file=config_file, limit=1)
    for more in range(nodes + 1, 4 * nodes + 1):
        found = propose(cfg, nodes=more, gpus_per_node=gpus_per_node, gpu_memory_gib=gpu_memory_gib, **kw)
        if found:
            return f"--nodes {more}", found[0]
    if gpu_memory_gib < 80:
        found = propose(cfg, nodes=nodes, gpus_per_node=gpus_per_node, gpu_memory_gib=80.0, **kw)
        if found:
            return "--gpu-memory 80", found[0]
    return None


def format_layouts(layouts: list[Layout], nodes: int, gpus_per_node: int, gpu_memory_gib: float) -> str:
    head = f"layouts that fit {nodes} × {gpus_per_node} GPUs of {gpu_memory_gib:g} GiB (best first):"
    lines = [head]
    if any(x.lora for x in layouts):
        lines.append(
            f"(LoRA: rank-{LORA_RANK} adapters trained on the frozen checkpoint, which with the adapter off is the KL "
            "reference; adapter pools. Far less memory than full weights, and far fewer trained parameters: another "
            "run than the paper's full-weight one, not the same on less memory)"
        )
    for n, x in enumerate(layouts, start=1):
        lines.append(
            f"{n}. {x.summary}\n   {x.gpus} GPUs ({x.idle} idle), {x.engine_gpus} engine GPUs, peak ~{x.peak_gib:.1f} "
            f"GiB per GPU\n   add: {' '.join(x.flags) or '(the recipe as it is)'}"
        )
    return "\n".join(lines)
