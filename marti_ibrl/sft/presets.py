"""The SFT warm starts' settings, one place: the demo's tiny model and its SFT, SmolLM2's, the validity check's cap.

Each is a dict of :func:`marti_ibrl.sft.train.run_sft` keyword arguments (plus ``n_scenarios``: scripted dialogues,
two records each), with how it was measured beside it."""

from __future__ import annotations

from typing import Any

# Demo warm start (tiny model: DEMO_TINY_MODEL, dond_corpus + compact prompts; compact prompts, max_rounds=10).
# Measured on 2 shared CPU cores: 1280 records, 144 optimizer steps, loss 6.31 -> 0.25-0.32; ~2 min wall in fp32
# (~4 min in bf16, 12 min under heavy load); protocol validity of sampled opening turns 0% -> ~40-60%
# (max_new_tokens=64). It does NOT reach 90% within the ~3 min budget: small batches (many steps) matter most.
DEMO_SFT: dict[str, Any] = dict(
    n_scenarios=640,  # one bot dialogue per scenario -> 2 records each
    epochs=1,
    lr=1e-2,
    batch_size=8,
    micro_batch_size=4,
    max_len=1024,  # longer records (~5%) are dropped by OpenRLHF's dataset
)
# SmolLM2-135M-Instruct's warm start (``marti-ibrl demo --model smollm2-135m-instruct``, recipes/dond/smollm2-cpu.yaml:
# compact prompt, natural-language bot turns, offers shown with their complement). A micro-batch of 4 records takes
# ≈ 28 s on 2 cores, so 160 scenarios (320 records, 40 steps) ≈ 37 min; lr 1e-4, a usual rate for teaching a 135M
# instruct model a format in few steps (2 steps at 2e-5 left it at 0% valid turns). The time and validity reached
# are in benchmarks/results/smollm2_dond.md.
SMOLLM2_SFT: dict[str, Any] = {**DEMO_SFT, "n_scenarios": 160, "lr": 1e-4}
# The tiny model the demo warm-starts (keyword arguments of marti_ibrl.tiny.build_tiny_model).
DEMO_TINY_MODEL: dict[str, Any] = dict(hidden_size=64, num_layers=2, intermediate_size=128)
# Its heads when vLLM serves it (``rollout.engine: vllm``): vLLM's CPU attention needs head_dim >= 32 (64 / 2).
VLLM_TINY_HEADS: dict[str, Any] = dict(num_heads=2, num_kv_heads=1)
# Generation cap of the validity check. Scripted-bot turns are 30-60 tokens with the tiny tokenizer (mean ~45),
# so rollout.max_new_tokens=48 truncates many well-formed turns.
VALIDITY_MAX_NEW_TOKENS = 64
