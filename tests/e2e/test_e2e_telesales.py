"""End to end: one IB-RL iteration on TeleSales (issue 6 §6) through Ray + DeepSpeed + HF engines on CPU.

Both roles (``sales``, ``customer``) are tiny local models; their rewards come from the LLM judges (§5.1), served by
a real HTTP server on 127.0.0.1 speaking the OpenAI chat API (``test_players.FakeServer``). The server scores each
call from a hash of its prompt, so rewards vary across rollouts (non-zero GRPO advantages) and each one can be
recomputed here from the reply the server sent; it refuses every judgement of one customer call (invalid JSON
until the retries run out), which must drop that call from the customer's group, never score it 0.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading

import pytest
import test_players

from marti_ibrl.envs.telesales.judges import CustomerJudge, trajectory_reward

pytestmark = pytest.mark.slow

serve = test_players.serve  # fixture: the 127.0.0.1 OpenAI-style server of the player tests
TURNS = re.compile(r"Turns to score: exactly these (agent|customer) turns, each once: ([0-9, ]+)\.")


class ScoringJudge:
    """Answers judge requests: every criterion of every listed turn, and the episode score, are k = a hash of the
    prompt mod 11; the first customer call it sees gets invalid output on every attempt."""

    def __init__(self):
        self.scores: dict[str, int] = {}  # prompt -> k
        self.doomed: str | None = None
        self.lock = threading.Lock()

    def __call__(self, body: dict) -> test_players.Reply:
        prompt = body["messages"][-1]["content"]
        who, listed = TURNS.search(prompt).groups()
        with self.lock:
            if who == "customer" and self.doomed in (None, prompt):
                self.doomed = prompt
                return test_players.ok('{"turns": "not a list"}')
            k = self.scores.setdefault(prompt, int(hashlib.sha1(prompt.encode()).hexdigest(), 16) % 11)
        criteria = ("relevance", "compliance", "contact_push") if who == "agent" else CustomerJudge.criteria
        turns = [{"turn": int(n), **dict.fromkeys(criteria, k), "reason": "ok"} for n in listed.split(",")]
        episode = "outcome" if who == "agent" else "realism"
        return test_players.ok(json.dumps({"turns": turns, episode: k, "reason": "ok"}))


@pytest.fixture(scope="module")
def judge_server():
    server = test_players.FakeServer(ScoringJudge())
    yield server
    server.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory, judge_server):
    import ray

    from marti_ibrl.config import load_config
    from marti_ibrl.tiny import build_tiny_telesales_model
    from marti_ibrl.trainer import IBRLTrainer

    tmp = tmp_path_factory.mktemp("e2e_telesales")
    model = build_tiny_telesales_model(tmp / "tiny")
    cfg = load_config(
        [
            *("--env.name", "telesales", "--env.max_rounds", "2", "--env.num_scenarios", "8"),
            *("--role1.pretrain", model, "--role2.pretrain", model, "--role1.lr", "5e-3", "--role2.lr", "5e-3"),
            # no reference models and no pool engines: fewer processes to start
            *("--role1.kl_coef", "0", "--role2.kl_coef", "0", "--pool.probs", "[1.0,0,0]"),
            *("--judge.base_url", judge_server.base_url, "--judge.model", "judge", "--judge.max_retries", "1"),
            *("--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "16"),
            *("--rollout.max_len", "1800", "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2"),
            *("--train.iterations", "1", "--ckpt.path", str(tmp / "run")),
        ]
    )
    trainer = IBRLTrainer(cfg)
    played = []
    rollout = trainer.runner.run

    def keep(*args, **kw):  # the iteration's trajectories, for the checks below
        trajectories = rollout(*args, **kw)
        played.extend(trajectories)
        return trajectories

    trainer.runner.run = keep
    history = trainer.fit()
    ray.shutdown()
    return trainer, history, played


def test_rewards_are_the_judges_verdicts(run, judge_server):
    trainer, _, played = run
    judge = judge_server.script
    assert len(played) == 4 and all(t.state.done for t in played)
    for t in played:
        sales_k = judge.scores[trainer.rewards.judges["sales"].messages(t)[-1]["content"]]
        penalty = -1.0 if t.state.malformed and t.state.fault_role == "sales" else 0.0
        n = sum(turn.role == "sales" for turn in t.turns)
        expected = trajectory_reward([sales_k / 10] * n, 0.5 * t.state.success + 0.5 * sales_k / 10) + penalty
        assert t.rewards["sales"] == pytest.approx(expected)
        if "customer" in t.reward_failures:
            continue
        n = sum(turn.role == "customer" for turn in t.turns)
        if n == 0:  # the agent's malformed opening ended the call: nothing to judge, the env's rule reward
            assert t.rewards["customer"] == 0.0
            continue
        k = judge.scores[trainer.rewards.judges["customer"].messages(t)[-1]["content"]]
        assert t.rewards["customer"] == pytest.approx(trajectory_reward([k / 10] * n, k / 10 * k / 10))


def test_judge_failure_drops_the_call_from_its_group_only(run, judge_server):
    from marti_ibrl.algorithm.advantages import members

    trainer, history, played = run
    failed = [t for t in played if "customer" in t.reward_failures]
    assert len(failed) == 1, [t.reward_failures for t in played]
    assert failed[0].reward_failures["customer"].startswith("bad_output: customer judge")
    assert "customer" not in failed[0].rewards
    assert failed[0] not in members(played, "customer") and failed[0] in members(played, "sales")
    assert history[0]["customer/reward_failed"] == 0.25 and history[0]["sales/reward_failed"] == 0.0
    assert history[0]["customer/judge/failures"] == 1.0 and history[0]["customer/judge/failure:bad_output"] == 1.0
    # 1 + max_retries attempts for the refused call, one request for every other judged (call, role)
    judged = sum(any(turn.role == r for turn in t.turns) for t in played for r in ("sales", "customer"))
    assert len(judge_server.requests) == judged + 1


def test_both_roles_updated_with_their_own_rewards(run):
    _, history, _ = run
    m = history[0]
    assert m["sales/updated"] == 1.0 and m["customer/updated"] == 1.0
    assert "sales/policy_loss" in m and "customer/policy_loss" in m
    assert m["sales/adv_abs_mean"] > 0 and m["customer/adv_abs_mean"] > 0
    assert all(0 < m[f"{r}/informative_groups"] <= m[f"{r}/groups"] for r in ("sales", "customer"))
    # one rank, micro-batch 2: the customer's members (the judge-failed call left out) are all trained, an odd
    # count filled with one zero-weight sample
    for r in ("sales", "customer"):
        assert m[f"{r}/samples_trained"] == m[f"{r}/samples_made"] == m[f"{r}/rank0/samples_trained"] > 0, r
        assert m[f"{r}/samples_padding"] == m[f"{r}/samples_made"] % 2, r
    dialogues = {r: m[f"{r}/samples_made"] - m[f"{r}/samples_penalized"] for r in ("sales", "customer")}
    assert dialogues["customer"] < dialogues["sales"]  # the judge-failed call is out of the customer's group
