"""benchmarks/isolation_overhead.py at toy sizes: the two steps it times do equal work (same advantages, same loss),
both train (finite, non-zero gradients), pairs alternate their order, and the last line is the ratio."""

from __future__ import annotations

import math
import re

import pytest
import torch
from bench_loader import benchmark_fixture
from openrlhf.models.loss import PolicyLoss

from marti_ibrl.algorithm.advantages import role_advantages
from marti_ibrl.algorithm.loss import IsolatedPolicyLoss

TOY = dict(hidden=32, layers=1, heads=2, batch=8, seq=48, group=4)


overhead = benchmark_fixture("isolation_overhead")


@pytest.mark.parametrize("all_ones_mask", [True, False], ids=["all-ones-mask", "dialogue-mask"])
def test_ib_and_vanilla_steps_do_equal_work(overhead, all_ones_mask: bool) -> None:
    bench = overhead.Bench(**TOY, lr=0.0, all_ones_mask=all_ones_mask)  # lr 0: both steps see the same weights
    try:
        b = bench.batch
        mask = b.action_mask
        if all_ones_mask:
            assert mask.all()
        else:  # a dialogue: the role owns some of the response, its counterpart the rest
            assert 0.25 < mask.float().mean() < 0.75 and mask.any(-1).all()
        assert b.scenario_uids == [f"scenario-{i // 4}" for i in range(8)]
        # advantages: OpenRLHF's positional group_norm == per-(role, scenario) groups == role_advantages (Eq. 4)
        vanilla_adv, ib_adv = bench.advantages("vanilla"), bench.advantages("ib")
        expected = role_advantages(b.rewards, b.scenario_uids, bench.role)
        assert expected.abs().min() > 0.01  # continuous rewards: no zero-variance group, no trivial advantage
        for adv in (vanilla_adv, ib_adv):
            torch.testing.assert_close(adv[mask], expected[:, None].expand_as(adv)[mask], rtol=1e-5, atol=1e-6)

        params_before = [p.detach().clone() for p in bench.actor.parameters()]
        _, _, vanilla = bench.step("vanilla")
        _, _, ib = bench.step("ib")
        for p, before in zip(bench.actor.parameters(), params_before, strict=True):
            assert torch.equal(p, before)
        loss_v, loss_ib = vanilla["metrics"]["policy_loss"], ib["metrics"]["policy_loss"]
        # Old/reference log-probs differ from the current ones (ratios ≠ 1, KL > 0), so the loss is not trivially 0
        # (with an all-ones mask a group's advantages sum to 0 over equal lengths: the token mean stays small).
        assert torch.isfinite(loss_v) and loss_v != 0 and vanilla["metrics"]["kl"] > 0
        torch.testing.assert_close(loss_ib, loss_v, rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(ib["metrics"]["kl"], vanilla["metrics"]["kl"], rtol=1e-5, atol=1e-9)
        for status in (vanilla, ib):
            grad_norm = status["metrics"]["actor_grad_norm"]
            assert math.isfinite(grad_norm) and grad_norm > 0
        assert ib["metrics"]["actor_grad_norm"] == pytest.approx(vanilla["metrics"]["actor_grad_norm"], rel=1e-4)
        assert type(bench.trainers["ib"].actor_loss_fn) is IsolatedPolicyLoss
        assert type(bench.trainers["vanilla"].actor_loss_fn) is PolicyLoss
    finally:
        bench.close()


def test_steps_train_with_a_learning_rate(overhead) -> None:
    bench = overhead.Bench(**TOY, dtype="fp32")
    try:
        before = [p.detach().clone() for p in bench.actor.parameters()]
        for kind in ("vanilla", "ib"):
            adv_s, train_s, status = bench.step(kind)
            assert adv_s > 0 and train_s > 0
            assert math.isfinite(status["metrics"]["actor_grad_norm"]) and status["metrics"]["actor_grad_norm"] > 0
        assert any(not torch.equal(p, b) for p, b in zip(bench.actor.parameters(), before, strict=True))
    finally:
        bench.close()


def test_pairs_alternate_their_order_after_warmup(overhead) -> None:
    class Recorder:
        def __init__(self):
            self.calls: list[str] = []

        def step(self, kind):
            self.calls.append(kind)
            return 0.001, 0.01 if kind == "vanilla" else 0.0105, {}

    rec = Recorder()
    times = overhead.measure(rec, repeats=3, warmup=1)
    assert rec.calls == ["vanilla", "ib", "ib", "vanilla", "vanilla", "ib", "ib", "vanilla"]
    assert len(times["vanilla"]) == len(times["ib"]) == 3
    assert overhead.step_ratio(times) == pytest.approx(0.0115 / 0.011)


def test_main_prints_the_ratio_last(overhead, capsys) -> None:
    argv = ["--hidden", "32", "--layers", "1", "--heads", "2", "--batch", "4", "--seq", "32"]
    ratio = overhead.main([*argv, "--repeats", "2", "--warmup", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("vanilla GRPO (OpenRLHF)") for line in lines)
    assert any(line.startswith("IB-RL (isolated)") for line in lines)
    match = re.fullmatch(r"ib/vanilla step time ratio: (\d+\.\d\d)", lines[-1])
    assert match, lines[-1]
    printed = float(match.group(1))
    assert printed > 0 and math.isfinite(printed)
    assert printed == pytest.approx(ratio, abs=0.005)
