"""The SFT warm starts' settings, one place: the demo's tiny model and its SFT, SmolLM2's, the validity check's cap.

Each is a dict of :func:`marti_ibrl.sft.train.run_sft` keyword arguments (plus ``n_scenarios``: scripted dialogues,
two records each), with how it was measured beside it."""

from __future__ import annotations

from typing import Any

# The demo's warm start (``make demo``: recipes/dond/tiny-cpu.yaml, whose committed result is recipes/dond/tiny-sft/,
# made by ``marti-ibrl demo --make-sft``): the mini Table 2 model and SFT hyperparameters (benchmarks/mini_table2.py:
# bots speaking protocol markers, offers shown with their complement) on 6000 of its 16000 dialogues. Sized so that
# deals can happen but are rare: in self-play (sft.checks.validity_report, 6 turns) 96% of its turns follow the
# protocol and 11% of its <selection> answers pick the opener's complement (a deal), so IB-RL starts near 10%
# agreement with something to learn. 2000 dialogues were too few: 42% valid turns, 6 answers in 218 turns, none a
# complement, so no deal ever happened and IB-RL could only learn to stop being malformed (agreement 0.00 -> 0.00).
# Measured: recipes/dond/tiny-sft/demo_sft.json and docs/measured.md.
DEMO_SFT: dict[str, Any] = dict(
    n_scenarios=6000,  # one bot dialogue per scenario -> 2 records each
    epochs=1,
    lr=7e-3,
    batch_size=16,
    micro_batch_size=16,
    max_len=512,
)
# The vLLM-capable tiny model's (tiny_architecture("vllm"): 4 heads of 32 instead of 8 of 16) on 12000 scenarios: with
# DEMO_SFT's 6000 it reached 68% protocol-valid opening turns (2026-12-06, 317 s on 2 cores), short of the 90% the
# demo's warm start reaches (its fewer, wider heads learn the format more slowly per step); twice the dialogues,
# same rate. recipes/dond/tiny-sft-vllm/demo_sft.json records what it reached.
# It learned the format (97% valid opening turns) but also to copy the complement shown with an offer: it closed 95%
# of its deals in self-play, so IB-RL from it started at ~90% agreement with nothing left to learn (benchmarks/
# sft_checkpoints.py: copying came at steps 600-750, before the format was reliable). So only 1 in 10 of its
# dialogues teaches the acceptance (sft_records' accept_share); offers and confirmations are all taught. One epoch of
# that left 53-63% of its opening turns valid (offers beyond the item counts; 2026-12-06): two epochs, 100% valid
# opening turns and 11 answers to an offer in 373 self-played turns (recipes/dond/tiny-sft-vllm/demo_sft.json).
DEMO_SFT_VLLM: dict[str, Any] = {**DEMO_SFT, "n_scenarios": 12000, "accept_share": 0.1, "epochs": 2}
# SmolLM2-135M-Instruct's warm start (``marti-ibrl demo --model smollm2-135m-instruct``, recipes/dond/smollm2-cpu.yaml:
# compact prompt, natural-language bot turns, offers shown with their complement). A micro-batch of 4 records takes
# ≈ 28 s on 2 cores, so 160 scenarios (320 records, 40 steps) ≈ 37 min; lr 1e-4, a usual rate for teaching a 135M
# instruct model a format in few steps (2 steps at 2e-5 left it at 0% valid turns). The time and validity reached
# are in benchmarks/results/smollm2_dond.md.
SMOLLM2_SFT: dict[str, Any] = dict(n_scenarios=160, epochs=1, lr=1e-4, batch_size=8, micro_batch_size=4, max_len=1024)
# The tiny model the demo warm-starts (keyword arguments of marti_ibrl.tiny.build_tiny_model): mini Table 2's.
DEMO_TINY_MODEL: dict[str, Any] = dict(
    hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=256
)
# A smaller one for tests that only need the pipeline to run (4x fewer parameters).
SMALL_TINY_MODEL: dict[str, Any] = dict(hidden_size=64, num_layers=2, intermediate_size=128)
# SMALL_TINY_MODEL's heads when vLLM serves it (``rollout.engine: vllm``): vLLM's CPU attention needs head_dim >= 32
# (64 / 2).
VLLM_TINY_HEADS: dict[str, Any] = dict(num_heads=2, num_kv_heads=1)


def tiny_architecture(engine: str) -> dict[str, Any]:
    """The demo's tiny model for a rollout engine: :data:`DEMO_TINY_MODEL`; for ``vllm``, 4 heads of 32 (vLLM-CPU's
    smallest head size) and 2 KV heads instead of 8 of 16 and 4 KV heads: the same parameters, the same width."""
    if engine != "vllm":
        return dict(DEMO_TINY_MODEL)
    heads = DEMO_TINY_MODEL["hidden_size"] // 32
    return {**DEMO_TINY_MODEL, "num_heads": heads, "num_kv_heads": heads // 2}


def demo_sft(engine: str) -> dict[str, Any]:
    """The tiny model's SFT settings for a rollout engine: :data:`DEMO_SFT`, or for ``vllm`` :data:`DEMO_SFT_VLLM`."""
    return dict(DEMO_SFT_VLLM if engine == "vllm" else DEMO_SFT)


# Generation cap of the validity check. Scripted-bot turns are 30-60 tokens with the tiny tokenizer (mean ~45),
# so rollout.max_new_tokens=48 truncates many well-formed turns.
VALIDITY_MAX_NEW_TOKENS = 64
