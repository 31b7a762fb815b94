"""Inside a vLLM worker process: OpenRLHF's ``WorkerWrap`` plus the calls the project's engines make.

Started as vLLM's ``worker_extension_cls`` by :func:`marti_ibrl.rollout.vllm_engine.vllm_engine_class`, so these methods
are reachable with ``collective_rpc``. Imports nothing from vLLM at module level: the module loads in any process.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap


def _plain_cpu_gemm(layer, remove_weight: bool) -> None:
    """vLLM's CPU GEMM dispatch without the weight prepacking: every linear layer calls ``F.linear`` on its parameter.

    vLLM-CPU prepacks linear weights for oneDNN after loading and drops the parameters; reloading them in place
    (``reload_weights``, vLLM's RL path) then served logits that matched neither the old nor the new weights (greedy
    tokens differed from HF's on the same weights, measured here). With plain parameters every reload is exact.
    ``benchmarks/rollout_engines.py`` measures the engine as it runs, with this in place. Only CPU calls it.
    """
    import torch

    layer.cpu_linear = torch.nn.functional.linear


def exit_with_parent(poll_s: float = 1.0) -> threading.Thread:
    """End this process when its parent dies: a daemon thread that exits as soon as ``os.getppid()`` changes.

    vLLM's async engine (OpenRLHF's ``RolloutRayActor``) runs its engine core, and with it this worker, in a child
    process of the Ray actor. ``ray.kill`` (how a finished or failed run stops its engines), a node's raylet ending,
    or Ray's memory monitor kill the actor with SIGKILL, which leaves that child running with the model and its KV
    cache (seen: two orphaned engine cores, 7.5 GB, after a run that Ray's memory monitor ended). A polled parent id
    rather than ``prctl(PR_SET_PDEATHSIG)``: that signal follows the parent *thread* that spawned the child, not the
    actor process."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread


if sys.modules.get("vllm") is not None:  # inside a vLLM worker (vLLM imports this module as its worker_extension_cls)
    import vllm.model_executor.layers.utils as _layer_utils

    _layer_utils.dispatch_cpu_unquantized_gemm = _plain_cpu_gemm
    exit_with_parent()


class StateDictBox:
    """A state dict wrapped in an object: vLLM's ``collective_rpc`` serialises bare tensor arguments as nested lists
    (msgspec), while an object is pickled whole (OpenRLHF sets ``VLLM_ALLOW_INSECURE_SERIALIZATION``)."""

    def __init__(self, state_dict: dict):
        self.state_dict = state_dict


class EngineWorkerExtension(WorkerWrap):
    """Every weight load goes through vLLM's in-place reload (``Worker.reload_weights``), which re-runs each layer's
    post-load processing. On CPU, OpenRLHF's per-parameter broadcast (``update_weight``) is received into a buffer and
    reloaded in one pass after the last parameter (fused q/k/v and gate/up layers are then processed once, whole); on
    GPUs it is OpenRLHF's, unchanged. (vLLM-CPU's weight prepacking, which made a plain ``load_weights`` fail, is
    switched off by :func:`_plain_cpu_gemm` above.)
    """

    def _reload(self, weights) -> None:
        from marti_ibrl.rollout.digest import param_hashes

        weights = list(weights)
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        self._loaded = getattr(self, "_loaded", {})  # name -> sha256 (a copy of the weights cost their size in RAM)
        self._loaded.update(param_hashes(weights))

    def update_weight(self, name, dtype, shape, empty_cache=False):
        if self.device.type != "cpu":
            return super().update_weight(name, dtype, shape, empty_cache)
        import torch

        assert dtype == self.model_config.dtype, f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}"
        weight = torch.empty(shape, dtype=dtype, device=self.device)
        self._model_update_group.broadcast(weight, src=0)
        self._received = getattr(self, "_received", [])
        self._received.append((name, weight))
        if empty_cache:  # OpenRLHF marks the last parameter of a sync with empty_cache=True
            received, self._received = self._received, []
            self._reload(received)

    def load_state_dict_box(self, box: StateDictBox) -> None:
        """Load weights sent through the Ray object store (the ``object_store`` sync backend)."""
        self._reload(box.state_dict.items())

    def load_weights_file(self, path: str) -> None:
        """Load an opponent-pool snapshot (safetensors, HF parameter names) from disk, in this worker."""
        from safetensors.torch import load_file

        self._reload(load_file(path).items())

    def weights_digest(self) -> str:
        """:func:`marti_ibrl.rollout.engines.params_digest` of the weights this worker was last loaded with (HF names).

        vLLM's served parameters cannot be compared with the trainer's: it fuses q/k/v and gate/up under other names
        and pads the vocabulary (and with vLLM-CPU's prepacking on, keeps linear weights only in kernel form). So the
        worker keeps the hashes of the checkpoint-format tensors of its last loads; that they are also what it serves
        is tested by comparing its greedy output with HF's on the same weights (tests/rollout/test_vllm_engine.py).
        """
        from marti_ibrl.rollout.digest import combine_param_hashes

        if not getattr(self, "_loaded", None):
            raise RuntimeError("weights_digest: no weights were loaded into this engine since it started")
        return combine_param_hashes(self._loaded)
