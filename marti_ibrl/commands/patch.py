"""``marti-ibrl patch apply | check | revert | export``: our OpenRLHF patches (:mod:`marti_ibrl.patching`,
:mod:`marti_ibrl.patch_export`)."""

from __future__ import annotations

import argparse
import sys


def cmd_patch(args: argparse.Namespace) -> int:
    from marti_ibrl.patching import PatchError
    from marti_ibrl.patching import main as patch_main

    try:
        if args.action == "export":
            from marti_ibrl.patch_export import main as export_main

            return export_main(args.check, args.against, args.out)
        return patch_main(args.action, args.root)
    except PatchError as e:
        print(f"marti-ibrl patch: error: {e}", file=sys.stderr)
        return 2


def add_patch_parser(sub) -> None:
    patch = sub.add_parser("patch", help="apply / check / revert our OpenRLHF patches; export: git am them upstream")
    patch.add_argument("action", choices=["apply", "check", "revert", "export"])
    patch.add_argument("--root", help="directory holding the openrlhf package (default: the installed one)")
    patch.add_argument("--check", action="store_true", help="export: also run OpenRLHF's suite on the series")
    patch.add_argument("--against", help="export: your OpenRLHF git checkout (default: the pristine wheel)")
    patch.add_argument("--out", help="export: keep the git repository here (a new or empty directory)")
    patch.set_defaults(func=cmd_patch)
