"""Vehicle TeleSales (paper §5.1-5.2, Appendix D): customer profiles; the environment comes later."""

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
    sales_view,
    write_jsonl,
)

__all__ = [
    "CODE_VERSION",
    "EVAL_GROUPS",
    "SPLITS",
    "TRAIN_GROUPS",
    "attributes",
    "customer_view",
    "difficulty",
    "flat_fields",
    "generate_profile",
    "generate_profiles",
    "sales_view",
    "write_jsonl",
]
