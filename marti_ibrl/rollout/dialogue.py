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
