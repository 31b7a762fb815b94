"""Per-role rendering and the turn-level action mask (Eq. 5) on real tokenized dialogues with a tiny model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from marti_ibrl.rollout.render import RoleView, action_mask_from_ranges, role_experience
from marti_ibrl.tiny import build_tiny_model, dond_corpus

SYS = {
    "A": "You are agent A. Your values: item0=3 item1=1 item2=0. Counts: item0=1 item1=2 item2=3.",
    "B": "You are agent B. Your values: item0=0 item1=2 item2=2. Counts: item0=1 item1=2 item2=3.",
}
TRY_MARKER = "<try> item0=1 item1=2 item2=0 <try>"
DIALOGUE = [
    ("A", f"Hello! I need the books. {TRY_MARKER}"),
    ("B", "No deal, I value the hats most."),
    ("A", "I can give you one ball if I keep the rest. <try> item0=1 item1=0 item2=1 <try>"),
    ("B", "<try> item0=1 item1=2 item2=3 <try> You take the books."),
    ("A", "Deal. <selection> item0=1 item1=0 item2=0 <selection>"),
    ("B", "<selection> item0=0 item1=2 item2=3 <selection>"),
]

# gen_fn(view, utterance) -> (generated ids, rollout logprobs, finished)
GenFn = Callable[[RoleView, str], tuple[list[int], list[float], bool]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), dond_corpus(SYS.values()))


@pytest.fixture(scope="module")
def tok(tiny_dir: str):
    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def model(tiny_dir: str):
    return AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager").eval()


def _enc(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _canonical(tok) -> GenFn:
    """An 'engine' that emits the canonical tokenization of the utterance + <|im_end|>, with distinct logprobs."""
    counter = iter(range(1, 10_000))

    def gen(view: RoleView, text: str) -> tuple[list[int], list[float], bool]:
        ids = _enc(tok, text) + [tok.eos_token_id]
        return ids, [-next(counter) / 1000.0 for _ in ids], True

    return gen


def _play(tok, gen_fn: GenFn, dialogue=DIALOGUE):
    """Run the dialogue; returns views and, per role, the (prompt ids, messages, gen ids, logprobs) of own turns."""
    views = {r: RoleView(tok, SYS[r]) for r in SYS}
    own: dict[str, list[tuple[list[int], list[dict], list[int], list[float]]]] = {r: [] for r in SYS}
    contents = []
    for speaker, text in dialogue:
        view = views[speaker]
        prompt, msgs = view.generation_prompt(), [dict(m) for m in view.messages]
        ids, lps, finished = gen_fn(view, text)
        content = view.add_own(ids, lps, finished)
        contents.append(content)
        own[speaker].append((prompt, msgs, ids, lps))
        for other, other_view in views.items():
            if other != speaker:
                other_view.add_counterpart(content)
    return views, own, contents


def _find(seq: list[int], sub: list[int]) -> int:
    for i in range(len(seq) - len(sub) + 1):
        if seq[i : i + len(sub)] == sub:
            return i
    raise AssertionError("subsequence not found")


def test_action_mask_from_ranges() -> None:
    mask = action_mask_from_ranges(8, [(1, 3), (5, 10)])
    assert mask.dtype == torch.bool
    assert mask.tolist() == [False, True, True, False, False, True, True, True]


def test_masks_cover_exactly_own_turns(tok) -> None:
    views, own, contents = _play(tok, _canonical(tok))
    assert contents == [text for _, text in DIALOGUE]
    eos = tok.eos_token
    masked_by_turn = {}
    for role, view in views.items():
        turns = [i for i, (speaker, _) in enumerate(DIALOGUE) if speaker == role]
        assert len(view.action_ranges) == len(turns) == 3
        mask = view.action_mask()
        assert int(mask.sum()) == sum(len(ids) for _, _, ids, _ in own[role])
        for (start, end), (_, _, ids, _), turn in zip(view.action_ranges, own[role], turns, strict=True):
            assert view.ids[start:end] == ids
            text = tok.decode(view.ids[start:end], skip_special_tokens=False)
            assert text == DIALOGUE[turn][1] + eos
            masked_by_turn[turn] = text[: -len(eos)]
        # Everything outside the mask is exactly: system, assistant headers/closings, full counterpart turns.
        expected = f"<|im_start|>system\n{SYS[role]}<|im_end|>\n"
        for speaker, text in DIALOGUE:
            expected += "<|im_start|>assistant\n\n" if speaker == role else f"<|im_start|>user\n{text}<|im_end|>\n"
        unmasked = [t for t, m in zip(view.ids, mask.tolist(), strict=True) if not m]
        assert tok.decode(unmasked, skip_special_tokens=False) == expected
        assert [m["role"] for m in view.messages] == ["system"] + [
            "assistant" if speaker == role else "user" for speaker, _ in DIALOGUE
        ]
        assert len(view) == len(view.ids) == len(view.logprobs)
        assert view.fallbacks == 0
    # The two roles' masks together cover the dialogue's utterances exactly once, in order.
    assert sorted(masked_by_turn) == list(range(len(DIALOGUE)))
    assert [masked_by_turn[i] for i in range(len(DIALOGUE))] == [text for _, text in DIALOGUE]


def test_generation_prompts_incremental_and_match_template(tok) -> None:
    views, own, _ = _play(tok, _canonical(tok))
    for role, view in views.items():
        for prompt, msgs, _, _ in own[role]:
            assert len(prompt) < len(view.ids) and view.ids[: len(prompt)] == prompt
            rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            assert prompt == _enc(tok, rendered)
            assert rendered.endswith("<|im_start|>assistant\n")
        # With canonical generations the final sequence is the one-shot render of the conversation.
        final = tok.apply_chat_template(view.messages, tokenize=False, add_generation_prompt=False)
        assert view.ids == _enc(tok, final)


def test_multi_token_markers_inside_mask(tok) -> None:
    views, _, _ = _play(tok, _canonical(tok))
    marker = _enc(tok, " " + TRY_MARKER)  # as it appears mid-utterance
    assert len(marker) >= 10  # several tokens, not one special token
    assert not set(marker) & set(tok.all_special_ids)
    a, b = views["A"], views["B"]
    pos = _find(a.ids, marker)
    assert a.action_mask()[pos : pos + len(marker)].all()  # A's own marker: trained on
    pos = _find(b.ids, marker)
    assert not b.action_mask()[pos : pos + len(marker)].any()  # the same marker in B's view: context only


def test_length_cut_generation(tok) -> None:
    view = RoleView(tok, SYS["A"])
    view.add_counterpart("Hi, let's split the items fairly.")
    full = _enc(tok, "I really need the books")
    cut = full[:3]  # finished=False: no eos generated
    header_end = len(view.generation_prompt())
    content = view.add_own(cut, [-0.1, -0.2, -0.3], finished=False)
    assert content == tok.decode(cut) and view.messages[-1] == {"role": "assistant", "content": content}
    assert view.action_ranges == [(header_end, header_end + 3)]
    assert view.ids[header_end : header_end + 3] == cut
    # The template closing is appended as non-action tokens.
    assert view.ids[header_end + 3 :] == _enc(tok, "<|im_end|>\n") == [tok.eos_token_id, _enc(tok, "\n")[0]]
    assert view.action_mask().tolist() == [header_end <= i < header_end + 3 for i in range(len(view))]
    assert view.truncated
    exp = role_experience(view, 4096)
    assert exp.truncated.tolist() == [True] and exp.response_length.tolist() == [3]
    # The dialogue goes on consistently after a cut turn.
    view.add_counterpart("Sorry, I cannot accept that.")
    prompt = view.generation_prompt()
    view.add_own([*full, tok.eos_token_id], None, finished=True)
    assert view.ids[: len(prompt)] == prompt and not view.truncated and not view.has_logprobs
    assert view.action_ranges[1] == (len(prompt), len(prompt) + len(full) + 1)
    assert role_experience(view, 4096).rollout_log_probs is None


def test_truncation_mid_action(tok) -> None:
    views, own, _ = _play(tok, _canonical(tok))
    view = views["B"]
    (s0, e0), (s1, e1) = view.action_ranges[:2]
    assert e1 - s1 > 4
    max_len = s1 + 2  # keeps 2 tokens of B's second turn
    exp = role_experience(view, max_len)
    assert exp.sequences.shape == (1, max_len) and exp.sequences[0].tolist() == view.ids[:max_len]
    assert exp.attention_mask.shape == (1, max_len) and bool(exp.attention_mask.all())
    assert exp.action_mask.shape == (1, max_len - 1) == exp.rollout_log_probs.shape
    expected = [1 if (s0 <= j < e0 or s1 <= j < e1) else 0 for j in range(1, max_len)]
    assert exp.action_mask[0].tolist() == expected
    assert int(exp.action_mask.sum()) == (e0 - s0) + 2
    assert exp.response_length.tolist() == [s1 - (s0 - 1) + 1]  # mask index i is token i + 1
    assert exp.total_length.tolist() == [float(max_len)]
    assert exp.info["response_clip_ratio"].tolist() == [True]
    assert exp.truncated.tolist() == [False]
    # Untruncated: T = len(view).
    full = role_experience(view, 10_000, reward=1.5, score=1.0, extra_logs={"agreed": torch.tensor(1.0)})
    assert full.sequences.shape == (1, len(view)) and full.action_mask.shape == (1, len(view) - 1)
    assert full.info["response_clip_ratio"].tolist() == [False]
    assert full.rewards.tolist() == [1.5] and full.info["agreed"].tolist() == [1.0]
    assert full.response_length.tolist() == [(view.action_ranges[-1][1] - 2) - (s0 - 1) + 1]
    assert full.prompts == [SYS["B"]]


def test_logprobs_at_action_positions(tok) -> None:
    views, own, _ = _play(tok, _canonical(tok))
    for role, view in views.items():
        exp = role_experience(view, 10_000)
        lp = exp.rollout_log_probs[0]
        expected = torch.zeros(len(view) - 1)
        for (start, end), (_, _, _, lps) in zip(view.action_ranges, own[role], strict=True):
            assert lp[start - 1 : end - 1].tolist() == pytest.approx(lps)  # shifted by one like OpenRLHF
            expected[start - 1 : end - 1] = torch.tensor(lps)
        assert torch.equal(lp, expected)
        assert torch.equal(lp != 0, exp.action_mask[0].bool())


def _sampler(model, tok, max_new_tokens: int = 6) -> GenFn:
    """An 'engine' that samples from the tiny model and reports the sampling log-probs."""

    def gen(view: RoleView, text: str) -> tuple[list[int], list[float], bool]:
        prompt = torch.tensor([view.generation_prompt()])
        out = model.generate(
            prompt,
            do_sample=True,
            max_new_tokens=max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        ids = out.sequences[0, prompt.shape[1] :].tolist()
        logits = torch.stack(out.logits, dim=1)[0]
        lps = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()
        return ids, lps, ids[-1] == tok.eos_token_id

    return gen


def test_real_generation_ids_and_logprobs(tok, model) -> None:
    torch.manual_seed(0)
    views, own, contents = _play(tok, _sampler(model, tok))
    for role, view in views.items():
        for (start, end), (prompt, _, ids, lps) in zip(view.action_ranges, own[role], strict=True):
            assert view.ids[:start] == prompt  # the header is part of the prompt the engine saw
            assert view.ids[start:end] == ids  # never re-tokenized
            assert view.logprobs[start:end] == lps
        # Teacher-forced log-probs of the final sequence agree with the rollout ones at the action positions.
        exp = role_experience(view, 10_000)
        with torch.no_grad():
            logits = model(exp.sequences).logits[0, :-1]
        teacher = logits.log_softmax(-1).gather(-1, exp.sequences[0, 1:, None])[:, 0]
        mask = exp.action_mask[0].bool()
        assert int(mask.sum()) == sum(len(ids) for _, _, ids, _ in own[role])
        assert torch.allclose(teacher[mask], exp.rollout_log_probs[0][mask], atol=1e-4)
    # The counterpart sees the decoded content of each turn as a user message.
    assert [m["content"] for m in views["B"].messages if m["role"] == "user"] == contents[0::2]


def test_fallback_for_non_incremental_template(tok) -> None:
    """A template whose system line depends on the message count is not prefix-stable: deltas fall back."""
    tok2 = AutoTokenizer.from_pretrained(tok.name_or_path)
    tok2.chat_template = (
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + ' #' + (messages|length)|string + '<|im_end|>\\n' }}"
        "{%- for message in messages[1:] %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    view = RoleView(tok2, "sys")
    view.add_counterpart("hello")
    prompt = view.generation_prompt()
    gen = _enc(tok2, "  deal ") + [tok2.eos_token_id]  # the template trims the content
    view.add_own(gen, [-1.0] * len(gen), finished=True)
    assert view.fallbacks >= 2
    start, end = view.action_ranges[0]
    assert view.ids[:start] == prompt and view.ids[start:end] == gen
    assert view.ids[end:] == _enc(tok2, "\n")
    assert tok2.decode(view.ids, skip_special_tokens=False) == (
        "<|im_start|>system\nsys #1<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
        "<|im_start|>assistant\n  deal <|im_end|>\n"
    )


def test_build_is_deterministic(tmp_path: Path) -> None:
    corpus = dond_corpus(SYS.values())
    a = build_tiny_model(tmp_path / "a", corpus)
    b = build_tiny_model(tmp_path / "b", corpus)
    c = build_tiny_model(tmp_path / "c", corpus, seed=1)
    assert (Path(a) / "tokenizer.json").read_bytes() == (Path(b) / "tokenizer.json").read_bytes()
    sa, sb, sc = (load_file(str(Path(d) / "model.safetensors")) for d in (a, b, c))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)  # the seed matters
    assert all(v.dtype == torch.float32 for v in sa.values())
    tok = AutoTokenizer.from_pretrained(a)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert sa["model.embed_tokens.weight"].shape[0] == len(tok)
