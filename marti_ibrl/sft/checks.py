"""Checks of an SFT checkpoint: protocol validity of sampled turns in self-play (:func:`validity_report`), and the
assistant-token NLL of records (:func:`assistant_nll`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from marti_ibrl.envs.dond import DondEnv, DondScenario, parse_utterance
from marti_ibrl.envs.dond.game import is_complementary
from marti_ibrl.sft.data import Record
from marti_ibrl.sft.presets import VALIDITY_MAX_NEW_TOKENS


def _load(model_dir: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    return model, tokenizer


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    return ids, attn


def _last_offer(state: Any, role: str) -> tuple[int, int, int] | None:
    """The allocation of the counterpart's last turn when it was a ``<try>``/``<selection>``, else None."""
    if not state.history or state.history[-1][0] == role:
        return None
    return parse_utterance(state.history[-1][1]).alloc


def _self_play(
    model_dir: str,
    env: Any,
    scenarios: Sequence[Any],
    n_turns: int,
    seed: int,
    judge: Callable[[Any, str, str, bool], tuple[bool, bool]],
    *,
    max_new_tokens: int,
    batch_size: int,
) -> dict[str, float]:
    """Self-play the first ``n_turns`` turns of each scenario with the model in every role.

    Turns are sampled like the RL rollout (HF ``generate``, temperature 1, top_p 1, no top-k) from
    ``RoleView.generation_prompt()``; the speaking order is ``env.fixed_seats`` when the env has one, else the opener
    rotates by scenario. ``judge(state, role, text, finished) -> (kept, done)`` applies the turn to the env: a turn
    not kept ends its dialogue (later turns are not sampled). Returns ``turn{t}``: the share of the dialogues alive
    at turn ``t`` whose turn was kept, ``n``: the turns sampled, ``truncated``: the share cut at ``max_new_tokens``.
    """
    import torch

    from marti_ibrl.rollout.render import RoleView

    model, tokenizer = _load(model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos_id = tokenizer.eos_token_id
    roles = tuple(env.roles)
    fixed = getattr(env, "fixed_seats", None)
    shown = getattr(env, "counterpart_text", None)
    live = []
    for i, scenario in enumerate(scenarios):
        seats = tuple(fixed) if fixed else roles[i % len(roles) :] + roles[: i % len(roles)]
        views = {r: RoleView(tokenizer, env.system_prompt(scenario, r)) for r in roles}
        live.append((env.new_state(scenario, seats), views, scenario))
    sampled = truncated = 0
    per_turn: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for t in range(n_turns):
            if not live:
                break
            still = []
            turn_ok = 0
            for start in range(0, len(live), batch_size):
                chunk = live[start : start + batch_size]
                prompts = [views[env.current_role(state)].generation_prompt() for state, views, _ in chunk]
                ids, attn = _left_pad(prompts, pad_id)
                out = model.generate(
                    input_ids=ids,
                    attention_mask=attn,
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=eos_id,
                    pad_token_id=pad_id,
                )
                for (state, views, scenario), row in zip(chunk, out[:, ids.shape[1] :].tolist()):
                    finished = eos_id in row
                    gen = row[: row.index(eos_id) + 1] if finished else row
                    text = tokenizer.decode(gen, skip_special_tokens=True).strip()
                    role = env.current_role(state)
                    kept, done = judge(state, role, text, finished)
                    sampled += 1
                    truncated += int(not finished)
                    if not kept:
                        continue
                    turn_ok += 1
                    views[role].add_own(gen, None, finished=finished)
                    for other, view in views.items():
                        if other != role:
                            view.add_counterpart(shown(role, text, scenario) if shown else text)
                    if not done:
                        still.append((state, views, scenario))
            per_turn[f"turn{t}"] = turn_ok / len(live)
            live = still
    return {"n": float(sampled), "truncated": truncated / max(sampled, 1), **per_turn}


def valid_turns(
    model_dir: str,
    env: Any,
    scenarios: Sequence[Any],
    n_turns: int,
    seed: int,
    *,
    max_new_tokens: int = VALIDITY_MAX_NEW_TOKENS,
    batch_size: int = 64,
) -> dict[str, float]:
    """Any environment's check of a warm start: :func:`_self_play` where a turn is kept when the env accepts it
    (``env.step(...).valid``) and it ended within ``max_new_tokens``. ``valid``: the share of sampled turns kept,
    ``turn0``: of the opening turns, ``ended``: of the dialogues, the share that reached their end in ``n_turns``."""
    counts = {"valid": 0, "ended": 0}

    def judge(state: Any, role: str, text: str, finished: bool) -> tuple[bool, bool]:
        result = env.step(state, role, text)
        kept = result.valid and finished
        counts["valid"] += int(kept)
        counts["ended"] += int(kept and result.done)
        return kept, result.done

    report = _self_play(model_dir, env, scenarios, n_turns, seed, judge, max_new_tokens=max_new_tokens,
                        batch_size=batch_size)  # fmt: skip
    return {**report, "valid": counts["valid"] / max(report["n"], 1), "ended": counts["ended"] / max(len(scenarios), 1)}


def validity_report(
    model_dir: str,
    env: DondEnv,
    scenarios: Sequence[DondScenario],
    n_turns: int,
    seed: int,
    *,
    max_new_tokens: int = VALIDITY_MAX_NEW_TOKENS,
    batch_size: int = 64,
) -> dict[str, float]:
    """DoND's check of a warm start: :func:`_self_play` (the opener alternating by scenario), fractions of the
    sampled turns:

    * ``valid``: the env accepts the turn (``env.step(...).valid``). Any text without markers is a valid "chat"
      turn, so even an untrained model scores ~1.0 here;
    * ``protocol``: valid, ended with eos within ``max_new_tokens``, and a move (``<try>``, ``<selection>`` or
      ``<disagree>``), as every scripted-bot turn is; ``turn{t}``: the same for turn ``t`` only;
    * ``truncated``: cut at ``max_new_tokens``;
    * ``complement``: of the ``<selection>`` turns answering the counterpart's ``<try>``/``<selection>``
      (``n_answers`` of them), the fraction that would close the deal (the exact complement of that offer).

    A turn that is not a protocol move ends its dialogue (later turns are not sampled); ``n`` counts the turns.
    """
    counts = {"valid": 0, "protocol": 0, "answers": 0, "completes": 0}

    def judge(state: Any, role: str, text: str, finished: bool) -> tuple[bool, bool]:
        offer = _last_offer(state, role)
        result = env.step(state, role, text)
        action = parse_utterance(text)
        if offer is not None and action.kind == "selection":
            counts["answers"] += 1
            counts["completes"] += int(is_complementary(state.scenario.counts, offer, action.alloc))
        counts["valid"] += int(result.valid)
        kept = result.valid and finished and action.kind != "chat"
        counts["protocol"] += int(kept)
        return kept, result.done

    report = _self_play(model_dir, env, scenarios, n_turns, seed, judge, max_new_tokens=max_new_tokens,
                        batch_size=batch_size)  # fmt: skip
    n = max(report["n"], 1)
    return {
        **report,
        "valid": counts["valid"] / n,
        "protocol": counts["protocol"] / n,
        "complement": counts["completes"] / max(counts["answers"], 1),
        "n_answers": float(counts["answers"]),
    }


def protocol_validity(
    model_dir: str, env: DondEnv, scenarios: Sequence[DondScenario], n_turns: int, seed: int
) -> float:
    """Fraction of self-played opening turns that are valid protocol moves (``protocol`` of :func:`validity_report`)."""
    return validity_report(model_dir, env, scenarios, n_turns, seed)["protocol"]


def assistant_nll(model_dir: str, records: Sequence[Record], *, max_len: int = 2048, batch_size: int = 8) -> float:
    """Mean negative log-likelihood per own-turn token of ``records`` (the RL rollout's tokenization, RoleView)."""
    import torch

    from marti_ibrl.rollout.render import RoleView

    model, tokenizer = _load(model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    seqs: list[tuple[list[int], Any]] = []
    for record in records:
        messages = record["messages"]
        view = RoleView(tokenizer, messages[0]["content"])
        for msg in messages[1:]:
            if msg["role"] == "assistant":
                ids = tokenizer(msg["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                view.add_own(ids, None, finished=True)
            else:
                view.add_counterpart(msg["content"])
        seqs.append((view.ids[:max_len], view.action_mask()[:max_len]))
    total = count = 0.0
    with torch.no_grad():
        for start in range(0, len(seqs), batch_size):
            chunk = seqs[start : start + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attn = torch.zeros_like(ids)
            mask = torch.zeros_like(ids, dtype=torch.bool)
            for i, (seq, action) in enumerate(chunk):
                ids[i, : len(seq)] = torch.tensor(seq)
                attn[i, : len(seq)] = 1
                mask[i, : len(seq)] = action
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            target = mask[:, 1:]
            total += float(-(logp * target).sum())
            count += float(target.sum())
    return total / max(count, 1.0)
