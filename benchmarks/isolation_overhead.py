"""Isolation overhead: one IB-RL training step vs OpenRLHF's vanilla GRPO step on the same tokens and model.

Both steps are OpenRLHF's own code on one model, one batch and one set of OpenRLHF args (the role's, from
``role_args``); they differ exactly by the IB-RL machinery:

* vanilla GRPO: ``RemoteExperienceMaker.compute_advantages_and_returns`` with OpenRLHF's positional group_norm
  (consecutive groups of ``n_samples_per_prompt``), then ``ActorPPOTrainer.training_step`` with ``PolicyLoss``;
* IB-RL: ``IsolatedExperienceMaker`` with per-sample ``group_ids`` = ``group_key(role, scenario)`` (Eq. 4 through
  ``grouped_reward_baseline``, patch 0005, i.e. what ``role_advantages`` computes), then
  ``IsolatedActorPPOTrainer.training_step`` with ``IsolatedPolicyLoss`` (Eq. 5).

A step is: advantages + actor forward (log-probs of the actions) + loss (with the k3 KL to fixed reference log-probs,
as in training) + backward + optimizer step, on the whole batch as one micro-batch. Both steps get the same action
mask — a dialogue whose turns alternate between the role and its counterpart, so the role owns about half of the
response — and the same scenarios (G samples each, consecutive), so both form the same groups and compute the same
loss: equal work.

Simplification: no Ray and no DeepSpeed. The actor is OpenRLHF's ``Actor`` loaded as ``PolicyModelActor`` loads it
(bf16), a tiny Qwen2 from ``marti_ibrl.tiny`` sized by the flags, then by default cast to fp32 (``--dtype``): CPUs
without bf16 units run bf16 several times slower, which would only dilute the overhead. The trainers are constructed
directly in a single-process gloo group, with a small torch strategy instead of ``DeepspeedStrategy``
(``loss.backward()``, gradient clipping to ``max_norm``, a torch ``AdamW`` step). That part is the same for both steps.
The default model is small on purpose: what IB-RL adds does not grow with the model (group keys, masked selects of
the (B, A) loss inputs), so a small model is the conservative case for the ratio.

Timing: ``--warmup`` pairs, then ``--repeats`` pairs in alternating order (vanilla first, then IB first, ...) so that
load from other jobs hits both alike. The last line is the median of the per-pair ratios. Goal: ≤ 1.05.

    .venv/bin/python benchmarks/isolation_overhead.py          # ~1-2 min on 2 cores
    .venv/bin/python benchmarks/isolation_overhead.py --hidden 256 --layers 4 --batch 16 --seq 512 --repeats 20
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass
class Batch:
    """A fixed batch of dialogues as the role's experience: (B, T) tokens, (B, A) masks and log-probs, (B,) rewards."""

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    old_log_probs: torch.Tensor
    ref_log_probs: torch.Tensor
    rewards: torch.Tensor
    scenario_uids: list[str]


class TorchStrategy:
    """The part of OpenRLHF's ``DeepspeedStrategy`` that ``ActorPPOTrainer.training_step`` calls, in plain torch."""

    ring_attn_group = None

    def __init__(self, args):
        self.args = args
        self.grad_norm = 0.0

    def is_rank_0(self) -> bool:
        return True

    def backward(self, loss, model, optimizer, **kwargs) -> None:
        loss.backward()

    def optimizer_step(self, optimizer, model, scheduler, name="model", **kwargs) -> None:
        self.grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.actor.max_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

    def get_grad_norm(self, model) -> float:
        """Global gradient norm before clipping, as DeepSpeed reports it."""
        return self.grad_norm


def dialogue_mask(batch: int, response: int, gen: torch.Generator) -> torch.Tensor:
    """(B, A) bool m_i: turns of random length alternate between the role and its counterpart (random first speaker)."""
    lo, hi = max(2, response // 16), max(3, response // 6)
    mask = torch.zeros(batch, response, dtype=torch.bool)
    for b in range(batch):
        pos, own = 0, bool(torch.randint(0, 2, (), generator=gen))
        while pos < response:
            n = int(torch.randint(lo, hi + 1, (), generator=gen))
            mask[b, pos : pos + n] = own
            pos, own = pos + n, not own
        if not mask[b].any():
            mask[b, -1] = True
    return mask


def role_args_for(model_dir: str, batch: int, group: int, run_dir: str, lr: float | None = None):
    """The role's OpenRLHF args as the trainer builds them (one micro-batch = the whole batch); ``lr``: override."""
    from marti_ibrl.backend.args import role_args
    from marti_ibrl.config import load_config

    flags = ["--role1.pretrain", model_dir, "--role2.pretrain", model_dir, "--ckpt.path", run_dir]
    flags += ["--rollout.n_samples_per_prompt", str(group), "--rollout.batch_size", str(batch // group)]
    flags += ["--train.micro_batch_size", str(batch), "--ds.attn_implementation", "sdpa"]
    cfg = load_config(flags)
    role = cfg.roles[0]
    args = role_args(cfg, role, "cpu")
    if lr is not None:
        args.actor.adam.lr = lr
    return args, role


class Bench:
    """One actor + optimizer shared by a vanilla OpenRLHF trainer and an IB-RL trainer, and one fixed batch."""

    def __init__(
        self,
        *,
        hidden: int = 128,
        layers: int = 2,
        heads: int = 4,
        batch: int = 8,
        seq: int = 256,
        dtype: str = "fp32",
        group: int = 4,
        seed: int = 0,
        lr: float | None = None,
        all_ones_mask: bool = False,
    ):
        if batch % group:
            raise ValueError(f"--batch {batch} must be a multiple of the group size G={group}")
        from openrlhf.models import Actor
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
        from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

        from marti_ibrl.backend.actors import IsolatedActorPPOTrainer, IsolatedExperienceMaker
        from marti_ibrl.tiny import build_tiny_model, dond_corpus

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self._tmp = tempfile.TemporaryDirectory(prefix="ibrl-overhead-")
        model_dir = build_tiny_model(
            f"{self._tmp.name}/model",
            dond_corpus(),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=max(1, heads // 2),
            intermediate_size=4 * hidden,
            max_position_embeddings=max(2048, seq),
            seed=seed,
        )
        self.args, role = role_args_for(model_dir, batch, group, f"{self._tmp.name}/run", lr)
        self.role, self.kl_coef = role.name, role.kl_coef
        self._own_group = not dist.is_initialized()
        if self._own_group:  # ActorPPOTrainer syncs its ranks at construction; here there is one
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

        a = self.args
        self.actor = Actor(
            model_dir,
            attn_implementation=a.ds.attn_implementation,
            param_dtype=a.ds.param_dtype,
            packing_samples=a.ds.packing_samples,
            temperature=a.rollout.temperature,
        )
        if dtype == "fp32":
            self.actor.model.float()
        elif dtype != a.ds.param_dtype:
            raise ValueError(f"dtype {dtype!r}: fp32, or the args' param_dtype {a.ds.param_dtype!r}")
        self.dtype = dtype
        self.n_params = sum(p.numel() for p in self.actor.parameters())
        self.vocab = self.actor.model.config.vocab_size
        self.strategy = TorchStrategy(a)
        adam = a.actor.adam
        self.optim = torch.optim.AdamW(
            self.actor.parameters(), lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optim, lambda _: 1.0)  # role_args: constant LR
        common = dict(micro_train_batch_size=a.train.micro_batch_size, eps_clip=a.actor.eps_clip)
        self.trainers = {
            "vanilla": ActorPPOTrainer(self.strategy, self.actor, None, self.optim, self.scheduler, **common),
            "ib": IsolatedActorPPOTrainer(self.strategy, self.actor, None, self.optim, self.scheduler, **common),
        }
        self.makers = {
            "vanilla": RemoteExperienceMaker(None, None, None, None, FixedKLController(0.0), self.strategy, None),
            "ib": IsolatedExperienceMaker(None, None, None, None, FixedKLController(0.0), self.strategy, None),
        }
        self.batch = self._make_batch(batch, seq, group, seed, all_ones_mask)

    def _make_batch(self, batch: int, seq: int, group: int, seed: int, all_ones: bool) -> Batch:
        gen = torch.Generator().manual_seed(seed)
        response = seq - seq // 4  # a quarter prompt (system + scenario), the rest the dialogue
        sequences = torch.randint(3, self.vocab, (batch, seq), generator=gen)  # ids 0-2 are the special tokens
        attention_mask = torch.ones(batch, seq, dtype=torch.long)
        action_mask = torch.ones(batch, response, dtype=torch.bool) if all_ones else dialogue_mask(batch, response, gen)
        with torch.no_grad():
            logp = self.actor(sequences, action_mask, attention_mask=attention_mask).float()
        # The rollout policy and the reference differ a little from the current weights (ratios ≠ 1, KL ≠ 0).
        old = (logp + 0.1 * torch.randn(logp.shape, generator=gen)) * action_mask
        ref = (logp + 0.1 * torch.randn(logp.shape, generator=gen)) * action_mask
        rewards = torch.rand(batch, generator=gen) * 10  # continuous: no constant group
        uids = [f"scenario-{i // group}" for i in range(batch)]  # G consecutive samples per scenario
        return Batch(sequences, attention_mask, action_mask, old, ref, rewards, uids)

    def experience(self, kind: str):
        """A fresh Experience of the fixed batch (the experience maker and trainer write into it)."""
        from openrlhf.trainer.ppo_utils.experience import Experience

        from marti_ibrl.algorithm.advantages import group_key

        b = self.batch
        n = b.sequences.shape[0]
        group_ids = [group_key(self.role, uid) for uid in b.scenario_uids] if kind == "ib" else []
        return Experience(
            sequences=b.sequences,
            attention_mask=b.attention_mask,
            action_mask=b.action_mask,
            action_log_probs=b.old_log_probs,
            base_action_log_probs=b.ref_log_probs,
            kl=torch.zeros_like(b.old_log_probs),  # with the KL in the loss, the maker's reward KL is 0
            rewards=b.rewards.clone(),
            response_length=b.action_mask.sum(-1).float(),
            total_length=b.attention_mask.sum(-1).float(),
            index=list(range(n)),
            group_ids=group_ids,
        )

    def advantages(self, kind: str) -> torch.Tensor:
        """(B, A) advantages of the fixed batch from the ``kind`` experience maker (no training)."""
        exp = self.experience(kind)
        self.makers[kind].compute_advantages_and_returns([exp])
        return exp.advantages

    def step(self, kind: str) -> tuple[float, float, dict]:
        """One training step: ("vanilla" | "ib") -> (advantage seconds, train-step seconds, OpenRLHF's status)."""
        t0 = time.perf_counter()
        exp = self.experience(kind)
        self.makers[kind].compute_advantages_and_returns([exp])
        t1 = time.perf_counter()
        status = self.trainers[kind].training_step(exp, self.kl_coef, 0)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, status

    def close(self) -> None:
        if self._own_group and dist.is_initialized():
            dist.destroy_process_group()
        self._tmp.cleanup()


def measure(bench: Bench, repeats: int, warmup: int = 2) -> dict[str, list[tuple[float, float]]]:
    """(advantage s, train-step s) per repeat and kind; pairs alternate their order (AB, BA, ...) after warm-up."""
    times: dict[str, list[tuple[float, float]]] = {"vanilla": [], "ib": []}
    for r in range(warmup + repeats):
        for kind in ("vanilla", "ib") if r % 2 == 0 else ("ib", "vanilla"):
            adv, train, _ = bench.step(kind)
            if r >= warmup:
                times[kind].append((adv, train))
    return times


def step_ratio(times: dict[str, list[tuple[float, float]]]) -> float:
    """Median over the repeats of (IB step time) / (vanilla step time) of the same pair."""
    return statistics.median(sum(i) / sum(v) for i, v in zip(times["ib"], times["vanilla"], strict=True))


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=128, help="hidden size of the tiny Qwen2 (intermediate: 4x)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4, help="attention heads (KV heads: half)")
    ap.add_argument("--batch", type=int, default=8, help="samples per step (a multiple of --group)")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sample (a quarter prompt, the rest response)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16: as loaded, as in training")
    ap.add_argument("--group", type=int, default=4, help="G: samples per scenario")
    ap.add_argument("--repeats", type=int, default=20, help="timed step pairs")
    ap.add_argument("--warmup", type=int, default=2, help="untimed step pairs first")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    bench = Bench(
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        batch=args.batch,
        seq=args.seq,
        group=args.group,
        seed=args.seed,
        dtype=args.dtype,
    )
    try:
        mask = bench.batch.action_mask
        print(
            f"tiny Qwen2: hidden {args.hidden}, {args.layers} layers, vocab {bench.vocab}, "
            f"{bench.n_params / 1e6:.2f}M params ({bench.dtype}), torch threads {torch.get_num_threads()}"
        )
        print(
            f"batch {args.batch} x {args.seq} tokens ({mask.shape[1]} response, role owns {mask.float().mean():.0%}), "
            f"G={args.group}; {args.warmup} warm-up + {args.repeats} timed pairs, alternating order"
        )
        times = measure(bench, args.repeats, args.warmup)
        print(f"{'median [ms]':<26}{'advantages':>12}{'train step':>12}{'total':>12}{'min total':>12}")
        for kind, name in (("vanilla", "vanilla GRPO (OpenRLHF)"), ("ib", "IB-RL (isolated)")):
            adv = statistics.median(a for a, _ in times[kind]) * 1e3
            train = statistics.median(t for _, t in times[kind]) * 1e3
            total = [(a + t) * 1e3 for a, t in times[kind]]
            print(f"{name:<26}{adv:>12.2f}{train:>12.1f}{statistics.median(total):>12.1f}{min(total):>12.1f}")
        ratio = step_ratio(times)
        print(f"ib/vanilla step time ratio: {ratio:.2f}")
        return ratio
    finally:
        bench.close()


if __name__ == "__main__":
    main()
