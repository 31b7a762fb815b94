"""Per-role rewards R_i(τ) (paper §3.1, §5.1): the env's rule, an LLM judge, or a user function.

``--roleN.reward_fn`` picks a role's reward:

* ``rule``: the environment's rule reward (DoND: own utility on a deal, minus the invalid penalty);
* ``judge``: the environment's role-specific LLM judge behind ``--judge.base_url`` (TeleSales §5.1; its
  ``EnvSpec.judges``, marti_ibrl/envs/registry.py);
* ``my_module:my_fn``: a user function with the signature::

    def my_fn(trajectory: marti_ibrl.rollout.dialogue.Trajectory, role: str, scenario) -> float

Unset, it is the environment's default (:func:`default_reward`): ``judge`` for TeleSales, as in the paper, ``rule``
otherwise (and for frozen roles, whose rewards are only logged). ``trajectory`` holds the finished dialogue (``turns``, ``seats``, ``outcome`` with per-role
``utilities``, the env ``state``); ``role`` is the role being scored; ``scenario`` the env scenario. Each role's
reward is computed independently; rewards are not assumed zero-sum or aligned.

A reward that cannot be computed (a judge still failing after its retries, a remote reward model down) raises
:class:`RewardUnavailable`: the rollout runner records the reason in ``trajectory.reward_failures`` and the trainer
drops that trajectory from the role's GRPO group (counted as ``ROLE/reward_failed``), never scoring it 0. Any other
exception, or a NaN/inf reward, is turned into one by :func:`marti_ibrl.reward_types.score`, which every reward call
goes through; ``--train.max_reward_failures`` stops a run that loses too many.

``RewardFn``, ``RULE``, ``JUDGE`` and ``RewardUnavailable`` live in :mod:`marti_ibrl.reward_types` (below this module
and the environments' judges, which import them from there) and are re-exported here.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

from marti_ibrl.reward_types import JUDGE, RULE, RewardFn, RewardUnavailable

__all__ = [
    "JUDGE",
    "RULE",
    "RewardFn",
    "RewardUnavailable",
    "RoleRewards",
    "default_reward",
    "env_reward",
    "load_reward_fn",
    "reward_spec",
]


def default_reward(env_name: str) -> str:
    """The reward a trained role gets when ``reward_fn`` is unset, its env's ``EnvSpec.default_reward``
    (marti_ibrl/envs/registry.py): the paper's LLM judges for TeleSales, else the rule."""
    from marti_ibrl.envs import registry

    return registry.get(env_name).default_reward


def reward_spec(env_name: str, role) -> str:
    """A role's reward (``role``: a :class:`marti_ibrl.config.RoleConfig`): its ``reward_fn``, else the default; a
    frozen role (nobody trains on its reward; it is only logged) defaults to the rule, so no judge is paid for it."""
    return role.reward_fn or (RULE if role.frozen else default_reward(env_name))


def load_reward_fn(spec: str) -> RewardFn:
    """Import ``module:function`` and check it takes (trajectory, role, scenario)."""
    from marti_ibrl.envs.custom import described

    module_name, _, attr = spec.partition(":")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module_name) or not re.fullmatch(r"[A-Za-z_]\w*", attr):
        raise ImportError(f"expected module:function (Python names), got {spec!r}")  # refused by form, not imported
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name not in (module_name, module_name.split(".")[0]):
            raise ImportError(f"{spec}: importing {module_name} raised {described(e)}") from None
        raise
    except Exception as e:  # a SyntaxError, anything its body raises: the user's code, said as such
        raise ImportError(f"{spec}: importing {module_name} raised {described(e)}") from None
    fn = getattr(module, attr)
    if not callable(fn):
        raise TypeError(f"{spec} is not callable")
    try:
        inspect.signature(fn).bind(None, "role", None)
    except TypeError as e:
        raise TypeError(f"{spec} must accept (trajectory, role, scenario): {e}") from None
    return fn


def env_reward(env) -> RewardFn:
    """The environment's rule reward (DoND: own utility on a deal, 0 otherwise, minus invalid penalty)."""

    def reward(trajectory, role: str, scenario) -> float:
        return float(env.reward(trajectory.state, role))

    return reward


class RoleRewards:
    """Every role's reward function as configured, and what they hold open (the judges' endpoint client).

    ``fns[role]`` is R_role; ``stats()`` the judges' counts (scored, failures by kind) and their client's (requests,
    structured outputs) for the logs; ``close()`` shuts the client down. ``cfg`` is a :class:`marti_ibrl.config.Config`.
    """

    def __init__(self, cfg, env) -> None:
        self.specs = specs = {r.name: reward_spec(cfg.env.name, r) for r in cfg.roles}  # role -> rule, judge, mod:fn
        self.judges: dict[str, Any] = {}
        self.client = None
        judged = [r for r, s in specs.items() if s == JUDGE]
        if judged:
            from marti_ibrl.envs import registry

            make_judges = registry.get(cfg.env.name).judges
            if make_judges is None:
                raise ValueError(f"{', '.join(judged)}: reward_fn judge, but environment {cfg.env.name} has no judges")
            self.client, self.judges = make_judges(cfg.judge, cfg.env, judged)
        self.fns: dict[str, RewardFn] = {}
        for role, spec in specs.items():
            if spec == RULE:
                self.fns[role] = env_reward(env)
            elif spec == JUDGE:
                self.fns[role] = self.judges[role].reward_fn(env_reward(env))
            else:
                self.fns[role] = load_reward_fn(spec)

    def stats(self) -> dict[str, float]:
        """``ROLE/judge/KEY``: each judge's counts; ``judge/endpoint/KEY``: its endpoint client's (requests, those
        sent with a JSON schema or without, refused schemas, retries, faults by kind; :mod:`marti_ibrl.llm`)."""
        out = {f"{r}/judge/{k}": float(v) for r, judge in self.judges.items() for k, v in judge.stats.items()}
        if self.client is not None:
            out.update({f"judge/endpoint/{k}": float(v) for k, v in self.client.stats_snapshot().items()})
        return out

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
