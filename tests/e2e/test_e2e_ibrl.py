"""End to end: 3 IB-RL iterations through Ray + DeepSpeed + HF engines on CPU, with the staggered schedule.

role1 updates every iteration, role2 every second (paper §4.2), so role2 updates at k=2 only.
A toy reward that varies across rollouts (a hash of the role's own text) gives non-zero GRPO
advantages from an untrained tiny model; it also exercises ``--roleN.reward_fn module:function``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re

import golden
import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def toy_reward(trajectory, role, scenario) -> float:
    """Deterministic, varied reward: a hash of the role's own utterances."""
    text = "".join(t.text for t in trajectory.turns if t.role == role)
    return (sum(map(ord, text)) % 7) / 6.0


def _weights(path) -> dict[str, torch.Tensor]:
    """Parameters of an HF export; the tied lm_head (saved by some exporters, not others) is dropped."""
    return {k: v.float() for k, v in load_file(str(path / "model.safetensors")).items() if k != "lm_head.weight"}


def _same(a: dict, b: dict) -> bool:
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    return all(torch.equal(a[k], b[k]) for k in a)


def tiny_flags(model: str, run_dir, iterations: int) -> list[str]:
    """The two-role tiny-model run the end-to-end tests share: 2 scenarios × G=2, 2 rounds, toy rewards."""
    return [
        *("--role1.pretrain", model, "--role2.pretrain", model),
        *("--role1.reward_fn", "test_e2e_ibrl:toy_reward", "--role2.reward_fn", "test_e2e_ibrl:toy_reward"),
        *("--role1.lr", "5e-3", "--role2.lr", "5e-3"),
        *("--env.prompt_style", "compact", "--env.max_rounds", "2"),
        *("--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2"),
        *("--rollout.max_new_tokens", "12", "--rollout.max_len", "384", "--rollout.micro_batch_size", "2"),
        *("--train.micro_batch_size", "2", "--train.iterations", str(iterations)),
        *("--ckpt.path", str(run_dir), "--ckpt.save_steps", "1"),
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.tiny import build_tiny_dond_model
    from marti_ibrl.trainer import IBRLTrainer

    tmp = tmp_path_factory.mktemp("e2e")
    model = build_tiny_dond_model(tmp / "tiny")
    # role1's reference shares its actor's device (--role1.colocate_ref): one slot less than otherwise
    cfg = load_config([*tiny_flags(model, tmp / "run", 3), "--role2.update_every", "2", "--role1.colocate_ref", "true"])
    trainer = IBRLTrainer(cfg)
    slots = ray.cluster_resources()["GPU"]
    table = _TableLines(trainer)
    with contextlib.redirect_stdout(table):
        history = trainer.fit()
    digests = {r: (s.weights_digest(), s.engine_digests()) for r, s in trainer.stacks.items()}
    ray.shutdown()
    return tmp, history, digests, (cfg, slots, table.lines)


class _TableLines(io.TextIOBase):
    """stdout during ``fit``: each line of the iteration table, with how many iterations had ended when it came."""

    def __init__(self, trainer) -> None:
        self.trainer, self.lines = trainer, []

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if re.match(r"\s*(iter\s|\d+\s)", line):
                self.lines.append((line, len(self.trainer.history)))
        return len(text)


def test_each_row_is_printed_when_its_iteration_ends(run):
    """Issue 65: a run's log shows iteration k's row before iteration k+1 starts (a Slurm .out reads live)."""
    lines = run[3][2]
    assert re.match(r"\s*iter\s+vs pool\s+agree", lines[0][0]) and lines[0][1] == 1, lines  # with the first row
    assert [(int(text.split()[0]), ended) for text, ended in lines[1:]] == [(1, 1), (2, 2), (3, 3)], lines


def test_schedule_gates_updates(run):
    _, history, _, _ = run
    assert [m["agent1/updated"] for m in history] == [1.0, 1.0, 1.0]
    assert [m["agent2/updated"] for m in history] == [0.0, 1.0, 0.0]
    assert all("agent1/policy_loss" in m for m in history)
    assert "agent2/policy_loss" not in history[0] and "agent2/policy_loss" in history[1]
    assert all(0.0 <= m["rollout/agreement"] <= 1.0 for m in history)


def test_weights_change_only_when_due(run):
    tmp, _, _, _ = run
    init = {k: v.to(torch.bfloat16).float() for k, v in _weights(tmp / "tiny").items()}
    step = {
        (role, k): _weights(tmp / "run" / role / "ckpt" / f"global_step{k}_hf")
        for role in ("agent1", "agent2")
        for k in (1, 2, 3)
    }
    # role1 (update_every=1) moves every iteration
    assert not _same(step["agent1", 1], init)
    assert not _same(step["agent1", 2], step["agent1", 1])
    assert not _same(step["agent1", 3], step["agent1", 2])
    # role2 (update_every=2) moves at k=2 only: its optimizer did not step at k=1 or k=3
    assert _same(step["agent2", 1], init)
    assert not _same(step["agent2", 2], step["agent2", 1])
    assert _same(step["agent2", 3], step["agent2", 2])
    # the final HF export is each role's own latest policy
    assert _same(_weights(tmp / "run" / "agent1" / "hf"), step["agent1", 3])
    assert _same(_weights(tmp / "run" / "agent2" / "hf"), step["agent2", 3])


def test_engines_hold_latest_weights(run):
    _, _, digests, _ = run
    for role, (actor, engines) in digests.items():
        assert engines and all(e == actor for e in engines), role
    assert digests["agent1"][0] != digests["agent2"][0]


def test_checkpoints_written(run):
    tmp, _, _, _ = run
    for role in ("agent1", "agent2"):
        actor_dir = tmp / "run" / role / "ckpt" / "_actor"
        assert sorted(p.name for p in actor_dir.iterdir() if p.is_dir()) == [
            "global_step1",
            "global_step2",
            "global_step3",
        ]
        assert (actor_dir / "latest").read_text().strip() == "global_step3"
        assert (tmp / "run" / role / "hf" / "tokenizer.json").exists()
    state = json.loads((tmp / "run" / "trainer_state.json").read_text())
    assert state["iteration"] == 3 and len(state["history"]) == 3
    assert any((tmp / "run" / "tensorboard").rglob("events.out.tfevents.*"))


def test_transcripts_kept_and_shown(run, capsys):
    """--logger.transcripts (default 4): every iteration's sample of dialogues, with text, seats, rewards, outcome."""
    from marti_ibrl.cli import main
    from marti_ibrl.rollout.transcripts import read

    tmp, history, _, _ = run
    kept = read(tmp / "run")
    assert [r["iteration"] for r in kept] == [1] * 4 + [2] * 4 + [3] * 4  # 2 scenarios x G=2 = 4: all of them
    for r in kept:
        assert r["turns"] and all(t["role"] in ("agent1", "agent2") and isinstance(t["text"], str) for t in r["turns"])
        assert set(r["seats"]) == {"agent1", "agent2"} and set(r["rewards"]) <= {"agent1", "agent2"}
    for k, m in enumerate(history, start=1):  # all of an iteration's dialogues: the mean of their rewards is its own
        if m["rollout/dialogues"] != 4:  # (a history iteration plays 8: a sample of 4 is kept)
            continue
        rewards = [r["rewards"]["agent1"] for r in kept if r["iteration"] == k and "agent1" in r["rewards"]]
        assert sum(rewards) / len(rewards) == pytest.approx(m["agent1/reward"])
    assert main(["show", str(tmp / "run"), "--iteration", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("iteration 2 · ") == 4 and kept[4]["turns"][0]["text"].strip()[:20] in out


def test_colocated_reference_takes_no_device_of_its_own(run):
    import copy

    from marti_ibrl.cluster.placement import device_slots

    _, history, _, (cfg, slots, _) = run
    apart = copy.deepcopy(cfg)
    apart.roles[0].colocate_ref = False
    # per role: actor 1 + reference 1 + engine 1 + pool engine 1; role1's reference on its actor's slot
    assert slots == device_slots(cfg) == device_slots(apart) - 1 == 7
    assert all("agent1/policy_loss" in m for m in history)  # ... and role1 trained with it (KL on: reference used)


def test_topology_records_what_ran(run):
    """RUN/topology.json: per role what its stack started (this run's config), the device and the Ray node."""
    tmp, _, _, (cfg, slots, _) = run
    topo = json.loads((tmp / "run" / "topology.json").read_text())
    assert topo["device"] == "cpu" and topo["frozen"] == {}
    from marti_ibrl.cluster.placement import pool_engine_count

    expected_reference = {"agent1": "colocated", "agent2": "separate"}  # --role1.colocate_ref true; both kl_coef > 0
    for role in cfg.roles:
        got = topo["trained"][role.name]
        assert got["ranks"] == role.num_nodes * role.num_gpus_per_node == 1
        assert (got["zero_stage"], got["param_dtype"]) == (cfg.ds.zero_stage, cfg.ds.param_dtype)
        assert (got["engine_kind"], got["engines"], got["tensor_parallel_size"]) == ("hf", role.num_engines, 1)
        assert got["pool_engines"] == pool_engine_count(cfg, role) == 1  # pools on (default pool.probs), unset: 1
        assert got["weight_sync"] == "object_store"  # CPU: no NCCL group
        assert got["reference"] == expected_reference[role.name]
    [node] = topo["nodes"]  # the local Ray: one live node with one logical "GPU" per device slot
    assert node["alive"] and node["resources"]["GPU"] == slots and node["address"]


def test_golden_trajectory(run):
    """What this seeded run learned, per iteration and role, and its final weights: pinned (tests/golden.py)."""
    _, history, digests, _ = run
    golden.check("hf", history, ["agent1", "agent2"], {r: actor for r, (actor, _) in digests.items()})
