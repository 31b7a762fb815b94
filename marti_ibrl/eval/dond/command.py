"""``marti-ibrl eval --env dond``: Deal-or-No-Deal's evaluation hook (:func:`evaluate`), around
:class:`~marti_ibrl.eval.evaluator.Evaluator`: the pairs to play, the checks made before any engine starts, the
protocol from ``--run``, the claim on ``--out``, then the episodes and ``tables.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from marti_ibrl.eval.pairs import (  # noqa: F401 (SETTINGS: re-exported for the tests)
    SETTINGS,
    check_models,
    check_names,
    claim_out,
    evaluation,
    merge_adapters,
    pairs_for,
    play,
    policies_of,
    record_played,
)
from marti_ibrl.eval.run_config import TRAINED_SETTINGS, setting_defaults
from marti_ibrl.eval.run_config import apply_run_settings as apply_settings

RUN_SETTINGS = {
    # eval flag's dest: the training config's key
    "prompt_style": "env.prompt_style",
    "bot_speech": "env.bot_speech",
    "show_complement": "env.show_complement",
    **TRAINED_SETTINGS,
}
"""The evaluation settings a policy's training fixed: the protocol it learned (prompt, bot speech, offers shown,
rounds) and its sampling. ``--run`` takes them from the run's ``config.yaml``; without it they are training's
defaults (:func:`run_setting_defaults`), the paper's protocol."""


def run_setting_defaults() -> dict[str, Any]:
    """:data:`RUN_SETTINGS`' values in the training schema: one source for the defaults of ``train`` and ``eval``."""
    return setting_defaults(RUN_SETTINGS)


def apply_run_settings(args) -> str | None:
    """Fill every :data:`RUN_SETTINGS` flag not given: from ``--run RUN``'s ``config.yaml`` (``ValueError`` unless
    it is a DoND training run), else training's default (:func:`marti_ibrl.eval.run_config.apply_run_settings`)."""
    return apply_settings(args, RUN_SETTINGS, args.env or "dond")


def plan(args) -> tuple[list, list[tuple]]:
    """The (policy, counterpart) pairs to play, with each pair's role in the tables; validates names."""
    if any(getattr(args, dest, None) is None for dest in RUN_SETTINGS):  # not yet filled (cmd_eval fills and prints)
        apply_run_settings(args)
    policies = policies_of(args)
    pairs = pairs_for(args, policies)
    if args.batch < 1 or args.num_engines < 1 or args.num_scenarios < 1:
        raise ValueError("--batch, --num-engines and -n must be >= 1")
    check_sampling(args)
    check_names(args, policies, pairs)
    return policies, pairs


def check_sampling(args) -> None:
    """The sampling flags' ranges (an engine or an endpoint would refuse them mid-run)."""
    if not args.temperature >= 0:
        raise ValueError(f"--temperature must be >= 0 (0: greedy), got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must lie in (0, 1], got {args.top_p}")
    if args.max_new_tokens < 1 or args.max_len <= args.max_new_tokens:
        raise ValueError(f"need 1 <= --max-new-tokens < --max-len, got {args.max_new_tokens} and {args.max_len}")
    if args.samples < 1 or args.max_rounds < 1:
        raise ValueError(f"--samples and --max-rounds must be >= 1, got {args.samples} and {args.max_rounds}")
    if args.max_resamples < 0:
        raise ValueError(f"--max-resamples must be >= 0, got {args.max_resamples}")


def evaluate(args) -> int:
    """``marti-ibrl eval --env dond`` (the hook of DoND's :class:`~marti_ibrl.envs.spec.EnvSpec`): every check before
    any engine starts, then the episodes (resumable), ``pairs.json``, ``endpoints.json`` and ``tables.md``."""
    if not args.policy:
        print("marti-ibrl eval: error: give --policy NAME=PATH (or --human-db FILE)", file=sys.stderr)
        return 2
    try:
        settings = apply_run_settings(args)
        if settings:
            print(settings, file=sys.stderr)
        policies, pairs = plan(args)
        check_models(pairs)
        from marti_ibrl.cluster.device import resolve_device

        resolve_device(args.device, "--device")  # before any work: the engines start later, when first needed
        env, scenarios = _env_and_scenarios(args)  # (a --data file that is not in Lewis format: one line)
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file; give a directory (it will hold episodes/, tables.md, ...)")
        claim_out(out, args, pairs)
    except ValueError as e:
        print(f"marti-ibrl eval: error: {e}", file=sys.stderr)
        return 2
    from marti_ibrl.eval.report import write_tables

    try:
        pairs = merge_adapters(pairs, out / "merged")
    except ValueError as e:
        print(f"marti-ibrl eval: error: {e}", file=sys.stderr)
        return 2
    with evaluation(args, env, scenarios, pairs) as ev:
        results = play(ev, pairs, out / "episodes", samples=args.samples)
    record_played(out, results, ev)
    print(write_tables(out))
    return 0


def _env_and_scenarios(args):
    from marti_ibrl.envs.dond import DondEnv, generate_scenarios, load_lewis_file

    env = DondEnv(
        max_rounds=args.max_rounds,
        prompt_style=args.prompt_style,
        bot_speech=args.bot_speech,
        show_complement=args.show_complement,
    )
    if args.data:
        try:
            scenarios = load_lewis_file(args.data)[: args.num_scenarios]
        except ValueError as e:  # (a file that cannot be read too)
            raise ValueError(f"--data {e}") from None
    else:
        scenarios = generate_scenarios(args.num_scenarios, args.scenario_seed)
    return env, [(s.uid, s) for s in scenarios]
