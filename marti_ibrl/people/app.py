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

Every refused action answers ``{"error": reason}`` (HTTP 400) and stores nothing (:class:`~.store.Rejected`).
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from pathlib import Path
from typing import Any

from marti_ibrl.people.store import Rejected, Store

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


def create_app(store: Store, game: Any = None, annotation: Any = None, token: str | None = None):
    """The app: ``game`` (a :class:`~.games.Game`) serves the play page, ``annotation`` (an
    :class:`~.annotate.Annotation`) the annotation page; one of them."""
    from fastapi import Body, FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    if (game is None) == (annotation is None):
        raise ValueError("create_app serves either a game or an annotation")
    app = FastAPI(title="marti-ibrl people", docs_url=None, redoc_url=None, openapi_url=None)
    page = (STATIC / ("play.html" if game is not None else "annotate.html")).read_text(encoding="utf-8")
    common = (STATIC / "common.js").read_text(encoding="utf-8")
    JSON_BODY = Body(...)  # noqa: N806 (FastAPI's marker of a JSON request body)
    lock = threading.Lock()  # one action at a time: a game's state is replayed, extended and stored as one step

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
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/common.js")
    def common_js() -> Response:  # what both pages share (token, the API call); no token needed, as for the page
        return Response(common, media_type="text/javascript")

    def own_game(game_id: int, participant: str) -> dict[str, Any]:
        row = store.game(game_id)
        if row["participant"] != participant:
            raise Rejected(f"game {game_id} is not yours")
        return row

    if game is not None:

        @app.post("/api/participant")
        def participant() -> dict[str, str]:
            return {"participant": store.new_participant()}

        @app.post("/api/games")
        def new_game(body: dict = JSON_BODY) -> dict[str, Any]:
            pid = str(body.get("participant", ""))
            if not store.has_participant(pid):
                raise Rejected("unknown participant: reload the page")
            with lock:
                game_id = game.start(store, pid)
            return {"game": game.view(store.game(game_id))}

        @app.get("/api/games/{game_id}")
        def show_game(game_id: int, participant: str) -> dict[str, Any]:
            return {"game": game.view(own_game(game_id, participant))}

        @app.post("/api/games/{game_id}/act")
        def act(game_id: int, body: dict = JSON_BODY) -> dict[str, Any]:
            action = body.get("action")
            if not isinstance(action, dict):
                raise Rejected("no action")
            with lock:
                own_game(game_id, str(body.get("participant", "")))
                return store.submit(game_id, str(body.get("action_id", "")), lambda row: game.act(row, action))

    else:

        def annotator_name(value: Any) -> str:
            name = str(value or "")
            if not _ANNOTATOR.match(name):
                raise Rejected("annotator name: 1-32 letters, digits, _ . -")
            return name

        @app.get("/api/annotate/next")
        def next_call(annotator: str) -> dict[str, Any]:
            return annotation.next_call(annotator_name(annotator))

        @app.post("/api/annotate/label")
        def label(body: dict = JSON_BODY) -> dict[str, Any]:
            name = annotator_name(body.get("annotator"))
            with lock:
                stored = store.label(name, str(body.get("call_id", "")), str(body.get("label", "")),
                                     str(body.get("note", "") or "")[:2000])  # fmt: skip
            return {**stored, **annotation.next_call(name)}

    return app


def serve(app, host: str, port: int) -> None:
    """Run ``app`` with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning")
