"""``marti-ibrl telesales eval``: the held-out evaluation (paper §5.2, Appendix D; :mod:`marti_ibrl.eval.telesales`,
run by :mod:`~marti_ibrl.eval.telesales.evaluator`), see :data:`EVAL_USAGE`. Bad input (files, specs, an unset
API-key variable, counts < 1, an output directory played with another simulator) exits 2 with one line before any
request, engine or Ray start.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from marti_ibrl.commands.argtypes import MAX_SAMPLES, MAX_SCENARIOS, float_range, int_range

EVAL_PROG = "marti-ibrl telesales eval"
EVAL_USAGE = """\
    marti-ibrl telesales eval --policy ibrl=checkpoint:runs/ibrl/sales/hf --policy uni=runs/uni/sales/hf \\
        --policy gpt=endpoint:gpt-5.5@https://api.example.com/v1#OPENAI_API_KEY \\
        --simulator gpt-5.5@https://api.example.com/v1#OPENAI_API_KEY \\
        --profiles eval_profiles.jsonl --samples 3 --concurrency 16 --out runs/telesales_eval

A policy is [NAME=]checkpoint:PATH (or a bare PATH: served by rollout engines, Table 15 format) or
[NAME=]endpoint:MODEL@URL[#KEY_ENV] (the prompted Table 10 baseline). Without --profiles, -n N evaluation profiles
are generated with --seed (default 500, seed 0). The story compiler (Table 8) and the auditor (Table 12) default to
the simulator's endpoint; stories are cached in --stories (default OUT/stories/LANG). Every JSON request carries its
reply's schema (--structured auto|on|off). Episodes go to OUT/episodes/NAME.jsonl (a rerun resumes); OUT/results.md,
OUT/summary.json and OUT/success_at_n.png at the end, with each endpoint's request counts."""


def _eval_plan(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the evaluation needs, checked before any work; ``ValueError`` / ``OSError`` on bad input."""
    from pathlib import Path

    from marti_ibrl.eval.telesales.agents import (
        Auditor,
        UserSimulator,
        endpoint_client,
        parse_endpoint,
    )

    _check_eval_flags(args)
    profiles, source = _eval_profiles(args)
    retry = {"max_retries": args.max_retries, "timeout": args.timeout, "backoff": args.backoff}
    clients: dict[tuple, Any] = {}

    def client(spec: dict[str, Any]) -> Any:
        key = (spec["base_url"], spec["model"], spec.get("api_key_env"))
        if key not in clients:
            clients[key] = endpoint_client(spec, args.concurrency, args.structured, **retry)
        return clients[key]

    simulator_spec = parse_endpoint(args.simulator)
    if args.simulator_max_new_tokens < 1:
        raise ValueError(f"--simulator-max-new-tokens must be >= 1 (got {args.simulator_max_new_tokens})")
    cap = {"max_new_tokens": args.simulator_max_new_tokens}  # a reply that never ends its JSON stops here
    simulator = UserSimulator(client(simulator_spec), {"temperature": args.simulator_temperature, **cap})
    compiler = client(parse_endpoint(args.compiler) if args.compiler else simulator_spec)
    auditor = None
    if not args.no_audit:
        auditor = Auditor(
            client(parse_endpoint(args.auditor or args.simulator)), args.lang, {"temperature": 0.0, **cap}
        )

    sampling = {"temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens}
    policies = _eval_policies(args, client, sampling)
    out = Path(args.out)
    _check_episodes_simulator(out, policies, simulator.name)
    meta = {
        "profiles": source,
        "samples per profile": args.samples,
        "simulator": simulator.name,
        "story compiler": compiler.model,
        "auditor": auditor.client.model if auditor else "none (--no-audit)",
        "language": args.lang,
    }
    return {
        "profiles": profiles,
        "simulator": simulator,
        "compiler": compiler,
        "auditor": auditor,
        "policies": policies,
        "sampling": sampling,
        "compiler_sampling": {"temperature": args.simulator_temperature, **cap},
        "clients": list(clients.values()),
        "out": out,
        "meta": meta,
    }


def _check_eval_flags(args: argparse.Namespace) -> None:
    """The evaluation's counts, retry settings, structured mode and prompt templates; ``ValueError`` if unfit."""
    from marti_ibrl.envs.telesales.prompts import EVAL_TEMPLATES, load_template
    from marti_ibrl.llm import STRUCTURED

    counts = {"--samples": args.samples, "--concurrency": args.concurrency, "-n": args.n, "--batch": args.batch}
    counts["--max-turns"] = args.max_turns
    for flag, value in counts.items():
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1 (got {value})")
    if args.max_retries < 0 or not args.timeout > 0 or args.backoff < 0:
        raise ValueError("--max-retries and --backoff must be >= 0 and --timeout > 0")
    if args.structured not in STRUCTURED:
        raise ValueError(f"--structured must be one of {', '.join(STRUCTURED)} (got {args.structured!r})")
    for template in (*EVAL_TEMPLATES, "sales"):
        load_template(template, args.lang)


def _eval_profiles(args: argparse.Namespace) -> tuple[list, str]:
    """The evaluation profiles (``--profiles`` FILE, else ``-n`` generated with ``--seed``) and where they came from."""
    from marti_ibrl.envs.telesales.profiles import generate_profiles, read_jsonl

    if args.profiles:
        if not os.path.isfile(args.profiles):
            raise ValueError(f"profiles file not found: {args.profiles}")
        profiles = read_jsonl(args.profiles, "eval")[: args.n]
        source = f"{args.profiles} ({len(profiles)} profiles)"
    else:
        n = args.n or 500
        profiles = generate_profiles(n, args.seed, "eval")
        source = f"generated: {n} evaluation profiles, seed {args.seed}"
    return profiles, source


def _eval_policies(args: argparse.Namespace, client, sampling: dict[str, Any]) -> dict[str, Any]:
    """``--policy [NAME=]SPEC`` each: name -> a checkpoint or LoRA adapter directory (loaded when the evaluation
    starts), or a prompted endpoint agent (``client(spec)`` gives its shared endpoint client)."""
    from marti_ibrl.eval.episodes import parse_named
    from marti_ibrl.eval.telesales.agents import PromptedSalesAgent
    from marti_ibrl.lora import adapter_base, is_adapter
    from marti_ibrl.rollout.players import parse_player_spec

    policies: dict[str, Any] = {}
    for text in args.policy:
        named = parse_named(text)
        spec_text = named.spec if ":" in named.spec.split("/")[0] else f"checkpoint:{named.spec}"
        spec = parse_player_spec(spec_text)
        if named.name in policies:
            raise ValueError(f"--policy names must be unique: {named.name!r} twice (use NAME=SPEC)")
        if spec["kind"] == "checkpoint":
            if is_adapter(spec["path"]):  # a LoRA role's ROLE/hf: merged into its base when the evaluation starts
                adapter_base(spec["path"])  # its base must exist
                policies[named.name] = spec["path"]
                continue
            if not os.path.isfile(os.path.join(spec["path"], "config.json")):
                raise ValueError(f"--policy {text}: not a Hugging Face checkpoint directory (no config.json) "
                                 "nor a LoRA adapter (no adapter_config.json)")  # fmt: skip
            policies[named.name] = spec["path"]
        elif spec["kind"] == "endpoint":
            policies[named.name] = PromptedSalesAgent(client(spec), named.name, sampling)
        else:
            raise ValueError(f"--policy {text}: expected checkpoint:PATH, a checkpoint directory, or "
                             "endpoint:MODEL@URL[#KEY_ENV]")  # fmt: skip
    return policies


def _check_episodes_simulator(out, policies: dict[str, Any], simulator: str) -> None:
    """Episodes already in ``out`` (an evaluation resumes there) must have been played with the same simulator."""
    from marti_ibrl.eval.telesales.evaluator import EPISODES, read_episodes

    for name in policies:
        path = out / EPISODES / f"{name}.jsonl"
        others = sorted({r.get("simulator") for r in read_episodes(path)} - {simulator})
        if others:
            raise ValueError(f"{path} was played with {', '.join(map(str, others))}, not {simulator}: "
                             "use another --out")  # fmt: skip


def cmd_telesales_eval(args: argparse.Namespace) -> int:
    try:
        plan = _eval_plan(args)
    except (ValueError, OSError) as e:
        print(f"{EVAL_PROG}: error: {e}", file=sys.stderr)
        return 2
    from marti_ibrl.eval.engines import LazyEngines, owned_ray
    from marti_ibrl.eval.telesales.evaluator import EPISODES, TeleSalesEvaluator, current_records, write_results
    from marti_ibrl.eval.telesales.outputs import StoryCache
    from marti_ibrl.lora import is_adapter, servable_checkpoint

    out = plan["out"]
    for name, sales in plan["policies"].items():  # a LoRA adapter: its base with it merged in, made once
        if isinstance(sales, str) and is_adapter(sales):
            print(f"[telesales eval] {name}: {sales} is a LoRA adapter, served merged into its base", file=sys.stderr)
            plan["policies"][name] = servable_checkpoint(sales, out / "merged")
    checkpoints = [p for p in plan["policies"].values() if isinstance(p, str)]
    ev = TeleSalesEvaluator(
        plan["profiles"],
        StoryCache(args.stories or out / "stories" / args.lang, args.lang),
        plan["compiler"],
        plan["simulator"],
        plan["auditor"],
        samples=args.samples,
        concurrency=args.concurrency,
        batch=args.batch,
        seed=args.seed,
        lang=args.lang,
        max_turns=args.max_turns,
        sampling=plan["sampling"],
        compiler_sampling=plan["compiler_sampling"],
        max_len=args.max_len,
        engines=LazyEngines(args, len(checkpoints)) if checkpoints else None,
        retry_failed=args.retry_failed,
    )
    runs = {}
    try:
        with owned_ray():  # started on the first checkpoint with calls left (LazyEngines), shut down after
            for name, sales in plan["policies"].items():
                records = ev.run_policy(name, sales, out / EPISODES / f"{name}.jsonl")
                runs[name] = current_records(records, plan["profiles"], args.samples)
    finally:
        for c in plan["clients"]:
            c.close()
    print(write_results(out, runs, {**plan["meta"], **endpoint_stats(plan["clients"])}))
    return 0


def endpoint_stats(clients: Any) -> dict[str, str]:
    """The report's line per endpoint client: this run's request counts (``AsyncChatClient.stats``: requests, with
    a schema or without, refused schemas, retries, faults by kind, failures)."""
    lines = {}
    for c in clients:
        name = f"requests to {c.model}@{c.base_url}" + (f"#{c.api_key_env}" if c.api_key_env else "")
        lines[name] = ", ".join(f"{k} {v}" for k, v in c.stats_snapshot().items())
    return lines


def add_telesales_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Wire ``eval`` into ``marti-ibrl telesales`` (handler in ``args.func``)."""
    p = subparsers.add_parser(
        "eval",
        help="held-out evaluation: policies vs. the user simulator, Success@n, hallucination (paper §5.2)",
        description=EVAL_USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--policy",
        action="append",
        required=True,
        metavar="[NAME=]SPEC",
        help="checkpoint:PATH, a checkpoint directory, or endpoint:MODEL@URL[#KEY_ENV]; repeatable",
    )
    p.add_argument("--simulator", required=True, metavar="MODEL@URL[#KEY_ENV]", help="the user simulator (Table 9)")
    p.add_argument("--compiler", metavar="MODEL@URL[#KEY_ENV]", help="story compiler (Table 8; default: simulator)")
    p.add_argument("--auditor", metavar="MODEL@URL[#KEY_ENV]", help="post-call auditor (Table 12; default: simulator)")
    p.add_argument("--no-audit", action="store_true", help="skip the Table 12 audit (no hallucination rate)")
    p.add_argument("--profiles", metavar="FILE.jsonl", help="evaluation profiles (marti-ibrl telesales profiles)")
    p.add_argument(
        "-n",
        type=int_range(1, MAX_SCENARIOS),
        default=None,
        help="number of profiles (default: all of --profiles, else 500)",
    )
    p.add_argument("--seed", type=int, default=0, help="profile generator seed without --profiles; sampling seed")
    p.add_argument(
        "--samples", type=int_range(1, MAX_SAMPLES), default=3, help="independent calls per profile (default: 3)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--stories", metavar="DIR", help="story cache directory (default: OUT/stories/LANG)")
    p.add_argument(
        "--concurrency", type=int_range(1), default=16, help="calls in play and requests per endpoint (default 16)"
    )
    p.add_argument(
        "--batch", type=int_range(1), default=None, help="calls per written batch (default: 4 x --concurrency)"
    )
    p.add_argument("--lang", default="en", help="prompt language (default: en)")
    p.add_argument(
        "--max-turns",
        type=int_range(1),
        default=None,
        help="turns per call, both roles counted (default: 2 x the profile's case_control.max_turns)",
    )
    p.add_argument("--temperature", type=float_range(0), default=1.0, help="policy sampling (default: 1.0)")
    p.add_argument("--top-p", type=float_range(0, 1, lo_open=True), default=1.0, help="policy sampling (default: 1.0)")
    p.add_argument("--max-new-tokens", type=int_range(1), default=256, help="policy tokens per turn (default: 256)")
    p.add_argument("--max-len", type=int_range(2), default=4096, help="a checkpoint's context (default: 4096)")
    _add_endpoint_args(p)
    p.add_argument("--num-engines", type=int_range(1), default=1, help="rollout engines per checkpoint (default: 1)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    from marti_ibrl.eval.engines import add_engine_argument

    add_engine_argument(p)
    p.add_argument("--retry-failed", action="store_true", help="play failed episodes again on a rerun")
    p.set_defaults(func=cmd_telesales_eval)  # fmt: skip
    return p


def _add_endpoint_args(p: argparse.ArgumentParser) -> None:
    """The LLM endpoints' sampling, retries and structured outputs (simulator, story compiler, auditor)."""
    p.add_argument(
        "--simulator-temperature",
        type=float_range(0),
        default=0.7,
        help="simulator and story-compiler sampling (default: 0.7; the auditor uses 0)",
    )
    p.add_argument(
        "--simulator-max-new-tokens",
        type=int_range(1),
        default=1024,
        help="longest reply of the simulator, story compiler and auditor (default: 1024 tokens)",
    )
    p.add_argument("--max-retries", type=int_range(0), default=4, help="retries per request (default: 4)")
    p.add_argument(
        "--timeout", type=float_range(0, lo_open=True), default=120.0, help="seconds per request (default: 120)"
    )
    p.add_argument(
        "--backoff", type=float_range(0), default=1.0, help="base of the exponential retry backoff (default: 1 s)"
    )
    p.add_argument(
        "--structured",
        default="auto",
        metavar="auto|on|off",
        help="send each reply's JSON schema (structured outputs): auto falls back to JSON mode once an endpoint "
        "refuses it, on always sends it, off never does; replies are validated either way (default: auto)",
    )
