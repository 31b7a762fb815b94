"""The smallest two-role game (docs/environments.md): a proposer splits a pot, a responder accepts or rejects."""

import re
from types import SimpleNamespace

from marti_ibrl.envs.base import Outcome, TurnResult

PROMPT = "You and the other side split {pot} coins. The proposer ends with OFFER k (the responder's share), the "
PROMPT += "responder with ACCEPT or REJECT (no deal: nobody gets anything). You are the {role}."
ACTIONS = {"proposer": r"OFFER (\d{1,3})\s*$", "responder": r"(ACCEPT|REJECT)\s*$"}


class SplitCoins:
    roles = ("proposer", "responder")
    fixed_seats = roles  # the proposer always opens

    def __init__(self, cfg):  # marti_ibrl.config.EnvConfig: max_rounds, invalid_penalty, data, ...
        self.penalty = cfg.invalid_penalty

    def training_scenarios(self, seed):  # (uid, scenario) pairs: the uid names the scenario's GRPO groups
        return [(f"pot-{seed}-{i}", 4 + (seed + 7 * i) % 9) for i in range(64)]

    def system_prompt(self, pot, role):
        return PROMPT.format(pot=pot, role=role)

    def new_state(self, pot, seats):  # fault_role: whose turn stayed malformed (the per-role malformed metric reads it)
        return SimpleNamespace(pot=pot, offer=None, done=False, agreed=False, fault_role=None, reason="")

    def current_role(self, state):
        return "proposer" if state.offer is None else "responder"

    def step(self, state, role, text):  # an invalid turn leaves the state as it was (the runner re-samples it)
        found = re.search(ACTIONS[role], text)
        if not found or (role == "proposer" and int(found.group(1)) > state.pot):
            return TurnResult(valid=False, done=False, reason=f"the {role}'s turn must end with {ACTIONS[role]}")
        if role == "proposer":
            state.offer = int(found.group(1))
        else:
            state.done, state.agreed, state.reason = True, found.group(1) == "ACCEPT", found.group(1).lower()
        return TurnResult(valid=True, done=state.done, reason=state.reason)

    def finish_malformed(self, state, role):
        state.done, state.fault_role, state.reason = True, role, "malformed"

    def abort(self, state, reason):
        state.done, state.reason = True, reason

    def outcome(self, state):
        shares = {"proposer": state.pot - state.offer, "responder": state.offer} if state.agreed else {}
        utilities = {r: float(shares.get(r, 0)) for r in self.roles}
        info = {"fault_role": state.fault_role, "reason": state.reason}
        return Outcome(agreed=state.agreed, malformed=state.fault_role is not None, utilities=utilities, info=info)

    def scripted_players(self):  # optional: `marti-ibrl sft --env` makes a warm start from their dialogues
        return {"fair": lambda pot, role, history, rng: f"OFFER {pot // 2}" if role == "proposer" else "ACCEPT",
                "stingy": lambda pot, role, history, rng: "OFFER 1" if role == "proposer" else "REJECT"}  # fmt: skip

    def reward(self, state, role):
        return self.penalty if state.fault_role == role else self.outcome(state).utilities[role] / state.pot
