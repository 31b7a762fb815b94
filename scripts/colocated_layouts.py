"""Draw docs/images/colocated_layouts.png: the DoND Qwen3.5-4B recipe's GPUs under ``--train.colocate none | role |
all``, per phase, each GPU a bar of what ``marti-ibrl plan`` puts on it (GiB, stacked by component).

    .venv/bin/python scripts/colocated_layouts.py [--out docs/images/colocated_layouts.png]

Every number comes from :func:`marti_ibrl.cluster.plan.make_plan` (and the GPUs from :func:`marti_ibrl.cluster.placement.gpu_map`)
on the recipes' own YAML, with the model sized from the built-in Qwen3.5-4B table: remake the figure after changing
either.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--role1.pretrain", "/models/Qwen3.5-4B", "--role2.pretrain", "/models/Qwen3.5-4B"]
LAYOUTS = [  # title, flags
    ("none: qwen3.5-4b.yaml, 32 GPUs", ["--config", "recipes/dond/qwen3.5-4b.yaml"]),
    (
        "role: each role on 4 GPUs",
        ["--config", "recipes/dond/qwen3.5-4b-colocated.yaml", "--train.colocate", "role"]
        + [f"--role{i}.{k}" + f" {v}" for i in (1, 2) for k, v in (("num_gpus_per_node", 4), ("num_engines", 4))],
    ),
    ("all: qwen3.5-4b-colocated.yaml, 8 GPUs", ["--config", "recipes/dond/qwen3.5-4b-colocated.yaml"]),
]
ASLEEP = "#bdbdbd"
COLORS = {  # (role index, kind) -> colour
    (0, "engines"): "#9ecae1",
    (0, "pool engines"): "#c6dbef",
    (0, "actor"): "#2171b5",
    (1, "engines"): "#fdae6b",
    (1, "pool engines"): "#fdd0a2",
    (1, "actor"): "#d94801",
}


def _bars(plan) -> list[tuple[str, list[list[tuple[str, float, str, bool]]]]]:
    """Per phase: per GPU, the (label, GiB, colour, state) segments stacked on it; state: ``""``, ``asleep`` (an
    engine) or ``resident`` (a DeepSpeed rank holding only its weights)."""
    from marti_ibrl.cluster.memory import GiB
    from marti_ibrl.cluster.placement import REFERENCE, gpu_map

    cfg = plan.cfg
    roles = [r.name for r in cfg.roles]
    where = gpu_map(cfg)
    n = plan.total_gpus
    if not plan.phases:  # separate: every component always resident on GPUs of its own
        gpus: list[list] = [[] for _ in range(n)]
        for u in plan.usages:
            c = u.component
            if c.kind == REFERENCE and not u.parts:
                continue
            kind = "actor" if c.kind in ("actor", REFERENCE) else c.kind
            label = f"{c.role} {c.kind}" + (" + reference" if c.kind == "actor" and c.group else "")
            for g in where[c]:
                gpus[g].append((label, u.total / GiB, COLORS[(roles.index(c.role), kind)], ""))
        return [("always (nothing sleeps)", gpus)]
    out = []
    for name in dict.fromkeys(pu.phase.name for pu in plan.phases):
        gpus = [[] for _ in range(n)]
        for pu in (pu for pu in plan.phases if pu.phase.name == name):
            owner = next(c for c in plan.components if c.group == pu.group and not c.shared)
            for key, value in pu.parts.items():
                role, kind = key.split(" ", 1)
                base = "engines" if kind == "engines" else "actor"
                state = "resident" if kind.endswith("(resident)") else ""
                state = "asleep" if kind == "engines" and not pu.phase.engines_awake else state
                for g in where[owner]:
                    gpus[g].append((key, value / GiB, COLORS[(roles.index(role), base)], state))
        title = name + (" (engines awake)" if name == "generation" else " (engines asleep)")
        out.append((title, gpus))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs/images/colocated_layouts.png"))
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from marti_ibrl.cluster.plan import make_plan
    from marti_ibrl.config import load_config

    panels = []
    for title, flags in LAYOUTS:
        argv = [a for f in flags for a in f.split(" ")] + MODEL
        plan = make_plan(load_config(argv, assumed=[]), gpus_per_node=8, gpu_memory_gib=80)
        together = {True: "; both roles' updates at once", False: "; one role's update after the other"}
        note = together.get(plan.updates_together, "") if plan.cfg.train.colocate == "all" else ""
        for phase, gpus in _bars(plan):
            panels.append((f"{title}: {phase}{note if 'training' in phase else ''}", gpus))

    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 2.1 * len(panels)), constrained_layout=True)
    roles = ("agent1", "agent2")
    for ax, (title, gpus) in zip(axes, panels):
        width = 0.8 if len(gpus) > 8 else 0.5
        for g, segments in enumerate(gpus):
            bottom = 0.0
            for _label, gib, color, state in segments:
                color = ASLEEP if state == "asleep" else color
                ax.bar(
                    g, gib, width, bottom=bottom, color=color, hatch="///" * (state == "resident"), edgecolor="white"
                )
                bottom += gib
        ax.axhline(80, color="black", lw=0.8, ls="--")
        ax.set_xlim(-0.6, 31.6 if len(gpus) > 8 else 7.6)
        ax.set_ylim(0, 85)
        ax.set_xticks(range(len(gpus)))
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylabel("GiB per GPU")
        ax.set_title(title, loc="left", fontsize=10)
    axes[-1].set_xlabel("GPU (dashed line: 80 GiB)")
    names = {"engines": "engines", "pool engines": "pool engines", "actor": "actor + reference"}
    handles = [Patch(color=c, label=f"{roles[i]} {names[kind]}") for (i, kind), c in COLORS.items()]
    handles += [
        Patch(color=ASLEEP, label="an engine asleep"),
        Patch(
            facecolor="#2171b5",
            hatch="///",
            edgecolor="white",
            label="DeepSpeed ranks: weights only\n(states offloaded)",
        ),
    ]
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
