"""The check shared by the vLLM engine tests: a sample's log-probs as the engine reported them against the HF model's."""

from __future__ import annotations

import torch


@torch.no_grad()
def max_logprob_gap(hf, prompts: list[list[int]], results: list[dict], temperature: float) -> float:
    """Largest |vLLM log-prob − HF log π| over every sampled token (HF scores prompt + sample in one forward)."""
    gap = 0.0
    for prompt, r in zip(prompts, results, strict=True):
        ids = torch.tensor([prompt + r["token_ids"]])
        logits = hf(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r["token_ids"]).unsqueeze(-1)).squeeze(-1)
        gap = max(gap, (lp - torch.tensor(r["logprobs"])).abs().max().item())
    return gap
