"""``marti-ibrl``: train | plan | eval | diagnose | report | show | demo | patch | model | export-merged | play | annotate, and
the environments' own (``dond sample / check-data``, ``telesales sft / profiles / eval``), ``sft`` (any game's warm start).

Every subcommand lives in :mod:`marti_ibrl.commands`, one module each (its parser ``add_*_parser(sub)`` and its
handler, stored as ``args.func``), added by :func:`build_parser`; the environments' are added by their registry
specs (:attr:`EnvSpec.commands <marti_ibrl.envs.spec.EnvSpec.commands>`). ``main(argv)`` parses and runs the
handler. Heavy imports (torch, Ray, OpenRLHF) happen only in the command that needs them, so ``--help`` and
config errors are instant.
"""

from __future__ import annotations

import argparse
import sys

from marti_ibrl import stopping

DESCRIPTION = "IB-RL: two LLM policies trained together, each with its own reward, groups, optimizer and pools."


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (the usage is one ``--help`` away) and exit 2; every subcommand's
    parser is one too (``add_subparsers`` makes its parsers of the parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand, in ``--help`` order: training, the environments' own, planning, evaluation, the rest."""
    from marti_ibrl.commands import demo, diagnose, export_merged, model, patch, people, plan, report, sft, show, train
    from marti_ibrl.commands import eval as evaluation
    from marti_ibrl.envs import registry

    parser = Parser(prog="marti-ibrl", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    train.add_train_parser(sub)
    for spec in registry.specs():  # each environment's own subcommands
        if spec.commands is not None:
            spec.commands(sub)
    plan.add_plan_parser(sub)
    evaluation.add_eval_parser(sub)
    diagnose.add_diagnose_parser(sub)
    report.add_report_parser(sub)
    show.add_show_parser(sub)
    demo.add_demo_parser(sub)
    sft.add_sft_parser(sub)
    patch.add_patch_parser(sub)
    model.add_model_parser(sub)
    export_merged.add_export_merged_parser(sub)
    people.add_people_parsers(sub)
    return parser


STOPPED_ANY = "what it finished is kept"
STOPPED = {  # what a command stopped by SIGTERM kept, and how to go on
    "train": "every committed iteration is kept: resume with the same flags and --ckpt.load_enable true",
    "demo": "every committed iteration is kept: `make demo` again starts over in its own directory",
    "eval": "every finished episode is kept: the same command with the same --out continues",
    "play": "every finished game is kept in its database",
    "annotate": "every label is kept in its database",
}


def main(argv: list[str] | None = None) -> int:
    from marti_ibrl import quiet

    quiet.install()  # the start-up notices nobody can act on (pynvml, Ray's tip, DeepSpeed's CPU line)
    parser = build_parser()
    try:  # a usage error is one line and exit 2 (Parser.error), --help exit 0: returned, as a handler's code
        args, rest = parser.parse_known_args(argv)
        if getattr(args, "dotted_flags", False):  # set by the parsers that read --section.key flags
            args.flags = rest  # dotted flags are the config's business (marti_ibrl.config.load_config)
        elif rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    try:
        with stopping.installed():  # SIGTERM: the command's own cleanup, then one line and exit 4
            return int(args.func(args) or 0)
    except stopping.Terminated:
        sys.stdout.flush()  # what the command printed comes first (a file's buffer would follow the line otherwise)
        print(f"marti-ibrl {args.command}: stopped by SIGTERM; {STOPPED.get(args.command, STOPPED_ANY)}",
              file=sys.stderr, flush=True)  # fmt: skip
        return stopping.EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
