"""``marti-ibrl export-merged ADAPTER OUT``: a LoRA role's adapter merged into its base (:mod:`marti_ibrl.lora`)."""

from __future__ import annotations

import argparse
import sys


def cmd_export_merged(args: argparse.Namespace) -> int:
    from pathlib import Path

    from marti_ibrl.checkpoints import checkpoint_problem
    from marti_ibrl.lora import adapter_base, export_merged

    try:
        base = adapter_base(args.adapter, args.base)
        for flag, path in (("ADAPTER", args.adapter), ("--base", base)):  # headers only, before any weight is read
            if why := checkpoint_problem(path):
                raise ValueError(f"{flag}: {why}")
        out = Path(args.out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.overwrite:
            raise ValueError(f"OUT: {out} exists and is not empty; choose another or pass --overwrite")
    except ValueError as e:
        print(f"marti-ibrl export-merged: error: {e}", file=sys.stderr)
        return 2
    out = export_merged(base, args.adapter, args.out, args.dtype)
    print(f"wrote {out} ({base} + {args.adapter}, merged)")
    return 0


def add_export_merged_parser(sub) -> None:
    merged = sub.add_parser(
        "export-merged",
        help="a LoRA role's adapter merged into its base: an ordinary HF checkpoint",
        description="ADAPTER: a peft directory (RUN/ROLE/hf, RUN/pool/ROLE/vNNNNNN); the base defaults to the one its "
        "adapter_config.json names (the role's --roleN.pretrain).",
    )
    merged.add_argument("adapter")
    merged.add_argument("out")
    merged.add_argument("--base", default=None, help="base checkpoint (default: the adapter's base_model_name_or_path)")
    merged.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    merged.add_argument("--overwrite", action="store_true", help="write into OUT even when it holds files")
    merged.set_defaults(func=cmd_export_merged)
