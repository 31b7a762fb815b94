"""A local Ray's start is bounded (``--ray.start_timeout``, :func:`marti_ibrl.backend.cluster.bounded_start`): a start
that hangs is interrupted, what it started is killed, and it is tried once more; twice is one line."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from marti_ibrl.backend.cluster import RayStartTimeout, bounded_start


def test_a_start_that_hangs_twice_is_one_error_and_leaves_no_process():
    calls, children = [], []

    def hangs():
        calls.append(time.monotonic())
        children.append(subprocess.Popen(["sleep", "60"]))  # as ray.init's GCS and raylet
        time.sleep(60)

    t0 = time.monotonic()
    with pytest.raises(RayStartTimeout, match=r"did not start in 0.5 s, 2 times.*--ray.start_timeout"):
        bounded_start(hangs, 0.5)
    assert len(calls) == 2 and time.monotonic() - t0 < 20
    for child in children:
        child.wait(timeout=10)  # killed, not left behind (wait reaps it; a live one would time out)
        assert child.returncode == -9


def test_a_start_that_hangs_once_is_started_again(capsys):
    calls = []

    def hangs_once():
        calls.append(1)
        if len(calls) == 1:
            time.sleep(60)

    bounded_start(hangs_once, 0.5)
    assert len(calls) == 2
    assert "did not start in 0.5 s (try 1 of 2)" in capsys.readouterr().out


def test_a_prompt_start_is_called_once_and_leaves_no_watchdog():
    calls = []
    bounded_start(lambda: calls.append(1), 5.0)
    time.sleep(0.2)
    assert calls == [1]
    assert not any(t.name == "marti-ibrl-ray-start" for t in __import__("threading").enumerate())


def test_the_users_own_ctrl_c_is_not_retried():
    calls = []

    def interrupted():
        calls.append(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bounded_start(interrupted, 5.0)
    assert calls == [1]


def test_processes_older_than_the_start_are_left_alone():
    older = subprocess.Popen(["sleep", "600"])
    time.sleep(1.5)
    try:
        with pytest.raises(RayStartTimeout):
            bounded_start(lambda: time.sleep(60), 0.3, tries=1)
        assert psutil.Process(older.pid).status() != psutil.STATUS_ZOMBIE and older.poll() is None
    finally:
        older.kill()
        older.wait()


def test_a_start_ray_gives_up_on_itself_is_started_again(capsys):
    """Ray's own "The current node timed out during startup" (its 30 s; seen under a load of 30 on 2 cores)."""
    calls = []

    def gives_up_once():
        calls.append(1)
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen because ...")

    bounded_start(gives_up_once, 5.0)
    assert len(calls) == 2
    assert "failed to start (Exception: The current node timed out during startup." in capsys.readouterr().out
    with pytest.raises(RayStartTimeout, match=r"failed to start \(RuntimeError: raylet died\), 2 times"):
        bounded_start(lambda: (_ for _ in ()).throw(RuntimeError("raylet died")), 5.0)


def test_cli_main_installs_its_sigterm_handler_only_while_it_runs(monkeypatch):
    """SIGTERM raises ``stopping.Terminated`` during a command (its cleanup, then exit 4) and the process's own
    handler is back after ``cli.main`` returns (a library caller, a test runner)."""
    import os
    import signal

    from marti_ibrl import cli, stopping

    before = signal.getsignal(signal.SIGTERM)
    seen = {}

    def command(args):
        seen["handler"] = signal.getsignal(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted by the handler's exception
        seen["after"] = True

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(
        parser, "parse_known_args", lambda argv: (__import__("argparse").Namespace(command="show", func=command), [])
    )
    assert cli.main(["show", "x"]) == stopping.EXIT_CODE
    assert seen == {"handler": stopping._raise} and signal.getsignal(signal.SIGTERM) == before


@pytest.mark.e2e  # starts a local Ray (tests/tiers.py)
def test_a_ray_whose_node_died_is_replaced_not_joined(capsys):
    """A run that failed while it started left this process connected to a Ray whose raylet had died (CI: a Ray agent
    exited and its raylet with it); the next run in the process joined it and waited forever for its placement
    groups. ``start_ray`` now starts a new Ray instead, and says so."""
    import ray

    from marti_ibrl.backend.cluster import start_ray

    start_ray(2, "cpu", log_to_driver=False)
    try:
        first = ray.get_runtime_context().get_node_id()
        for proc in psutil.Process().children(recursive=True):
            if proc.name() == "raylet":
                proc.kill()
        deadline = time.monotonic() + 60
        while any(n["NodeID"] == first and n["Alive"] for n in ray.nodes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        start_ray(2, "cpu", log_to_driver=False)
        assert "the Ray this process was connected to has lost its node; starting a new one" in capsys.readouterr().err
        now = ray.get_runtime_context().get_node_id()
        assert now != first and any(n["NodeID"] == now and n["Alive"] for n in ray.nodes())
        assert ray.get(ray.remote(lambda: 7).remote()) == 7
        start_ray(2, "cpu", log_to_driver=False)  # alive: joined as it is, nothing said
        assert ray.get_runtime_context().get_node_id() == now and "lost its node" not in capsys.readouterr().err
    finally:
        ray.shutdown()
