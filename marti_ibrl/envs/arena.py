"""TextArena's two-player games as environments: ``--env.name textarena:GAME-ID`` (e.g. ``textarena:TicTacToe-v0``).

TextArena (PyPI ``textarena``, pinned) is the suite multi-agent LLM-RL papers train on (SPIRAL: TicTacToe, Kuhn
Poker, Simple Negotiation, one shared policy); here each of its two players is a role of its own, trained as IB-RL
trains any two roles (own policy, reward, GRPO groups, optimizer, pools). The game is TextArena's own class,
unwrapped (``GAME-ID-raw``): nothing of its rules is copied.

* **Roles** ``player0`` and ``player1``: TextArena's player ids 0 and 1 (a game decides who moves first, some at
  random: Kuhn Poker); every dialogue seats them so (``fixed_seats``), so each role learns one side.
* **A scenario** is the seed of TextArena's ``reset`` (cards, boards, values); ``--env.num_scenarios`` of them.
* **What a role sees.** Its system prompt is every message TextArena gives its player at reset (the rules, its
  private cards, the first board); after each move, the messages TextArena queued for each player since it last saw
  them (the opponent's move, the board, the end of a round) are its ``user`` message before its next turn
  (:attr:`~marti_ibrl.envs.base.TurnResult.shown`): a player may see news after its own move, and may move twice.
  Its own move's echo is left out (it is its ``assistant`` turn).
* **Invalid moves** are our malformed turns: TextArena's verdict (a move it refuses, with its reason), the game put
  back exactly as before the move (a snapshot, TextArena's retry message included), so the runner re-samples it
  (``--env.max_resamples``) and penalises every attempt as it does for any game; a turn that stays invalid ends the
  game with ``--env.invalid_penalty`` for its player and 0 for the other.
* **Rewards** (``--env.payoff``): ``outcome``, TextArena's per player at the end: win 1 / loss -1 / draw 0, zero-sum
  in every game, the iterated prisoner's dilemma and the negotiation included (TextArena scores them by who gained
  more); ``own``, the player's own score where the game keeps one (:data:`OWN_PAYOFF`: the dilemma's points, the
  negotiation's gain in inventory value), read from TextArena's game state, not zero-sum. ``Outcome.agreed``: a
  player won (``own``: some player gained); ``info["reason"]``: TextArena's.
* **Randomness.** TextArena draws from Python's global ``random`` (its ``reset`` seeds it): each game keeps its own
  generator state and swaps it in around every TextArena call, so dialogues played side by side stay reproducible
  and nothing of ours shares a stream with them.

Refused in one line (:func:`check_game`): a game that is not two-player, and games that fetch data at run time
(their module reads nltk corpora or the network: there is none on a cluster's compute nodes): :data:`FETCHING`.
"""

from __future__ import annotations

import copy
import importlib.util
import random
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marti_ibrl.envs.base import Outcome, TurnResult
from marti_ibrl.envs.spec import EnvSpec

PREFIX = "textarena:"
ROLES = ("player0", "player1")
FETCHING = ("nltk", "requests", "urllib", "load_dataset", "hf_hub", "download")
"""Words in a game's module that mean it reads corpora or the network at run time."""
GAME = -1  # TextArena's sender id of the game's own messages (ta.GAME_ID)
PAYOFFS = ("outcome", "own")
OWN_PAYOFF = {
    "IteratedPrisonersDilemma-v0": lambda game_state, pid: game_state["scores"][pid],
    "SimpleNegotiation-v0": lambda game_state, pid: game_state["inventory_value"][pid]["change"],
}
"""``--env.payoff own``: each game's own score of a player, as TextArena's game state keeps it at the end."""
VERIFIED = ("SimpleNegotiation-v0", "TicTacToe-v0", "KuhnPoker-v0", "IteratedPrisonersDilemma-v0")
"""Games trained and evaluated in ``make test`` (tests/envs/test_arena.py); others load if :func:`check_game` passes."""


class GameRefused(ValueError):
    """A TextArena game this adapter cannot play (not two-player, fetches data, unknown id)."""


def game_id(name: str) -> str:
    """``textarena:GAME-ID`` -> ``GAME-ID``."""
    return name[len(PREFIX) :] if name.startswith(PREFIX) else name


@contextmanager
def _stream(game: _Game) -> Iterator[None]:
    """Python's global ``random`` set to ``game``'s own state while TextArena runs, then put back."""
    outside = random.getstate()
    random.setstate(game.rng)
    try:
        yield
    finally:
        game.rng = random.getstate()
        random.setstate(outside)


def _make(gid: str) -> Any:
    import textarena as ta

    return ta.make(f"{gid}-raw")


def check_game(gid: str) -> None:
    """Raise :class:`GameRefused` (one line) unless ``gid`` is a registered two-player TextArena game that reads no
    corpus or network at run time."""
    try:
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError as e:  # the pinned dependency missing: make install
        raise GameRefused(f"textarena is not installed ({e}); run make install") from None
    if f"{gid}-raw" not in ENV_REGISTRY:
        two = ", ".join(VERIFIED)
        raise GameRefused(f"textarena:{gid}: no such TextArena game (two-player games tested here: {two})")
    entry = ENV_REGISTRY[f"{gid}-raw"].entry_point
    module = entry.rpartition(":")[0] if isinstance(entry, str) else entry.__module__
    found = importlib.util.find_spec(module)  # read, not imported: some download their corpora on import
    source = Path(found.origin).read_text(encoding="utf-8") if found and found.origin else ""
    fetches = [word for word in FETCHING if word in source]
    if fetches:
        raise GameRefused(f"textarena:{gid}: fetches data at run time ({fetches[0]}); not supported (no network on "
                          "compute nodes)")  # fmt: skip
    env = _make(gid)
    saved = random.getstate()
    try:
        env.reset(num_players=2, seed=0)
    except (AssertionError, ValueError, TypeError) as e:
        raise GameRefused(f"textarena:{gid}: not a two-player game ({str(e).strip() or type(e).__name__})") from None
    finally:
        random.setstate(saved)


@dataclass
class _Game:
    """One dialogue: TextArena's env, its random state, the messages not yet shown to each player."""

    env: Any
    rng: Any
    done: bool = False
    fault_role: str | None = None
    reason: str = ""
    rewards: dict[int, float] = field(default_factory=dict)


def _render(messages: list, pid: int) -> str:
    """TextArena's queued messages for ``pid`` as one text: ``[GAME] …`` / ``[Player k] …``, its own echo left out."""
    lines = []
    for sender, text, _kind in messages:
        if sender == pid:
            continue
        lines.append(f"[{'GAME' if sender == GAME else f'Player {sender}'}] {str(text).strip()}")
    return "\n".join(lines)


class TextArenaEnv:
    """A TextArena two-player game as a :class:`~marti_ibrl.envs.base.DialogueEnv` (module docstring)."""

    roles = ROLES
    fixed_seats = ROLES

    def __init__(self, cfg: Any) -> None:
        self.gid = game_id(cfg.name)
        check_game(self.gid)
        self.invalid_penalty = float(cfg.invalid_penalty)
        self.num_scenarios = int(cfg.num_scenarios)
        self.payoff = check_payoff(self.gid, getattr(cfg, "payoff", "outcome"))
        self._prompts: dict[int, dict[int, str]] = {}

    # -- scenarios ------------------------------------------------------------------------------------------------

    def training_scenarios(self, seed: int) -> list[tuple[str, int]]:
        """``(uid, reset seed)`` pairs: ``--env.num_scenarios`` seeds for ``seed``."""
        base = random.Random(f"textarena/{self.gid}/{seed}")
        return [(f"{self.gid}-{seed}-{i}", base.randrange(2**31)) for i in range(self.num_scenarios)]

    # -- the contract ---------------------------------------------------------------------------------------------

    def new_state(self, scenario: int, seats: Any = None) -> _Game:
        game = self._reset(scenario)
        for pid in (0, 1):  # what reset queued is the system prompt: not shown again
            game.env.state.observations[pid] = []
        self._end_if_over(game)
        return game

    def system_prompt(self, scenario: int, role: str) -> str:
        """Every message TextArena gives the role's player at reset (rules, private information, first board)."""
        if scenario not in self._prompts:
            game = self._reset(scenario)
            # one scenario kept: a dialogue asks for both roles' prompts together, and the next dialogue's differ
            self._prompts = {scenario: {pid: _render(game.env.state.observations[pid], pid) for pid in (0, 1)}}
        return self._prompts[scenario][ROLES.index(role)]

    def current_role(self, state: _Game) -> str:
        return ROLES[state.env.state.current_player_id]

    def step(self, state: _Game, role: str, text: str) -> TurnResult:
        """TextArena's move; an invalid one leaves the game exactly as it was (TurnResult.valid False)."""
        pid = ROLES.index(role)
        if state.done or state.env.state.current_player_id != pid:
            return TurnResult(valid=False, done=state.done, reason=f"not {role}'s turn")
        before = copy.deepcopy(state.env), state.rng
        ta_state = state.env.state
        errors = getattr(ta_state, "error_count", 0)  # TextArena counts a refused move here (its step resets the flag)
        with _stream(state):
            state.env.step(text)
        if getattr(ta_state, "error_count", 0) > errors or ta_state.game_info[pid].get("invalid_move"):
            why = _last_admin(ta_state.observations[pid]) or "an invalid move"
            state.env, state.rng = before
            return TurnResult(valid=False, done=False, reason=f"malformed: {why}")
        shown = {}
        for other in (0, 1):
            shown[ROLES[other]] = _render(state.env.state.observations[other], other)
            state.env.state.observations[other] = []
        self._end_if_over(state)
        return TurnResult(valid=True, done=state.done, reason=state.reason, shown=shown)

    def finish_malformed(self, state: _Game, role: str) -> None:
        state.done, state.fault_role, state.reason = True, role, "malformed"
        state.rewards = {pid: (self.invalid_penalty if ROLES[pid] == role else 0.0) for pid in (0, 1)}

    def abort(self, state: _Game, reason: str) -> None:
        state.done, state.reason, state.rewards = True, reason, {0: 0.0, 1: 0.0}

    def outcome(self, state: _Game) -> Outcome:
        utilities = {ROLES[pid]: float(state.rewards.get(pid, 0.0)) for pid in (0, 1)}
        won = any(u > 0 for u in utilities.values()) and state.fault_role is None
        info = {"fault_role": state.fault_role, "reason": state.reason, "turns": int(state.env.state.turn)}
        return Outcome(agreed=won, malformed=state.fault_role is not None, utilities=utilities, info=info)

    def reward(self, state: _Game, role: str) -> float:
        return float(state.rewards.get(ROLES.index(role), 0.0))

    def scripted_players(self) -> dict[str, Any]:
        """Scripted players of our own (TextArena ships none), for ``marti-ibrl sft --env textarena:GAME``: ``random``
        plays a uniformly random legal move read from what its player was last shown (the moves TextArena lists:
        ``Available Moves: '[0]', …``, ``Your available actions are: '[check]', …``); the iterated prisoner's
        dilemma's talks, then picks; the negotiation offers one unit it holds for one it lacks, and accepts or denies
        an offer at random. A game whose messages list no moves has none: :class:`GameRefused`."""
        plays = {"IteratedPrisonersDilemma-v0": _prisoner, "SimpleNegotiation-v0": _negotiator}.get(self.gid, _listed)
        first = self.training_scenarios(0)[0][1]
        if plays is _listed and not any(_moves(self.system_prompt(first, r)) for r in ROLES):
            raise GameRefused(f"textarena:{self.gid}: no scripted players (its messages list no moves)")

        def random_player(scenario: int, role: str, history: Any, rng: random.Random) -> str:
            seen = [h[2].get(role, "") for h in history if len(h) > 2 and h[2]]
            return plays([self.system_prompt(scenario, role), *[m for m in seen if m]], ROLES.index(role), rng)

        return {"random": random_player}

    # -- helpers --------------------------------------------------------------------------------------------------

    def _reset(self, scenario: int) -> _Game:
        """A fresh game of ``scenario``: TextArena's env reset with that seed, in the game's own random stream."""
        game = _Game(env=_make(self.gid), rng=random.Random(scenario).getstate())
        with _stream(game):
            game.env.reset(num_players=2, seed=scenario)
        return game

    def _end_if_over(self, state: _Game) -> None:
        ta_state = state.env.state
        if not ta_state.done:
            return
        state.done = True
        state.rewards = {int(pid): float(r) for pid, r in (ta_state.rewards or {}).items()}
        if self.payoff == "own":
            state.rewards = {pid: float(OWN_PAYOFF[self.gid](ta_state.game_state, pid)) for pid in (0, 1)}
        reasons = [info.get("reason") for info in ta_state.game_info.values() if info.get("reason")]
        state.reason = str(reasons[0] if reasons else getattr(ta_state, "info", {}).get("reason", "game over"))


def _moves(text: str) -> list[str]:
    """The moves a TextArena message lists, quoted: ``'[4]'``, ``'[check]'``."""
    return re.findall(r"'(\[[^\]']+\])'", text)


def _listed(shown: list[str], pid: int, rng: random.Random) -> str:
    """A random move of those listed on the latest line that lists any (a line describing a move quotes one too,
    but the list of legal moves comes after it)."""
    for line in reversed("\n".join(shown).splitlines()):
        if moves := _moves(line):
            return rng.choice(moves)
    raise RuntimeError("no move listed in what the player was shown")


def _prisoner(shown: list[str], pid: int, rng: random.Random) -> str:
    """The iterated prisoner's dilemma: a word in the talks, a random pick when asked to decide."""
    if "Please reply with" in shown[-1]:
        return rng.choice(["[Cooperate]", "[Defect]"])
    return rng.choice(["Let's both cooperate.", "I will play fair.", "Your move."])


def _negotiator(shown: list[str], pid: int, rng: random.Random) -> str:
    """Simple Negotiation: answers an offer made to it at random, else offers one unit it holds for one it lacks."""
    if f"made the following offer to Player {pid}" in shown[-1]:
        return rng.choice(["[Accept]", "[Deny]"])
    held = re.findall(r"\[(\w+)\]\s+Qty:\s*(\d+)", shown[0])
    give, want = rng.sample([name for name, _ in held], 2)
    return f"[Offer: 1 {give} -> 1 {want}]"


def _last_admin(messages: list) -> str:
    """TextArena's reason for an invalid move (its last GAME_ADMIN message, the "Please resubmit" advice cut)."""
    for sender, text, kind in reversed(messages):
        if sender == GAME and getattr(kind, "name", "") == "GAME_ADMIN":
            return str(text).split(" Please resubmit")[0].strip()
    return ""


def check_payoff(gid: str, payoff: str) -> str:
    """``payoff`` if game ``gid`` has it (:data:`PAYOFFS`, ``own`` where :data:`OWN_PAYOFF` names the game's score);
    otherwise :class:`GameRefused` in one line."""
    if payoff not in PAYOFFS:
        raise GameRefused(f"--env.payoff: {payoff}: must be one of {', '.join(PAYOFFS)}")
    if payoff == "own" and gid not in OWN_PAYOFF:
        raise GameRefused(
            f"--env.payoff: own: textarena:{gid} keeps no score of each player's own (only {', '.join(OWN_PAYOFF)}); "
            "its reward is TextArena's outcome"
        )
    return payoff


def arena_spec(name: str) -> EnvSpec:
    """The registry's spec of ``textarena:GAME-ID`` (checked: :func:`check_game`; its ``--env.payoff``:
    :func:`check_payoff`)."""
    check_game(game_id(name))

    def check(cfg: Any) -> None:
        check_payoff(game_id(name), cfg.env.payoff)  # (validate says a refusal as a ConfigError)

    title = f"TextArena {game_id(name)}"
    options = frozenset({"payoff"})
    return EnvSpec(name=name, roles=ROLES, factory=make_arena_env, title=title, check=check, options=options)


def make_arena_env(cfg: Any, seed: int) -> tuple[TextArenaEnv, list[tuple[str, int]]]:
    env = TextArenaEnv(cfg)
    return env, env.training_scenarios(seed)
