"""The per-role masked loss (paper Eq. 5): counterpart tokens carry exactly no weight, by construction."""

from __future__ import annotations

import math

import pytest
import torch
from openrlhf.models.loss import PolicyLoss
from transformers import AutoModelForCausalLM, AutoTokenizer

from marti_ibrl.algorithm.loss import IsolatedPolicyLoss, isolate
from marti_ibrl.envs.dond import DondEnv, generate_scenarios
from marti_ibrl.rollout.render import RoleView, role_experience
from marti_ibrl.tiny import build_tiny_model, dond_corpus

B, A = 3, 12


def _turn_mask() -> torch.Tensor:
    """(B, A) turn-level mask m_i: own turns are contiguous spans, counterpart turns in between."""
    mask = torch.zeros(B, A, dtype=torch.long)
    mask[0, 1:4] = 1
    mask[0, 7:10] = 1
    mask[1, 0:5] = 1
    mask[2, 3:6] = 1
    mask[2, 9:12] = 1
    return mask


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, A, generator=gen) * 3
    return {
        "log_probs": old + torch.randn(B, A, generator=gen) * 0.3,
        "old_log_probs": old,
        "rollout_log_probs": old + torch.randn(B, A, generator=gen) * 0.05,
        "advantages": torch.randn(B, 1, generator=gen).expand(B, A).clone(),  # one Â per trajectory
    }


def _run(loss_fn: PolicyLoss, inputs: dict[str, torch.Tensor], mask: torch.Tensor):
    log_probs = inputs["log_probs"].clone().requires_grad_(True)
    loss, clip_ratio, ppo_kl, vllm_kl, _ = loss_fn(
        log_probs,
        inputs["old_log_probs"],
        inputs["advantages"],
        action_mask=mask,
        rollout_log_probs=inputs["rollout_log_probs"],
    )
    (grad,) = torch.autograd.grad(loss, log_probs)
    return loss.detach(), grad, clip_ratio, ppo_kl, vllm_kl


LOSS_KWARGS = [
    {},
    {"token_level_loss": False},
    {"dual_clip": 3.0},
    {"is_correction_level": "token"},
    {"is_correction_level": "seq", "is_correction_mode": "mask"},
]


@pytest.mark.parametrize("kwargs", LOSS_KWARGS)
def test_equals_openrlhf_policy_loss_on_finite_inputs(kwargs: dict) -> None:
    mask = _turn_mask()
    for seed in range(3):
        inputs = _inputs(seed)
        ours = _run(IsolatedPolicyLoss(**kwargs), inputs, mask)
        parent = _run(PolicyLoss(**kwargs), inputs, mask)
        torch.testing.assert_close(ours[0], parent[0], rtol=1e-6, atol=1e-7)  # loss
        torch.testing.assert_close(ours[1], parent[1], rtol=1e-6, atol=1e-8)  # d loss / d log_probs
        torch.testing.assert_close(ours[2], parent[2])  # clip ratio
        torch.testing.assert_close(ours[3], parent[3])  # ppo kl
        assert ours[0].item() != 0.0


def test_hand_computed_value() -> None:
    # one sequence, two own tokens with ratio 1 and Â = 2, one counterpart token: loss = -mean(1 * 2)
    loss, *_ = IsolatedPolicyLoss()(
        torch.tensor([[-1.0, -2.0, -3.0]]),
        torch.tensor([[-1.0, -9.0, -3.0]]),
        torch.tensor([[2.0, 2.0, 2.0]]),
        action_mask=torch.tensor([[1, 0, 1]]),
    )
    assert loss.item() == -2.0


def _perturb_counterpart(inputs: dict[str, torch.Tensor], mask: torch.Tensor, how: str) -> dict[str, torch.Tensor]:
    out = {}
    gen = torch.Generator().manual_seed(99)
    for name, x in inputs.items():
        if how == "random":
            other = torch.randn(x.shape, generator=gen) * 50
        elif how == "inf":
            other = torch.full_like(x, math.inf if name != "old_log_probs" else -math.inf)
        else:
            other = torch.full_like(x, math.nan)
        out[name] = torch.where(mask.bool(), x, other)
    return out


@pytest.mark.parametrize("how", ["random", "inf", "nan"])
@pytest.mark.parametrize("kwargs", LOSS_KWARGS)
def test_counterpart_positions_cannot_change_loss_or_gradient(kwargs: dict, how: str) -> None:
    mask = _turn_mask()
    inputs = _inputs(1)
    base = _run(IsolatedPolicyLoss(**kwargs), inputs, mask)
    got = _run(IsolatedPolicyLoss(**kwargs), _perturb_counterpart(inputs, mask, how), mask)
    assert torch.isfinite(got[0])
    assert torch.equal(got[0], base[0])  # loss: bit-identical
    assert torch.equal(got[1], base[1])  # gradient: bit-identical
    assert torch.equal(got[2], base[2]) and torch.equal(got[3], base[3])
    assert got[1][~mask.bool()].abs().sum().item() == 0.0  # exactly no gradient at counterpart tokens
    assert got[1][mask.bool()].abs().sum().item() > 0.0
    if kwargs.get("is_correction_level", "off") != "off":
        assert torch.equal(got[4], base[4])


@pytest.mark.parametrize("how", ["inf", "nan"])
def test_parent_policy_loss_leaks_non_finite_counterpart_values(how: str) -> None:
    """Why the subclass exists: OpenRLHF masks *after* the ratio, and 0 * inf = NaN."""
    mask = _turn_mask()
    perturbed = _perturb_counterpart(_inputs(1), mask, how)
    loss, *_ = _run(PolicyLoss(), perturbed, mask)
    assert torch.isnan(loss)
    # a non-finite advantage alone (finite log-probs) also poisons the gradient: d(ρ·Â)/dρ = Â
    only_adv = dict(_inputs(1), advantages=perturbed["advantages"])
    loss, grad, *_ = _run(PolicyLoss(), only_adv, mask)
    assert torch.isnan(loss)
    assert torch.isnan(grad[~mask.bool()]).all()
    loss, grad, *_ = _run(IsolatedPolicyLoss(), only_adv, mask)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()


def test_change_at_own_positions_does_change_the_loss() -> None:
    """The isolation tests above could fail: an own-token change moves loss and gradient."""
    mask = _turn_mask()
    inputs = _inputs(2)
    base = _run(IsolatedPolicyLoss(), inputs, mask)
    changed = dict(inputs, advantages=inputs["advantages"] + mask * 0.5)
    got = _run(IsolatedPolicyLoss(), changed, mask)
    assert not torch.equal(got[0], base[0])
    assert not torch.equal(got[1], base[1])


def test_isolate_and_missing_mask() -> None:
    x = torch.tensor([1.0, math.nan, math.inf])
    assert isolate(x, torch.tensor([1, 0, 0])).tolist() == [1.0, 0.0, 0.0]
    assert isolate(None, torch.tensor([1])) is None
    with pytest.raises(ValueError, match="action mask"):
        IsolatedPolicyLoss()(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))


def test_clipping_zeroes_the_gradient_outside_the_trust_region() -> None:
    eps = 0.2
    ratios = torch.tensor([[1.5, 1.1, 0.5, 0.5, 1.5, 0.9]])
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, -1.0, -1.0]])
    old = torch.full_like(ratios, -2.0)
    log_probs = (old + ratios.log()).requires_grad_(True)
    mask = torch.ones_like(ratios, dtype=torch.long)
    loss, clip_ratio, *_ = IsolatedPolicyLoss(clip_eps_low=eps, clip_eps_high=eps)(
        log_probs, old, adv, action_mask=mask
    )
    (grad,) = torch.autograd.grad(loss, log_probs)
    n = ratios.numel()
    # token 0: ρ=1.5 > 1+ε with Â>0 -> the clipped (constant) term is the min: zero gradient
    # token 2: ρ=0.5 < 1-ε with Â<0 -> likewise clipped: zero gradient
    # the others take the unclipped term: d(-ρÂ/n)/d log π = -ρÂ/n
    expected = torch.tensor([[0.0, -1.1 / n, 0.0, -0.5 / n, 1.5 / n, 0.9 / n]])
    assert grad[0, 0].item() == 0.0 and grad[0, 2].item() == 0.0
    torch.testing.assert_close(grad, expected)
    torch.testing.assert_close(loss, -torch.tensor((1.2 + 1.1 - 0.8 + 0.5 - 1.5 - 0.9) / n))
    assert clip_ratio.item() == pytest.approx(2 / 6)


# ------------------------------------------------------------------------------------ end to end on a tiny model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), dond_corpus())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").float().train()
    return tok, model


def _dialogue_sequence(tok) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """agent1's rendering of a dialogue with both roles' turns: (1, T) ids, (1, T-1) masks of agent1 / agent2."""
    env = DondEnv(prompt_style="compact")
    scenario = generate_scenarios(1, seed=3)[0]
    view = RoleView(tok, env.system_prompt(scenario, "agent1"))
    own = ["Hello! I would like to make a deal.", "<try> item0=1 item1=0 item2=2 <try>"]
    counterpart = ["What do you value the most?", "<selection> item0=0 item1=1 item2=0 <selection>"]
    for mine, theirs in zip(own, counterpart):
        ids = list(tok(mine, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
        view.add_own(ids, [-0.5] * len(ids), finished=True)
        view.add_counterpart(theirs)
    exp = role_experience(view, max_len=4096, reward=1.0)
    mask_a = exp.action_mask
    # the counterpart's utterance tokens: every non-template position after the system prompt that is not agent1's
    return exp.sequences, mask_a, 1 - mask_a


def test_model_gradient_of_role_loss_ignores_counterpart_tokens(tiny) -> None:
    tok, model = tiny
    seq, mask_a, not_a = _dialogue_sequence(tok)
    assert int(mask_a.sum()) > 10 and int(not_a.sum()) > 10
    logits = model(seq).logits[:, :-1].float()
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, seq[:, 1:].unsqueeze(-1)).squeeze(-1)  # (1, T-1)
    gen = torch.Generator().manual_seed(0)
    old = log_probs.detach() + torch.randn(log_probs.shape, generator=gen) * 0.1
    adv = torch.full(log_probs.shape, 0.8)
    params = [p for p in model.parameters() if p.requires_grad]
    loss_fn = IsolatedPolicyLoss()

    def grads(old_lp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        loss, *_ = loss_fn(log_probs, old_lp, advantages, action_mask=mask, rollout_log_probs=old_lp)
        return torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)

    base = grads(old, adv, mask_a)
    assert sum(float(g.abs().sum()) for g in base if g is not None) > 0
    counterpart = ~mask_a.bool()
    for old_other, adv_other in [(old - 5.0, -adv * 10), (torch.full_like(old, -math.inf), adv * math.nan)]:
        got = grads(torch.where(counterpart, old_other, old), torch.where(counterpart, adv_other, adv), mask_a)
        for g, b in zip(got, base):
            assert (g is None and b is None) or torch.equal(g, b)

    # it could fail: perturbing agent1's own old log-probs changes agent1's parameter gradient ...
    moved = grads(torch.where(counterpart, old, old - 0.3), adv, mask_a)
    assert any(not torch.equal(g, b) for g, b in zip(moved, base) if g is not None)
    # ... and the counterpart's mask picks different tokens, hence a different gradient
    other = grads(old, adv, not_a)
    assert any(not torch.equal(g, b) for g, b in zip(other, base) if g is not None)


def test_lora_roles_on_one_base_are_isolated(tiny) -> None:
    """Two LoRA roles on one frozen base (as when they share a checkpoint and an engine set): role A's loss and its
    adapter's gradient are unchanged by role B's tokens and by role B's adapter weights; B's adapter and the base get
    no gradient from A's loss."""
    import copy

    from peft import LoraConfig, get_peft_model

    tok, model = tiny
    seq, mask_a, not_a = _dialogue_sequence(tok)
    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules="all-linear"), adapter_name="agent1")
    peft.add_adapter("agent2", LoraConfig(r=4, target_modules="all-linear"))
    gen = torch.Generator().manual_seed(1)
    for n, p in peft.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.05, generator=gen)
    peft.base_model.set_adapter("agent1")  # (set_adapter freezes the inactive adapter: both stay in the graph)
    for n, p in peft.named_parameters():
        p.requires_grad_(".lora_" in n)
    own = [p for n, p in peft.named_parameters() if ".agent1." in n]
    other = [p for n, p in peft.named_parameters() if ".agent2." in n]
    loss_fn = IsolatedPolicyLoss()
    old_gen = torch.Generator().manual_seed(0)
    noise = torch.randn(seq.shape[0], seq.shape[1] - 1, generator=old_gen) * 0.1
    adv = torch.full(noise.shape, 0.8)

    def loss_and_grads(sequence: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        logits = peft(sequence).logits[:, :-1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, sequence[:, 1:].unsqueeze(-1)).squeeze(-1)
        old = lp.detach() + noise
        loss, *_ = loss_fn(lp, old, adv, action_mask=mask_a, rollout_log_probs=old)
        return loss.detach(), torch.autograd.grad(loss, own + other, allow_unused=True)

    loss, grads = loss_and_grads(seq)
    assert sum(float(g.abs().sum()) for g in grads[: len(own)]) > 0
    assert all(g is None or not g.any() for g in grads[len(own) :])  # role B's adapter: no gradient from A's loss
    # role B's adapter weights change: nothing of A's changes
    with torch.no_grad():
        for p in other:
            p.add_(torch.randn(p.shape, generator=gen))
    loss2, grads2 = loss_and_grads(seq)
    assert torch.equal(loss, loss2) and all(torch.equal(a, b) for a, b in zip(grads[: len(own)], grads2[: len(own)]))
    # ... and it could fail: role A's own adapter weights do change its gradient
    with torch.no_grad():
        for p in own:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    _, grads3 = loss_and_grads(seq)
    assert any(not torch.equal(a, b) for a, b in zip(grads[: len(own)], grads3[: len(own)]))
