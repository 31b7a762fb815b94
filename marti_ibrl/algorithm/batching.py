"""A role's update batch across its data-parallel ranks: every sample trained exactly once per epoch.

An iteration gives role i a varying number n_i of samples (its group members, Eq. 4), while DeepSpeed needs
every rank to run the same number of micro-batches of ``micro`` samples. :func:`split_across_ranks` deals the
n_i samples to the R ranks (a seeded permutation, then contiguous shares of ⌈n_i/R⌉ or ⌊n_i/R⌋) and fills every
rank to the same ``gas × micro`` slots, gas = ⌈n_i / (R · micro)⌉, with *zero-weight* samples (the glue's
``zero_weight_copy``: an empty action mask m_i, so no token of it enters the loss, its normalisers or its
gradient). No sample is dropped, none is repeated; fewer than R · micro slots are padding.

Because one update epoch is exactly one optimizer step (gas micro-batches per rank, one accumulation window),
OpenRLHF's step-global normalisers (total action tokens, total non-empty sequences, over all ranks and
micro-batches of the window) are those of a single step over the n_i samples alone: every real sample keeps
the weight it has in an unpadded, undivided batch — 1/T_i per token under ``token-mean`` (T_i the role's
action tokens this iteration), 1/n_i per sequence under ``seq-mean-token-mean`` — and padding weighs 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RankSplit:
    """Which of a role's samples each data-parallel rank trains on in one update, and how much padding it gets."""

    ranks: tuple[tuple[int, ...], ...]
    """Per rank r, the indices (into the role's samples) of the real samples it trains on."""
    padding: tuple[int, ...]
    """Per rank r, the zero-weight samples that fill it to ``micro_batches × micro`` slots."""
    micro: int
    """Samples per micro-batch (``train.micro_batch_size``)."""

    @property
    def micro_batches(self) -> int:
        """gas: micro-batches per rank per epoch (DeepSpeed's gradient accumulation for this update); 0: no update."""
        return (len(self.ranks[0]) + self.padding[0]) // self.micro

    @property
    def trained(self) -> tuple[int, ...]:
        """Per rank, the number of real samples it trains on."""
        return tuple(len(r) for r in self.ranks)


def split_across_ranks(n: int, ranks: int, micro: int, seed: int) -> RankSplit:
    """Deal n samples to ``ranks`` data-parallel ranks in equal, micro-batch-aligned shares (module docstring).

    Deterministic in (n, ranks, micro, seed): a resumed run deals the same samples to the same ranks. n = 0 gives
    no micro-batches (the role does not update); 0 < n < ranks still updates, the ranks without a real sample
    train on padding only (a zero gradient, averaged in by DeepSpeed as the normalisers expect).
    """
    if n < 0:
        raise ValueError(f"split_across_ranks: n must be >= 0 samples, got {n}")
    if ranks < 1:
        raise ValueError(f"split_across_ranks: ranks must be >= 1, got {ranks}")
    if micro < 1:
        raise ValueError(f"split_across_ranks: micro must be >= 1, got {micro}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    gas = -(-n // (ranks * micro))  # ⌈n / (R · micro)⌉
    base, extra = divmod(n, ranks)
    shares, start = [], 0
    for r in range(ranks):
        size = base + (r < extra)  # the first n mod R ranks take one more
        shares.append(tuple(order[start : start + size]))
        start += size
    return RankSplit(tuple(shares), tuple(gas * micro - len(s) for s in shares), micro)
