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
    shown: dict[str, str] | None = None
    """What each role is shown after this turn, by role: a ``user`` message in its chat before its next turn, the
    speaker's own included when the game owes it one (a TextArena game shows a player the board after its own move);
    a role absent or given "" is shown nothing. None (every game of ours): each other role is shown the turn as
    ``counterpart_text`` says (:func:`shown_after`)."""


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


def shown_after(env: Any, speaker: str, text: str, scenario: Any, shown: dict[str, str] | None) -> dict[str, str]:
    """``{role: message}`` shown after ``speaker`` said ``text`` (:attr:`TurnResult.shown`): the env's own when it
    gave them, else ``counterpart_text`` (or the text as said) to every other role. Empty messages are left out."""
    if shown is not None:
        return {role: message for role, message in shown.items() if message}
    render = getattr(env, "counterpart_text", None)  # optional in the contract: as said
    said = render(speaker, text, scenario) if render is not None else text
    return {role: said for role in env.roles if role != speaker}


def role_messages(env: Any, scenario: Any, history: Sequence[tuple], role: str) -> list[dict]:
    """``role``'s chat: its system prompt, own turns as ``assistant``, what it was shown of each turn as ``user``
    (:func:`shown_after`: ``env.counterpart_text`` of the others' turns by default). ``history``: ``(speaker, text)``
    or ``(speaker, text, shown)`` with the turn's :attr:`TurnResult.shown`. ``env``: any env with ``system_prompt``
    (DoND; TeleSales, :mod:`marti_ibrl.envs.telesales.transcripts`; ``scripted_records``).

    Messages after the role's last own turn are dropped: a trailing ``user`` message carries no loss, and OpenRLHF's
    multiturn SFT dataset garbles it (:mod:`marti_ibrl.sft`); empty if the role never spoke.
    """
    messages = [{"role": "system", "content": env.system_prompt(scenario, role)}]
    for speaker, text, *shown in history:
        if speaker == role:
            messages.append({"role": "assistant", "content": text})
        message = shown_after(env, speaker, text, scenario, shown[0] if shown else None).get(role)
        if message:
            messages.append({"role": "user", "content": message})
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return messages
