"""Per-role masked policy loss (paper Eq. 5).

    J_i(θ_i) = E_τ[ Σ_w m_i(w) · min(ρ_i(w) Â^(i), clip(ρ_i(w), 1−ε, 1+ε) Â^(i)) ] − β · KL(π_θi ‖ π_ref_i)

m_i(w) is the role's turn-level mask: 1 exactly on the tokens role i's current policy generated
(built in ``marti_ibrl.rollout.render``; it is the Experience's ``action_mask``). The KL term (k3,
to the role's own initial checkpoint) and the optional entropy bonus are OpenRLHF's
``ActorPPOTrainer.training_step``, aggregated over the same mask.

What this subclass adds to OpenRLHF's ``PolicyLoss``: isolation *by construction*. The parent
computes ratios at every position and multiplies by the mask afterwards, so a non-finite value at a
counterpart position (0 · inf = NaN) would leak into the role's loss. Here every per-token input is
zeroed outside m_i before the ratio is formed, so counterpart tokens carry exactly no weight:
changing them cannot change the role's loss or its gradient.
"""

from __future__ import annotations

import torch
from openrlhf.models.loss import PolicyLoss


def isolate(x: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor | None:
    """x where the role acted, 0 elsewhere (no gradient flows to the zeroed positions)."""
    if x is None:
        return None
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


class IsolatedPolicyLoss(PolicyLoss):
    """OpenRLHF's clipped PPO/GRPO surrogate, restricted to the role's own tokens m_i (Eq. 5)."""

    def forward(
        self,
        log_probs: torch.Tensor,  # (B, A) log π_θi(w)
        old_log_probs: torch.Tensor,  # (B, A) log π_θi_old(w)
        advantages: torch.Tensor,  # (B, A) Â^(i), constant over a trajectory's role tokens
        action_mask: torch.Tensor | None = None,  # (B, A) m_i(w)
        rollout_log_probs: torch.Tensor | None = None,  # (B, A) log-probs recorded by the rollout engine
        **loss_batch_info,
    ):
        if action_mask is None:
            raise ValueError("IsolatedPolicyLoss needs the role's action mask m_i")
        return super().forward(
            isolate(log_probs, action_mask),
            isolate(old_log_probs, action_mask),
            isolate(advantages, action_mask),
            action_mask=action_mask,
            rollout_log_probs=isolate(rollout_log_probs, action_mask),
            **loss_batch_info,
        )
