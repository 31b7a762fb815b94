"""End to end: unilateral RL (paper §5) — agent1 trains, agent2 is frozen.

agent2's seat is played by a pool of three frozen counterparts, one sampled per scenario (pool-of-N,
§5.4): a scripted bot, a checkpoint served by its own rollout engine, and an OpenAI-compatible endpoint
(a real HTTP server on 127.0.0.1 that always answers "<disagree>"). Only agent1 has a DeepSpeed actor, on two
data-parallel ranks: its samples (a count that is not a multiple of micro-batch × ranks) are all trained.
agent1's reward function is a buggy one (:func:`broken_reward`): NaN for some dialogues, a ValueError for others;
those leave its groups, counted, and its weights stay finite.
"""

from __future__ import annotations

import json
import math
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from test_e2e_ibrl import _same, _weights, toy_reward

pytestmark = pytest.mark.slow


def broken_reward(trajectory, role, scenario) -> float:
    """:func:`toy_reward` with a bug: NaN for one value of a hash of the dialogue (a 0/0), a ValueError for another
    (hashed by scenario and sample, not by text: a tiny model's repeated turns would otherwise fail together)."""
    bucket = zlib.crc32(f"{trajectory.scenario_uid}/{trajectory.sample_index}/{role}".encode()) % 5
    if bucket == 0:
        return float("nan")
    if bucket == 1:
        raise ValueError("no score for this dialogue")
    return toy_reward(trajectory, role, scenario)


class _Chat(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Chat.requests.append({"body": body, "auth": self.headers.get("Authorization")})
        reply = {"choices": [{"message": {"role": "assistant", "content": "Not for me. <disagree>"}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import os

    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.tiny import build_tiny_dond_model
    from marti_ibrl.trainer import IBRLTrainer

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["E2E_ENDPOINT_KEY"] = "sk-e2e"
    tmp = tmp_path_factory.mktemp("unilateral")
    model = build_tiny_dond_model(tmp / "tiny")
    endpoint = f"endpoint:scripted@http://127.0.0.1:{server.server_port}/v1#E2E_ENDPOINT_KEY"
    cfg = load_config(
        [
            *("--role1.pretrain", model, "--role1.lr", "5e-3", "--role1.kl_coef", "0"),
            *("--role1.num_gpus_per_node", "2"),  # two DeepSpeed ranks
            *("--role1.reward_fn", "test_e2e_baselines:broken_reward", "--ds.param_dtype", "fp32"),
            *("--role2.frozen", f"bot:greedy,checkpoint:{model},{endpoint}"),
            *("--env.prompt_style", "compact", "--env.max_rounds", "2"),
            *("--rollout.batch_size", "6", "--rollout.n_samples_per_prompt", "2"),
            *("--rollout.max_new_tokens", "12", "--rollout.max_len", "384", "--rollout.micro_batch_size", "4"),
            *("--train.micro_batch_size", "4", "--train.iterations", "2"),
            *("--ckpt.path", str(tmp / "run"), "--ckpt.save_steps", "1", "--ray.log_to_driver", "false"),
        ]
    )
    trainer = IBRLTrainer(cfg)
    history = trainer.fit()
    ray.shutdown()
    server.shutdown()
    return tmp, trainer, history


def test_only_the_trained_role_has_a_stack(run):
    tmp, trainer, history = run
    assert list(trainer.stacks) == ["agent1"]
    assert not (tmp / "run" / "agent2").exists()
    assert [m["agent1/updated"] for m in history] == [1.0, 1.0]
    assert [m["agent2/updated"] for m in history] == [0.0, 0.0]
    init = _weights(tmp / "tiny")  # fp32, as the role trains (--ds.param_dtype fp32) and exports
    assert not _same(_weights(tmp / "run" / "agent1" / "hf"), init)


def test_counterparts_sampled_per_scenario(run):
    _, trainer, history = run
    names = {"frozen:bot:greedy", "frozen:checkpoint:", "frozen:endpoint:"}
    seen = set()
    for entry in trainer.rollout_log:
        assert entry["configuration"] == "both" and entry["opponents"]["agent1"] == "current"
        for name in entry["opponents"]["agent2"].split(","):
            seen.add(next(n for n in names if name.startswith(n)))
    assert seen == names  # 12 scenario draws over 3 counterparts: each one played
    assert all(m["agent2/current_share"] == 0.0 and m["agent1/current_share"] == 1.0 for m in history)


def test_endpoint_was_called_with_the_role_view(run):
    _, _, history = run
    assert _Chat.requests, "the endpoint counterpart never played"
    first = _Chat.requests[0]
    assert first["auth"] == "Bearer sk-e2e"
    assert first["body"]["model"] == "scripted" and first["body"]["max_tokens"] == 12
    assert (
        first["body"]["messages"][0]["role"] == "system" and "agent" not in first["body"]["messages"][0]["content"][:0]
    )
    assert all(m["rollout/failed"] == 0.0 for m in history)


def test_two_ranks_train_every_sample_once(run):
    _, trainer, history = run
    assert trainer.stacks["agent1"].dp_ranks == 2
    for m in history:
        made = m["agent1/samples_made"]
        trained = [m[f"agent1/rank{r}/samples_trained"] for r in (0, 1)]
        padding = [m[f"agent1/rank{r}/samples_padding"] for r in (0, 1)]
        assert made > 0 and m["agent1/samples_trained"] == sum(trained) == made  # none dropped, none twice
        assert m["agent1/samples_padding"] == sum(padding) < 2 * 4
        assert trained[0] + padding[0] == trained[1] + padding[1]  # equal shares of whole micro-batches (4)
        assert (trained[0] + padding[0]) % 4 == 0 and abs(trained[0] - trained[1]) <= 1
        for key in ("policy_loss", "ppo_clip_ratio", "ppo_kl"):  # padding rows leave no NaN in the statistics
            assert math.isfinite(m[f"agent1/{key}"]), key
    # counts the old rule (the smallest rank's whole micro-batches) trained only part of
    assert any(m["agent1/samples_made"] % (2 * 4) for m in history)
    assert all(m["agent1/samples_padding"] > 0 for m in history if m["agent1/samples_made"] % 8)
    assert not any(k.startswith("agent2/samples") for k in history[0])  # frozen: no samples of its own


def test_broken_rewards_leave_the_groups_and_never_reach_the_weights(run):
    """NaN rewards and a raising reward function (the run goes on): those dialogues are counted and left out of
    agent1's groups, every update steps (no NaN loss to skip), and every checkpoint written is finite."""
    tmp, trainer, history = run
    failures = [m["agent1/reward/failures"] for m in history]
    assert sum(failures) >= 2, failures  # the hash hits both bugs over 2 × 12 dialogues
    for m in history:
        assert m["agent1/reward_failed"] == m["agent1/reward/failures"] / m["rollout/dialogues"] <= 0.5
        dialogues = m["agent1/samples_made"] - m["agent1/samples_penalized"]  # (the rest: re-sampled attempts)
        assert dialogues <= m["rollout/dialogues"] - m["agent1/reward/failures"]
        assert math.isfinite(m["agent1/reward"]) and math.isfinite(m["agent1/policy_loss"])
        assert (m["agent1/update/steps"], m["agent1/update/skipped"], m["agent1/updated"]) == (1.0, 0.0, 1.0)
    exports = [tmp / "run" / "agent1" / "hf", *(tmp / "run" / "agent1" / "ckpt").glob("global_step*_hf")]
    assert len(exports) == 3
    for path in exports:
        assert all(torch.isfinite(w).all() for w in _weights(path).values()), path
