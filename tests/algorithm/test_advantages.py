"""Per-role advantages (paper Eq. 4): groups keyed by (role, scenario), any order, explicit conventions."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker, grouped_reward_baseline
from transformers import AutoTokenizer

from marti_ibrl.algorithm.advantages import (
    acted_with_current_policy,
    group_key,
    members,
    penalized_attempts,
    role_advantages,
)
from marti_ibrl.config import ESTIMATORS  # every one the config accepts, checked against the patched OpenRLHF
from marti_ibrl.envs.dond import DondEnv, generate_scenarios
from marti_ibrl.rollout.dialogue import Attempt, Trajectory, Turn
from marti_ibrl.rollout.render import RoleView
from marti_ibrl.tiny import build_tiny_model, dond_corpus
from marti_ibrl.trainer import role_samples


def loop_reference(rewards: list[float], ids: list[str], estimator: str) -> list[float]:
    """Plain-Python Eq. 4 (and the other group baselines), one sample at a time."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r, g in zip(rewards, ids):
        groups[g].append(r)
    out = []
    for r, g in zip(rewards, ids):
        xs = groups[g]
        n = len(xs)
        mean = sum(xs) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
        if n == 1:
            out.append(0.0)
        elif estimator == "group_norm":
            out.append((r - mean) / (std + 1e-9))
        elif estimator == "rloo":
            out.append(r - (sum(xs) - r) / (n - 1))
        else:  # reinforce_baseline, dr_grpo
            out.append(r - mean)
    return out


# ---------------------------------------------------------------------------------------------------- Eq. 4 numbers


def test_group_norm_hand_computed() -> None:
    adv = role_advantages(torch.tensor([1.0, 2.0, 3.0]), ["q"] * 3, "agent1")
    assert adv.tolist() == [-1.0, 0.0, 1.0]
    # unbiased std like torch.std: mean 1, var (1+1+1+9)/3 = 4, std 2 (the biased std would be sqrt(3))
    adv = role_advantages(torch.tensor([0.0, 0.0, 0.0, 4.0]), ["q"] * 4, "agent1")
    assert adv.tolist() == [-0.5, -0.5, -0.5, 1.5]
    adv = role_advantages(torch.tensor([1.0, 3.0]), ["q", "q"], "agent1")
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0]) / math.sqrt(2))


def test_other_estimators_hand_computed() -> None:
    r = torch.tensor([0.0, 0.0, 0.0, 4.0])
    # rloo: baseline = mean of the others
    assert role_advantages(r, ["q"] * 4, "a", "rloo").tolist() == pytest.approx([-4 / 3, -4 / 3, -4 / 3, 4.0])
    assert role_advantages(r, ["q"] * 4, "a", "reinforce_baseline").tolist() == [-1.0, -1.0, -1.0, 3.0]
    assert role_advantages(r, ["q"] * 4, "a", "dr_grpo").tolist() == [-1.0, -1.0, -1.0, 3.0]


def test_groups_are_keyed_by_role_and_scenario() -> None:
    assert group_key("agent1", "gen-0-3") == "agent1/gen-0-3"
    # two scenarios interleaved: each sample is normalised within its own scenario only
    r = torch.tensor([1.0, 10.0, 2.0, 20.0, 3.0, 30.0])
    adv = role_advantages(r, ["a", "b", "a", "b", "a", "b"], "agent1")
    assert adv.tolist() == [-1.0, -1.0, 0.0, 0.0, 1.0, 1.0]


def test_reordering_invariance() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(-3, 11, (12,), generator=gen).float()  # integers: every sum is exact
    uids = ["s0", "s1", "s2"] * 4
    for estimator in ESTIMATORS:
        base = role_advantages(rewards, uids, "agent1", estimator)
        for seed in range(5):
            perm = torch.randperm(12, generator=torch.Generator().manual_seed(seed))
            shuffled = role_advantages(rewards[perm], [uids[i] for i in perm], "agent1", estimator)
            assert torch.equal(shuffled, base[perm]), estimator
        # the sorted layout (contiguous groups) too
        order = sorted(range(12), key=lambda i: uids[i])
        assert torch.equal(role_advantages(rewards[order], [uids[i] for i in order], "agent1", estimator), base[order])


def test_reordering_invariance_on_float_rewards() -> None:
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(20, generator=gen)
    uids = [f"s{i % 4}" for i in range(20)]
    base = role_advantages(rewards, uids, "agent2")
    perm = torch.randperm(20, generator=gen)
    torch.testing.assert_close(role_advantages(rewards[perm], [uids[i] for i in perm], "agent2"), base[perm])


def test_estimators_are_exactly_the_patched_group_baselines() -> None:
    """One list: the config accepts what patch 0005 computes, and an estimator without a group baseline (or a typo)
    is an error in both, never raw rewards passed through."""
    from openrlhf.trainer.ppo_utils.experience_maker import GROUP_ESTIMATORS

    assert ESTIMATORS == GROUP_ESTIMATORS
    for name in ("gae", "reinforce", "flash_reinforce", "group-norm"):
        with pytest.raises(ValueError, match=f"estimator '{name}' has no group baseline"):
            grouped_reward_baseline(torch.tensor([1.0, 2.0]), ["g", "g"], name)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("value", [5.0, 0.0, -1.0, 0.1, 0.7, 1 / 3, 7.1])
@pytest.mark.parametrize("n", [2, 4, 7, 8])
def test_zero_variance_group_gives_exactly_zero(estimator: str, value: float, n: int) -> None:
    # 7 x 0.1 in float32: the group mean is off by one ulp; without the constant-group rule group_norm
    # divided that ~1e-8 residue by std + 1e-9 and returned about -0.82 for every sample.
    adv, std = grouped_reward_baseline(torch.full((n,), value), ["g"] * n, estimator)
    assert not adv.isnan().any()
    if estimator == "rloo":
        assert adv.abs().max().item() < 1e-6  # no normalisation: a rounding residue stays a residue
    else:
        assert adv.tolist() == [0.0] * n
        assert std.tolist() == [0.0] * n


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_single_sample_group_gives_zero(estimator: str) -> None:
    adv, std = grouped_reward_baseline(torch.tensor([7.0, 1.0, 2.0, 3.0]), ["lonely", "g", "g", "g"], estimator)
    assert adv[0].item() == 0.0
    assert std[0].item() == 0.0
    assert not adv.isnan().any()
    assert adv[1:].tolist() == pytest.approx(loop_reference([1.0, 2.0, 3.0], ["g"] * 3, estimator))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_vectorised_estimators_match_loop_reference(estimator: str) -> None:
    rng = random.Random(1234)
    for _ in range(20):
        n_groups = rng.randint(1, 6)
        ids = [f"agent{rng.randint(1, 2)}/q{rng.randrange(n_groups)}" for _ in range(rng.randint(1, 30))]
        rewards = [rng.choice([rng.uniform(-2, 10), float(rng.randint(-1, 10))]) for _ in ids]
        got, _ = grouped_reward_baseline(torch.tensor(rewards, dtype=torch.float64), ids, estimator)
        assert got.tolist() == pytest.approx(loop_reference(rewards, ids, estimator), rel=1e-9, abs=1e-9)


def test_group_std_is_reported_per_sample() -> None:
    _, std = grouped_reward_baseline(torch.tensor([1.0, 0.0, 3.0, 4.0, 2.0]), ["a", "b", "a", "b", "a"], "group_norm")
    torch.testing.assert_close(std, torch.tensor([1.0, math.sqrt(8), 1.0, math.sqrt(8), 1.0]))


# ------------------------------------------------------------------------------------------------- isolation


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_changing_role_b_rewards_leaves_role_a_bit_identical(estimator: str) -> None:
    gen = torch.Generator().manual_seed(3)
    n = 16
    uids = [f"q{i % 4}" for i in range(n)]
    roles = ["agent1", "agent2"] * (n // 2)
    ids = [group_key(role, uid) for role, uid in zip(roles, uids)]
    is_a = torch.tensor([r == "agent1" for r in roles])
    rewards = torch.randn(n, generator=gen)
    base, _ = grouped_reward_baseline(rewards, ids, estimator)
    for change in (torch.randn(n, generator=gen) * 100, torch.full((n,), 1e6), torch.zeros(n)):
        perturbed = torch.where(is_a, rewards, change)
        got, _ = grouped_reward_baseline(perturbed, ids, estimator)
        assert torch.equal(got[is_a], base[is_a])
        assert not torch.equal(got[~is_a], base[~is_a])  # role B did see its change
    # and role A alone (how the trainer calls it: one role per experience maker) gives the same numbers
    alone = role_advantages(rewards[is_a], [u for u, a in zip(uids, is_a) if a], "agent1", estimator)
    assert torch.equal(alone, base[is_a])


# ------------------------------------------------------------------- OpenRLHF's experience maker: ids vs positions


def _maker(estimator: str, n_samples: int) -> RemoteExperienceMaker:
    args = SimpleNamespace(
        rollout=SimpleNamespace(n_samples_per_prompt=n_samples),
        algo=SimpleNamespace(
            advantage=SimpleNamespace(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False),
        ),
        reward=SimpleNamespace(clip_range=None, overlong_buffer_len=None, stop_properly_penalty_coef=None),
    )
    return RemoteExperienceMaker(None, None, None, None, SimpleNamespace(value=0.0), SimpleNamespace(args=args), None)


def _experiences(rewards: list[float], masks: list[list[int]], order: list[int], with_ids: bool, n: int):
    """One batch-1 Experience per sample, listed in ``order``; sample i belongs to prompt i // n."""
    out = []
    for i in order:
        mask = torch.tensor([masks[i]], dtype=torch.long)
        exp = Experience(
            action_mask=mask,
            kl=torch.zeros(mask.shape),
            rewards=torch.tensor([rewards[i]]),
            index=[i],
            info={},
        )
        if with_ids:
            exp.group_ids = [f"agent1/q{i // n}"]
        out.append(exp)
    return out


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_group_ids_reproduce_positional_path_on_contiguous_groups(estimator: str) -> None:
    n, n_prompts, width = 4, 3, 7
    rng = random.Random(7)
    rewards = [rng.uniform(-1, 10) for _ in range(n * n_prompts)]
    masks = []
    for _ in rewards:  # two own turns separated by a counterpart turn, random lengths
        a, b, c = rng.randint(0, 2), rng.randint(1, 2), rng.randint(3, 5)
        masks.append([0] * a + [1] * b + [0] * (c - a - b) + [1] * (width - c))
    order = list(range(len(rewards)))
    rng.shuffle(order)  # the maker receives them shuffled; ``index`` restores positions

    positional = _maker(estimator, n).compute_advantages_and_returns(_experiences(rewards, masks, order, False, n))
    by_ids = _maker(estimator, n).compute_advantages_and_returns(_experiences(rewards, masks, order, True, n))
    for p, g in zip(positional, by_ids):
        torch.testing.assert_close(g.advantages, p.advantages, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.returns, p.returns, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.info["group_reward_std"], p.info["group_reward_std"])
        assert g.kl is None and p.kl is None

    if estimator == "group_norm":  # concrete: the advantage is Eq. 4, constant over the role's own tokens
        ref = loop_reference(rewards, [f"q{i // n}" for i in range(len(rewards))], estimator)
        for exp, i in zip(by_ids, order):
            own = exp.advantages[exp.action_mask.bool()]
            assert own.tolist() == pytest.approx([ref[i]] * len(own), abs=1e-5)


def test_experience_maker_hand_computed_with_ids_in_any_order() -> None:
    rewards = [3.0, 1.0, 2.0, 5.0, 5.0]
    ids = ["agent1/x", "agent1/x", "agent1/x", "agent1/y", "agent1/y"]
    exps = []
    for r, g in zip(rewards, ids):
        exps.append(
            Experience(
                action_mask=torch.tensor([[0, 1, 1, 0, 1]]),
                kl=torch.zeros(1, 5),
                rewards=torch.tensor([r]),
                group_ids=[g],
                info={},
            )
        )
    out = _maker("group_norm", 4).compute_advantages_and_returns(exps)  # n_samples_per_prompt is not used
    assert [e.advantages[0, -1].item() for e in out] == [1.0, -1.0, 0.0, 0.0, 0.0]
    assert [e.info["group_reward_std"].item() for e in out] == [1.0, 1.0, 1.0, 0.0, 0.0]


# --------------------------------------------------------------------------------- membership rule: role_samples


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny"), dond_corpus()))


UTTERANCES = [
    "Hello! I would like to make a deal.",
    "<try> item0=1 item1=0 item2=2 <try>",
    "I accept your offer.",
    "<selection> item0=0 item1=1 item2=0 <selection>",
]


def _trajectory(tok, env: DondEnv, scenario, uid: str, policies: dict[str, str], rewards: dict[str, float], g: int):
    seats = ["agent1", "agent2"] if g % 2 == 0 else ["agent2", "agent1"]
    views = {r: RoleView(tok, env.system_prompt(scenario, r)) for r in env.roles}
    traj = Trajectory(uid, scenario, seats, dict(policies), views=views, rewards=dict(rewards), sample_index=g)
    for k, text in enumerate(UTTERANCES):
        speaker = seats[k % 2]
        ids = list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
        lps = [-0.01 * (j + 1) for j in range(len(ids))]
        views[speaker].add_own(ids, lps, finished=True)
        for other in env.roles:
            if other != speaker:
                views[other].add_counterpart(text)
        traj.turns.append(Turn(speaker, text, ids, lps, True))
    return traj


def test_acted_with_current_policy() -> None:
    assert acted_with_current_policy({"agent1": "current", "agent2": "pool:3"}, "agent1")
    assert not acted_with_current_policy({"agent1": "current", "agent2": "pool:3"}, "agent2")
    assert not acted_with_current_policy({"agent1": "frozen:bot"}, "agent1")
    assert not acted_with_current_policy({"agent1": "current"}, "agent2")


def test_role_samples_membership_groups_rewards_and_masks(tok) -> None:
    env = DondEnv(prompt_style="compact")
    s0, s1 = generate_scenarios(2, seed=5)
    trajs = [
        _trajectory(tok, env, s0, "q0", {"agent1": "current", "agent2": "current"}, {"agent1": 6, "agent2": 4}, 0),
        _trajectory(tok, env, s0, "q0", {"agent1": "current", "agent2": "pool:2"}, {"agent1": -1, "agent2": 0}, 1),
        _trajectory(tok, env, s1, "q1", {"agent1": "pool:1", "agent2": "current"}, {"agent1": 3, "agent2": 7}, 0),
        _trajectory(tok, env, s1, "q1", {"agent1": "frozen:bot", "agent2": "current"}, {"agent1": 0, "agent2": 2}, 1),
    ]
    expected = {"agent1": [0, 1], "agent2": [0, 2, 3]}
    for role, member_index in expected.items():
        chosen = members(trajs, role)
        assert chosen == [trajs[i] for i in member_index]
        samples = role_samples([(t, t.rewards[role]) for t in chosen], role, max_len=4096)
        assert len(samples) == len(member_index)
        for exp, t_index in zip(samples, member_index):
            traj = trajs[t_index]
            assert exp.group_ids == [f"{role}/{traj.scenario_uid}"]
            assert exp.rewards.tolist() == [float(traj.rewards[role])]
            assert exp.labels == [traj.scenario_uid]
            seq = exp.sequences[0]
            assert seq.tolist() == traj.views[role].ids
            mask = exp.action_mask[0].bool()
            assert mask.shape == (len(seq) - 1,)
            # the mask covers exactly the role's own generated tokens (eos included), nothing of the counterpart
            own = [i for turn in traj.turns if turn.role == role for i in turn.token_ids]
            assert seq[1:][mask].tolist() == own
            assert int(mask.sum()) == len(own)
            own_text = [turn.text for turn in traj.turns if turn.role == role]
            spans = [tok.decode(seq[s:e].tolist(), skip_special_tokens=True) for s, e in traj.views[role].action_ranges]
            assert spans == own_text
            # rollout log-probs are the engine's at the role's tokens and 0 elsewhere
            lps = exp.rollout_log_probs[0]
            assert lps[mask].tolist() == pytest.approx([x for t in traj.turns if t.role == role for x in t.logprobs])
            assert lps[~mask].abs().sum().item() == 0.0


def test_discarded_attempts_are_penalised_samples_of_their_role_alone(tok) -> None:
    env = DondEnv(prompt_style="compact")
    (s0,) = generate_scenarios(1, seed=5)
    both = {"agent1": "current", "agent2": "current"}
    kept = _trajectory(tok, env, s0, "q0", both, {"agent1": 6, "agent2": 4}, 0)
    pooled = _trajectory(tok, env, s0, "q0", {"agent1": "current", "agent2": "pool:1"}, {"agent1": 2, "agent2": 2}, 1)
    bad = list(tok("<try<try<try", add_special_tokens=False)["input_ids"])
    for t in (kept, pooled):  # agent2's second turn was re-sampled once before the kept one
        view = t.views["agent2"]
        start = view.action_ranges[-1][0]
        t.discarded.append(Attempt("agent2", "<try<try<try", view.ids[:start], bad, [-0.5] * len(bad), False, "x"))
    assert penalized_attempts(members([kept, pooled], "agent1"), "agent1", -1.0) == []
    (stub,) = penalized_attempts(members([kept, pooled], "agent2"), "agent2", -1.0)  # pool:1 wrote the other
    assert stub.scenario_uid == "q0" and stub.learners == ("agent2",) and stub.rewards == {"agent2": -1.0}
    assert stub.outcome.malformed and stub.outcome.info["fault_role"] == "agent2"
    assert members([stub], "agent1") == [] and members([stub], "agent2") == [stub]
    (exp,) = role_samples([(stub, -1.0)], "agent2", max_len=4096)
    seq, mask = exp.sequences[0], exp.action_mask[0].bool()
    assert exp.group_ids == ["agent2/q0"] and exp.rewards.tolist() == [-1.0] and bool(exp.truncated[0])
    assert seq.tolist() == kept.discarded[0].prompt_ids + bad
    assert seq[1:][mask].tolist() == bad  # the attempt alone is its action: the turns before it are context
    assert exp.rollout_log_probs[0][mask].tolist() == [-0.5] * len(bad)
    # in the group of q0, below the kept dialogue: a negative advantage, the kept one's positive
    adv = role_advantages(torch.tensor([4.0, -1.0]), ["q0", "q0"], "agent2")
    assert adv[1] < 0 < adv[0]


def test_members_exclude_failed_dialogues_and_roles_that_never_spoke(tok) -> None:
    env = DondEnv(prompt_style="compact")
    (s0,) = generate_scenarios(1, seed=5)
    both = {"agent1": "current", "agent2": "current"}
    full = _trajectory(tok, env, s0, "q0", both, {"agent1": 1, "agent2": 2}, 0)
    failed = _trajectory(tok, env, s0, "q0", both, {"agent1": 1, "agent2": 2}, 0)
    failed.failed = True  # a frozen endpoint gave up mid-dialogue: counted, never trained on
    views = {r: RoleView(tok, env.system_prompt(s0, r)) for r in env.roles}
    short = Trajectory("q0", s0, ["agent1", "agent2"], dict(both), views=views, rewards={"agent1": -1, "agent2": 0})
    ids = list(tok(UTTERANCES[0], add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
    views["agent1"].add_own(ids, None, finished=True)  # agent1 opened (malformed, say); agent2 never spoke
    views["agent2"].add_counterpart(UTTERANCES[0])
    trajs = [full, failed, short]
    assert members(trajs, "agent1") == [full, short]
    assert members(trajs, "agent2") == [full]


def test_members_are_of_the_roles_own_pairing(tok) -> None:
    """Eq. 6 as written (p_agent1): agent1's groups hold the pairing current agent1 vs historical agent2, agent2's
    hold the all-current pairing; the snapshot's tokens are in no group, and current agent1's all-current
    dialogues are not in agent1's group either (they belong to agent2's pairing)."""
    env = DondEnv(prompt_style="compact")
    (s0,) = generate_scenarios(1, seed=5)
    vs_history = [
        _trajectory(tok, env, s0, "q0", {"agent1": "current", "agent2": "pool:3"}, {"agent1": 1, "agent2": 2}, g)
        for g in range(2)
    ]
    current = [
        _trajectory(tok, env, s0, "q0", {"agent1": "current", "agent2": "current"}, {"agent1": 1, "agent2": 2}, g)
        for g in range(2)
    ]
    for t in vs_history:
        t.learners = ("agent1",)
    for t in current:
        t.learners = ("agent2",)
    trajs = vs_history + current
    assert members(trajs, "agent1") == vs_history  # G members, all of its own pairing
    assert members(trajs, "agent2") == current
    for t in trajs:  # without pairings (learners None) every dialogue a role's current policy played is its own
        t.learners = None
    assert members(trajs, "agent1") == trajs and members(trajs, "agent2") == current
