"""Ray for a run: started here, or joined (a Slurm allocation, ``--ray.address``) and waited for until its nodes are up;
actors killed on the way out.
"""

from __future__ import annotations

import contextlib
import os
import sys

import ray

from marti_ibrl import stopping
from marti_ibrl.cluster.placement import device_slots
from marti_ibrl.config import Config, ConfigError
from marti_ibrl.config.schema import RayConfig
from marti_ibrl.procenv import SHARE_ONE_GPU_ENV, ray_env_vars, share_one_gpu

START_TIMEOUT = RayConfig.start_timeout
"""``--ray.start_timeout``'s default (the commands without a config use it too)."""


def init_ray(cfg: Config, device: str) -> None:
    """Connect to a cluster (``ray.address``) or start a local Ray with the job's device slots
    (:func:`marti_ibrl.cluster.placement.device_slots`, the placement ``marti-ibrl plan`` prints)."""
    start_ray(
        device_slots(cfg), device, cfg.ray.address, cfg.ray.num_cpus, cfg.ray.log_to_driver, cfg.ray.start_timeout
    )


class RayStartTimeout(RuntimeError):
    """A local Ray did not start, every try (:func:`bounded_start`): past its bound, or given up on by Ray itself."""


def _kill_started_since(started: float) -> list[str]:
    """Kill this process's descendants created at or after ``started`` (``time.time()``): the GCS, raylet and
    workers of a start given up on, which ``ray.shutdown`` does not know (the interrupted ``ray.init`` never recorded
    its node). Returns their names."""
    import psutil

    killed = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.create_time() >= started - 1.0:
                killed.append(child.name())
                child.kill()
    return killed


def bounded_start(init, limit: float, tries: int = 2) -> None:
    """Call ``init`` (a local ``ray.init``) at most ``tries`` times. Each try is bounded by ``limit`` seconds: past it,
    a watchdog thread sends the main thread SIGINT (Python's handler: a KeyboardInterrupt, which wakes a call blocked
    in Ray's C++). A try that hangs so, or that Ray gives up itself ("The current node timed out during startup ...
    the GCS has become overloaded": ``ray.init`` waits a fixed 30 s for its raylet to register, which took 22 s
    just to start on 2 cores under a load of 30, 2026-12-07), has the processes it started
    killed and Ray shut down, and the next try starts afresh; after the last, :class:`RayStartTimeout` says what
    happened in one line. A Ctrl-C of the user's own is a Ctrl-C. Off the main thread (where nothing can interrupt
    it) ``init`` runs once, unbounded."""
    import signal
    import threading
    import time

    from marti_ibrl.cluster.nodes import _python_handles_sigint

    if threading.current_thread() is not threading.main_thread():
        init()  # (off the main thread Ray installs no SIGTERM handler either)
        return
    why = ""
    for attempt in range(1, tries + 1):
        started, done, fired = time.time(), threading.Event(), threading.Event()

        def watch(done=done, fired=fired):
            if not done.wait(limit):
                fired.set()  # a real SIGINT: it wakes a blocking call (a flag alone waits until the call returns)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

        previous = _python_handles_sigint()
        watchdog = threading.Thread(target=watch, name="marti-ibrl-ray-start", daemon=True)
        watchdog.start()
        try:
            try:
                with stopping.kept():  # ray.init installs its own SIGTERM handler (marti_ibrl/stopping.py)
                    init()
            finally:
                done.set()
                watchdog.join()
            return
        except KeyboardInterrupt:
            if not fired.is_set():
                raise
            why = f"did not start in {limit:g} s"
        except Exception as e:  # Ray gave up on its own start (its node's registration timed out)
            if fired.is_set():
                why = f"did not start in {limit:g} s"
            else:
                why = "failed to start (" + " ".join(f"{type(e).__name__}: {e}".split())[:200] + ")"
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        killed = _kill_started_since(started)
        with contextlib.suppress(Exception):
            ray.shutdown()
        print(
            f"marti-ibrl: a local Ray {why} (try {attempt} of {tries}); stopped {len(killed)} process(es) it started"
            + ("; starting it again" if attempt < tries else ""),
            flush=True,
        )
    raise RayStartTimeout(
        f"a local Ray {why}, {tries} times; its session logs are under /tmp/ray/session_latest/logs; give it longer "
        "with --ray.start_timeout SECONDS, or start it on a less busy machine"
    )


def wait_for_cluster(address: str, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for the Ray cluster at ``address`` (``host:port``, ``auto``, ``ray://host:port``)
    to accept a TCP connection; a ConfigError naming ``--ray.address`` when it does not (Ray's own client retries
    for minutes). A port that answers but is not Ray's is left to ``ray.init`` to find out."""
    import socket
    import time

    from marti_ibrl.backend.internals import bootstrap_address  # how ray.init reads `auto` and RAY_ADDRESS

    flag = f"--ray.address {address}"
    try:
        target = bootstrap_address(address) if address == "auto" else address.removeprefix("ray://")
    except (ConnectionError, ValueError) as e:  # `auto` with no cluster on this machine; a malformed address
        raise ConfigError(f"{flag}: {' '.join(str(e).split())[:300]}") from None
    host, _, port = (target or "").rpartition(":")
    if not host or not port.isdigit():
        return  # "local" (ray.init starts one), or a form only Ray knows
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(5.0, timeout))).close()
            return
        except OSError as e:
            error = e
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"{flag}: nothing answers at {host}:{port} after {timeout:g} s ({error.strerror or error}); start the "
                "cluster's head first (ray start --head), or wait longer with --ray.connect_timeout SECONDS"
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _node_alive() -> bool:
    """Whether the Ray node this process is connected through (its raylet) is alive, as the GCS sees it."""
    try:
        mine = ray.get_runtime_context().get_node_id()
        return any(n.get("NodeID") == mine and n.get("Alive") for n in ray.nodes())
    except Exception:  # the GCS is gone too
        return False


def start_ray(
    slots: int,
    device: str,
    address: str | None = None,
    num_cpus: int | None = None,
    log_to_driver: bool = True,
    start_timeout: float = START_TIMEOUT,
) -> None:
    """Connect to ``address`` or start a local Ray; on CPU, declare one logical device per slot.

    On a cluster the job's GPUs are checked first: OpenRLHF's placement groups would otherwise wait forever for
    GPUs that are not there. With ``MARTI_IBRL_SHARE_ONE_GPU=1`` (benchmarks/gpu_smoke.sh) a local Ray declares
    one logical GPU per slot and every process uses the one visible GPU (a smoke test of the GPU code path on a
    single device; real runs give every component GPUs of its own).
    """
    if ray.is_initialized():
        if _node_alive():
            return
        # the Ray this process is connected to lost its own node (its raylet died: a run that failed while it
        # started, before anything shut Ray down); a job placed there would wait forever for its placement groups
        print("marti-ibrl: the Ray this process was connected to has lost its node; starting a new one",
              file=sys.stderr, flush=True)  # fmt: skip
        ray.shutdown()
    env_vars = ray_env_vars()  # NCCL_CUMEM_ENABLE only as the user set it (OpenRLHF sets it where vLLM needs it)
    if not log_to_driver:
        import logging

        for name in list(logging.root.manager.loggerDict):  # OpenRLHF's per-step INFO lines in the driver
            if name.split(".")[0] == "openrlhf":
                logging.getLogger(name).setLevel(logging.WARNING)
    if device == "cpu":
        # Each "GPU" is a scheduling slot for one actor or engine process: the placement code is the
        # GPU code, unchanged. Processes share the cores, one thread each (on a Ray cluster too).
        env_vars["OMP_NUM_THREADS"] = "1"
    if address:
        with stopping.kept():  # ray.init installs its own SIGTERM handler (marti_ibrl/stopping.py)
            ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=log_to_driver)
        have = ray.cluster_resources().get("GPU", 0)
        if have < slots:  # on CPU the slots are logical GPUs the cluster's nodes declare (ray start --num-gpus)
            ray.shutdown()
            what = "GPUs" if device != "cpu" else "device slots (logical GPUs: `ray start --num-gpus` on CPU nodes)"
            raise RuntimeError(
                f"--ray.address {address}: the job needs {slots} {what} (see `marti-ibrl plan` with the same flags), "
                f"the Ray cluster has {have:g}: OpenRLHF's placement groups would wait for them forever"
            )
        return
    kwargs = {"num_cpus": num_cpus}
    if device == "cpu":
        kwargs = {"num_cpus": num_cpus or slots + 2, "num_gpus": slots, "logging_level": "ERROR"}
    visible = None
    if device == "cuda" and share_one_gpu():
        # Ray must neither refuse more logical GPUs than CUDA_VISIBLE_DEVICES lists nor point actors at them:
        # the raylet starts without it, the processes get it back (and keep it: NOSET).
        env_vars.update({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", SHARE_ONE_GPU_ENV: "1"})
        kwargs = {"num_cpus": num_cpus or slots + 2, "num_gpus": slots}
        visible = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env_vars["CUDA_VISIBLE_DEVICES"] = visible
    try:
        # address="local": always a Ray of our own; never an earlier `ray start` cluster on this machine, which
        # Ray would otherwise join through /tmp/ray/ray_current_cluster, even when that cluster is long dead
        bounded_start(
            lambda: ray.init(
                address="local",
                include_dashboard=False,
                runtime_env={"env_vars": env_vars},
                log_to_driver=log_to_driver,
                **kwargs,
            ),
            start_timeout,
        )
    finally:
        if visible is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible


def kill_actors(handles) -> None:
    """``ray.kill`` each actor. Ray's own teardown at the driver's exit stops the raylet first and leaves each
    worker to notice; a rank spinning in a native collective never does and outlives the run."""
    for handle in handles:
        with contextlib.suppress(Exception):  # already dead (a lost node), or Ray itself is gone
            ray.kill(handle, no_restart=True)
