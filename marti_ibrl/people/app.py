"""The web app of ``marti-ibrl play`` and ``marti-ibrl annotate``: FastAPI, a JSON API and one plain HTML page each.

Why FastAPI and not Gradio: the pages are small (a transcript, a text box, a few buttons) and the work is in what is
stored, when and how often: one SQLite transaction per action, idempotent by an id the page sends, a token checked on
every request. FastAPI gives exactly that, in a few routes anyone can read, tested without a browser too
(``fastapi.testclient``); the pages are static HTML + vanilla JS (``static/``) with stable element ids for Playwright.
Gradio would bring its own queue and session state (to be mirrored into SQLite), its own front-end build and
component ids, and about 40 dependencies more.

Access: bound to 127.0.0.1 unless told otherwise; any other host needs a token (:func:`check_bind`). With a token, the
pages read it from their URL (``/?token=...``) and send it as ``X-Token`` with every request; a request without the
right one is refused (403) and the page says so.

Every refused action answers ``{"error": reason}`` and stores nothing (:class:`~.store.Rejected`): HTTP 400, 404 for
a game that is not there, 422 for a message over ``--max-message-chars`` or an id that is not one, 413 for a request
body over ``--max-body-bytes`` (refused before it is read whole, :class:`BodyLimit`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.people.agreement import SIMULATOR  # the report's rater name for the simulator: no person's
from marti_ibrl.people.store import MAX_ID, Rejected, Store

TOKEN_ENV = "MARTI_IBRL_PEOPLE_TOKEN"
"""Where ``play`` / ``annotate`` read the token when ``--token`` is not given."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")
STATIC = Path(__file__).parent / "static"
_ANNOTATOR = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")


def resolve_token(token: str | None) -> str | None:
    """``--token``, else the environment variable :data:`TOKEN_ENV`, else none."""
    return token or os.environ.get(TOKEN_ENV) or None


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve anything but the loopback interface without a token (``ValueError`` with the reason)."""
    if host not in LOOPBACK and not token:
        raise ValueError(
            f"--host {host} makes the app reachable from other machines: give --token SECRET (or set {TOKEN_ENV}), "
            "and share the link /?token=SECRET with the participants"
        )


MAX_MESSAGE = 2000
"""The longest message (``play``: a turn's text; ``annotate``: a note) in characters (``--max-message-chars``)."""
MAX_BODY = 64 * 1024
"""The largest request body in bytes (``--max-body-bytes``): refused (413) before it is read whole."""


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is refused (413, ``{"error": ...}``) before it is read whole:
    at once when its ``Content-Length`` says so, else (chunked, or a length that lied) as soon as the bytes received
    pass the cap. The app then reads the body from the bytes buffered here (never more than the cap and one chunk).
    A client that leaves before its body is whole is one line on stderr (was a traceback, "No response returned")."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            return await self.refuse(scope, send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left mid-body: one line, nothing stored
                client = ":".join(map(str, scope.get("client") or ("?",)))
                of = f" of {int(length):,}" if b"content-length" in dict(scope.get("headers") or []) else ""
                print(f"marti-ibrl: a client ({client}) left during {scope.get('method')} {scope.get('path')} after "
                      f"{len(body):,}{of} bytes; nothing was stored", file=sys.stderr, flush=True)  # fmt: skip
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self.refuse(scope, send)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        return await self.app(scope, replay, send)

    async def refuse(self, scope: dict, send: Any) -> None:
        from starlette.responses import JSONResponse

        error = f"request too large: over {self.max_bytes:,} bytes (the server's --max-body-bytes); nothing was stored"
        response = JSONResponse({"error": error}, status_code=413, headers={"Connection": "close"})
        await response(scope, None, send)


def check_text(what: str, value: Any, limit: int) -> str:
    """``value`` as the text of a message, or :class:`Rejected` (422) if it is not text or over ``limit`` characters."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Rejected(f"{what}: expected text, got {type(value).__name__}", status=422)
    if len(value) > limit:
        raise Rejected(f"{what} too long: {len(value):,} characters, at most {limit:,}: shorten it and send it again",
                       status=422)  # fmt: skip
    return value


def allowed_hosts(token: str | None, extra: Sequence[str] = ()) -> tuple[str, ...] | None:
    """The host names a request may name (its ``Host``, and its ``Origin`` when it sends one): without a token, the
    loopback names and ``extra`` (``--allowed-host``), so a page of another site cannot reach the token-less app
    through a DNS name rebound to 127.0.0.1, nor post a form to it; with a token, None (no check: the
    token, which no other site's page can send, is the guard)."""
    return None if token else (*LOOPBACK, *extra)


def _hostname(value: str) -> str:
    """The host name of a ``Host`` header (``name:port``, ``[::1]:port``) or an ``Origin`` (``scheme://name:port``)."""
    from urllib.parse import urlsplit

    return (urlsplit(value if "://" in value else f"//{value}").hostname or "").lower()


def create_app(
    store: Store,
    game: Any = None,
    annotation: Any = None,
    token: str | None = None,
    max_message: int = MAX_MESSAGE,
    max_body: int = MAX_BODY,
    hosts: Sequence[str] | None = LOOPBACK,
):
    """The app: ``game`` (a :class:`~.games.Game`) serves the play page, ``annotation`` (an
    :class:`~.annotate.Annotation`) the annotation page; one of them. ``max_message``: the longest message in
    characters (:data:`MAX_MESSAGE`), ``max_body``: the largest request body in bytes (:data:`MAX_BODY`); ``hosts``:
    the host names a request's ``Host`` and ``Origin`` may name (:func:`allowed_hosts`; None: any), else a 403."""
    from fastapi import Body, FastAPI, Request
    from fastapi import Path as PathParam
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    if (game is None) == (annotation is None):
        raise ValueError("create_app serves either a game or an annotation")
    app = FastAPI(title="marti-ibrl people", docs_url=None, redoc_url=None, openapi_url=None)
    page = (STATIC / ("play.html" if game is not None else "annotate.html")).read_text(encoding="utf-8")
    limits = {"message": max_message, "body": max_body}  # what the pages check before sending (common.js)
    common = f"const LIMITS = {json.dumps(limits)};\n" + (STATIC / "common.js").read_text(encoding="utf-8")
    JSON_BODY = Body(...)  # noqa: N806 (FastAPI's marker of a JSON request body)
    GAME_ID = PathParam(ge=1, le=MAX_ID)  # noqa: N806 (a game id: SQLite's integers; anything else is a 422)

    allowed = None if hosts is None else {h.lower().strip("[]") for h in hosts}

    @app.middleware("http")
    async def same_host(request: Request, call_next):
        if allowed is not None:
            names = [request.headers.get("host", "")] + [v for v in [request.headers.get("origin")] if v is not None]
            foreign = next((n for n in names if _hostname(n) not in allowed), None)
            if foreign is not None:
                return JSONResponse(
                    {"error": f"{foreign!r} is not this app's host (--allowed-host NAME to serve it)"}, status_code=403
                )
        return await call_next(request)

    @app.middleware("http")
    async def require_token(request: Request, call_next):
        if token and request.url.path.startswith("/api/"):
            sent = request.headers.get("x-token", "")
            if not secrets.compare_digest(sent.encode(), token.encode()):
                reason = "no token in the link" if not sent else "unknown token"
                return JSONResponse({"error": f"{reason}: open the link you were given (…/?token=…)"}, status_code=403)
        return await call_next(request)

    @app.exception_handler(Rejected)
    async def rejected(_request: Request, exc: Rejected):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        # FastAPI's own 422 ({"detail": [...]}) as one line the page shows: where, and what was expected
        first = exc.errors()[0] if exc.errors() else {}
        loc = first.get("loc") or ("request",)
        where = ".".join(str(x) for x in loc[1:] or loc)
        return JSONResponse({"error": f"{where}: {first.get('msg', 'not understood')}"}, status_code=422)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/common.js")
    def common_js() -> Response:  # what both pages share (token, the API call); no token needed, as for the page
        return Response(common, media_type="text/javascript")

    if game is not None:
        _game_routes(app, store, game, max_message, JSON_BODY, GAME_ID)
    else:
        _annotation_routes(app, store, annotation, max_message, JSON_BODY)
    app.add_middleware(BodyLimit, max_bytes=max_body)  # added last, so outermost: the body is read before any check
    return app


def _game_routes(app, store: Store, game: Any, max_message: int, json_body: Any, game_id_param: Any) -> None:
    """The play page's API: a participant, their games, their actions (``store.submit``: once per ``action_id``)."""

    @app.post("/api/participant")
    def participant() -> dict[str, str]:
        return {"participant": store.new_participant()}

    @app.post("/api/games")
    def new_game(body: dict = json_body) -> dict[str, Any]:
        pid = str(body.get("participant", ""))
        if not store.has_participant(pid):
            raise Rejected("unknown participant: reload the page")
        return {"game": game.view(store.game(game.start(store, pid)))}

    @app.get("/api/games/{game_id}")
    def show_game(participant: str, game_id: int = game_id_param) -> dict[str, Any]:
        return {"game": game.view(store.owned_game(game_id, participant))}

    @app.post("/api/games/{game_id}/act")
    def act(game_id: int = game_id_param, body: dict = json_body) -> dict[str, Any]:
        action = body.get("action")
        if not isinstance(action, dict):
            raise Rejected("no action")
        action = {**action, "text": check_text("message", action.get("text"), max_message)}
        participant, action_id = str(body.get("participant", "")), str(body.get("action_id", ""))
        return store.submit(game_id, participant, action_id, lambda row: game.act(row, action))


def _annotation_routes(app, store: Store, annotation: Any, max_message: int, json_body: Any) -> None:
    """The annotation page's API: the next call to label for an annotator, and a label (with its note)."""

    def annotator_name(value: Any) -> str:
        name = str(value or "")
        if not _ANNOTATOR.match(name):
            raise Rejected("annotator name: 1-32 letters, digits, _ . -")
        if name.lower() == SIMULATOR:  # the report's name for the simulator's own labels (people/agreement.py)
            raise Rejected(f"annotator name: {name!r} is the simulator's, in the report; choose another")
        return name

    @app.post("/api/annotate/session")
    def session(body: dict = json_body) -> dict[str, Any]:
        """The session that writes as the name typed in (a new one, or the page's own again after a reload)."""
        name = annotator_name(body.get("annotator"))
        sent = body.get("session")
        return {"session": store.claim_annotator(name, sent if isinstance(sent, str) else None), "annotator": name}

    @app.get("/api/annotate/next")
    def next_call(session: str) -> dict[str, Any]:
        return annotation.next_call(store.annotator_of(session))

    @app.post("/api/annotate/label")
    def label(body: dict = json_body) -> dict[str, Any]:
        name = store.annotator_of(str(body.get("session", "")))  # the session's annotator, never a name sent
        note = check_text("note", body.get("note"), max_message)
        stored = store.label(name, str(body.get("call_id", "")), str(body.get("label", "")), note)
        return {**stored, **annotation.next_call(name)}


def bind(host: str, port: int) -> socket.socket:
    """The app's listening socket, bound before the server changes anything (``ValueError``: the port is taken)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ValueError(f"--host {host}: {e.strerror or e}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)  # the port is this server's from now on (uvicorn serves the connections waiting here)
    except OSError as e:
        sock.close()
        raise ValueError(f"--host {host} --port {port}: cannot listen there ({e.strerror}); is another server on "
                         "it? Give another --port") from None  # fmt: skip
    return sock


def serve(app, sock: socket.socket) -> None:
    """Run ``app`` with uvicorn on the socket of :func:`bind` until interrupted."""
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
