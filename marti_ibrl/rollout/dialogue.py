"""Typed containers for rollouts: one :class:`Trajectory` per dialogue, shared by every role in it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marti_ibrl.envs.base import Outcome


@dataclass
class Turn:
    role: str  # who spoke
    text: str  # decoded utterance (special tokens stripped)
    token_ids: list[int]  # the ids the speaker's engine generated (speaker's tokenizer)
    logprobs: list[float]  # rollout log π_old(w) per generated token
    valid: bool  # the env accepted it (False only for a turn that stayed malformed)
    resamples: int = 0  # malformed attempts discarded before this one
    shown: dict[str, str] | None = None  # what each role was shown after it (TurnResult.shown; None: the default)


@dataclass
class Attempt:
    """A malformed turn the runner discarded and re-sampled: what the role's policy saw and wrote. Training penalises
    it as a sample of its own (``--train.penalize_resamples``, :func:`marti_ibrl.algorithm.advantages.penalized_attempts`)."""

    role: str
    text: str
    prompt_ids: list[int]  # the role's generation prompt at that turn (its view's ids + the assistant header)
    token_ids: list[int]  # what its engine generated
    logprobs: list[float]  # rollout log π_old(w) per generated token
    finished: bool  # False: cut by max_new_tokens
    reason: str = ""  # the env's reason it was malformed

    def view(self, system_prompt: str) -> AttemptView:
        """The attempt as a one-turn view (:func:`marti_ibrl.rollout.render.role_experience` reads it as a
        :class:`~marti_ibrl.rollout.render.RoleView`): the prompt, no action; then the tokens written, the action."""
        start = len(self.prompt_ids)
        return AttemptView(
            ids=[*self.prompt_ids, *self.token_ids],
            action_ranges=[(start, start + len(self.token_ids))] if self.token_ids else [],
            logprobs=[0.0] * start + list(self.logprobs),
            system_prompt=system_prompt,
            truncated=not self.finished,
        )


@dataclass
class AttemptView:
    """What :func:`~marti_ibrl.rollout.render.role_experience` reads of a view, for a discarded attempt."""

    ids: list[int]
    action_ranges: list[tuple[int, int]]
    logprobs: list[float]
    system_prompt: str
    truncated: bool = False
    has_logprobs: bool = True


@dataclass
class Trajectory:
    """A finished dialogue τ_g: exactly the seats' roles, each played by some policy."""

    scenario_uid: str  # q: the GRPO group of Eq. 4 is (role, scenario_uid)
    scenario: Any
    seats: list[str]  # speaking order (seat 0 opens)
    policies: dict[str, str]  # role -> "current" | "pool:<version>" | "frozen:<name>"
    turns: list[Turn] = field(default_factory=list)
    state: Any = None  # the env's final state
    outcome: Outcome | None = None
    rewards: dict[str, float] = field(default_factory=dict)  # R_i(τ) per role that has one
    reward_failures: dict[str, str] = field(default_factory=dict)  # role -> why it has no reward (not in its group)
    views: dict[str, Any] = field(default_factory=dict)  # role -> RoleView (token ids + action ranges)
    truncated: bool = False  # ended because a role's context hit rollout.max_len
    failed: bool = False  # a frozen counterpart (endpoint) could not produce a turn: kept out of training
    sample_index: int = 0  # g within the scenario's group
    learners: tuple[str, ...] | None = None  # roles whose groups it may join (its Eq. 6 pairing); None: no restriction
    discarded: list[Attempt] = field(default_factory=list)  # malformed attempts re-sampled (engine-played seats)
