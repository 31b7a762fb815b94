"""Issue 63, the property tier for user code: hypothesis draws broken environments of one's own (a method of the
shipped example ``examples/price_negotiation.py`` replaced by one that raises, or returns what the contract does not
allow) and every one must end in the start-up check's one line naming ``module:Class`` (:class:`UserCodeError`), or
pass it when the replacement happens to keep the contract; never another exception, a traceback or a second line.
The start-up check (:func:`make_custom_env`) and then every call the runner and trainer make through
:class:`CheckedEnv` are exercised. Derandomized: the same cases on every run; ``MARTI_CLI_EXAMPLES`` as for the CLI
tier (tests/commands/test_cli_properties.py)."""

from __future__ import annotations

import math
import os
import sys
import types
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marti_ibrl.config.schema import EnvConfig
from marti_ibrl.envs.custom import UserCodeError, make_custom_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("MARTI_CLI_EXAMPLES", "1000"))
sys.path.insert(0, str(ROOT / "examples"))
from price_negotiation import PriceNegotiation  # noqa: E402

METHODS = {  # method: its arguments (self aside)
    "__init__": 1,
    "training_scenarios": 1,
    "system_prompt": 2,
    "new_state": 2,
    "current_role": 1,
    "step": 3,
    "outcome": 1,
    "reward": 2,
    "finish_malformed": 2,
    "abort": 2,
}
ERRORS = (ValueError, KeyError, RuntimeError, TypeError, ZeroDivisionError, AttributeError, IndexError, OSError)


class Unprintable(Exception):
    """An exception whose message cannot be made (its ``__str__`` raises)."""

    def __str__(self) -> str:
        raise RuntimeError("no message")


class BadRepr:
    """A returned value that cannot be shown (its ``__repr__`` raises)."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _values() -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.integers(),
        st.floats(allow_nan=True),
        st.text(max_size=200),
        st.lists(st.integers(), max_size=5),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        st.just(BadRepr()),
        st.just([("only-uid",)]),
        st.just([("uid", None)] * 3),
    )


def _defects() -> st.SearchStrategy:
    raising = st.tuples(st.just("raise"), st.sampled_from(ERRORS + (Unprintable,)), st.text(max_size=300))
    returning = st.tuples(st.just("return"), _values(), st.just(""))
    recursing = st.tuples(st.just("recurse"), st.just(None), st.just(""))
    return st.one_of(raising, returning, recursing)


def _broken_class(method: str, defect: tuple) -> type:
    kind, what, message = defect

    def broken(self, *args):
        if kind == "raise":
            raise what() if what is Unprintable else what(message)
        if kind == "recurse":
            return broken(self, *args)
        if method == "__init__":  # (an __init__ returning a value is a TypeError of Python's own)
            raise TypeError(f"__init__() should return None, not {type(what).__name__}")
        return what

    return type("Broken", (PriceNegotiation,), {method: broken})


def _play(env, scenarios) -> None:
    """What a dialogue asks of the env: prompts, a state, turns until it ends, then outcome and rewards."""
    scenario = scenarios[0][1]
    for role in env.roles:
        env.system_prompt(scenario, role)
    state = env.new_state(scenario, list(env.roles))
    for text in ("OFFER 40", "OFFER 60", "ACCEPT"):
        role = env.current_role(state)
        if env.step(state, role, text).done:
            break
    env.finish_malformed(state, role)
    env.abort(state, "the probe ended it")
    env.outcome(state)
    for role in env.roles:
        reward = env.reward(state, role)
        assert isinstance(reward, float) and math.isfinite(reward), reward


SEEN: dict[str, int] = {}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(method=st.sampled_from(sorted(METHODS)), defect=_defects())
def test_a_broken_env_is_one_line_naming_it_or_keeps_the_contract(method, defect):
    module = types.ModuleType("prop_env")
    module.Broken = _broken_class(method, defect)
    sys.modules["prop_env"] = module
    try:
        env, scenarios = make_custom_env(EnvConfig(name="prop_env:Broken"), 42)
        _play(env, scenarios)
    except UserCodeError as e:
        said = str(e)
        assert said.startswith("--env.name prop_env:Broken: ") and "\n" not in said and len(said) < 600, said
        SEEN["refused"] = SEEN.get("refused", 0) + 1
    else:
        SEEN["passed"] = SEEN.get("passed", 0) + 1
    finally:
        sys.modules.pop("prop_env", None)


def test_the_cases_drawn_were_both_refused_and_passed():
    """(After the property: its draws were not all of one kind.)"""
    if SEEN:  # (run alone, the property may not have run first in this worker)
        assert SEEN.get("refused", 0) > EXAMPLES // 2 and sum(SEEN.values()) >= EXAMPLES, SEEN
