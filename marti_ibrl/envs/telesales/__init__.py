"""Vehicle TeleSales (paper §5.1-5.2, Appendices D and E): customer profiles and the training environment.

Its registry entry (roles, factory, judge rewards, checks, subcommands) is :mod:`.spec`; its subcommands are in
:mod:`marti_ibrl.commands.telesales`; its held-out evaluation (user simulator, Table 11 rubric, metrics) is
:mod:`marti_ibrl.eval.telesales`."""

from marti_ibrl.envs.telesales.env import SEATS, TeleSalesEnv, TeleSalesState, initial_scores
from marti_ibrl.envs.telesales.profiles import (
    CODE_VERSION,
    EVAL_GROUPS,
    SPLITS,
    TRAIN_GROUPS,
    attributes,
    customer_view,
    difficulty,
    flat_fields,
    generate_profile,
    generate_profiles,
    profile_id,
    read_jsonl,
    sales_view,
    write_jsonl,
)

__all__ = [
    "CODE_VERSION",
    "EVAL_GROUPS",
    "SEATS",
    "SPLITS",
    "TRAIN_GROUPS",
    "TeleSalesEnv",
    "TeleSalesState",
    "attributes",
    "customer_view",
    "difficulty",
    "flat_fields",
    "generate_profile",
    "generate_profiles",
    "initial_scores",
    "profile_id",
    "read_jsonl",
    "sales_view",
    "write_jsonl",
]
