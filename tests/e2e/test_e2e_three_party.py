"""End to end: three roles (three-party split-the-items DoND) through the same trainer.

Nothing in the pipeline assumes two roles: three DeepSpeed actors with their own optimizers, three
engine sets, three pools, Eq. 6 with four configurations ([p_all_current, p_agent1, p_agent2, p_agent3]).
The untrained tiny model's turns are malformed, so a dialogue ends at its opener's turn and only the
opener acts (and is in its groups): G = 6 rollouts of one scenario give each role 2 openings, one group
of two with different rewards.
"""

from __future__ import annotations

import pytest
import torch
from test_e2e_ibrl import _same, _weights

pytestmark = pytest.mark.slow

ROLES = ("agent1", "agent2", "agent3")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.tiny import build_tiny_dond_model
    from marti_ibrl.trainer import IBRLTrainer

    tmp = tmp_path_factory.mktemp("three")
    model = build_tiny_dond_model(tmp / "tiny")
    flags = [*("--env.name", "dond3", "--env.prompt_style", "compact", "--env.max_rounds", "1")]
    for i in (1, 2, 3):
        flags += [f"--role{i}.pretrain", model, f"--role{i}.lr", "5e-3", f"--role{i}.kl_coef", "0"]
        flags += [f"--role{i}.reward_fn", "test_e2e_ibrl:toy_reward"]
    cfg = load_config(
        [
            *flags,
            *("--role3.update_every", "2", "--pool.probs", "[0.25,0.25,0.25,0.25]", "--pool.size", "2"),
            *("--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "6"),
            *("--rollout.max_new_tokens", "10", "--rollout.max_len", "512", "--rollout.micro_batch_size", "2"),
            *("--train.micro_batch_size", "2", "--train.iterations", "2"),
            *("--ckpt.path", str(tmp / "run"), "--ckpt.save_steps", "1", "--ray.log_to_driver", "false"),
        ]
    )
    trainer = IBRLTrainer(cfg)
    history = trainer.fit()
    digests = {r: (s.weights_digest(), s.engine_digests()) for r, s in trainer.stacks.items()}
    ray.shutdown()
    return tmp, trainer, history, digests


def test_three_stacks_and_three_seats(run):
    _, trainer, history, digests = run
    assert list(trainer.stacks) == list(ROLES) and trainer.runner.env.roles == ROLES
    assert all(trainer.rollout_log[0]["opponents"][r] == "current" for r in ROLES)  # pools empty at k=1
    assert [m["agent3/scheduled"] for m in history] == [0.0, 1.0]
    assert history[0]["agent1/updated"] == history[0]["agent2/updated"] == 1.0 and history[0]["agent3/updated"] == 0.0
    for r in ROLES:
        actor, engines = digests[r]
        assert engines == [actor]
    assert len({digests[r][0] for r in ROLES}) == 3


def test_each_role_moves_only_when_it_updates(run):
    tmp, _, history, _ = run
    for r in ROLES:
        steps = [_weights(tmp / "run" / r / "ckpt" / f"global_step{k}_hf") for k in (1, 2)]
        init = {k: v.to(torch.bfloat16).float() for k, v in _weights(tmp / "tiny").items()}
        assert _same(steps[0], init) == (history[0][f"{r}/updated"] == 0.0), r
        assert _same(steps[1], steps[0]) == (history[1][f"{r}/updated"] == 0.0), r
