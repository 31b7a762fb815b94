"""The SFT warm starts' settings, one place: the demo's tiny model and its SFT, SmolLM2's, the validity check's cap.

Each is a dict of :func:`marti_ibrl.sft.train.run_sft` keyword arguments (plus ``n_scenarios``: scripted dialogues,
two records each), with how it was measured beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# The demo's warm start (``make demo``: recipes/dond/tiny-cpu.yaml, whose committed result is recipes/dond/tiny-sft/,
# made by ``marti-ibrl demo --make-sft``): the demo's tiny model (:data:`DEMO_TINY_MODEL`) on scripted dialogues (bots
# speaking protocol markers, offers shown with their complement), two epochs of 12000 dialogues of which only 1 in 10
# teaches the acceptance (sft_records' accept_share; offers and confirmations are all taught). What that buys: when
# it answers an offer with a selection it *copies* the complement shown, and it rarely answers so (11 of 373
# self-played turns), so deals start rare (IB-RL begins near 5% agreement) and what IB-RL has to learn is *when* to
# accept. The earlier warm start (8 heads of 16, one epoch of 6000 dialogues, every acceptance taught) never learned
# the copy: 9% of its selections were the complement, the rate of random units, so its deals came from copies IB-RL
# had to teach, and whether that took off was the seed's luck (docs/measured.md, "Why the demo stalls on seeds 7 and
# 11"). Taught every acceptance, the model below closed 95% of its deals at once and left IB-RL nothing to learn; one
# epoch left half its opening turns invalid. Measured: recipes/dond/tiny-sft/demo_sft.json, docs/measured.md.
DEMO_SFT: dict[str, Any] = dict(
    n_scenarios=12000,  # one bot dialogue per scenario -> 2 records each
    epochs=2,
    lr=7e-3,
    batch_size=16,
    micro_batch_size=16,
    max_len=512,
    accept_share=0.1,
)
# SmolLM2-135M-Instruct's warm start (``marti-ibrl demo --model smollm2-135m-instruct``, recipes/dond/smollm2-cpu.yaml:
# compact prompt, natural-language bot turns, offers shown with their complement). A micro-batch of 4 records takes
# ≈ 28 s on 2 cores, so 160 scenarios (320 records, 40 steps) ≈ 37 min; lr 1e-4, a usual rate for teaching a 135M
# instruct model a format in few steps (2 steps at 2e-5 left it at 0% valid turns). The time and validity reached
# are in benchmarks/results/smollm2_dond.md.
SMOLLM2_SFT: dict[str, Any] = dict(n_scenarios=160, epochs=1, lr=1e-4, batch_size=8, micro_batch_size=4, max_len=1024)
# The tiny model the demo warm-starts (keyword arguments of marti_ibrl.tiny.build_tiny_model): mini Table 2's width
# and depth with 4 heads of 32 (vLLM-CPU's smallest head size), so one model serves every rollout engine.
DEMO_TINY_MODEL: dict[str, Any] = dict(
    hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=256
)
# A smaller one for tests that only need the pipeline to run (4x fewer parameters).
SMALL_TINY_MODEL: dict[str, Any] = dict(hidden_size=64, num_layers=2, intermediate_size=128)
# SMALL_TINY_MODEL's heads when vLLM serves it (``rollout.engine: vllm``): vLLM's CPU attention needs head_dim >= 32
# (64 / 2).
VLLM_TINY_HEADS: dict[str, Any] = dict(num_heads=2, num_kv_heads=1)


TINY_WIDTH = 256
"""A model of this hidden size or less is tiny (``model tiny``'s and the demo's are 128): it gets the demo's SFT rate
(``marti-ibrl sft``'s defaults) and one CPU thread (:func:`marti_ibrl.sft.train.run_sft`)."""


def is_tiny(model_dir: str | os.PathLike[str]) -> bool:
    """Whether the HF model in ``model_dir`` is :data:`TINY_WIDTH` wide or less (its ``config.json``); False when
    that cannot be read (what loads the model says why, in its own words)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    width = config.get("hidden_size") if isinstance(config, dict) else None
    return isinstance(width, int) and width <= TINY_WIDTH


# Generation cap of the validity check. Scripted-bot turns are 30-60 tokens with the tiny tokenizer (mean ~45),
# so rollout.max_new_tokens=48 truncates many well-formed turns.
VALIDITY_MAX_NEW_TOKENS = 64
