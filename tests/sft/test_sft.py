"""SFT warm start: per-role records from scripted dialogues, OpenRLHF's multiturn masks on them, a tiny SFT run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from marti_ibrl.envs.dond import TRAINING_BOTS, DondEnv, generate_scenarios
from marti_ibrl.envs.dond.prompts import lewis_input
from marti_ibrl.sft import assistant_nll, run_sft, sft_loss_curve, sft_records, write_sft_data
from marti_ibrl.tiny import CHATML_TEMPLATE, build_tiny_model, dond_corpus

BOTS = list(TRAINING_BOTS)


@pytest.fixture(scope="module")
def env() -> DondEnv:
    return DondEnv(prompt_style="compact", max_rounds=10)


@pytest.fixture(scope="module")
def scenarios():
    return generate_scenarios(12, seed=3)


@pytest.fixture(scope="module")
def records(env: DondEnv, scenarios) -> list[dict]:
    return sft_records(env, scenarios, BOTS, seed=0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, env: DondEnv) -> str:
    prompts = [env.system_prompt(s, r) for s in generate_scenarios(50, seed=99) for r in env.roles]
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), dond_corpus(prompts))


def _labelled(messages: list[dict], role: str, other: str) -> list[tuple[str, str]]:
    return [(role if m["role"] == "assistant" else other, m["content"]) for m in messages[1:]]


def test_records_per_role_perspective(env: DondEnv, scenarios, records: list[dict]) -> None:
    a, b = env.roles
    assert len(records) == 2 * len(scenarios)  # every role speaks at least once in a bot dialogue
    openers = set()
    for i, scenario in enumerate(scenarios):
        rec_a, rec_b = records[2 * i]["messages"], records[2 * i + 1]["messages"]
        for rec, role, other in ((rec_a, a, b), (rec_b, b, a)):
            # system prompt = the role's own prompt: its private input, not the counterpart's
            assert [m["role"] for m in rec[:1]] == ["system"]
            assert rec[0]["content"] == env.system_prompt(scenario, role)
            own, theirs = (lewis_input(scenario, env.roles.index(r)) for r in (role, other))
            assert f"<input> {own} </input>" in rec[0]["content"]
            if own != theirs:
                assert theirs not in rec[0]["content"]
            # strictly alternating turns that end with the role's own (assistant) turn
            kinds = [m["role"] for m in rec[1:]]
            assert kinds[-1] == "assistant"
            assert all(x != y for x, y in zip(kinds, kinds[1:]))
            if kinds[0] == "assistant":
                openers.add(role)
        # the two records are the same dialogue, mirrored: A's assistant turns are B's user turns
        la, lb = _labelled(rec_a, a, b), _labelled(rec_b, b, a)
        short, full = sorted((la, lb), key=len)
        assert full[: len(short)] == short and len(full) - len(short) <= 1
        assert {la[0][0], lb[0][0]} == {full[0][0]}  # both records agree on who opened
        # ... and a legal one: replaying it through the env accepts every turn
        state = env.new_state(scenario, (full[0][0], b if full[0][0] == a else a))
        for speaker, text in full:
            assert env.step(state, speaker, text).valid
    assert openers == {a, b}  # seats alternate


def test_records_deterministic_by_seed(env: DondEnv, scenarios, records: list[dict], tmp_path: Path) -> None:
    assert sft_records(env, scenarios, BOTS, seed=0) == records
    assert sft_records(env, scenarios, BOTS, seed=1) != records
    path = write_sft_data(tmp_path / "sft.jsonl", records)
    assert [json.loads(line) for line in Path(path).read_text().splitlines()] == records


def test_openrlhf_multiturn_masks_cover_exactly_own_turns(tiny_dir: str, records: list[dict]) -> None:
    """OpenRLHF's SFTDataset (multiturn, chat template) trains on the role's own turns only, opener included."""
    from datasets import Dataset
    from openrlhf.datasets import SFTDataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    data = SimpleNamespace(input_key="messages", output_key=None, apply_chat_template=True)
    strategy = SimpleNamespace(args=SimpleNamespace(data=data))
    subset = records[:6]
    ds = SFTDataset(Dataset.from_list(subset), tok, 2048, strategy, multiturn=True, num_processors=1)
    assert len(ds) == len(subset)
    for i, record in enumerate(subset):
        ids, _, loss_mask = ds[i]
        assert tok.decode(ids[0]) == tok.apply_chat_template(record["messages"], tokenize=False).rstrip("\n")
        # mask[t] = 1 trains the prediction of token t + 1
        trained = ids[0][1:][loss_mask[0][:-1].bool()]
        own = [m["content"] + "<|im_end|>" for m in record["messages"] if m["role"] == "assistant"]
        assert tok.decode(trained).replace("\n", "") == "".join(own).replace("\n", "")


@pytest.mark.slow
def test_sft_run_through_openrlhf_cli(env: DondEnv, tiny_dir: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train = sft_records(env, generate_scenarios(16, seed=5), BOTS, seed=0)
    held_out = sft_records(env, generate_scenarios(8, seed=6), BOTS, seed=1)
    data = write_sft_data(tmp_path / "train.jsonl", train)
    lines: list[str] = []
    out = run_sft(
        tiny_dir,
        data,
        str(tmp_path / "sft"),
        epochs=1,
        lr=1e-2,
        batch_size=8,
        micro_batch_size=4,
        max_len=1024,
        log_file=str(tmp_path / "sft.log"),
        progress=lines.append,
    )
    assert AutoModelForCausalLM.from_pretrained(out) is not None
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == CHATML_TEMPLATE
    assert tokenizer.eos_token == "<|im_end|>"
    curve = sft_loss_curve(out)
    # one optimizer step per full batch of 8 records (OpenRLHF drops records whose prompt exceeds max_len)
    assert 2 <= len(curve) <= len(train) // 8
    assert curve[-1][1] < curve[0][1]
    assert lines and lines[-1].startswith("sft done")
    before, after = assistant_nll(tiny_dir, held_out), assistant_nll(out, held_out)
    assert before > 5.5  # ~ln(vocab size): untrained
    print(f"held-out own-turn NLL: untrained {before:.3f}, after SFT {after:.3f}; loss curve {curve}")
    assert after < before - 0.5, (before, after)


def test_records_show_offers_as_the_rollout_does(scenarios) -> None:
    from marti_ibrl.sft.checks import _last_offer

    env = DondEnv(prompt_style="compact", max_rounds=10, show_complement=True)
    plain = sft_records(DondEnv(prompt_style="compact", max_rounds=10), scenarios, BOTS, seed=0)
    shown = sft_records(env, scenarios, BOTS, seed=0)
    notes = 0
    for i, (a, b) in enumerate(zip(plain, shown, strict=True)):
        scenario = scenarios[i // 2]
        for m_plain, m_shown in zip(a["messages"], b["messages"], strict=True):
            if m_plain["role"] == "user":
                assert m_shown["content"] == env.counterpart_text("x", m_plain["content"], scenario)
                notes += m_shown["content"] != m_plain["content"]
            else:
                assert m_shown == m_plain  # own turns and the system prompt are never rewritten
    assert notes > len(scenarios)
    state = env.new_state(scenarios[0])
    assert _last_offer(state, "agent1") is None
    env.step(state, "agent1", "<try> item0=0 item1=0 item2=0 <try>")
    assert _last_offer(state, "agent2") == (0, 0, 0) and _last_offer(state, "agent1") is None
