"""Deal-or-No-Deal (Lewis et al. 2017) with the paper's Table-17 protocol: scenarios, environment, prompts, bots
(training bots and held-out evaluation bots).

Its registry entries (``dond``, ``dond3``) are :mod:`.spec`; its subcommands are in :mod:`marti_ibrl.commands.dond`."""

from marti_ibrl.envs.dond.bots import (
    TRAINING_BOTS,
    ConcedingNegotiator,
    FairNegotiator,
    ScriptedNegotiator,
    make_bot,
    play_dialogue,
)
from marti_ibrl.envs.dond.game import DondEnv, DondState, complement, is_complementary, utility
from marti_ibrl.envs.dond.heldout import HELDOUT_BOTS, make_heldout_bot
from marti_ibrl.envs.dond.prompts import role_prompt
from marti_ibrl.envs.dond.protocol import Action, format_selection, format_try, parse_utterance
from marti_ibrl.envs.dond.scenarios import (
    DondScenario,
    LewisRecord,
    generate_scenarios,
    load_lewis_file,
    parse_lewis_line,
    rule_violations,
)
from marti_ibrl.envs.dond.three_party import (
    ThreePartyAction,
    ThreePartyDondEnv,
    ThreePartyState,
    format_three_party_selection,
    format_three_party_try,
    generate_three_party_scenarios,
    parse_three_party,
)

__all__ = [
    "HELDOUT_BOTS",
    "TRAINING_BOTS",
    "Action",
    "ConcedingNegotiator",
    "DondEnv",
    "DondScenario",
    "DondState",
    "FairNegotiator",
    "LewisRecord",
    "ScriptedNegotiator",
    "ThreePartyAction",
    "ThreePartyDondEnv",
    "ThreePartyState",
    "complement",
    "format_selection",
    "format_three_party_selection",
    "format_three_party_try",
    "format_try",
    "generate_scenarios",
    "generate_three_party_scenarios",
    "is_complementary",
    "load_lewis_file",
    "make_bot",
    "make_heldout_bot",
    "parse_lewis_line",
    "parse_three_party",
    "parse_utterance",
    "play_dialogue",
    "role_prompt",
    "rule_violations",
    "utility",
]
