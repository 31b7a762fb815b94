"""The environment protocol every dialogue domain implements (docs/environments.md: the contract, a minimal game).

A *scenario* is one prompt of the paper's GRPO groups (Eq. 4 groups rollouts by scenario).
An environment is pure Python: it never touches models. The rollout runner asks it, turn by
turn, who speaks, feeds it each utterance, and at the end asks it for each role's reward.
Nothing here assumes exactly two roles. :func:`role_messages` renders one role's side of a dialogue as chat messages
(the SFT records of :mod:`marti_ibrl.sft` and of TeleSales' call transcripts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class TurnResult:
    """What the environment says about one utterance."""

    valid: bool  # False: malformed (wrong format / impossible allocation); the runner may re-sample it
    done: bool  # the dialogue is over after this turn
    reason: str = ""  # why invalid / why done, for logs


@dataclass
class Outcome:
    """How a finished dialogue ended, per role (indexed by role name)."""

    agreed: bool  # a deal / success was reached
    malformed: bool  # ended because a turn stayed malformed after the re-samples
    utilities: dict[str, float] = field(default_factory=dict)  # raw task utility per role (0 without a deal)
    info: dict[str, Any] = field(default_factory=dict)  # domain-specific details (allocations, ...)


class DialogueEnv(Protocol):
    """A turn-based dialogue game between ``len(roles)`` roles.

    ``seats`` is the speaking order of a dialogue: a permutation of the roles; seat 0 speaks first,
    then seats alternate (round-robin for more than two roles).
    """

    roles: Sequence[str]

    def system_prompt(self, scenario: Any, role: str) -> str:
        """The role's system message, containing its private input for this scenario."""

    def new_state(self, scenario: Any, seats: Sequence[str]) -> Any:
        """A fresh mutable dialogue state."""

    def current_role(self, state: Any) -> str:
        """Whose turn it is."""

    def step(self, state: Any, role: str, text: str) -> TurnResult:
        """Apply one utterance of ``role``. Invalid utterances must not change the state."""

    def finish_malformed(self, state: Any, role: str) -> None:
        """End the dialogue because ``role``'s turn stayed malformed after the re-samples."""

    def abort(self, state: Any, reason: str) -> None:
        """End the dialogue without agreement for a reason outside the game (e.g. the context limit)."""

    def outcome(self, state: Any) -> Outcome:
        """The outcome of a finished dialogue."""

    def reward(self, state: Any, role: str) -> float:
        """The role's default (rule) reward for a finished dialogue."""


def role_messages(env: Any, scenario: Any, history: Sequence[tuple[str, str]], role: str) -> list[dict]:
    """``role``'s chat: its system prompt, own turns as ``assistant``, the counterpart's as ``user`` (shown as the
    rollout shows them: ``env.counterpart_text`` when the env has one, else as said). ``env``: any env with
    ``system_prompt`` (DoND; TeleSales, :mod:`marti_ibrl.envs.telesales.transcripts`; ``scripted_records``).

    Messages after the role's last own turn are dropped: a trailing ``user`` message carries no loss, and OpenRLHF's
    multiturn SFT dataset garbles it (:mod:`marti_ibrl.sft`); empty if the role never spoke.
    """
    shown = getattr(env, "counterpart_text", None)  # optional in the contract: as said
    messages = [{"role": "system", "content": env.system_prompt(scenario, role)}]
    for speaker, text in history:
        if speaker == role:
            messages.append({"role": "assistant", "content": text})
        else:
            messages.append({"role": "user", "content": shown(speaker, text, scenario) if shown else text})
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return messages
