"""A role's update across its ranks: every sample trained exactly once per epoch, padding weighs exactly nothing."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from openrlhf.models.loss import aggregate_loss
from openrlhf.models.utils import compute_approx_kl
from openrlhf.trainer.ppo_utils.experience import Experience, make_experience_batch
from openrlhf.utils.loss_utils import _optimizer_step_loss_norm

from marti_ibrl.algorithm.batching import split_across_ranks
from marti_ibrl.algorithm.loss import IsolatedPolicyLoss
from marti_ibrl.backend.actors import IsolatedExperienceMaker, single_samples, weightless_rows_out, zero_weight_copy
from marti_ibrl.training.metrics import sample_metrics

# ------------------------------------------------------------------------------------------- the split itself


@pytest.mark.parametrize("micro", [1, 2, 3, 4, 16])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_every_sample_once_equal_whole_micro_batches(ranks: int, micro: int) -> None:
    for n in [*range(0, 41), 50, 64, 97]:
        split = split_across_ranks(n, ranks, micro, seed=n)
        flat = [i for share in split.ranks for i in share]
        assert sorted(flat) == list(range(n)), (n, ranks, micro)  # no drop, no duplicate
        slots = {len(share) + pad for share, pad in zip(split.ranks, split.padding, strict=True)}
        assert len(slots) == 1, (n, ranks, micro)  # every rank the same number of samples ...
        (slot,) = slots
        assert slot % micro == 0 and split.micro_batches == slot // micro  # ... in whole micro-batches
        assert split.micro_batches == math.ceil(n / (ranks * micro))  # the fewest that hold them all
        assert sum(split.padding) == ranks * slot - n < ranks * micro or n == 0
        assert max(split.trained) - min(split.trained) <= 1  # balanced shares, the larger ones first
        assert list(split.trained) == sorted(split.trained, reverse=True)
        if n:  # rank 0 has a real sample in every micro-batch, however its DataLoader shuffles
            assert split.padding[0] < micro


@pytest.mark.parametrize(
    ("n", "ranks", "micro", "trained", "padding"),
    [
        (28, 1, 16, (28,), (4,)),  # the demo role with 28 samples: 16 trained before, all 28 now
        (32, 1, 16, (32,), (0,)),  # an exact multiple: no padding
        (50, 4, 2, (13, 13, 12, 12), (1, 1, 2, 2)),  # was 14/14/14/8 -> 32 trained
        (17, 4, 2, (5, 4, 4, 4), (1, 2, 2, 2)),  # was: one rank empty, the update skipped
        (3, 4, 2, (1, 1, 1, 0), (1, 1, 1, 2)),  # fewer samples than ranks: still one micro-batch each
        (1, 2, 4, (1, 0), (3, 4)),
        (0, 2, 4, (0, 0), (0, 0)),  # no sample: no micro-batch, no update
    ],
)
def test_split_examples(n: int, ranks: int, micro: int, trained: tuple, padding: tuple) -> None:
    split = split_across_ranks(n, ranks, micro, seed=0)
    assert (split.trained, split.padding) == (trained, padding)
    assert split.micro_batches == (math.ceil(n / (ranks * micro)))


def test_split_is_seeded() -> None:
    a, b = split_across_ranks(40, 4, 2, seed=7), split_across_ranks(40, 4, 2, seed=7)
    assert a == b  # a resumed run deals the same samples to the same ranks
    assert split_across_ranks(40, 4, 2, seed=8).ranks != a.ranks


@pytest.mark.parametrize(("args", "what"), [((-1, 2, 2), "n must be"), ((4, 0, 2), "ranks"), ((4, 2, 0), "micro")])
def test_split_rejects_bad_sizes(args: tuple, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        split_across_ranks(*args, seed=0)


def test_sample_metrics_per_role_and_rank() -> None:
    m = sample_metrics("agent1", 17, split_across_ranks(17, 4, 2, seed=0), 4)
    assert m["agent1/samples_made"] == m["agent1/samples_trained"] == 17.0
    assert m["agent1/samples_padding"] == 7.0
    assert [m[f"agent1/rank{r}/samples_trained"] for r in range(4)] == [5.0, 4.0, 4.0, 4.0]
    assert [m[f"agent1/rank{r}/samples_padding"] for r in range(4)] == [1.0, 2.0, 2.0, 2.0]
    idle = sample_metrics("agent2", 6, None, 2)  # made samples, but did not update
    assert idle == {
        "agent2/samples_made": 6.0,
        "agent2/samples_trained": 0.0,
        "agent2/samples_padding": 0.0,
        "agent2/rank0/samples_trained": 0.0,
        "agent2/rank0/samples_padding": 0.0,
        "agent2/rank1/samples_trained": 0.0,
        "agent2/rank1/samples_padding": 0.0,
    }


# ------------------------------------------------------------------- padding weighs nothing, on a tiny model

VOCAB = 48


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return Qwen2ForCausalLM(config).float().train()


def _batched_experiences(lengths: list[list[int]], seed: int = 0) -> list[Experience]:
    """Rollout micro-batches as the experience maker returns them: (B, T) right-padded, (B, T-1) role masks."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for batch in lengths:
        t = max(batch)
        seq = torch.randint(1, VOCAB, (len(batch), t), generator=gen)
        attn = torch.zeros(len(batch), t, dtype=torch.long)
        mask = torch.zeros(len(batch), t - 1, dtype=torch.bool)
        for i, length in enumerate(batch):
            attn[i, :length] = 1
            seq[i, length:] = 0
            mask[i, 2 : length - 1 : 2] = True  # own tokens interleaved with counterpart ones (m_i)
            mask[i, length - 3 : length - 1] = True
        old = -torch.rand(len(batch), t - 1, generator=gen) * 3
        adv = torch.randn(len(batch), 1, generator=gen).expand(-1, t - 1).clone()
        out.append(
            Experience(
                sequences=seq,
                attention_mask=attn,
                action_mask=mask,
                action_log_probs=old,
                base_action_log_probs=old + torch.randn(old.shape, generator=gen) * 0.2,
                advantages=adv,
                rewards=adv[:, 0].clone(),
                info={"reward": adv[:, 0].clone()},
            )
        )
    return out


def _step(model, shards: list[list[Experience]], micro: int, token_level: bool) -> tuple[float, list[torch.Tensor]]:
    """One update epoch = one optimizer step as ppo_train runs it on R ranks (DeepSpeed simulated): every rank's
    micro-batches with OpenRLHF's step-global normalisers, loss / gas per micro-batch, gradients averaged over R."""
    ranks, gas = len(shards), len(shards[0]) // micro
    batches = [[make_experience_batch(s[i : i + micro]) for i in range(0, len(s), micro)] for s in shards]
    assert all(len(b) == gas for b in batches)
    info = _optimizer_step_loss_norm([b.action_mask for rank in batches for b in rank], None, ranks, gas)
    loss_fn = IsolatedPolicyLoss(token_level_loss=token_level)
    model.zero_grad()
    total = 0.0
    for rank in batches:
        for b in rank:
            logits = model(b.sequences, attention_mask=b.attention_mask).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, b.sequences[:, 1:, None]).squeeze(-1) * b.action_mask
            loss, *_ = loss_fn(lp, b.action_log_probs, b.advantages, action_mask=b.action_mask, **info)
            kl = compute_approx_kl(lp, b.base_action_log_probs, kl_estimator="k3")
            loss = loss + 0.1 * aggregate_loss(kl, b.action_mask, token_level_loss=token_level, **info)
            assert torch.isfinite(loss)  # an all-padding micro-batch included
            (loss / gas / ranks).backward()
            total += loss.item() / gas / ranks
    return total, [p.grad.clone() for p in model.parameters()]


def _dealt(items: list[Experience], ranks: int, micro: int, pad: Experience) -> list[list[Experience]]:
    split = split_across_ranks(len(items), ranks, micro, seed=3)
    return [[items[i] for i in s] + [pad] * p for s, p in zip(split.ranks, split.padding, strict=True)]


@pytest.mark.parametrize("token_level", [True, False])
@pytest.mark.parametrize(("lengths", "ranks", "micro"), [([[12, 9, 14], [10, 11]], 2, 2), ([[13]], 3, 2)])
def test_padding_changes_neither_loss_nor_gradient(model, lengths, ranks: int, micro: int, token_level: bool):
    items = single_samples(_batched_experiences(lengths))
    assert len(items) == sum(map(len, lengths)) and all(it.sequences.dim() == 1 for it in items)
    pad = zero_weight_copy(min(items, key=lambda it: it.sequences.numel()))
    assert not pad.action_mask.any() and not pad.advantages.any()
    # the reference: all samples in one batch on one rank, no padding
    ref_loss, ref_grads = _step(model, [items], len(items), token_level)
    assert ref_loss != 0.0 and sum(float(g.abs().sum()) for g in ref_grads) > 0
    shards = _dealt(items, ranks, micro, pad)
    assert sum(it is pad for s in shards for it in s) > 0  # there is padding to test
    loss, grads = _step(model, shards, micro, token_level)
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-7)

    if len(items) > 1:  # it could fail: a plain copy as the filler (weight > 0) moves the gradient
        plain = _dealt(items, ranks, micro, items[0])
        _, moved = _step(model, plain, micro, token_level)
        assert any(not torch.allclose(g, r, rtol=1e-4, atol=1e-7) for g, r in zip(moved, ref_grads, strict=True))


def test_single_samples_leave_the_batches_intact() -> None:
    batches = _batched_experiences([[12, 9, 14], [10, 11]])
    batches[0].index = [0, 1, 2]
    items = single_samples(batches)
    assert [int(it.attention_mask.sum()) for it in items] == [12, 9, 14, 10, 11]
    assert [it.sequences.numel() for it in items] == [12, 9, 14, 10, 11]  # right padding removed
    assert batches[0].index == [0, 1, 2] and batches[0].sequences.shape == (3, 14)


# --------------------------------------------------------------------- logged statistics leave padding out


def _status(action_mask: torch.Tensor) -> dict:
    """A training_step status as OpenRLHF builds it: token means are 0/0 on a micro-batch without action tokens."""
    tokens = action_mask.float().sum()
    return {
        "metrics": {
            "policy_loss": torch.tensor(0.0),
            "ppo_clip_ratio": (action_mask.float().sum() / tokens),
            "actor_lr": 1e-3,
            "reward": torch.tensor([1.0, 3.0, 5.0][: action_mask.shape[0]]),
        },
        "weights": {"policy_loss": "token", "ppo_clip_ratio": "token", "actor_lr": None, "reward": "sample"},
        "num_samples": float(action_mask.shape[0]),
        "num_action_tokens": float(tokens),
    }


def test_statistics_of_an_all_padding_micro_batch_are_zero_not_nan() -> None:
    mask = torch.zeros(2, 5, dtype=torch.bool)
    raw = _status(mask)
    assert math.isnan(raw["metrics"]["ppo_clip_ratio"].item())  # what OpenRLHF would log: NaN
    got = weightless_rows_out(raw, mask)
    assert got["metrics"]["ppo_clip_ratio"].item() == 0.0 and got["metrics"]["reward"].item() == 0.0
    assert got["num_samples"] == 0.0 and got["num_action_tokens"] == 0.0 and got["metrics"]["actor_lr"] == 1e-3


def test_per_sample_statistics_skip_padding_rows() -> None:
    mask = torch.tensor([[1, 0, 1], [0, 0, 0], [0, 1, 0]], dtype=torch.bool)
    got = weightless_rows_out(_status(mask), mask)
    assert got["metrics"]["reward"].item() == 3.0  # mean of rows 0 and 2 (1, 5), not of all three (3, 3): ...
    assert got["num_samples"] == 2.0
    assert got["metrics"]["ppo_clip_ratio"].item() == 1.0  # token statistics: already over the real tokens
    mask = torch.tensor([[1, 0, 0], [0, 1, 0]], dtype=torch.bool)  # no padding: untouched
    raw = _status(mask)
    assert weightless_rows_out(raw, mask) is raw and raw["metrics"]["reward"].tolist() == [1.0, 3.0]


# --------------------------------------------------------------------------- log-prob passes fill every rank


@pytest.mark.parametrize(("n", "ranks", "micro", "calls"), [(1, 4, 2, 4), (5, 2, 2, 4), (4, 2, 2, 2), (3, 1, 2, 2)])
def test_log_prob_passes_are_a_multiple_of_the_ranks(n: int, ranks: int, micro: int, calls: int) -> None:
    maker = IsolatedExperienceMaker.__new__(IsolatedExperienceMaker)
    maker.args = SimpleNamespace(
        train=SimpleNamespace(dynamic_batch_enable=False), rollout=SimpleNamespace(micro_batch_size=micro)
    )
    maker.tokenizer = SimpleNamespace(pad_token_id=0)
    maker.actor_model_group = SimpleNamespace(_actor_handlers=[object()] * ranks, duplicate_actors=1)
    seen = []
    maker.make_experience = lambda batches: seen.append([len(b.sequences) for b in batches]) or batches
    maker.compute_advantages_and_returns = lambda experiences: experiences
    out = maker.make_experience_batch(_batched_experiences([[6]] * n))
    assert len(seen[0]) == calls and len(seen[0]) % ranks == 0  # every rank the same number of forward calls
    assert sum(len(b.sequences) for b in out) == n  # the fillers' results are dropped before Eq. 4
    assert [i for b in out for i in b.index] == list(range(n))
