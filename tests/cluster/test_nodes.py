"""A lost Ray node (``marti_ibrl.cluster.nodes``): which started nodes are gone, the message naming the node and
what ran there, and the watch interrupting a driver blocked in a call that would never return."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from marti_ibrl.cluster import nodes
from marti_ibrl.cluster.nodes import NodeWatch, loss_message, lost_nodes

STARTED = [
    {"node_id": "aaaa1111bbbb2222", "name": "n1", "address": "127.0.0.1", "alive": True},
    {"node_id": "cccc3333dddd4444", "name": "n2", "address": "127.0.0.1", "alive": True},
    {"node_id": "eeee5555ffff6666", "name": "n3", "address": "127.0.0.1", "alive": False},  # dead at start-up
]
PLACED = {
    "agent1": {"actor": ["aaaa1111bbbb2222", "cccc3333dddd4444"], "engines": ["cccc3333dddd4444"] * 2},
    "agent2": {"actor": ["aaaa1111bbbb2222"] * 2, "engines": ["aaaa1111bbbb2222"]},
}


def _ray_nodes(*alive: str) -> list[dict]:
    return [{"NodeID": n["node_id"], "Alive": n["node_id"] in alive} for n in STARTED]


def test_a_node_dead_or_gone_since_start_up_is_lost() -> None:
    assert lost_nodes(STARTED, _ray_nodes("aaaa1111bbbb2222", "cccc3333dddd4444")) == []
    assert [n["name"] for n in lost_nodes(STARTED, _ray_nodes("aaaa1111bbbb2222"))] == ["n2"]
    assert [n["name"] for n in lost_nodes(STARTED, _ray_nodes("aaaa1111bbbb2222")[:1])] == ["n2"]  # not listed


def test_the_message_names_the_node_what_ran_there_and_how_to_resume() -> None:
    message = loss_message([STARTED[1]], PLACED, iteration=2, committed=1, run_dir="/runs/x")
    assert message.startswith("Ray node n2 (127.0.0.1, id cccc3333dddd) was lost during iteration 2; it ran ")
    assert "agent1 actor (1), agent1 engines (2)" in message and "agent2" not in message
    assert "Nothing of iteration 2 was committed: the run directory /runs/x holds iteration 1 as committed" in message
    assert "RUN_DIR=/runs/x sbatch RECIPE --ckpt.load_enable true" in message
    first = loss_message([STARTED[1]], PLACED, iteration=1, committed=0, run_dir="/runs/x")
    assert "nothing was committed yet in /runs/x" in first


@pytest.mark.parametrize("sigint", ["python", "ignored"])
def test_the_watch_interrupts_a_blocked_driver_when_a_node_dies(monkeypatch, sigint) -> None:
    """Also where SIGINT was ignored at start (a driver started in the background, as under srun / ray job submit):
    Python's interrupt of the main thread is then a no-op unless the watch installs Python's handler."""
    import ray

    alive = {"aaaa1111bbbb2222", "cccc3333dddd4444"}
    monkeypatch.setattr(ray, "nodes", lambda: _ray_nodes(*alive))
    before = signal.signal(signal.SIGINT, signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler)
    try:
        watch = NodeWatch(STARTED, period=0.05)
        try:  # (stopped in any case: a watch left running would end this process after its grace period)
            threading.Timer(0.3, lambda: alive.discard("cccc3333dddd4444")).start()
            start = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                while time.monotonic() - start < 30:  # a ray.get that never returns
                    time.sleep(0.01)
            assert time.monotonic() - start < 25
            assert [n["name"] for n in watch.lost] == ["n2"]
        finally:
            watch.stop()
        expected = signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler
        assert signal.getsignal(signal.SIGINT) is expected  # the disposition the run started with, restored
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_ray_error_waits_for_the_health_check_to_declare_the_node_dead(monkeypatch) -> None:
    import ray

    calls = []

    def ray_nodes():  # Ray declares n2 dead on the third look
        calls.append(1)
        return _ray_nodes("aaaa1111bbbb2222", *(["cccc3333dddd4444"] if len(calls) < 3 else []))

    monkeypatch.setattr(ray, "nodes", ray_nodes)
    monkeypatch.setattr(nodes.time, "sleep", lambda s: None)
    watch = NodeWatch(STARTED, period=3600)
    try:
        assert [n["name"] for n in watch.lost_error(RuntimeError("actor died"))] == ["n2"]
        assert len(calls) == 3
    finally:
        watch.stop()


def test_one_node_is_not_watched_and_no_error_waits(monkeypatch) -> None:
    import ray

    monkeypatch.setattr(ray, "nodes", lambda: pytest.fail("a one-node run polls nothing"))
    watch = NodeWatch(STARTED[:1])
    assert watch.lost_error(RuntimeError("a bug")) == []


def test_a_driver_stuck_after_the_interrupt_is_ended_by_the_watch(tmp_path) -> None:
    """Interrupted, the main thread may still be stuck (joining a thread that waits on a collective whose peer is
    gone): after the grace period the watch prints the error itself and exits with status 3."""
    import subprocess
    import sys

    script = tmp_path / "stuck.py"
    script.write_text(
        "import time, ray\n"
        "from marti_ibrl.cluster.nodes import NodeWatch\n"
        "calls = []\n"
        "ray.nodes = lambda: calls.append(1) or [{'NodeID': 'a', 'Alive': True}, {'NodeID': 'b', 'Alive': len(calls) < 3}]\n"
        "started = [{'node_id': i, 'name': i, 'address': '127.0.0.1', 'alive': True} for i in 'ab']\n"
        "watch = NodeWatch(started, describe=lambda lost: f'lost {[n[\"name\"] for n in lost]}', period=0.05, grace=0.5)\n"
        "try:\n"
        "    time.sleep(30)\n"
        "except KeyboardInterrupt:\n"
        "    time.sleep(30)  # stuck\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip().splitlines()[-1]) == (3, "marti-ibrl train: error: lost ['b']")
    assert time.monotonic() - start < 25
