"""``marti-ibrl play`` and ``marti-ibrl annotate`` (docs/people.md).

    marti-ibrl play --policy runs/ibrl/agent1/hf --env dond --db people.sqlite
    marti-ibrl play --policy endpoint:sales@http://10.0.0.5:8000/v1 --env telesales --db people.sqlite \\
        --host 0.0.0.0 --token SECRET
    marti-ibrl annotate runs/ts-eval/episodes/*.jsonl --blind --db labels.sqlite
    marti-ibrl annotate --report --db labels.sqlite
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from marti_ibrl.commands.argtypes import MAX_SCENARIOS, PORT, float_range, int_range, path_arg


def _bind_arguments(p: argparse.ArgumentParser) -> None:
    from marti_ibrl.people.app import MAX_BODY, MAX_MESSAGE, TOKEN_ENV

    p.add_argument("--db", required=True, type=path_arg, help="the SQLite file (created if new)")
    p.add_argument("--host", default="127.0.0.1", help="interface to serve on (default: this machine only)")
    p.add_argument("--port", type=PORT, default=8000)
    p.add_argument("--token", default=None, help=f"required off 127.0.0.1 (or set {TOKEN_ENV}); link: /?token=...")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="without a token, a host name the page may be reached by besides localhost, 127.0.0.1 and "
                        "::1 (others get 403: a rebound DNS name or another site's form); repeatable")  # fmt: skip
    p.add_argument("--max-message-chars", type=int, default=MAX_MESSAGE,
                   help=f"longest message (play) or note (annotate) a page may send; longer is refused (default "
                        f"{MAX_MESSAGE})")  # fmt: skip
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=MAX_BODY,
        help=f"largest request body; larger is refused before it is read (default {MAX_BODY})",
    )


def _check_limits(args: argparse.Namespace) -> None:
    """``--max-message-chars`` and ``--max-body-bytes`` (``ValueError`` with the reason)."""
    if args.max_message_chars < 1:
        raise ValueError(f"--max-message-chars {args.max_message_chars}: expected a number of characters >= 1")
    room = 6 * args.max_message_chars + 4096  # a character takes up to 6 bytes JSON-escaped (\uXXXX), plus the rest
    if args.max_body_bytes < room:
        raise ValueError(f"--max-body-bytes {args.max_body_bytes}: too small for --max-message-chars "
                         f"{args.max_message_chars}; expected at least {room}")  # fmt: skip


def playable_envs() -> list[str]:
    """The environments a person can play (``play --env``): those whose :class:`~marti_ibrl.envs.spec.EnvSpec` has a
    ``play`` hook. What a person plays is the env's own (DoND: an agent's seat; TeleSales: the customer)."""
    from marti_ibrl.envs import registry

    return [spec.name for spec in registry.specs() if spec.play is not None]


def add_people_parsers(subparsers: Any) -> None:
    play = subparsers.add_parser(
        "play",
        help="a person plays against a policy in the browser (DoND, or TeleSales as the customer)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    play.add_argument(
        "--policy", required=True, help="PATH | checkpoint:PATH | endpoint:MODEL@URL[#KEY_ENV] | bot:NAME"
    )
    play.add_argument("--env", required=True, choices=playable_envs(), help="an environment a person can play")
    _bind_arguments(play)
    play.add_argument("--name", default=None, help="the policy's name in the tables (default: from --policy)")
    play.add_argument(
        "-n",
        "--num-scenarios",
        type=int_range(1, MAX_SCENARIOS),
        default=100,
        help="scenarios / evaluation profiles to cycle",
    )
    play.add_argument("--scenario-seed", type=int, default=20260, help="DoND scenario / TeleSales profile seed")
    play.add_argument("--data", default=None, help="DoND: Lewis-format file; TeleSales: evaluation profiles JSONL")
    play.add_argument("--prompt-style", default="paper", choices=["paper", "compact"], help="DoND role prompt")
    play.add_argument("--show-complement", action="store_true", help="DoND: as training with --env.show_complement")
    play.add_argument("--max-rounds", type=int_range(1), default=10, help="DoND rounds")
    play.add_argument("--lang", default="en", choices=["en", "zh"], help="TeleSales prompts")
    play.add_argument("--temperature", type=float_range(0), default=1.0)
    play.add_argument("--top-p", type=float_range(0, 1, lo_open=True), default=1.0)
    play.add_argument("--max-new-tokens", type=int_range(1), default=64)
    play.add_argument("--seed", type=int, default=0)
    play.set_defaults(func=cmd_play)

    ann = subparsers.add_parser(
        "annotate",
        help="blind-label recorded TeleSales calls in the browser; --report: agreement and Cohen's kappa",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ann.add_argument("episodes", nargs="*", help="`telesales eval` episode files (OUT/episodes/*.jsonl)")
    ann.add_argument("--blind", action="store_true", help="hide methods and simulator labels (the only mode)")
    ann.add_argument("--report", action="store_true", help="print the agreement report and exit")
    ann.add_argument("--release", metavar="NAME", default=None,
                     help="free annotator NAME for another browser (a name is bound to the browser that chose it; "
                          "its labels stay its own) and exit; works while the server runs")  # fmt: skip
    _bind_arguments(ann)
    ann.set_defaults(func=cmd_annotate)


def _fail(command: str, message: str) -> int:
    print(f"marti-ibrl {command}: error: {message}", file=sys.stderr)
    return 2


def _missing_web() -> str | None:
    """Why the web app cannot run here (the ``people`` extra is not installed), or None."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed: pip install -e '.[people]' (or `make install`)"
    return None


def build_game(args: argparse.Namespace):
    """The :class:`~.games.Game` of ``play``'s arguments (the policy's seat loaded)."""
    from marti_ibrl.eval.episodes import parse_named
    from marti_ibrl.people.seat import make_seat

    if args.num_scenarios < 1:
        raise ValueError("-n must be >= 1")
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens}
    name = args.name or parse_named(args.policy).name
    from marti_ibrl.envs import registry

    return registry.get(args.env).play(args, lambda: make_seat(args.policy, sampling, args.seed), name)


def cmd_play(args: argparse.Namespace) -> int:
    """Serve the play page. The database is this server's alone (:class:`~.store.ServerLock`, taken first: a second
    server on it refuses, naming the first); the earlier session's unfinished games are marked abandoned only once the
    lock is held and the port bound, so a server that does not start changes nothing."""
    from marti_ibrl.people.app import allowed_hosts, bind, check_bind, create_app, resolve_token, serve
    from marti_ibrl.people.store import ServerLock, Store

    token = resolve_token(args.token)
    if why := _missing_web():
        return _fail("play", why)
    lock = ServerLock(args.db)
    try:
        check_bind(args.host, token)
        _check_limits(args)
        lock.acquire(f"http://{args.host}:{args.port}/")
        if Path(args.db).exists():  # an existing file is SQLite and ours (a new one is made once the port is bound)
            Store(args.db).close()
        game = build_game(args)
        sock = bind(args.host, args.port)
    except ValueError as e:
        lock.release()
        return _fail("play", str(e))
    try:
        store = Store(args.db)
        left = store.abandon_active()
        if left:
            print(f"{left} unfinished game(s) of an earlier session marked abandoned", file=sys.stderr)
        link = f"http://{args.host}:{args.port}/" + (f"?token={token}" if token else "")
        print(f"playing {game.policy} ({args.env}) at {link}; games stored in {args.db}", file=sys.stderr)
        app = create_app(
            store, game=game, token=token, max_message=args.max_message_chars, max_body=args.max_body_bytes,
            hosts=allowed_hosts(token, args.allowed_host),
        )  # fmt: skip
        serve(app, sock)
    finally:
        lock.release()
    return 0


def cmd_annotate(args: argparse.Namespace) -> int:
    """Serve the annotation page (or print ``--report``); the database is this process's alone while it writes
    (:class:`~.store.ServerLock`: a second ``annotate`` or ``play`` on it refuses, naming the first)."""
    from marti_ibrl.people.store import ServerLock

    lock = ServerLock(args.db)
    if not args.report and args.release is None:  # (a report only reads; a release is one row, SQLite's own lock)
        try:
            lock.acquire(f"annotate at http://{args.host}:{args.port}/")
        except ValueError as e:  # ServerBusy, or a --db that cannot be made
            return _fail("annotate", str(e))
    try:
        return _annotate(args)
    finally:
        lock.release()


def _annotate(args: argparse.Namespace) -> int:
    from marti_ibrl.people.store import Store

    if args.release is not None:
        if args.episodes or args.report:
            return _fail("annotate", "--release NAME changes the database only: give no episode files, no --report")
        if not Path(args.db).is_file():
            return _fail("annotate", f"--db {args.db}: no such database")
        try:
            freed = Store(args.db).release_annotator(args.release)
        except ValueError as e:
            return _fail("annotate", str(e))
        said = "freed: the next browser to enter it continues its labels" if freed else "was not taken; nothing changed"
        print(f"annotator {args.release!r} {said}", file=sys.stderr)
        return 0
    if args.report:
        from marti_ibrl.people.agreement import report, report_markdown

        if args.episodes:
            return _fail("annotate", "--report reads the database only: give no episode files")
        try:
            print(report_markdown(report(Store(args.db))), end="")
        except ValueError as e:
            return _fail("annotate", str(e))
        return 0
    from marti_ibrl.people.annotate import Annotation, load_calls
    from marti_ibrl.people.app import allowed_hosts, bind, check_bind, create_app, resolve_token, serve

    if not args.blind:
        return _fail("annotate", "only blind annotation is supported: pass --blind (methods and labels are hidden)")
    token = resolve_token(args.token)
    if why := _missing_web():
        return _fail("annotate", why)
    try:
        check_bind(args.host, token)
        _check_limits(args)
        store = Store(args.db)
        added, known = load_calls(store, args.episodes)
        total = len(store.calls())
        if not total:
            raise ValueError("no calls to annotate: give `telesales eval` episode files")
        sock = bind(args.host, args.port)
    except ValueError as e:
        return _fail("annotate", str(e))
    link = f"http://{args.host}:{args.port}/" + (f"?token={token}" if token else "")
    print(f"{added} calls added ({known} already there, {total} in all); annotate at {link}", file=sys.stderr)
    app = create_app(store, annotation=Annotation(store), token=token, max_message=args.max_message_chars,
                     max_body=args.max_body_bytes, hosts=allowed_hosts(token, args.allowed_host))  # fmt: skip
    serve(app, sock)
    return 0
