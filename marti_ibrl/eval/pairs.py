"""What every ``marti-ibrl eval`` of frozen policies shares, whatever the environment: the named counterparts checked
before any engine starts, one episodes file per (policy, counterpart) pair, the claim on ``--out`` (resume the same
evaluation, refuse another's), the schedule that plays the pairs, LoRA adapters merged for serving.

DoND's evaluation (:mod:`marti_ibrl.eval.dond.command`) and any other environment's (:mod:`marti_ibrl.eval.generic`)
plan their pairs with :func:`pairs_for` and play them with :func:`play`.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

KINDS = ("in-system", "self-play", "cross-play", "held-out")
"""The kinds of (policy, counterpart) pairs :func:`pairs_for` makes, in the order the tables show them."""


def policies_of(args) -> list:
    """``--policy NAME=PATH`` as named ``checkpoint:PATH`` specs; ValueError unless each is a directory and the
    names are unique."""
    from marti_ibrl.eval.episodes import Named, parse_named
    from marti_ibrl.rollout.players import parse_player_spec

    policies = []
    for text in args.policy:
        named = parse_named(text)
        spec = named.spec if ":" in named.spec.split("/")[0] else f"checkpoint:{named.spec}"
        parsed = parse_player_spec(spec)
        if parsed["kind"] != "checkpoint" or not Path(parsed["path"]).is_dir():
            raise ValueError(f"--policy {text}: not a checkpoint directory")
        policies.append(Named(named.name, spec))
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"--policy: names must be unique, got {names}")
    return policies


def pairs_for(args, policies: list, check=None) -> list[tuple]:
    """The (policy, counterpart, kind) pairs to play: per policy its training counterparts (``--in-system``), itself
    (``--self-play``), the other policies (``--cross-play``), the held-out ``--counterpart``s. ``check(spec)``
    (default :func:`check_spec`) refuses a counterpart before any engine starts."""
    from marti_ibrl.eval.episodes import SELF, Named, parse_named

    check = check or check_spec
    names = [p.name for p in policies]
    pairs = []
    in_system: dict[str, list[str]] = {}
    for text in args.in_system:
        name, eq, spec = text.partition("=")
        if not eq or name not in names:
            raise ValueError(f"--in-system {text}: expected POLICY=SPEC with POLICY one of {names}")
        check(spec)
        in_system.setdefault(name, []).append(spec)
    counterparts = [parse_named(t) for t in args.counterpart]
    for c in counterparts:
        check(c.spec)
    for p in policies:
        pairs += [(p, c, "in-system") for c in in_system_counterparts(in_system.get(p.name, []))]
        if args.self_play:
            pairs.append((p, Named("self", SELF), "self-play"))
        if args.cross_play:
            pairs += [(p, Named(f"policy:{q.name}", q.spec), "cross-play") for q in policies if q.name != p.name]
        pairs += [(p, c, "held-out") for c in counterparts]
    if not pairs:
        raise ValueError("nothing to play: give --counterpart, --in-system, --self-play or --cross-play")
    return pairs


def check_names(args, policies: list, pairs: list[tuple]) -> None:
    """One episodes file per pair, and no counterpart named as a policy (the runner batches turns by name)."""
    from marti_ibrl.eval.episodes import parse_named

    names = [p.name for p in policies]
    counterparts = [parse_named(t) for t in args.counterpart]
    files = [episodes_file(p, c) for p, c, _ in pairs]
    clash = [c.name for c in counterparts if c.name in names] + [f for f in dict.fromkeys(files) if files.count(f) > 1]
    if clash:
        raise ValueError(f"counterpart names must differ from each other and from the policies (NAME=SPEC): {clash}")


def check_models(pairs: list[tuple]) -> None:
    """Every checkpoint of :func:`plan`'s pairs is a model (an engine would fail on it with a traceback, later)."""
    for p, c, kind in pairs:
        flag = {"in-system": "--in-system", "held-out": "--counterpart"}.get(kind, "--policy")
        for named in (p, c):
            if named.spec.startswith("checkpoint:"):
                check_model("--policy" if named is p else flag, named)


def check_model(flag: str, named) -> None:
    """``checkpoint:PATH`` is an HF model directory or a peft adapter that loads (:mod:`marti_ibrl.checkpoints`)."""
    from marti_ibrl.checkpoints import checkpoint_problem

    why = checkpoint_problem(named.spec.removeprefix("checkpoint:"))
    if why:
        raise ValueError(
            f"{flag} {named.name}: {why}; give a Hugging Face checkpoint directory such as runs/NAME/agent1/hf"
        )


def in_system_counterparts(specs: list[str]) -> list:
    """One training counterpart is ``in-system``; several (a pool) are ``in-system:BOT`` or ``in-system-K``."""
    from marti_ibrl.eval.episodes import Named
    from marti_ibrl.rollout.players import parse_player_spec

    if len(specs) == 1:
        return [Named("in-system", specs[0])]
    out = []
    for k, spec in enumerate(specs, 1):
        parsed = parse_player_spec(spec)
        name = f"in-system:{parsed['name']}" if parsed["kind"] in ("bot", "heldout") else f"in-system-{k}"
        out.append(Named(name, spec))
    return out


def check_spec(text: str) -> None:
    """A counterpart spec's syntax, and a bot's name, checked before any engine starts."""
    from marti_ibrl.rollout.players import make_player, parse_player_spec

    spec = parse_player_spec(text)
    if spec["kind"] in ("bot", "heldout"):
        make_player(spec)
    key = spec.get("api_key_env")
    if spec["kind"] == "endpoint" and key and not os.environ.get(key):
        raise ValueError(f"{text}: the API key variable {key} is not set (export {key}=... or drop '#{key}')")


def episodes_file(policy, counterpart) -> str:
    """The JSONL file of one (policy, counterpart) pair under OUT/episodes/."""
    return f"{policy.name}__{counterpart.name.replace(':', '-')}.jsonl"


SETTINGS = "eval_settings.json"
"""``OUT/eval_settings.json``: what made the episodes under ``OUT/episodes/`` (:func:`claim_out`)."""


EPISODE_SETTINGS = ("env", "data", "scenario_seed", "prompt_style", "bot_speech", "show_complement", "max_rounds",
                    "max_resamples", "temperature", "top_p", "max_new_tokens", "max_len", "seed")  # fmt: skip
"""The flags an episode depends on (not -n, --samples: more of them extend an evaluation; not --batch, --engine, ...:
how it is played)."""


RECORDED_BEFORE = {"max_resamples": 2}
"""Settings a record written before their flag existed lacks, and the value its episodes were played with."""


def claim_out(out: Path, args, pairs: list[tuple]) -> None:
    """Resume the evaluation in ``out``, or start one there; ValueError when ``out`` holds another evaluation's
    episodes: other :data:`EPISODE_SETTINGS`, or an episode file of a pair whose players are other checkpoints or
    counterparts (new pairs may join). ``--overwrite`` deletes that evaluation's episodes first. ``out`` made before
    :data:`SETTINGS` existed is taken as this evaluation's."""
    settings = {k: getattr(args, k) for k in EPISODE_SETTINGS}
    files = {episodes_file(p, c): [p.spec, c.spec] for p, c, _ in pairs}
    record = out / SETTINGS
    if record.is_file() and not args.overwrite:
        try:
            old = json.loads(record.read_text())
            if not (isinstance(old["settings"], dict) and isinstance(old["files"], dict)):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"{record} is not readable (edited by hand?): fix or delete it, or add --overwrite"
            ) from None
        changed = [
            f"{k} {old['settings'].get(k, RECORDED_BEFORE.get(k))!r} -> {v!r}"
            for k, v in settings.items()
            if old["settings"].get(k, RECORDED_BEFORE.get(k)) != v
        ]
        changed += [f"{f}: {old['files'][f]} -> {v}" for f, v in files.items() if old["files"].get(f, v) != v]
        if changed:
            raise ValueError(
                f"--out {out} holds another evaluation's episodes ({'; '.join(changed)}): resume it with its own "
                "settings, give another --out, or add --overwrite to delete them and play afresh"
            )
        files = {**old["files"], **files}
    elif args.overwrite:
        shutil.rmtree(out / "episodes", ignore_errors=True)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file on the way, no permission, ...
        raise ValueError(f"--out {out}: cannot make the directory ({e.strerror})") from None
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps({"settings": settings, "files": files}, indent=1, sort_keys=True))
    tmp.replace(record)


def play(ev, pairs: list[tuple], episodes: Path, samples: int = 1) -> list[dict]:
    """Play every (policy, counterpart, kind) of :func:`plan` into ``episodes/``; the ``pairs.json`` entries.

    A policy's pairs are one stream of dialogues (:meth:`Evaluator.run_pairs`: its batches stay full from one
    counterpart to the next). Cross-play B vs A is not played again once A vs B has been: it is A vs B's games
    seen from B's seat (:meth:`Evaluator.mirror_pair`). A checkpoint's engines stop after the last stream that needs
    them (one evaluation can hold dozens of checkpoints; only the ones still to play stay in memory).
    """
    from marti_ibrl.eval.episodes import Named

    schedule = _schedule(pairs)
    last_use = {named.spec: i for i, (policy, played, _) in enumerate(schedule) for named in (policy, *played)}
    for i, (policy, played, mirrored) in enumerate(schedule):
        ev.run_pairs(policy, [(c, episodes / episodes_file(policy, c)) for c in played], samples)
        for spec in [spec for spec, last in last_use.items() if last == i]:
            ev.release(Named(spec, spec))
        for c, source in mirrored:
            ev.mirror_pair(episodes / source, policy.name, c.name, episodes / episodes_file(policy, c))
    return [
        {"policy": p.name, "counterpart": c.name, "kind": kind, "file": episodes_file(p, c)} for p, c, kind in pairs
    ]


def _schedule(pairs: list[tuple]) -> list[tuple]:
    """Per policy, in order: ``(policy, counterparts to play, [(cross-play counterpart, file of the pair to mirror)])``.

    Cross-play counterparts are named ``policy:OTHER`` (:func:`plan`): B vs A mirrors the played A vs B.
    """
    crossed: dict[tuple[str, str], str] = {}  # (policy, other policy) of cross-play played -> its episodes file
    out = []
    for policy, group in itertools.groupby(pairs, key=lambda pair: pair[0]):
        group = [(c, kind) for _, c, kind in group]
        others = {c: c.name.removeprefix("policy:") for c, kind in group if kind == "cross-play"}
        mirrored = {c: crossed[other, policy.name] for c, other in others.items() if (other, policy.name) in crossed}
        crossed |= {(policy.name, other): episodes_file(policy, c) for c, other in others.items()}
        out.append((policy, [c for c, _ in group if c not in mirrored], list(mirrored.items())))
    return out


def merge_adapters(pairs: list[tuple], cache_dir: Path) -> list[tuple]:
    """``pairs`` with every ``checkpoint:ADAPTER`` (a LoRA role's ``ROLE/hf``, a pool snapshot) replaced by the merged
    checkpoint :func:`marti_ibrl.lora.servable_checkpoint` writes once under ``cache_dir``; names (tables, episode
    files) stay as given."""
    from dataclasses import replace

    from marti_ibrl.lora import is_adapter, servable_checkpoint

    specs = {n.spec for p, c, _ in pairs for n in (p, c) if n.spec.startswith("checkpoint:")}
    merged = {}
    for spec in sorted(specs):
        path = spec.removeprefix("checkpoint:")
        if is_adapter(path):
            print(f"[eval] {path} is a LoRA adapter: serving its base with it merged in ({cache_dir})", file=sys.stderr)
            merged[spec] = "checkpoint:" + servable_checkpoint(path, cache_dir)

    def swap(n):
        return replace(n, spec=merged[n.spec]) if n.spec in merged else n

    return [(swap(p), swap(c), kind) for p, c, kind in pairs]


@contextmanager
def evaluation(args, env, scenarios, pairs: list[tuple], policy_roles: dict | None = None):
    """The :class:`~marti_ibrl.eval.evaluator.Evaluator` of an evaluation, inside a Ray of its own: engines for the
    pairs' checkpoints started when first needed (``--engine``, ``--num-engines``), the sampling and re-samples of
    ``args``; ``policy_roles``: the roles each policy plays (default: every role); every engine and endpoint closed on
    the way out."""
    from marti_ibrl.eval.engines import LazyEngines, owned_ray
    from marti_ibrl.eval.evaluator import Evaluator

    checkpoints = sorted({s for p, c, _ in pairs for s in (p.spec, c.spec) if s.startswith("checkpoint:")})
    with owned_ray():
        engines = LazyEngines(args, len(checkpoints)) if checkpoints else None
        sampling = {"temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens}
        ev = Evaluator(
            env,
            scenarios,
            sampling,
            args.max_len,
            args.max_resamples,
            engines,
            seed=args.seed,
            chunk=args.batch,
            policy_roles=policy_roles,
        )
        try:
            yield ev
        finally:
            ev.close()


def record_played(out: Path, results: list[dict], ev) -> None:
    """``OUT/pairs.json`` (the pairs and their episode files) and ``OUT/endpoints.json`` (what this invocation asked
    each endpoint counterpart: a resumed run only what it played, also printed)."""
    (out / "pairs.json").write_text(json.dumps(results, indent=1))
    if ev.endpoint_stats:
        (out / "endpoints.json").write_text(json.dumps(ev.endpoint_stats, indent=1, sort_keys=True))
        for name, counts in sorted(ev.endpoint_stats.items()):
            print(f"endpoint {name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
