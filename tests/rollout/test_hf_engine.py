"""The HF-generate rollout engine: batched sampling, rollout log-probs, per-dialogue prefix cache."""

import pytest
import torch

from marti_ibrl.envs.dond import DondEnv, generate_scenarios
from marti_ibrl.rollout.engines import HFGenerateEngine
from marti_ibrl.rollout.render import RoleView
from marti_ibrl.tiny import build_tiny_dond_model

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 12}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = build_tiny_dond_model(tmp_path_factory.mktemp("tiny"))
    return HFGenerateEngine(path, seed=0)


def _forward_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


def test_multi_turn_sessions_reuse_cache_and_logprobs_match_a_full_forward(engine):
    env = DondEnv(prompt_style="compact")
    scenarios = generate_scenarios(5, 3)
    views = [RoleView(engine.tokenizer, env.system_prompt(s, "agent1")) for s in scenarios]
    sessions = [f"d{i}" for i in range(len(views))]
    engine.sessions.clear()
    engine.stats.update(prompt_tokens=0, cached_tokens=0)
    for turn in range(3):
        # a new dialogue joins at turn 1: a batch mixing cached and uncached rows
        active = list(range(4)) if turn == 0 else list(range(5))
        before = dict(engine.stats)
        outs = engine.generate_batch(
            [views[i].generation_prompt() for i in active], SAMPLING, [sessions[i] for i in active]
        )
        for i, out in zip(active, outs, strict=True):
            assert 1 <= len(out["token_ids"]) <= SAMPLING["max_new_tokens"]
            assert out["finish_reason"] == ("stop" if out["token_ids"][-1] == engine.eos_id else "length")
            views[i].add_own(out["token_ids"], out["logprobs"], finished=out["finish_reason"] == "stop")
            views[i].add_counterpart(f"counter offer {turn} <try> item0=1 item1=0 item2=1 <try>")
    # the last turn: every dialogue extends its session, so most of each prompt comes from the cache
    cached = engine.stats["cached_tokens"] - before["cached_tokens"]
    total = engine.stats["prompt_tokens"] - before["prompt_tokens"]
    assert cached / total > 0.7, (cached, total)
    for view in views:
        ref = _forward_logprobs(engine.model, view.ids)
        got = torch.tensor(view.logprobs[1:])
        mask = view.action_mask()[1:]
        assert mask.sum() > 0
        assert torch.allclose(got[mask], ref[mask], atol=1e-4), (got[mask] - ref[mask]).abs().max()


def test_a_new_dialogue_in_a_cached_batch_is_prefilled_on_its_own(engine):
    env = DondEnv(prompt_style="compact")
    views = [RoleView(engine.tokenizer, env.system_prompt(s, "agent1")) for s in generate_scenarios(5, 7)]
    sessions = ["a", "b", "c", "d", "e"]
    engine.sessions.clear()
    for view, out in zip(views, engine.generate_batch([v.generation_prompt() for v in views[:4]], SAMPLING, sessions)):
        view.add_own(out["token_ids"], out["logprobs"], finished=out["finish_reason"] == "stop")
        view.add_counterpart("counter offer <try> item0=1 item1=0 item2=1 <try>")
    prompts = [v.generation_prompt() for v in views]
    suffix = max(len(p) - len(engine.sessions[s][0]) for p, s in zip(prompts[:4], sessions))
    before = engine.stats["computed_tokens"]
    outs = engine.generate_batch(prompts, SAMPLING, sessions)
    computed = engine.stats["computed_tokens"] - before
    # the new dialogue's prompt once (all but the token generate feeds), then every row only the longest new suffix
    assert computed == len(prompts[4]) - 1 + 5 * suffix
    assert computed < 5 * len(prompts[4]) / 2  # without the prefill every row would compute the whole new prompt
    for view, out in zip(views, outs):
        view.add_own(out["token_ids"], out["logprobs"], finished=out["finish_reason"] == "stop")
        ref, got, mask = (
            _forward_logprobs(engine.model, view.ids),
            torch.tensor(view.logprobs[1:]),
            view.action_mask()[1:],
        )
        assert torch.allclose(got[mask], ref[mask], atol=1e-4), (got[mask] - ref[mask]).abs().max()


def test_weight_update_clears_the_cache(engine):
    view = RoleView(engine.tokenizer, "system")
    engine.generate_batch([view.generation_prompt()], SAMPLING, ["s"])
    assert "s" in engine.sessions
    engine.update_weights_from_state_dict({k: v.clone() for k, v in engine.model.state_dict().items()})
    assert not engine.sessions


def test_prompt_that_does_not_extend_the_session_is_recomputed(engine):
    engine.sessions.clear()
    a = RoleView(engine.tokenizer, "first system prompt").generation_prompt()
    b = RoleView(engine.tokenizer, "another system prompt").generation_prompt()
    engine.generate_batch([a], SAMPLING, ["x"])
    assert engine._cached_len(b, "x") == 0
    assert engine._cached_len(a + [5, 6], "x") in (0, len(engine.sessions["x"][0]))
    engine.end_sessions(["x", "never-seen"])  # the runner ends a dialogue's caches; unknown ids are ignored
    assert "x" not in engine.sessions and engine._cached_len(a + [5, 6], "x") == 0


def test_grouped_query_attention_keeps_kv_heads_unexpanded_and_samples_as_transformers_sdpa(engine):
    """The engine's attention (``sdpa_gqa``) hands grouped K/V heads to the kernel as they are; it must sample the
    same tokens with the same log-probs as transformers' SDPA (which copies them per query head under a mask)."""
    model = engine.model
    assert model.config._attn_implementation == "sdpa_gqa"
    assert model.config.num_attention_heads > model.config.num_key_value_heads  # grouped: there is something to skip
    env = DondEnv(prompt_style="compact")
    prompts = [RoleView(engine.tokenizer, env.system_prompt(s, "agent1")) for s in generate_scenarios(6, 11)]
    prompts = [v.generation_prompt()[: 20 + 7 * i] for i, v in enumerate(prompts)]  # ragged: left padding, a mask
    sampling = {**SAMPLING, "max_new_tokens": 24, "seed": 5}

    def sample(attn: str) -> list[dict]:
        model.set_attn_implementation(attn)
        engine.sessions.clear()
        first = engine.generate_batch(prompts, sampling, [f"g{i}" for i in range(len(prompts))])
        # a second turn decodes over each dialogue's cached K/V (the decode path the change is for)
        again = [p + o["token_ids"] + [5, 6, 7] for p, o in zip(prompts, first)]
        return first + engine.generate_batch(again, sampling, [f"g{i}" for i in range(len(prompts))])

    try:
        ours, reference = sample("sdpa_gqa"), sample("sdpa")
    finally:
        model.set_attn_implementation("sdpa_gqa")
    assert sum(len(o["token_ids"]) for o in ours) > 2 * len(prompts)
    for a, b in zip(ours, reference, strict=True):
        assert a["token_ids"] == b["token_ids"]
        assert torch.allclose(torch.tensor(a["logprobs"]), torch.tensor(b["logprobs"]), atol=1e-5)
