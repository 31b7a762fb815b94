"""``marti-ibrl eval``: frozen policies against counterparts, through the environment's evaluation hook
(:attr:`EnvSpec.evaluate <marti_ibrl.envs.spec.EnvSpec.evaluate>`; DoND's: :mod:`marti_ibrl.eval.dond.command`).

    marti-ibrl eval --policy ibrl=runs/ibrl/agent1/hf --policy uni=runs/uni/agent1/hf \\
        --in-system ibrl=checkpoint:runs/ibrl/agent2/hf --in-system uni=bot:greedy \\
        --counterpart heldout:hardliner --counterpart heldout:tit_for_tat \\
        --self-play --cross-play -n 1000 --out runs/eval

Writes ``OUT/episodes/*.jsonl`` (resumable), ``OUT/summary.json`` and ``OUT/tables.md``; ``marti-ibrl
report`` turns them into ``report.md`` with statistics and figures.

    marti-ibrl eval --human-db people.sqlite --out runs/human-eval

turns the games people played in the browser (``marti-ibrl play``) into the same files, plus ``statistics.md``
(:mod:`marti_ibrl.people.human_eval`).
"""

from __future__ import annotations

import argparse
import errno
import sys

from marti_ibrl.commands.argtypes import MAX_SAMPLES, MAX_SCENARIOS, float_range, int_range, path_arg
from marti_ibrl.eval.dond.command import run_setting_defaults
from marti_ibrl.eval.engines import add_engine_argument


def evaluable_envs() -> list[str]:
    """The environments ``marti-ibrl eval --env`` evaluates: those whose registry spec has an ``evaluate`` hook
    (TeleSales evaluates with its own simulator and rubric: ``marti-ibrl telesales eval``)."""
    from marti_ibrl.envs import registry

    return [spec.name for spec in registry.specs() if spec.evaluate is not None]


def cmd_eval(args) -> int:
    """The evaluation of :func:`evaluate`, with ``--out`` this process's alone while it runs (a second ``eval`` into
    the same ``--out`` refuses in one line naming the first: :class:`marti_ibrl.outputs.OutputLock`)."""
    from pathlib import Path

    from marti_ibrl.outputs import OutputInUse, OutputLock

    if Path(args.out).exists() and not Path(args.out).is_dir():
        return evaluate(args)  # (refused there in one line; nothing to lock)
    try:
        lock = OutputLock(args.out, "--out").acquire()
    except OutputInUse as e:
        return _error(str(e))
    except OSError as e:  # a file on the way, no permission, ...
        return _error(f"--out {args.out}: cannot make the directory ({e.strerror or e})")
    try:
        code = evaluate(args)
        if code == 0 and args.run and Path(args.out).resolve() == (Path(args.run) / "eval").resolve():
            from marti_ibrl.eval.report import refresh_report

            if line := refresh_report(args.run, "evaluation"):  # the run's report reads RUN/eval
                print(line)
        return code
    except OSError as e:  # the disk filled up (or went read-only) under the episodes: every finished one is kept
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):
            raise
        print(
            f"marti-ibrl eval: error: --out {args.out}: {e.strerror} ({e.filename or 'writing'}); every finished "
            "episode is kept: make room and run the same command again to resume",
            file=sys.stderr,
        )
        return 4
    finally:
        lock.release()


def evaluate(args) -> int:
    """``--human-db``: the games people played, as tables; else the environment's evaluation (``--env``, else
    ``--run``'s environment, else the first that has one)."""
    if args.human_db:
        from marti_ibrl.people.human_eval import write_human_eval

        if args.policy or args.counterpart or args.in_system or args.self_play or args.cross_play:
            return _error("--human-db reads played games: give no policies or counterparts")
        try:
            print(write_human_eval(args.human_db, args.out, args.reference), end="")
        except (FileNotFoundError, ValueError) as e:
            return _error(str(e))
        return 0
    from marti_ibrl.envs import registry
    from marti_ibrl.eval.run_config import run_env_name

    try:
        if args.env is None:
            args.env = run_env_name(args.run) if args.run else evaluable_envs()[0]
    except ValueError as e:  # --run's config.yaml missing or unreadable (the message names --run)
        return _error(str(e))
    try:
        spec = registry.get(args.env)
    except (ValueError, ImportError, AttributeError, TypeError) as e:  # a module:Class that does not load, too
        return _error(f"--env {args.env}: {e}")
    if spec.evaluate is None and spec.commands is not None:  # TeleSales: its simulator and rubric
        where = f"--run {args.run}: a {args.env} run" if args.run else f"--env {args.env}"
        own = f"{args.env}'s own commands: marti-ibrl {args.env} --help"
        return _error(f"{where}; marti-ibrl eval evaluates {', '.join(evaluable_envs())} ({own})")
    if spec.evaluate is None:  # any other environment: its own rewards (marti_ibrl/eval/generic.py)
        from marti_ibrl.eval.generic import evaluate as evaluate_any

        return evaluate_any(args, spec)
    if args.policy_role:
        return _error(f"--policy-role: {args.env}'s policies play every role (its roles are interchangeable)")
    return spec.evaluate(args)


def _error(why: str) -> int:
    print(f"marti-ibrl eval: error: {why}", file=sys.stderr)
    return 2


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval",
        help="evaluate frozen policies against counterparts (seat-averaged, JSONL, resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_players(p)
    _add_scenarios_and_protocol(p)
    _add_engines_and_output(p)
    p.set_defaults(func=cmd_eval)
    return p


def _add_players(p: argparse.ArgumentParser) -> None:
    """Who plays: the policies, their counterparts and the pairings (or people's games instead)."""
    p.add_argument("--policy", action="append", default=[], metavar="NAME=PATH", help="HF checkpoint to evaluate")
    p.add_argument(
        "--human-db",
        default=None,
        metavar="FILE",
        help="instead of playing: the DoND games people played (`marti-ibrl play --db FILE`) as this evaluation's "
        "tables, with GEE statistics clustered by participant and by scenario",
    )
    p.add_argument("--reference", default=None, help="--human-db: the reference policy of the GEE (default: first)")
    p.add_argument(
        "--counterpart",
        action="append",
        default=[],
        metavar="[NAME=]SPEC",
        help="held-out counterpart: heldout:NAME, bot:NAME, checkpoint:PATH, endpoint:MODEL@URL[#KEY_ENV]",
    )
    p.add_argument(
        "--in-system",
        action="append",
        default=[],
        metavar="POLICY=SPEC",
        help="the policy's training counterpart (for Δmismatch = J_in-system − J_held-out); repeat it for a "
        "policy trained against a pool of counterparts (J_in-system is then their mean)",
    )
    p.add_argument(
        "--policy-role",
        action="append",
        default=[],
        metavar="POLICY=ROLE",
        help="the role a policy plays, where its path does not name it (a run's ROLE/hf does) and the roles are not "
        "interchangeable (environments without an evaluation of their own)",
    )
    p.add_argument("--self-play", action="store_true", help="also play each policy against itself")
    p.add_argument("--cross-play", action="store_true", help="also play every policy against every other policy")


def _add_scenarios_and_protocol(p: argparse.ArgumentParser) -> None:
    """The scenarios played, and the protocol and sampling flags (defaulting to the training run's)."""
    p.add_argument(
        "--env",
        default=None,
        help=f"the environment (default: --run's, else {evaluable_envs()[0]}); {', '.join(evaluable_envs())} with "
        "its own metrics, any other (registered or module:Class) by its rewards (docs/evaluation.md)",
    )
    p.add_argument("--data", default=None, help="Lewis-format test file (default: generated scenarios)")
    p.add_argument("-n", "--num-scenarios", type=int_range(1, MAX_SCENARIOS), default=1000)
    p.add_argument("--scenario-seed", type=int, default=20260, help="generator seed (not the training seed)")
    p.add_argument("--samples", type=int_range(1, MAX_SAMPLES), default=1, help="episodes per scenario and seat")
    p.add_argument(
        "--run",
        default=None,
        metavar="RUN",
        help="the training run the policies come from: the protocol and sampling flags below default to its "
        "config.yaml (what the policy learned); flags given explicitly override it, and both are printed",
    )
    # default None: the value comes from --run's config, else training's default (apply_run_settings)
    default = {dest: f"default: --run's, else {value}" for dest, value in run_setting_defaults().items()}
    p.add_argument("--prompt-style", default=None, choices=["paper", "compact"], help=default["prompt_style"])
    p.add_argument(
        "--bot-speech", default=None, choices=["natural", "markers"], help=f"how bots speak ({default['bot_speech']})"
    )
    p.add_argument(
        "--show-complement",
        action="store_true",
        default=None,
        help="show offers with the units they leave the listener (as training with --env.show_complement true)",
    )
    p.add_argument("--max-rounds", type=int_range(1), default=None, help=default["max_rounds"])
    p.add_argument(
        "--max-resamples",
        type=int_range(0),
        default=None,
        help=f"re-samples of a malformed turn before it counts as no deal ({default['max_resamples']})",
    )
    p.add_argument("--temperature", type=float_range(0), default=None, help=default["temperature"])
    p.add_argument("--top-p", type=float_range(0, 1, lo_open=True), default=None, help=default["top_p"])
    p.add_argument("--max-new-tokens", type=int_range(1), default=None, help=default["max_new_tokens"])
    p.add_argument("--max-len", type=int_range(2), default=None, help=default["max_len"])


def _add_engines_and_output(p: argparse.ArgumentParser) -> None:
    """The engines that serve the checkpoints, and where the episodes go."""
    p.add_argument("--num-engines", type=int_range(1), default=1, help="rollout engines per checkpoint")
    p.add_argument(
        "--batch", type=int_range(1), default=64, help="episodes played concurrently (split across the engines)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    add_engine_argument(p)
    p.add_argument("--out", required=True, type=path_arg, help="output directory")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="--out holds another evaluation's episodes (other settings or policies): delete them and play afresh "
        "(without it the eval refuses; the same evaluation always resumes)",
    )
