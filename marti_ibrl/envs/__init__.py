"""Dialogue environments. ``make_env`` builds the configured one with its training scenarios."""

from __future__ import annotations

from marti_ibrl.config import EnvConfig, env_roles
from marti_ibrl.envs.base import DialogueEnv, Outcome, TurnResult

__all__ = ["DialogueEnv", "Outcome", "TurnResult", "make_env"]


def make_env(cfg: EnvConfig, seed: int) -> tuple[DialogueEnv, list[tuple[str, object]]]:
    """The environment and its training scenarios as (uid, scenario) pairs."""
    if cfg.name == "dond":
        from marti_ibrl.envs.dond import DondEnv, generate_scenarios, load_lewis_file

        env = DondEnv(
            roles=env_roles(cfg.name),
            max_rounds=cfg.max_rounds,
            invalid_penalty=cfg.invalid_penalty,
            prompt_style=cfg.prompt_style,
            bot_speech=cfg.bot_speech,
            show_complement=cfg.show_complement,
        )
        scenarios = load_lewis_file(cfg.data) if cfg.data else generate_scenarios(cfg.num_scenarios, seed)
        return env, [(s.uid, s) for s in scenarios]
    if cfg.name == "dond3":
        from marti_ibrl.envs.dond import ThreePartyDondEnv, generate_three_party_scenarios

        if cfg.data:
            raise ValueError(
                f"--env.data is not supported for dond3 (got {cfg.data!r}): its scenarios come from the generator"
            )
        env = ThreePartyDondEnv(
            roles=env_roles(cfg.name),
            max_rounds=cfg.max_rounds,
            invalid_penalty=cfg.invalid_penalty,
            prompt_style=cfg.prompt_style,
            bot_speech=cfg.bot_speech,
        )
        return env, [(s.uid, s) for s in generate_three_party_scenarios(cfg.num_scenarios, seed)]
    if cfg.name == "telesales":
        from marti_ibrl.envs.telesales import TeleSalesEnv, generate_profiles, read_jsonl

        env = TeleSalesEnv(max_turns=2 * cfg.max_rounds, invalid_penalty=cfg.invalid_penalty, lang=cfg.lang)
        profiles = read_jsonl(cfg.data, "train") if cfg.data else generate_profiles(cfg.num_scenarios, seed, "train")
        return env, [(p["sample_id"], p) for p in profiles]
    if ":" in cfg.name:
        from marti_ibrl.envs.custom import make_custom_env

        return make_custom_env(cfg, seed)
    raise ValueError(f"unknown environment {cfg.name!r}")
