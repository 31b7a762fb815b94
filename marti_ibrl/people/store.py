"""The SQLite file of ``marti-ibrl play`` and ``marti-ibrl annotate``: what people did, committed as it happens.

Tables (every time is Unix seconds, UTC):

* ``participants(id, created)``: an anonymous id (random hex) per browser; nothing else about the person;
* ``games(id, participant, env, policy, scenario_uid, scenario, human_role, policy_role, seats, status, outcome,
  created, ended)``: one game of a person against a policy. ``status`` is ``active`` while it is played, ``finished``
  when the environment ended it (``outcome``: the env's outcome as JSON) and ``abandoned`` when it was left half way
  (the person started another game, or the server restarted). Only finished games are ever counted;
* ``turns(game_id, idx, role, text, valid, resamples, created)``: the transcript, each turn committed as it is
  played;
* ``actions(game_id, id, response, created)``: every action a page submitted, by the id the page gave it, within its
  game (so within its participant: only they act on it): a second submit of the same id to the same game (a double
  click, a resent request) gets the first answer back and changes nothing; the same id in another game is another
  action;
* ``calls(id, source, episode_id, policy, profile_id, simulator_label, record)``: recorded TeleSales calls to
  annotate (``record``: the ``telesales eval`` episode line; ``id``: an opaque hash, what annotators see);
* ``labels(annotator, call_id, label, note, created)``: one label per annotator and call.

A :class:`Store` is safe to share between the server's threads: one connection, one lock, one transaction per call.
The policy's turns are generated outside that lock, under a lock of their game only (:meth:`Store.submit`): a slow
turn keeps no other game waiting. One server at a time serves a database (:class:`ServerLock`).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from marti_ibrl.outputs import OutputInUse, OutputLock, describe

LABELS = ("yes", "no", "unclear")
"""An annotator's answer to "consented to add WeChat?"."""
ACTIVE, FINISHED, ABANDONED = "active", "finished", "abandoned"
MAX_ID = 2**63 - 1
"""SQLite's largest integer: no game id beyond it."""
GAME_IDS = 2**53 - 1
"""A new game's id is drawn at random in 1..GAME_IDS (unguessable, not the next integer; at most
JavaScript's largest exact integer, as the pages hold it). Games of a database made before keep their ids."""
Play = Callable[[dict[str, Any]], tuple[list[dict], "dict | None", dict]]
"""``play(game) -> (new turns, outcome or None while the game goes on, response)``: one step of a game
(:meth:`Store.submit`)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS participants (id TEXT PRIMARY KEY, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS games (
    id INTEGER PRIMARY KEY AUTOINCREMENT, participant TEXT NOT NULL REFERENCES participants(id),
    env TEXT NOT NULL, policy TEXT NOT NULL, scenario_uid TEXT NOT NULL, scenario TEXT NOT NULL,
    human_role TEXT NOT NULL, policy_role TEXT NOT NULL, seats TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('active', 'finished', 'abandoned')), outcome TEXT,
    created REAL NOT NULL, ended REAL);
CREATE TABLE IF NOT EXISTS turns (
    game_id INTEGER NOT NULL REFERENCES games(id), idx INTEGER NOT NULL, role TEXT NOT NULL, text TEXT NOT NULL,
    valid INTEGER NOT NULL, resamples INTEGER NOT NULL, created REAL NOT NULL, PRIMARY KEY (game_id, idx));
CREATE TABLE IF NOT EXISTS actions (
    game_id INTEGER NOT NULL REFERENCES games(id), id TEXT NOT NULL, response TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (game_id, id));
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, episode_id TEXT NOT NULL, policy TEXT NOT NULL,
    profile_id TEXT NOT NULL, simulator_label TEXT NOT NULL, record TEXT NOT NULL, UNIQUE (source, episode_id));
CREATE TABLE IF NOT EXISTS labels (
    annotator TEXT NOT NULL, call_id TEXT NOT NULL REFERENCES calls(id),
    label TEXT NOT NULL CHECK (label IN ('yes', 'no', 'unclear')), note TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (annotator, call_id));
CREATE TABLE IF NOT EXISTS annotators (
    name TEXT PRIMARY KEY, session TEXT NOT NULL UNIQUE, created REAL NOT NULL);
"""


_ACTIONS_BY_ID_ALONE = """
ALTER TABLE actions RENAME TO actions_by_id;
CREATE TABLE actions (
    game_id INTEGER NOT NULL REFERENCES games(id), id TEXT NOT NULL, response TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (game_id, id));
INSERT INTO actions (game_id, id, response, created)
    SELECT game_id, id, response, created FROM actions_by_id WHERE game_id IN (SELECT id FROM games);
DROP TABLE actions_by_id;
"""
"""Databases of the earlier schema keyed an action by its id alone, so another participant's id found their game."""


class Rejected(ValueError):
    """An action refused with one clear reason (shown on the page); nothing was stored. ``status``: the HTTP status
    the app answers with (400 unless said: 404 no such thing, 413 / 422 too large)."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


class ServerBusy(ValueError):
    """Another server holds the database (:class:`ServerLock`); the message names it."""


class ServerLock:
    """The one server of the database at ``db`` (:class:`marti_ibrl.outputs.OutputLock` on ``DB.lock`` beside it:
    an exclusive ``flock`` held while the server runs, released by the system when its process ends, however it
    ends; the record says who holds it, so a second server can name it)."""

    def __init__(self, db: str | Path) -> None:
        self.db = Path(db)
        self._lock: OutputLock | None = None

    def acquire(self, link: str) -> None:
        """Hold the lock, or :class:`ServerBusy` naming the owner (nothing else is touched)."""
        lock = OutputLock(self.db, "--db", directory=False, note=link)
        try:
            lock.acquire()
        except OSError as e:  # its directory cannot be made (a file on the way, no permission)
            raise ValueError(f"--db {self.db}: cannot make or lock it there ({e.strerror or e})") from None
        except OutputInUse as e:
            h = e.holder
            owner = f"{describe(h).split(' (')[0]}, since {h.get('since', '?')}, at {h.get('note', '?')}"
            raise ServerBusy(f"{self.db} is served by another `marti-ibrl` server ({owner}); stop it, or give "
                             "another --db") from None  # fmt: skip
        self._lock = lock

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


class Store:
    """The SQLite file at ``path`` (created with its tables if new)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a directory; give a SQLite file (created if new)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file on the way, no permission
            raise ValueError(f"{self.path}: cannot make its directory ({e.strerror or e})") from None
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:  # not SQLite, or not this project's database
            raise ValueError(f"{self.path}: not a database marti-ibrl can use ({e})") from None
        if [r["name"] for r in self._db.execute("PRAGMA table_info(actions)") if r["pk"]] == ["id"]:
            self._db.executescript(f"BEGIN IMMEDIATE; {_ACTIONS_BY_ID_ALONE} COMMIT;")
        self._lock = threading.RLock()
        self._game_locks: dict[int, threading.Lock] = {}  # one action per game at a time (submit)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self):
        """One transaction under the lock: everything in it is stored, or (on any exception) nothing."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, tuple(args)).fetchall()]

    # -- participants ----------------------------------------------------------------------------------------

    def new_participant(self) -> str:
        pid = secrets.token_hex(8)
        with self._tx() as db:
            db.execute("INSERT INTO participants VALUES (?, ?)", (pid, time.time()))
        return pid

    def has_participant(self, pid: str) -> bool:
        return bool(self._rows("SELECT 1 FROM participants WHERE id = ?", (pid,)))

    # -- games -----------------------------------------------------------------------------------------------

    def abandon_active(self, participant: str | None = None, game_id: int | None = None) -> int:
        """Mark the active games (of ``participant``, the game ``game_id``, or all) abandoned; how many."""
        where, args = "", []
        if participant:
            where, args = where + " AND participant = ?", [*args, participant]
        if game_id is not None:
            where, args = where + " AND id = ?", [*args, game_id]
        with self._tx() as db:
            cur = db.execute(f"UPDATE games SET status = 'abandoned', ended = ? WHERE status = 'active' {where}",
                             (time.time(), *args))  # fmt: skip
            return cur.rowcount

    def create_game(
        self,
        participant: str,
        env: str,
        policy: str,
        scenario_uid: str,
        scenario: Any,
        human_role: str,
        policy_role: str,
        seats: list[str],
        turns: list[dict[str, Any]],
        status: str = ACTIVE,
        outcome: dict | None = None,
    ) -> int:
        """A new game with its first turns (the policy's, when it opens); the participant's unfinished games are
        abandoned in the same transaction."""
        columns = {"scenario_uid": scenario_uid, "scenario": scenario, "human_role": human_role,
                   "policy_role": policy_role, "seats": seats}  # fmt: skip
        return self._insert_game(participant, env, policy, lambda _k: columns, turns, status, outcome)

    def new_game(self, participant: str, env: str, policy: str, draw: Callable[[int], dict[str, Any]]) -> int:
        """A new active game of ``participant``, with no turn yet (the policy's opening ones follow by
        :meth:`open_game`). ``draw(k)`` gives its ``scenario_uid``, ``scenario``, ``human_role``, ``policy_role`` and
        ``seats``, ``k`` being the number of ``env`` games before it, counted in the same transaction: two games
        started at once never draw the same ``k``. The participant's unfinished games are abandoned in it too."""
        return self._insert_game(participant, env, policy, draw, [], ACTIVE, None)

    def _insert_game(
        self,
        participant: str,
        env: str,
        policy: str,
        draw: Callable[[int], dict[str, Any]],
        turns: list[dict[str, Any]],
        status: str,
        outcome: dict | None,
    ) -> int:
        if not self.has_participant(participant):
            raise Rejected(f"unknown participant {participant!r}: reload the page")
        now = time.time()
        with self._tx() as db:
            c = draw(db.execute("SELECT COUNT(*) FROM games WHERE env = ?", (env,)).fetchone()[0])
            db.execute("UPDATE games SET status = 'abandoned', ended = ? WHERE status = 'active' AND participant = ?",
                       (now, participant))  # fmt: skip
            game_id = secrets.randbelow(GAME_IDS) + 1
            while db.execute("SELECT 1 FROM games WHERE id = ?", (game_id,)).fetchone():
                game_id = secrets.randbelow(GAME_IDS) + 1
            db.execute(
                "INSERT INTO games (id, participant, env, policy, scenario_uid, scenario, human_role, policy_role,"
                " seats, status, outcome, created, ended) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (game_id, participant, env, policy, c["scenario_uid"], json.dumps(c["scenario"]), c["human_role"],
                 c["policy_role"], json.dumps(c["seats"]), status, json.dumps(outcome) if outcome else None, now,
                 now if status != ACTIVE else None),
            )  # fmt: skip
            self._insert_turns(db, game_id, 0, turns, now)
        return game_id

    @staticmethod
    def _insert_turns(db: sqlite3.Connection, game_id: int, start: int, turns: list[dict], now: float) -> None:
        for i, t in enumerate(turns, start):
            db.execute("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (game_id, i, t["role"], t["text"], int(t.get("valid", True)), int(t.get("resamples", 0)), now))  # fmt: skip

    def game(self, game_id: int) -> dict[str, Any]:
        """A game with its ``turns`` (JSON columns decoded); :class:`Rejected` (404) if there is none."""
        rows = self._rows("SELECT * FROM games WHERE id = ?", (game_id,)) if 0 < game_id <= MAX_ID else []
        if not rows:
            raise Rejected(f"no game {game_id}", status=404)
        game = rows[0]
        game["number"] = self._rows(  # the participant's own count (the page's "Game N"; the id is drawn at random)
            "SELECT COUNT(*) AS n FROM games WHERE participant = ? AND (created < ? OR (created = ? AND id <= ?))",
            (game["participant"], game["created"], game["created"], game["id"]),
        )[0]["n"]
        for key in ("scenario", "seats", "outcome"):
            game[key] = json.loads(game[key]) if game[key] is not None else None
        game["turns"] = [
            {"role": t["role"], "text": t["text"], "valid": bool(t["valid"]), "resamples": t["resamples"],
             "created": t["created"]}
            for t in self._rows("SELECT * FROM turns WHERE game_id = ? ORDER BY idx", (game_id,))
        ]  # fmt: skip
        return game

    def games(self, env: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        """Every game (of ``env``, with ``status``), oldest first, with its turns."""
        sql, args = "SELECT id FROM games WHERE 1 = 1", []
        if env:
            sql, args = sql + " AND env = ?", [*args, env]
        if status:
            sql, args = sql + " AND status = ?", [*args, status]
        return [self.game(r["id"]) for r in self._rows(sql + " ORDER BY created, rowid", args)]

    def submit(self, game_id: int, participant: str, action_id: str, play: Play) -> dict[str, Any]:
        """Apply one action of ``participant``'s page to their active game ``game_id``, once.

        ``play(game)`` returns ``(new turns, outcome or None while the game goes on, response)``, or raises
        :class:`Rejected` (nothing is stored). It runs under this game's own lock, not the store's: the policy's turn
        may take long, and keeps no other game waiting. The turns, the game's end and ``response`` are then stored in
        one transaction; a second submit of ``action_id`` to this game returns the stored response with
        ``duplicate: true`` (an action id counts within its game, which only its participant may act on).
        """
        if not action_id or len(action_id) > 100:
            raise Rejected("the page sent no action id: reload the page")
        self.owned_game(game_id, participant)  # before its lock: no lock is made for a game that is not there
        with self._game_lock(game_id):
            game = self.owned_game(game_id, participant)
            done = self._rows("SELECT response FROM actions WHERE game_id = ? AND id = ?", (game_id, action_id))
            if done:
                return {**json.loads(done[0]["response"]), "duplicate": True}
            response = self._play(game, play, action_id)
        return {**response, "duplicate": False}

    def open_game(self, game_id: int, play: Play) -> None:
        """The policy's opening turns of a game of :meth:`new_game` (none when the person opens), generated and
        stored as :meth:`submit` does."""
        with self._game_lock(game_id):
            self._play(self.game(game_id), play, None)

    def owned_game(self, game_id: int, participant: str) -> dict[str, Any]:
        """:meth:`game`, if it is ``participant``'s; else one answer whether it is another's or none at all (404), so
        that ids cannot be probed for which games exist."""
        try:
            game = self.game(game_id)
        except Rejected:
            game = None
        if game is None or game["participant"] != participant:
            raise Rejected(f"no game {game_id} of yours", status=404)
        return game

    def _game_lock(self, game_id: int) -> threading.Lock:
        with self._lock:
            return self._game_locks.setdefault(game_id, threading.Lock())

    def _play(self, game: dict[str, Any], play: Play, action_id: str | None) -> dict[str, Any]:
        """``play(game)`` outside the store's lock, then its turns stored, if the game is still as it was read (not
        abandoned meanwhile by its participant's next game)."""
        if game["status"] != ACTIVE:
            raise Rejected(f"this game is {game['status']}: start a new one")
        turns, outcome, response = play(game)
        game_id, now = game["id"], time.time()
        with self._tx() as db:
            (status,) = db.execute("SELECT status FROM games WHERE id = ?", (game_id,)).fetchone()
            (n,) = db.execute("SELECT COUNT(*) FROM turns WHERE game_id = ?", (game_id,)).fetchone()
            if status != ACTIVE:
                raise Rejected(f"this game was {status} meanwhile (you started another): start a new one")
            if n != len(game["turns"]):
                raise Rejected("this game went on meanwhile: reload the page")
            self._insert_turns(db, game_id, n, turns, now)
            if outcome is not None:
                db.execute("UPDATE games SET status = 'finished', outcome = ?, ended = ? WHERE id = ?",
                           (json.dumps(outcome), now, game_id))  # fmt: skip
            if action_id is not None:
                db.execute("INSERT INTO actions (game_id, id, response, created) VALUES (?, ?, ?, ?)",
                           (game_id, action_id, json.dumps(response), now))  # fmt: skip
        return response

    # -- calls and labels ------------------------------------------------------------------------------------

    def add_call(self, call_id: str, source: str, record: dict[str, Any], simulator_label: str) -> bool:
        """Register a recorded call for annotation (``False``: it was already there)."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO calls VALUES (?, ?, ?, ?, ?, ?, ?)",
                (call_id, source, record["episode_id"], record["policy"], record["profile_id"], simulator_label,
                 json.dumps(record, ensure_ascii=False)),
            )  # fmt: skip
            return cur.rowcount == 1

    def calls(self) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM calls ORDER BY id")
        for r in rows:
            r["record"] = json.loads(r["record"])
        return rows

    def label(self, annotator: str, call_id: str, label: str, note: str = "") -> dict[str, Any]:
        """Store ``annotator``'s label of a call. The same label again is a no-op (``duplicate``); a different one
        is :class:`Rejected` (labels are final, so a double submit can never change one)."""
        if label not in LABELS:
            raise Rejected(f"choose one of {', '.join(LABELS)}" + (f" (got {label!r})" if label else ""))
        if not self._rows("SELECT 1 FROM calls WHERE id = ?", (call_id,)):
            raise Rejected(f"no call {call_id!r}")
        with self._tx() as db:
            old = db.execute("SELECT label FROM labels WHERE annotator = ? AND call_id = ?", (annotator, call_id))
            old = old.fetchone()
            if old is not None:
                if old["label"] != label:
                    raise Rejected(f"call {call_id} is already labelled {old['label']!r}; labels are final")
                return {"duplicate": True}
            db.execute("INSERT INTO labels VALUES (?, ?, ?, ?, ?)", (annotator, call_id, label, note, time.time()))
        return {"duplicate": False}

    def claim_annotator(self, name: str, session: str | None = None) -> str:
        """The session that writes as annotator ``name`` (an identity is bound to the browser that chose
        it, not a name any request may send): a new one when the name is free; ``session`` again when it is the
        name's own (a reload, the page's next visit); :class:`Rejected` (409) when the name is another session's.
        ``annotate --release NAME`` frees a name for another browser."""
        with self._tx() as db:
            row = db.execute("SELECT session FROM annotators WHERE name = ?", (name,)).fetchone()
            if row is None:
                session = secrets.token_urlsafe(24)
                db.execute("INSERT INTO annotators VALUES (?, ?, ?)", (name, session, time.time()))
                return session
        if session is not None and secrets.compare_digest(row["session"].encode(), session.encode()):
            return session
        raise Rejected(f"annotator name {name!r} is taken by another browser: continue in the one that chose it, or "
                       "choose another name (the study's organiser can free it: marti-ibrl annotate --release NAME)",
                       status=409)  # fmt: skip

    def annotator_of(self, session: str) -> str:
        """The annotator name bound to ``session``; :class:`Rejected` (403) for an unknown session."""
        rows = self._rows("SELECT name FROM annotators WHERE session = ?", (session,))
        if not rows:
            raise Rejected("unknown annotator session: reload the page and enter your name again", status=403)
        return rows[0]["name"]

    def release_annotator(self, name: str) -> bool:
        """Free annotator ``name`` for another browser (its labels stay its own); whether it was claimed."""
        with self._tx() as db:
            return db.execute("DELETE FROM annotators WHERE name = ?", (name,)).rowcount == 1

    def labels(self, annotator: str | None = None) -> list[dict[str, Any]]:
        if annotator is None:
            return self._rows("SELECT * FROM labels ORDER BY annotator, call_id")
        return self._rows("SELECT * FROM labels WHERE annotator = ? ORDER BY call_id", (annotator,))

    def counts(self) -> dict[str, int]:
        """Rows per table (what tests and the report check: a rejected action adds none)."""
        return {t: self._rows(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"]
                for t in ("participants", "games", "turns", "actions", "calls", "labels", "annotators")}  # fmt: skip
