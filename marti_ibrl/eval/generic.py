"""``marti-ibrl eval`` of any environment (a registered one without its own evaluation, or ``module:Class``): frozen
policies against frozen checkpoints, endpoints, themselves and each other, scored by the environment's own rewards.

The environment and its protocol come from ``--run RUN``'s ``config.yaml`` (its ``env`` section as trained; the flags
``--max-rounds``, ``--max-resamples``, ``--data`` and the sampling flags override it, and the line printed says
which). Its scenarios are the environment's own (``factory(env, --scenario-seed)``, the first ``-n``).

A policy plays the role its checkpoint was trained in (a run's ``ROLE/hf``: the path names the role; else
``--policy-role NAME=ROLE``), or every role where the roles are interchangeable (:attr:`EnvSpec.interchangeable_roles
<marti_ibrl.envs.spec.EnvSpec.interchangeable_roles>`); a counterpart plays every other role. Episodes are
:class:`~marti_ibrl.eval.evaluator.Evaluator`'s (resumable JSONL, one line per finished episode); the tables
(:func:`summarize`) give per role the policy's mean reward with a 95% confidence interval, the counterpart's, and
the outcome counts (agreed, malformed, malformed by the policy's own turn, failed, truncated), seat-averaged where
the roles are interchangeable. DoND's Table-2 metrics (:mod:`marti_ibrl.eval.dond`) extend the same episodes.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.eval.pairs import (
    KINDS,
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
from marti_ibrl.eval.run_config import TRAINED_SETTINGS, apply_run_settings

RUN_SETTINGS = TRAINED_SETTINGS
"""What a policy's training fixed and an evaluation of any environment keeps (:data:`marti_ibrl.eval.run_config.TRAINED_SETTINGS`)."""
DOND_ONLY = {"prompt_style": "--prompt-style", "bot_speech": "--bot-speech", "show_complement": "--show-complement"}


def evaluate(args, spec) -> int:
    """``marti-ibrl eval`` of ``spec``, an environment without an evaluation of its own: every check before any
    engine starts, then the episodes (resumable), ``pairs.json``, ``summary.json`` and ``tables.md``."""

    def error(why: str) -> int:
        print(f"marti-ibrl eval: error: {why}", file=sys.stderr)
        return 2

    if not args.policy:
        return error("give --policy NAME=PATH (a run's ROLE/hf)")
    try:
        given = [flag for dest, flag in DOND_ONLY.items() if getattr(args, dest) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: DoND's protocol flags; {spec.name} has none")
        line = apply_run_settings(args, RUN_SETTINGS, spec.name)
        if line:
            print(line, file=sys.stderr)
        env, scenarios = env_and_scenarios(args, spec)
        policies, pairs, roles_of = plan(args, spec)
        check_models(pairs)
        from marti_ibrl.cluster.device import resolve_device

        resolve_device(args.device, "--device")
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file; give a directory (it will hold episodes/, tables.md, ...)")
        claim_out(out, args, pairs)
        pairs = merge_adapters(pairs, out / "merged")
    except ValueError as e:
        return error(str(e))
    with evaluation(args, env, scenarios, pairs, roles_of) as ev:
        results = play(ev, pairs, out / "episodes", samples=args.samples)
    record_played(out, results, ev)
    print(write_tables(out, list(env.roles), spec.interchangeable_roles))
    return 0


def env_and_scenarios(args, spec) -> tuple[Any, list[tuple[str, Any]]]:
    """The environment as ``--run`` trained it (its ``env`` section; flags override the rounds, re-samples and
    ``--data``) and the first ``-n`` of its scenarios for ``--scenario-seed``."""
    from omegaconf import OmegaConf

    from marti_ibrl.config.schema import EnvConfig
    from marti_ibrl.eval.run_config import read_run_config

    env_cfg = OmegaConf.structured(EnvConfig)
    if args.run:
        path, cfg = read_run_config(args.run)
        trained = OmegaConf.select(cfg, "env", default=None)
        try:
            env_cfg = OmegaConf.merge(env_cfg, trained or {})
        except Exception as e:  # a key the schema does not have, a wrong type: edited by hand
            raise ValueError(
                f"--run {args.run}: {path}: its env section does not load ({' '.join(str(e).split())})"
            ) from None
    env_cfg.name, env_cfg.max_rounds, env_cfg.max_resamples = spec.name, args.max_rounds, args.max_resamples
    env_cfg.num_scenarios = args.num_scenarios  # (an env that generates its scenarios makes no more than -n)
    if args.data:
        env_cfg.data = args.data
    env_cfg = OmegaConf.to_object(env_cfg)
    try:
        env, scenarios = spec.factory(env_cfg, args.scenario_seed)
    except (ValueError, OSError) as e:  # the env's scenario loader refused --data / its file
        raise ValueError(f"{spec.name}: its scenarios: {e}") from None
    scenarios = list(scenarios)[: args.num_scenarios]
    if not scenarios:
        raise ValueError(f"{spec.name}: no scenarios to play (its factory returned none)")
    return env, scenarios


def plan(args, spec) -> tuple[list, list[tuple], dict[str, tuple[str, ...]]]:
    """The policies, the (policy, counterpart, kind) pairs and the roles each policy plays (:func:`policy_roles`)."""
    from marti_ibrl.eval.pairs import check_spec

    def check(text: str) -> None:
        if text.split(":", 1)[0] in ("bot", "heldout"):
            raise ValueError(f"{text}: {spec.name} has no scripted players; give checkpoint:PATH or endpoint:...")
        check_spec(text)

    policies = policies_of(args)
    if args.self_play and not spec.interchangeable_roles:
        raise ValueError(f"--self-play: {spec.name}'s roles {list(spec.roles)} play different games")
    chosen = dict(_policy_role(text, [p.name for p in policies], spec.roles) for text in args.policy_role)
    roles_of = {p.name: policy_roles(p, spec.roles, spec.interchangeable_roles, chosen.get(p.name)) for p in policies}
    pairs = pairs_for(args, policies, check)
    # cross-play: a policy meets another only in a role it does not play itself
    pairs = [
        (p, c, kind)
        for p, c, kind in pairs
        if kind != "cross-play" or set(spec.roles) - set(roles_of[p.name]) & set(roles_of[c.name.split(":", 1)[1]])
    ]
    if not pairs:
        raise ValueError("nothing to play: the policies all play the same role (give --counterpart or --in-system)")
    if args.batch < 1 or args.num_engines < 1 or args.num_scenarios < 1:
        raise ValueError("--batch, --num-engines and -n must be >= 1")
    check_names(args, policies, pairs)
    return policies, pairs, roles_of


def _policy_role(text: str, names: Sequence[str], roles: Sequence[str]) -> tuple[str, str]:
    name, eq, role = text.partition("=")
    if not eq or name not in names or role not in roles:
        raise ValueError(
            f"--policy-role {text}: expected POLICY=ROLE with POLICY one of {list(names)}, ROLE of {roles}"
        )
    return name, role


def policy_roles(policy, roles: Sequence[str], interchangeable: bool, chosen: str | None = None) -> tuple[str, ...]:
    """The roles ``policy`` plays: ``chosen`` (``--policy-role``), else the one role its path names (a run's
    ``ROLE/hf``), else every role where they are interchangeable; ValueError otherwise."""
    if chosen:
        return (chosen,)
    parts = Path(policy.spec.removeprefix("checkpoint:")).parts
    named = [r for r in roles if r in parts]
    if len(named) == 1:
        return (named[0],)
    if interchangeable:
        return tuple(roles)
    raise ValueError(
        f"--policy {policy.name}: which role does it play? its path names {'none' if not named else 'several'} of "
        f"{list(roles)} (a run's ROLE/hf does): add --policy-role {policy.name}=ROLE"
    )


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """Mean and its ``level`` t-interval (statsmodels); (None, None, None) without values, the mean alone for one."""
    if not values:
        return None, None, None
    m = sum(values) / len(values)
    if len(values) < 2 or max(values) == min(values):
        return m, (m if len(values) > 1 else None), (m if len(values) > 1 else None)
    from statsmodels.stats.weightstats import DescrStatsW

    lo, hi = DescrStatsW(values).tconfint_mean(alpha=1 - level)
    return m, float(lo), float(hi)


def summarize_role(episodes: Iterable[Mapping[str, Any]], role: str) -> dict[str, Any]:
    """The episodes in which the policy played ``role``: its mean reward (95% CI), the counterparts' mean reward,
    counts and rates of each outcome, the endings' reasons."""
    eps = [e for e in episodes if e["policy_role"] == role]
    n = len(eps)
    mine = [float(e["rewards"][role]) for e in eps]
    theirs = [sum(float(v) for r, v in e["rewards"].items() if r != role) / max(1, len(e["rewards"]) - 1) for e in eps]
    m, lo, hi = mean_ci(mine)
    counts = {
        "agreed": sum(bool(e["agreed"]) for e in eps),
        "malformed": sum(bool(e["malformed"]) for e in eps),
        "malformed_by_policy": sum(bool(e["malformed"]) and e.get("fault_role") == role for e in eps),
        "failed": sum(bool(e["failed"]) for e in eps),
        "truncated": sum(bool(e.get("truncated")) for e in eps),
    }
    return {
        "n": n,
        "reward": m,
        "reward_ci": [lo, hi],
        "counterpart_reward": mean_ci(theirs)[0],
        **{k: v for k, v in counts.items()},
        **{f"{k}_rate": (v / n if n else None) for k, v in counts.items()},
        "reasons": dict(Counter(e.get("reason") or "" for e in eps).most_common()),
    }


AVERAGED = ("reward", "counterpart_reward", "agreed_rate", "malformed_rate", "malformed_by_policy_rate", "failed_rate")


def summarize(episodes: Iterable[Mapping[str, Any]], roles: Sequence[str], interchangeable: bool) -> dict[str, Any]:
    """Per role the policy played (:func:`summarize_role`), and where the roles are interchangeable and it played
    several, ``averaged``: each of :data:`AVERAGED` as the mean over those roles (seat-averaged, as DoND's Table 2)."""
    episodes = list(episodes)
    played = [r for r in roles if any(e["policy_role"] == r for e in episodes)]
    out: dict[str, Any] = {"roles": {r: summarize_role(episodes, r) for r in played}}
    if interchangeable and len(played) > 1:
        per = out["roles"].values()
        out["averaged"] = {"n": sum(s["n"] for s in per)} | {
            k: None if any(s[k] is None for s in per) else sum(s[k] for s in per) / len(played) for k in AVERAGED
        }
    return out


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _cell(s: Mapping[str, Any]) -> str:
    ci = s.get("reward_ci")
    interval = f" [{_f(ci[0])}, {_f(ci[1])}]" if ci and ci[0] is not None else ""
    return (
        f"{_f(s['reward'])}{interval} · {_f(s['counterpart_reward'])} · agreed {_f(s['agreed_rate'])} · "
        f"malformed {_f(s['malformed_rate'])} (own {_f(s['malformed_by_policy_rate'])}) · n {s['n']}"
    )


def tables_markdown(pairs: Sequence[Mapping[str, Any]], roles: Sequence[str]) -> str:
    """One table per kind of pair: a row per (policy, role played), a column per counterpart."""
    parts = [
        "Cells: the policy's mean reward [95% CI] · the counterpart's mean reward · agreed rate · malformed rate "
        "(own: ended on the policy's turn) · episodes. *averaged*: the mean over the roles (interchangeable roles)."
    ]
    for kind in KINDS:
        mine = [p for p in pairs if p["kind"] == kind]
        if not mine:
            continue
        columns = list(dict.fromkeys(p["counterpart"] for p in mine))
        rows = [["policy", "role", *columns]]
        for policy in dict.fromkeys(p["policy"] for p in mine):
            by = {p["counterpart"]: p["summary"] for p in mine if p["policy"] == policy}
            seen = [r for r in [*roles, "averaged"] if any(_part(s, r) for s in by.values())]
            for r in seen:
                rows.append(
                    [policy, r, *(_cell(_part(by[c], r)) if c in by and _part(by[c], r) else "" for c in columns)]
                )
        head, *body = rows
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(b) + " |" for b in body)]
        parts += ["", f"## {kind}", "", *lines]
    return "\n".join(parts) + "\n"


def _part(summary: Mapping[str, Any], role: str) -> Mapping[str, Any] | None:
    return summary.get("averaged") if role == "averaged" else summary["roles"].get(role)


def write_tables(eval_dir: str | Path, roles: Sequence[str], interchangeable: bool) -> str:
    """``summary.json`` and ``tables.md`` of an eval directory (``pairs.json`` and ``episodes/``); the tables."""
    from marti_ibrl.eval.episodes import read_episodes

    eval_dir = Path(eval_dir)
    pairs = json.loads((eval_dir / "pairs.json").read_text())
    for p in pairs:
        p["summary"] = summarize(read_episodes(eval_dir / "episodes" / p["file"]), roles, interchangeable)
    (eval_dir / "summary.json").write_text(json.dumps(pairs, indent=1))
    text = tables_markdown(pairs, roles)
    (eval_dir / "tables.md").write_text(text)
    return text
