"""Tiny, locally built Qwen-architecture models for tests and CPU smoke runs.

Nothing is downloaded: a byte-level BPE tokenizer is trained on a given corpus with the ``tokenizers``
library, wrapped as a HF fast tokenizer with a Qwen-style ChatML chat template, and a randomly initialised
``Qwen2ForCausalLM`` is sized to it. The build is deterministic: the same inputs give a byte-identical
``tokenizer.json`` and identical weights.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# Qwen's ChatML template, without the tool/reasoning branches and without a default system prompt.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2's pre-tokenizer regex (single digits, contractions, letters with an optional leading symbol, ...).
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_CHAT_ROLE_TEXTS = ["system\n", "user\n", "assistant\n"]

_DOND_PHRASES = [
    "Hello! I would like to make a deal.",
    "Hi, let's split the items fairly.",
    "I really need the books, you can have the hats and the balls.",
    "I value the hats most. Can I have both hats?",
    "That does not work for me. How about this instead?",
    "I can give you one ball if I keep the rest.",
    "You take the books and I take the hats.",
    "Deal. Let's finalize it.",
    "I accept your offer.",
    "No deal, that is not fair.",
    "I propose the following split:",
    "What do you value the most?",
    "I will give you item0 if you give me item1.",
    "Okay, I agree to that.",
    "Let me think about it. Could you give me one more?",
    "I need at least two of item2.",
    "My final offer is below.",
    "Sounds good to me!",
    "Sorry, I cannot accept that.",
    "We should both get something out of this.",
    "I'll take item0 and item2, you get item1.",
    "Fine, I agree with your last proposal.",
]


def dond_corpus(extra_texts: Iterable[str] = ()) -> list[str]:
    """A small deterministic text corpus for the Deal-or-No-Deal domain (tokenizer training).

    Contains every ``<try> ... <try>`` / ``<selection> ... <selection>`` marker with counts 0..4, ``<disagree>``,
    typical negotiation phrases, digits and the given ``extra_texts`` (e.g. the system prompts).
    """
    corpus: list[str] = []
    for a, b, c in itertools.product(range(5), repeat=3):
        items = f"item0={a} item1={b} item2={c}"
        corpus.append(f"<try> {items} <try>")
        corpus.append(f"<selection> {items} <selection>")
    corpus.append("<disagree>")
    corpus.extend(_DOND_PHRASES)
    for phrase, (a, b, c) in zip(_DOND_PHRASES, itertools.product(range(5), repeat=3), strict=False):
        corpus.append(f"{phrase} <try> item0={a} item1={b} item2={c} <try>")
    corpus.append(" ".join(str(d) for d in range(10)))
    corpus.append("0123456789")
    corpus.extend(str(t) for t in extra_texts)
    return corpus


def _train_tokenizer(corpus: Iterable[str], vocab_size: int):  # -> tokenizers.Tokenizer
    """Train a Qwen-style byte-level BPE tokenizer on ``corpus``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The ChatML role names are always part of the corpus so the template headers are short.
    tok.train_from_iterator([*corpus, *_CHAT_ROLE_TEXTS], trainer=trainer)
    return tok


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    corpus: Iterable[str],
    *,
    vocab_size: int = 1024,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> str:
    """Build and save a tiny Qwen2 causal LM + ChatML tokenizer in ``out_dir``; returns ``out_dir`` as str.

    ``vocab_size`` is the BPE training target; the model's vocabulary is ``len(tokenizer)`` (it can be smaller
    when the corpus has fewer merges). Weights are fp32, tied embeddings, saved as safetensors.
    """
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = str(out_dir)
    os.makedirs(out, exist_ok=True)

    raw = _train_tokenizer(corpus, vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        model_max_length=max_position_embeddings,
        padding_side="left",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out)

    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
        use_cache=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_dond_model(
    out_dir: str | os.PathLike[str], *, prompt_style: str = "compact", n_scenarios: int = 20, seed: int = 0, **model
) -> str:
    """:func:`build_tiny_model` for DoND: the tokenizer also learns both roles' system prompts of ``n_scenarios``
    generated scenarios (``seed``), so prompts tokenize compactly. ``model``: build_tiny_model's keywords."""
    from marti_ibrl.envs.dond import generate_scenarios, role_prompt

    prompts = [role_prompt(s, i, prompt_style) for s in generate_scenarios(n_scenarios, seed) for i in (0, 1)]
    return build_tiny_model(out_dir, dond_corpus(prompts), seed=seed, **model)


def telesales_corpus(n_calls: int = 40, seed: int = 99) -> list[str]:
    """Tokenizer corpus for TeleSales: both roles' system prompts and every turn as each role sees it, over
    ``n_calls`` synthetic calls (:func:`marti_ibrl.envs.telesales.transcripts.synthetic_calls`)."""
    from marti_ibrl.envs.telesales.env import TeleSalesEnv
    from marti_ibrl.envs.telesales.transcripts import synthetic_calls, turn_text

    env = TeleSalesEnv()
    corpus = ["0123456789", " ".join("0123456789")]
    for call in synthetic_calls(n_calls, seed=seed):
        corpus += [env.system_prompt(call["profile"], role) for role in env.roles]
        for turn in call["turns"]:
            text = turn_text(turn)
            corpus += [text, env.counterpart_text(turn["speaker"], text, call["profile"])]
    return corpus


def build_tiny_telesales_model(
    out_dir: str | os.PathLike[str], *, n_calls: int = 40, seed: int = 0, vocab_size: int = 2048, **model
) -> str:
    """:func:`build_tiny_model` for TeleSales (both roles share it). Vocabulary 2048: the customer's Table 16 system
    prompt is then about 1k tokens, a JSON customer turn about 100. ``model``: build_tiny_model's keywords."""
    return build_tiny_model(out_dir, telesales_corpus(n_calls), vocab_size=vocab_size, seed=seed, **model)
