"""Table-3 ablations: shared reward, joint normalisation (hand-computed), no_stabilization config rewrite."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from marti_ibrl.algorithm.ablations import ABLATIONS, get, joint_normalized_advantages, resolve
from marti_ibrl.algorithm.advantages import role_advantages
from marti_ibrl.config import Config, ConfigError, RoleConfig, load_config
from marti_ibrl.rollout.dialogue import Trajectory


def _traj(rewards: dict[str, float]) -> Trajectory:
    return Trajectory(
        scenario_uid="q0",
        scenario=None,
        seats=list(rewards),
        policies={r: "current" for r in rewards},
        rewards=dict(rewards),
    )


# -- training_reward -------------------------------------------------------------------------------------------------


def test_training_reward_is_the_roles_own_reward_without_shared_reward() -> None:
    t = _traj({"agent1": 3.0, "agent2": 5.0})
    for ablation in ("none", "joint_norm", "no_stabilization"):
        assert get(ablation).training_reward(t, "agent1") == 3.0
        assert get(ablation).training_reward(t, "agent2") == 5.0


def test_shared_reward_is_the_sum_of_every_roles_reward() -> None:
    t = _traj({"agent1": 3.0, "agent2": 5.0})
    assert get("shared_reward").training_reward(t, "agent1") == 8.0
    assert get("shared_reward").training_reward(t, "agent2") == 8.0
    t3 = _traj({"agent1": -1.0, "agent2": 2.5, "agent3": 4.0})
    assert get("shared_reward").training_reward(t3, "agent3") == 5.5
    assert isinstance(get("shared_reward").training_reward(t, "agent1"), float)


# -- joint_normalized_advantages -------------------------------------------------------------------------------------


def test_joint_norm_pools_both_roles_of_a_scenario() -> None:
    samples = [("agent1", "q", 1.0), ("agent1", "q", 3.0), ("agent2", "q", 10.0), ("agent2", "q", 14.0)]
    # by hand: mean 7, deviations -6 -4 3 7, sum of squares 110, unbiased var 110/3
    sigma = math.sqrt(110 / 3)
    expected = [-6 / sigma, -4 / sigma, 3 / sigma, 7 / sigma]
    got = joint_normalized_advantages(samples)
    assert got == pytest.approx(expected, abs=1e-7)
    assert got == pytest.approx([-0.990867, -0.660578, 0.495434, 1.156012], abs=1e-5)


def test_joint_norm_differs_from_per_role_group_norm_when_scales_differ() -> None:
    r1, r2 = [1.0, 3.0], [10.0, 14.0]
    uids = ["q", "q"]
    per_role = {
        "agent1": role_advantages(torch.tensor(r1), uids, "agent1").tolist(),
        "agent2": role_advantages(torch.tensor(r2), uids, "agent2").tolist(),
    }
    # Eq. 4 per role: each role's better trajectory is +1/sqrt(2), its worse one -1/sqrt(2)
    h = 1 / math.sqrt(2)
    assert per_role["agent1"] == pytest.approx([-h, h], abs=1e-6)
    assert per_role["agent2"] == pytest.approx([-h, h], abs=1e-6)
    joint = joint_normalized_advantages([("agent1", "q", r) for r in r1] + [("agent2", "q", r) for r in r2])
    # the joint baseline is biased by the scale gap: agent1's *better* rollout gets a negative advantage,
    # agent2's worse one a positive advantage
    assert all(a < 0 for a in joint[:2]) and all(a > 0 for a in joint[2:])
    assert joint[:2] != pytest.approx(per_role["agent1"], abs=0.1)
    assert joint[2:] != pytest.approx(per_role["agent2"], abs=0.1)


def test_joint_norm_keeps_scenarios_separate_in_any_order() -> None:
    samples = [
        ("agent1", "q1", 1.0),
        ("agent2", "q2", 4.0),
        ("agent1", "q1", 3.0),
        ("agent1", "q2", 0.0),
        ("agent2", "q1", 10.0),
        ("agent2", "q2", 8.0),
        ("agent2", "q1", 14.0),
    ]
    got = joint_normalized_advantages(samples)
    s1 = math.sqrt(110 / 3)  # q1: {1, 3, 10, 14}
    s2 = math.sqrt(16)  # q2: {4, 0, 8}: mean 4, deviations 0 -4 4, unbiased var 32/2
    expected = [-6 / s1, 0.0, -4 / s1, -4 / s2, 3 / s1, 4 / s2, 7 / s1]
    assert got == pytest.approx(expected, abs=1e-7)
    q1_alone = joint_normalized_advantages([s for s in samples if s[1] == "q1"])
    assert q1_alone == pytest.approx([g for g, s in zip(got, samples) if s[1] == "q1"], abs=1e-9)


def test_joint_norm_degenerate_groups_give_zero() -> None:
    got = joint_normalized_advantages([("agent1", "c", 0.1)] * 7 + [("agent2", "single", 5.0)])
    assert got == [0.0] * 8  # a constant scenario (0.1 rounding residue included) and a single-sample scenario


# -- resolve ---------------------------------------------------------------------------------------------------------


def _cfg(ablation: str, probs: list[float], update_every: tuple[int, int]) -> Config:
    cfg = Config(
        roles=[
            RoleConfig(name="agent1", update_every=update_every[0]),
            RoleConfig(name="agent2", update_every=update_every[1]),
        ],
        ablation=ablation,
    )
    cfg.pool.probs = list(probs)
    return cfg


def test_no_stabilization_disables_the_pool_and_staggering_without_mutating_the_input() -> None:
    cfg = _cfg("no_stabilization", [0.7, 0.2, 0.1], (1, 3))
    before = copy.deepcopy(cfg)
    out, lines = resolve(cfg)
    assert out is not cfg
    assert out.pool.probs == [1.0, 0.0, 0.0]
    assert [r.update_every for r in out.roles] == [1, 1]
    assert len(lines) == 2  # probs + role2.update_every; role1 already updates every iteration
    assert lines[0].startswith("pool.probs [0.7, 0.2, 0.1] -> ")
    assert lines[1].startswith("role2.update_every 3 -> 1")
    assert cfg == before  # the input config is untouched
    assert cfg.pool.probs == [0.7, 0.2, 0.1] and cfg.roles[1].update_every == 3
    # everything else is carried over
    assert out.rollout == cfg.rollout and out.train == cfg.train and [r.name for r in out.roles] == ["agent1", "agent2"]

    out, lines = resolve(_cfg("no_stabilization", [0.7, 0.2, 0.1], (2, 4)))
    assert len(lines) == 3 and [r.update_every for r in out.roles] == [1, 1]
    assert lines[1].startswith("role1.update_every 2 -> 1") and lines[2].startswith("role2.update_every 4 -> 1")


def test_no_stabilization_on_an_already_stable_config_changes_nothing() -> None:
    cfg = _cfg("no_stabilization", [1.0, 0.0, 0.0], (1, 1))
    out, lines = resolve(cfg)
    assert lines == []
    assert out == cfg


def test_the_registry_is_table_3() -> None:
    assert list(ABLATIONS) == ["none", "shared_reward", "joint_norm", "no_stabilization"]
    switches = {n: (a.shared_reward, a.joint_baseline, a.stabilization) for n, a in ABLATIONS.items()}
    assert switches == {
        "none": (False, False, True),  # the full method
        "shared_reward": (True, False, True),
        "joint_norm": (False, True, True),
        "no_stabilization": (False, False, False),
    }  # each ablation switches off exactly one component
    with pytest.raises(ValueError, match=r"unknown ablation 'bogus': must be one of \('none', 'shared_reward'"):
        get("bogus")


def test_load_config_applies_the_ablation_once(tmp_path, capsys) -> None:
    """The effective config comes out of load_config (so trainer, plan and placement agree); a hand-made config
    that still needs the ablation's changes is refused by the trainer before anything starts."""
    from marti_ibrl.tiny import build_tiny_dond_model
    from marti_ibrl.trainer import IBRLTrainer

    m = build_tiny_dond_model(tmp_path / "tiny")
    flags = ["--role1.pretrain", m, "--role2.pretrain", m, "--role2.update_every", "2"]
    cfg = load_config([*flags, "--ablation", "no_stabilization", "--ckpt.path", str(tmp_path / "run")])
    assert cfg.pool.probs == [1.0, 0.0, 0.0] and [r.update_every for r in cfg.roles] == [1, 1]
    err = capsys.readouterr().err
    assert "--ablation no_stabilization: pool.probs [0.7, 0.2, 0.1] -> [1.0, 0, ...] (no opponent pool)" in err
    assert "--ablation no_stabilization: role2.update_every 2 -> 1 (no staggered updates)" in err
    assert resolve(cfg) == (cfg, [])  # applied: resolving again changes nothing
    plain = load_config([*flags, "--ckpt.path", str(tmp_path / "run")])
    assert plain.pool.probs == [0.7, 0.2, 0.1] and plain.roles[1].update_every == 2
    plain.ablation = "no_stabilization"  # by hand, without its changes
    with pytest.raises(ConfigError, match="--ablation no_stabilization is not applied to this config"):
        IBRLTrainer(plain)
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("ablation", [a for a in ABLATIONS if a != "no_stabilization"])
def test_other_ablations_leave_the_config_alone(ablation: str) -> None:
    cfg = _cfg(ablation, [0.7, 0.2, 0.1], (1, 3))
    out, lines = resolve(cfg)
    assert out is cfg and lines == []
    assert out.pool.probs == [0.7, 0.2, 0.1] and out.roles[1].update_every == 3


def test_joint_norm_advantages_pass_through_the_role_experience_maker() -> None:
    """joint_norm: the driver's joint advantages reach the loss unchanged (no per-role baseline on top)."""
    from openrlhf.trainer.ppo_utils.experience import Experience
    from test_advantages import _maker

    from marti_ibrl.backend.actors import IsolatedExperienceMaker

    samples = [("agent1", "q", 1.0), ("agent1", "q", 3.0), ("agent2", "q", 10.0), ("agent2", "q", 14.0)]
    joint = joint_normalized_advantages(samples)
    base = _maker("group_norm", 2)
    maker = IsolatedExperienceMaker.__new__(IsolatedExperienceMaker)
    maker.__dict__.update(base.__dict__)

    def exps():  # agent1's two samples, as its stack builds them
        return [
            Experience(
                action_mask=torch.tensor([[0, 1, 1]]),
                kl=torch.zeros(1, 3),
                rewards=torch.tensor([r]),
                group_ids=["agent1/q"],
                info={},
            )
            for r in joint[:2]
        ]

    maker.precomputed_advantages = True
    out = maker.compute_advantages_and_returns(exps())
    assert [e.advantages[0, -1].item() for e in out] == pytest.approx(joint[:2], abs=1e-6)
    maker.precomputed_advantages = False  # the default path re-normalises within agent1's own group: ±1/√2
    out = maker.compute_advantages_and_returns(exps())
    assert [e.advantages[0, -1].item() for e in out] == pytest.approx([-(0.5**0.5), 0.5**0.5], abs=1e-5)
