"""The `marti-ibrl plan --fit` section of docs/cluster.md: the best layout of each 32-GPU recipe on smaller allocations.

    .venv/bin/python scripts/plan_fit_table.py          # rewrite the section between its markers
    .venv/bin/python scripts/plan_fit_table.py --check  # exit 1 when the section is not what the planner says now

The recipes' checkpoints are sized by name (the planner's Qwen3.5-4B/9B table), so no checkpoint is needed;
tests/cluster/test_plan.py checks that the section is current and that every layout it proposes passes `plan --strict`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "cluster.md"
BEGIN, END = "<!-- plan-fit:begin (scripts/plan_fit_table.py) -->", "<!-- plan-fit:end -->"
RECIPES = ("dond/qwen3.5-4b", "dond/qwen3.5-9b", "telesales/qwen3.5-4b", "telesales/qwen3.5-9b")
ALLOCATIONS = ((4, 8, 80.0), (2, 8, 80.0), (1, 8, 80.0), (1, 4, 80.0), (1, 8, 40.0))


def recipe_flags(recipe: str) -> list[str]:
    """The recipe's YAML with its checkpoints named (sized from the planner's table) and a judge endpoint."""
    model = "/models/Qwen3.5-9B" if "9b" in recipe else "/models/Qwen3.5-4B"
    flags = ["--config", str(ROOT / "recipes" / f"{recipe}.yaml"), "--role1.pretrain", model, "--role2.pretrain", model]
    if recipe.startswith("telesales"):
        flags += ["--judge.base_url", "https://judge.example/v1", "--judge.model", "judge"]
    return flags


def section() -> str:
    from marti_ibrl.cluster.layouts import propose, smallest_fit
    from marti_ibrl.commands.plan import parse_flags

    rows = [
        "| recipe | allocation | best layout that fits (`plan --fit`, first of up to 5) | flags to add |",
        "|---|---|---|---|",
    ]
    for recipe in RECIPES:
        flags = recipe_flags(recipe)
        cfg, _ = parse_flags(flags, strict=False)
        for nodes, gpn, mem in ALLOCATIONS:
            alloc = dict(nodes=nodes, gpus_per_node=gpn, gpu_memory_gib=mem)
            where = f"{nodes} × {gpn} GPUs, {mem:g} GiB"
            found = propose(cfg, **alloc, config_file=flags[1], limit=1)
            if found:
                x = found[0]
                add = f"`{' '.join(x.flags)}`" if x.flags else "none (the recipe as it is)"
                rows.append(f"| `{recipe}` | {where} | {x.summary}; {x.idle} idle | {add} |")
                continue
            bigger = smallest_fit(cfg, **alloc, config_file=flags[1])
            said = f"nothing fits; smallest change: `{bigger[0]}`" if bigger else "nothing fits"
            rows.append(f"| `{recipe}` | {where} | {said} | |")
    return "\n".join([BEGIN, *rows, END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + section() + text[end:]
    if args.check:
        if new != text:
            print("docs/cluster.md: the plan --fit section is stale: run scripts/plan_fit_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
