"""One game of a person against the policy: who sits where, what the person may do, what the page shows.

The rules and the scoring are the environments' own: every turn goes through ``env.step`` (an invalid one is refused
with the environment's reason and changes nothing), the end and the utilities are ``env.outcome``. The state is never
kept in memory between requests: :meth:`Game.replay` rebuilds it from the stored transcript.

* :class:`DondGame`: Deal-or-No-Deal (:class:`~marti_ibrl.envs.dond.game.DondEnv`). Game ``k`` (counted over the
  database) plays scenario ``k mod n``; the person takes role ``roles[k mod 2]`` and the opener alternates every two
  games, so with a policy each seat is the policy's opening seat in half the games (Table 2 is seat-averaged).
  The person's actions: ``message`` (free text, with the allocation widget's Table 17 markup or not), ``accept``
  (the ``<selection>`` of what the policy's latest offer leaves the person) and ``walk_away`` (``<disagree>``).
* :class:`TeleSalesGame`: the person is the customer of an evaluation profile (its character card), the policy the
  sales agent (Table 15 format, :class:`HumanCallEnv`). The person's actions: ``say``, ``consent`` (agrees to add
  the WeChat contact: the call ends as a success) and ``hang_up``.

The policy's turn is re-sampled twice when the environment refuses it and then ends the game as malformed (the
policy's fault), as in :class:`~marti_ibrl.rollout.runner.DialogueRunner`; a policy that produces no turn at all (an
endpoint after its retries) ends it as ``counterpart_failure`` (``failed``).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Sequence
from typing import Any

from marti_ibrl.envs.dond import DondEnv, generate_scenarios, load_lewis_file
from marti_ibrl.envs.dond.game import complement
from marti_ibrl.envs.dond.protocol import DISAGREE, format_selection, parse_utterance
from marti_ibrl.envs.dond.scenarios import DondScenario
from marti_ibrl.eval.telesales.env import SEATS, EvalCallState, EvalCase, TeleSalesEvalEnv, simulator_turn_json
from marti_ibrl.eval.telesales.outputs import SUCCESS_ACTION, SimulatorTurn, Story, validate_simulator_turn
from marti_ibrl.people.store import Rejected, Store

MAX_RESAMPLES = 2
COUNTERPART_FAILURE = "counterpart_failure"
ITEM_NAMES = ("book", "hat", "ball")
"""Lewis et al. (2017): item0, item1, item2."""


class Game:
    """What both games share: seats, the policy's turns, replaying a stored transcript."""

    env_name: str
    human_role: str
    policy_role: str

    def __init__(self, env: Any, seat: Any, policy: str) -> None:
        self.env, self.seat, self.policy = env, seat, policy

    # -- to implement ----------------------------------------------------------------------------------------
    def draw(self, k: int) -> tuple[str, Any, Any, str, list[str]]:
        """(scenario uid, scenario JSON, scenario object, person's role, seats) of the ``k``-th game."""
        raise NotImplementedError

    def scenario(self, game: dict[str, Any]) -> Any:
        """The scenario object of a stored game."""
        raise NotImplementedError

    def human_turn(self, game: dict[str, Any], state: Any, action: dict[str, Any]) -> str:
        """The transcript text of the person's action, or :class:`Rejected` with the reason."""
        raise NotImplementedError

    def view(self, game: dict[str, Any]) -> dict[str, Any]:
        """What the person's page shows."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------------------------
    def start(self, store: Store, participant: str) -> int:
        """A new game for ``participant``, the policy's opening turn included (generated under the game's own lock,
        as :meth:`act`'s turns: other games go on meanwhile); its id."""
        game_id = store.new_game(participant, self.env_name, self.policy, self.columns)
        try:
            store.open_game(game_id, self.open)
        except BaseException:  # no opening turn (the seat failed): never a game to play on, nor to count
            store.abandon_active(game_id=game_id)
            raise
        return game_id

    def columns(self, k: int) -> dict[str, Any]:
        """The stored columns of the ``k``-th game (:meth:`draw`)."""
        uid, scenario_json, _, human_role, seats = self.draw(k)
        policy_role = next(r for r in self.env.roles if r != human_role)
        return {"scenario_uid": uid, "scenario": scenario_json, "human_role": human_role,
                "policy_role": policy_role, "seats": seats}  # fmt: skip

    def open(self, game: dict[str, Any]) -> tuple[list[dict], dict | None, dict]:
        """The policy's opening turns of a new game (none when the person opens): (turns, outcome if it ended, {})."""
        state = self.replay(game)
        turns = self.policy_turns(
            state, self.scenario(game), game["scenario_uid"], game["seats"], [], game["policy_role"]
        )
        return turns, self.outcome(state) if self.done(state) else None, {}

    def replay(self, game: dict[str, Any]) -> Any:
        """The environment's state after the stored turns."""
        state = self.env.new_state(self.scenario(game), game["seats"])
        for t in game["turns"]:
            if t["valid"]:
                result = self.env.step(state, t["role"], t["text"])
                if not result.valid:  # the database was edited by hand, or the rules changed
                    raise RuntimeError(f"game {game['id']}: stored turn {t['text']!r} is now invalid: {result.reason}")
            else:
                self.env.finish_malformed(state, t["role"])
        return state

    def act(self, game: dict[str, Any], action: dict[str, Any]) -> tuple[list[dict], dict | None, dict]:
        """The person's action and the policy's answer: (new turns, outcome if the game ended, response).
        :class:`Rejected` (nothing stored) for an action the rules refuse."""
        state = self.replay(game)
        if self.done(state) or self.env.current_role(state) != game["human_role"]:
            raise Rejected("it is not your turn")
        text = self.human_turn(game, state, action)
        result = self.env.step(state, game["human_role"], text)
        if not result.valid:
            raise Rejected(f"not a valid move: {result.reason}")
        turns = [{"role": game["human_role"], "text": text, "valid": True, "resamples": 0}]
        history = [(t["role"], t["text"]) for t in game["turns"]] + [(game["human_role"], text)]
        limit = getattr(self.seat, "max_prompt_tokens", None)  # a checkpoint seat: its prompt bounded in tokens
        if limit is not None:
            n = len(self.seat.prompt(self.env, game["policy_role"], self.scenario(game), game["seats"], history))
            if n > limit:
                raise Rejected(f"too long for the policy to read: its prompt would be {n} tokens, at most {limit}")
        turns += self.policy_turns(
            state, self.scenario(game), game["scenario_uid"], game["seats"], history, game["policy_role"]
        )
        outcome = self.outcome(state) if self.done(state) else None
        after = {**game, "turns": game["turns"] + turns, "status": "finished" if outcome else "active"}
        after["outcome"] = outcome
        return turns, outcome, {"game": self.view(after)}

    def policy_turns(
        self, state: Any, scenario: Any, uid: str, seats: list[str], history: Sequence[tuple[str, str]], role: str
    ) -> list[dict[str, Any]]:
        """The policy's turns until it is the person's turn or the game is over (re-sampled as the runner does)."""
        turns: list[dict[str, Any]] = []
        history = list(history)
        while not self.done(state) and self.env.current_role(state) == role:
            attempt = 0
            while True:
                text = self.seat.respond(self.env, role, scenario, uid, seats, history)
                if text is None:
                    state.failed = True
                    self.env.abort(state, COUNTERPART_FAILURE)
                    return turns
                result = self.env.step(state, role, text)
                if result.valid or attempt == MAX_RESAMPLES:
                    break
                attempt += 1
            turns.append({"role": role, "text": text, "valid": result.valid, "resamples": attempt})
            history.append((role, text))
            if not result.valid:
                self.env.finish_malformed(state, role)
        return turns

    @staticmethod
    def done(state: Any) -> bool:
        return bool(state.done)

    def outcome(self, state: Any) -> dict[str, Any]:
        out = self.env.outcome(state)
        return {"agreed": out.agreed, "malformed": out.malformed, "failed": bool(getattr(state, "failed", False)),
                "utilities": out.utilities, "info": out.info}  # fmt: skip


def _seen(game: dict[str, Any], shown) -> list[dict[str, str]]:
    return [
        {"who": "you" if t["role"] == game["human_role"] else "them", "text": shown(t)}
        for t in game["turns"]
        if t["valid"] or t["role"] != game["human_role"]
    ]


class DondGame(Game):
    """Deal-or-No-Deal against the policy (module doc)."""

    env_name = "dond"

    def __init__(self, env: DondEnv, seat: Any, policy: str, scenarios: Sequence[DondScenario]) -> None:
        super().__init__(env, seat, policy)
        if not scenarios:
            raise ValueError("no DoND scenarios to play")
        self.scenarios = list(scenarios)

    def draw(self, k: int):
        scenario = self.scenarios[k % len(self.scenarios)]
        roles = list(self.env.roles)
        shift = (k // 2) % 2
        seats = roles[shift:] + roles[:shift]
        return scenario.uid, scenario.to_json(), scenario, roles[k % 2], seats

    def scenario(self, game: dict[str, Any]) -> DondScenario:
        return DondScenario.from_json(game["scenario"], uid=game["scenario_uid"])

    def offer(self, game: dict[str, Any], state: Any) -> tuple[int, int, int] | None:
        """What the policy's open offer (its pending ``<selection>``, else its latest ``<try>``) leaves the person."""
        counts = tuple(game["scenario"]["counts"])
        if state.pending_selection is not None:
            who, alloc = state.pending_selection
            return complement(counts, alloc) if who == game["policy_role"] else None
        for role, text in reversed(state.history):
            action = parse_utterance(text)
            if role == game["policy_role"] and action.kind == "try":
                return complement(counts, action.alloc)
        return None

    def human_turn(self, game: dict[str, Any], state: Any, action: dict[str, Any]) -> str:
        kind, text = action.get("kind"), str(action.get("text") or "").strip()
        if kind == "walk_away":
            return f"{text} {DISAGREE}".strip()
        if kind == "accept":
            mine = self.offer(game, state)
            if mine is None:
                raise Rejected("there is no offer to accept yet")
            return f"{text} {format_selection(mine)}".strip()
        if kind != "message":
            raise Rejected(f"unknown action {kind!r}")
        if not text:
            raise Rejected("empty message: write something, or use the allocation widget")
        action_ = parse_utterance(text)
        if action_.kind == "malformed":
            raise Rejected(f"not a valid move: {action_.error}")
        return text

    def view(self, game: dict[str, Any]) -> dict[str, Any]:
        scenario = game["scenario"]
        human = self.env.roles.index(game["human_role"])
        out: dict[str, Any] = {
            "env": "dond",
            "game_id": game["id"],
            "number": game["number"],  # the participant's own count of games: what the page calls it
            "status": game["status"],
            "items": [
                {"name": f"item{i} ({ITEM_NAMES[i]})", "count": c, "value": scenario["values"][human][i]}
                for i, c in enumerate(scenario["counts"])
            ],  # fmt: skip
            "transcript": _seen(game, lambda t: t["text"]),
            "your_turn": False,
            "offer": None,
        }
        if game["status"] == "active":
            state = self.replay(game)
            out["your_turn"] = not state.done and self.env.current_role(state) == game["human_role"]
            out["offer"] = self.offer(game, state)
            out["must_answer"] = state.pending_selection is not None
        elif game["status"] == "finished":
            o, policy = game["outcome"], self.env.roles.index(game["policy_role"])
            out["result"] = {
                "agreed": o["agreed"],
                "reason": o["info"]["reason"],
                "your_utility": o["utilities"][game["human_role"]],
                "their_utility": o["utilities"][game["policy_role"]],
                "their_values": scenario["values"][policy],
                "allocations": o["info"]["allocations"],
                "you": game["human_role"],
                "them": game["policy_role"],
            }
        return out


# ---- TeleSales ----------------------------------------------------------------------------------------------------

PERSON_STORY = Story("(played by a person)", {})
"""A person needs no compiled story: they play from the character card."""
SAY = ("ProvideInfo", "Hesitate")
CONSENT = ("AcceptContact", SUCCESS_ACTION)
HANG_UP = ("EndCall", "HangUp")
"""The (intent, action) labels a person's turn is recorded with: the button they pressed. Free text is not
classified; ``Hesitate`` is the label the training environment gives an unlabelled customer turn."""


class HumanCallEnv(TeleSalesEvalEnv):
    """The evaluation call with a person as the customer. Their turns are Table 9 turns with no rubric code (the
    scores stay at the profile's initial state) and the labels of :data:`SAY` / :data:`CONSENT` / :data:`HANG_UP`.
    Unlike the simulator, a person may consent before the agent sent a contact tool: their consent is the outcome."""

    def check_customer(self, state: EvalCallState, raw: Any) -> SimulatorTurn:
        return validate_simulator_turn(raw, before=state.scores)


def person_turn(scores: dict[str, float], labels: tuple[str, str], reply: str) -> str:
    """The transcript text of a person's customer turn."""
    intent, action = labels
    return simulator_turn_json(SimulatorTurn((), **scores, intent=intent, action=action, reply=reply))


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{k.replace('_', ' ')}: {_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    return "–" if value is None else str(value)


def character_card(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """What the person plays from: the customer's side of an evaluation profile (no simulator state), as sections
    ``{"title", "fields": [[name, text], ...]}``: who they are, their purchase, contact, concerns and speech, and
    what the agent's lead says about them."""
    from marti_ibrl.envs.telesales.profiles import customer_view

    view = customer_view(profile)
    view.pop("runtime_state", None)
    sections = []
    for group, body in view.items():
        for name, fields in body.items() if isinstance(body, dict) else [(group, body)]:
            title = "what the agent's lead says about you" if group == "agent_info" else name.replace("_", " ")
            rows = fields.items() if isinstance(fields, dict) else [(name, fields)]
            sections.append({"title": title, "fields": [[k.replace("_", " "), _text(v)] for k, v in rows]})
    return sections


class TeleSalesGame(Game):
    """The person as the customer, the policy as the sales agent (module doc)."""

    env_name = "telesales"

    def __init__(self, env: HumanCallEnv, seat: Any, policy: str, profiles: Sequence[dict[str, Any]]) -> None:
        super().__init__(env, seat, policy)
        if not profiles:
            raise ValueError("no TeleSales evaluation profiles to play")
        self.profiles = list(profiles)

    def draw(self, k: int):
        profile = self.profiles[k % len(self.profiles)]
        case = EvalCase(copy.deepcopy(profile), PERSON_STORY)
        return case.uid, profile, case, "customer", list(SEATS)

    def scenario(self, game: dict[str, Any]) -> EvalCase:
        return EvalCase(game["scenario"], PERSON_STORY)

    def human_turn(self, game: dict[str, Any], state: EvalCallState, action: dict[str, Any]) -> str:
        kind, text = action.get("kind"), str(action.get("text") or "").strip()
        if kind == "say":
            if not text:
                raise Rejected("empty message: say something, or consent / hang up")
            return person_turn(state.scores, SAY, text)
        if kind == "consent":
            return person_turn(state.scores, CONSENT, text or "OK, I'll add you on WeChat.")
        if kind == "hang_up":
            return person_turn(state.scores, HANG_UP, text or "Sorry, I have to go. Bye.")
        raise Rejected(f"unknown action {kind!r}")

    def view(self, game: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "env": "telesales",
            "game_id": game["id"],
            "number": game["number"],  # the participant's own count of games: what the page calls it
            "status": game["status"],
            "card": character_card(game["scenario"]),
            "transcript": _seen(game, lambda t: self.env.counterpart_text(t["role"], t["text"])),
            "your_turn": False,
        }
        if game["status"] == "active":
            state = self.replay(game)
            out["your_turn"] = not state.done and self.env.current_role(state) == game["human_role"]
        elif game["status"] == "finished":
            o = game["outcome"]
            out["result"] = {"success": o["agreed"], "reason": o["info"]["reason"], "outcome": o["info"]["outcome"]}
        return out


def dond_game(args: argparse.Namespace, seat: Callable[[], Any], name: str):
    """The person plays one seat of two-party DoND against ``seat()`` (``marti-ibrl play --env dond``)."""
    env = DondEnv(max_rounds=args.max_rounds, prompt_style=args.prompt_style, show_complement=args.show_complement)
    if args.data:
        try:
            scenarios = load_lewis_file(args.data)[: args.num_scenarios]
        except ValueError as e:  # (a file that cannot be read too)
            raise ValueError(f"--data {e}") from None
    else:
        scenarios = generate_scenarios(args.num_scenarios, args.scenario_seed)
    return DondGame(env, seat(), name, scenarios)


def telesales_game(args: argparse.Namespace, seat: Callable[[], Any], name: str):
    """The person is the customer of a TeleSales call with ``seat()`` selling (``marti-ibrl play --env telesales``)."""
    from marti_ibrl.envs.telesales.profiles import generate_profiles, read_jsonl

    if args.policy.split(":")[0] in ("bot", "heldout"):
        raise ValueError(f"--policy {args.policy}: scripted bots play Deal-or-No-Deal only; for TeleSales give a "
                         "checkpoint or an endpoint")  # fmt: skip
    if args.data:
        profiles = read_jsonl(args.data, "eval")[: args.num_scenarios]
    else:
        profiles = generate_profiles(args.num_scenarios, args.scenario_seed, "eval")
    return TeleSalesGame(HumanCallEnv(sales_mode="checkpoint", lang=args.lang), seat(), name, profiles)
