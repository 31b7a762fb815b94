"""The policy's seat in a game against a person: one turn at a time, produced as the rollouts produce it.

``--policy`` of ``marti-ibrl play`` (:func:`make_seat`):

* ``PATH`` or ``checkpoint:PATH``: an HF checkpoint, served in this process by the rollout's
  :class:`~marti_ibrl.rollout.hf_engine.HFGenerateEngine` (no Ray: one person plays one turn at a time), its prompt
  rendered by :class:`~marti_ibrl.rollout.render.RoleView` exactly as in training and evaluation;
* ``endpoint:MODEL@BASE_URL[#API_KEY_ENV]``: an OpenAI-compatible endpoint through
  :class:`~marti_ibrl.rollout.players.EndpointPlayer` (its retries and backoff);
* ``bot:NAME`` / ``heldout:NAME``: a scripted DoND negotiator (:class:`~marti_ibrl.rollout.players.ScriptedBotPlayer`),
  deterministic: what the browser tests play against.

A seat is stateless: every turn is produced from the stored transcript, so a restarted server goes on where it was.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.rollout.dialogue import Trajectory, Turn
from marti_ibrl.rollout.players import make_player, parse_player_spec

History = Sequence[tuple[str, str]]  # (role, text) of the turns so far


class TextSeat:
    """A text player (endpoint or scripted bot) in the policy's seat."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.player = make_player(spec)
        self.name = self.player.name

    def respond(self, env: Any, role: str, scenario: Any, uid: str, seats: list[str], history: History) -> str | None:
        """The player's next turn; ``None`` when it could not produce one (an endpoint after its retries)."""
        turns = [Turn(r, text, [], [], True) for r, text in history]
        traj = Trajectory(scenario_uid=uid, scenario=scenario, seats=list(seats), policies={}, turns=turns)
        out = self.player.respond(env, role, [traj])[0]
        return None if out is None else out.strip()

    def close(self) -> None:
        self.player.close()


MAX_CONTEXT = 4096
"""The longest prompt plus answer a checkpoint seat generates for, in tokens (or the model's own context when
shorter): whatever ``--max-message-chars`` allows, one game's turn cannot hold the shared engine for longer than a
prompt of this size takes (the games' turns take the engine one at a time)."""


class CheckpointSeat:
    """An HF checkpoint in the policy's seat (HF ``generate`` in this process, one turn at a time). Its prompt is
    bounded in tokens (:attr:`max_prompt_tokens`): a person's message that would overflow it is refused before it is
    stored (``Game.act``), so no turn makes every other game wait on one huge generation."""

    def __init__(self, path: str, sampling: dict[str, Any], seed: int = 0) -> None:
        from marti_ibrl.rollout.hf_engine import HFGenerateEngine

        if not Path(path, "config.json").is_file():
            raise ValueError(f"{path}: not an HF checkpoint directory (no config.json)")
        self.engine = HFGenerateEngine(path, seed=seed)
        self.tokenizer = self.engine.tokenizer
        self.sampling = dict(sampling)
        self.name = Path(path).resolve().name
        self._lock = threading.Lock()  # one generate at a time (the engine keeps per-session caches)
        own = getattr(self.engine.model.config, "max_position_embeddings", None) or MAX_CONTEXT
        self.max_prompt_tokens = min(own, MAX_CONTEXT) - int(self.sampling.get("max_new_tokens", 64))

    def prompt(self, env: Any, role: str, scenario: Any, seats: list[str], history: History) -> list[int]:
        """The token ids the checkpoint reads for its next turn (:class:`~marti_ibrl.rollout.render.RoleView`): its
        own earlier turns re-encoded, the other side's as ``env.counterpart_text`` shows them."""
        from marti_ibrl.rollout.render import RoleView

        view = RoleView(self.tokenizer, env.system_prompt(scenario, role))
        for speaker, text in history:
            if speaker == role:
                view.add_own(self.tokenizer.encode(text, add_special_tokens=False), None, finished=True)
            else:
                view.add_counterpart(env.counterpart_text(speaker, text, scenario))
        return view.generation_prompt()

    def respond(self, env: Any, role: str, scenario: Any, uid: str, seats: list[str], history: History) -> str:
        """The checkpoint's next turn (:meth:`prompt`)."""
        prompt = self.prompt(env, role, scenario, seats, history)
        with self._lock:
            out = self.engine.generate_batch([prompt], self.sampling)[0]
        return self.tokenizer.decode(out["token_ids"], skip_special_tokens=True).strip()

    def close(self) -> None:
        """Nothing to release."""


def make_seat(spec: str, sampling: dict[str, Any], seed: int = 0) -> TextSeat | CheckpointSeat:
    """The seat of ``--policy SPEC`` (module doc); ``ValueError`` with the reason for a bad spec."""
    text = spec if ":" in spec.split("/")[0] else f"checkpoint:{spec}"
    parsed = parse_player_spec(text)
    if parsed["kind"] == "checkpoint":
        from marti_ibrl.checkpoints import checkpoint_problem

        if why := checkpoint_problem(parsed["path"]):  # before an engine fails on it
            raise ValueError(f"--policy {spec}: {why}")
        return CheckpointSeat(parsed["path"], sampling, seed)
    if parsed["kind"] == "endpoint":
        parsed["sampling"] = dict(sampling)
    elif parsed["kind"] in ("bot", "heldout"):
        parsed["seed"] = seed
    return TextSeat(parsed)
