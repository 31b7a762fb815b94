"""Environments of your own: ``--env.name my_module:MyEnv``.

``MyEnv`` is a class implementing :class:`marti_ibrl.envs.base.DialogueEnv` (``roles``, ``system_prompt``,
``new_state``, ``current_role``, ``step``, ``finish_malformed``, ``abort``, ``outcome``, ``reward``; optionally
``counterpart_text(speaker, text, scenario)`` and ``fixed_seats``) plus two hooks the trainer calls::

    roles = ("buyer", "seller")                           # class attribute: read before anything is built

    def __init__(self, cfg: marti_ibrl.config.EnvConfig)  # max_rounds, invalid_penalty, data, ... as you need

    def training_scenarios(self, seed: int) -> list[tuple[str, object]]
        # (uid, scenario) pairs; uid names the scenario's GRPO groups (Eq. 4)

The module must be importable (on ``PYTHONPATH``). ``examples/price_negotiation.py`` is a complete one in under
150 lines. Everything else (rollouts, masks, per-role groups, pools, schedule, checkpoints) is the same trainer.
:func:`custom_spec` makes the class an :class:`~marti_ibrl.envs.registry.EnvSpec` (its ``roles``,
:func:`make_custom_env`, the ``rule`` reward), which :func:`marti_ibrl.envs.registry.get` registers like the
built-in environments.
"""

from __future__ import annotations

import importlib
import math
import re
from pathlib import Path
from typing import Any

from marti_ibrl.envs.spec import EnvSpec

REQUIRED = ("system_prompt", "new_state", "current_role", "step", "finish_malformed", "abort", "outcome", "reward")


PROBE_TEXT = "Hello."
"""The turn :func:`make_custom_env` offers ``step`` once at start-up, on a fresh state of the first scenario: any
text is a turn the contract answers (a ``TurnResult``, valid or not)."""


class UserCodeError(ValueError):
    """An environment of your own broke its contract (:class:`CheckedEnv`): one line naming its ``module:Class``, the
    method, the exception and where in your file it was raised."""


def _where(e: BaseException) -> str:
    """Where in the user's code ``e`` was raised: the innermost frame outside Python's own library, installed packages
    and this package (``file:line``; the innermost of all where every frame is theirs); a SyntaxError's own file and
    line."""
    import sysconfig

    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    theirs = tuple(
        {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        | {str(Path(__file__).resolve().parents[1])}
    )
    frames = []
    tb = e.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    own = [f for f in frames if not f[0].startswith("<") and not str(Path(f[0]).resolve()).startswith(theirs)]
    file, line = (own or frames or [("?", 0)])[-1]
    return f"{file}:{line}"


def _shown(make: Any, what: str) -> str:
    """``make()`` (a user object's ``str`` or ``repr``), or a note when that raises too."""
    try:
        return make()
    except Exception as e:
        return f"<{what} failed: {type(e).__name__}>"


def described(e: BaseException) -> str:
    """An exception of a user's code in one line: its type, message (whitespace folded, at most 300 characters; a
    message whose ``__str__`` raises is said so) and where it was raised (``file:line``)."""
    message = _shown(lambda: str(e), "its message")
    return " ".join(f"{type(e).__name__}: {message}".split())[:300] + f" ({_where(e)})"


def _raised(spec: str, what: str, e: BaseException) -> UserCodeError:
    return UserCodeError(f"--env.name {spec}: {what} raised {described(e)}")


def load_env_class(spec: str) -> type:
    """Import ``module:Class`` and check it has ``roles`` and the methods the runner and trainer call; a module that
    does not import (a SyntaxError, an exception in its body) is one :class:`UserCodeError` naming file and line."""
    module_name, _, attr = spec.partition(":")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module_name) or not re.fullmatch(r"[A-Za-z_]\w*", attr):
        raise ImportError(f"expected module:Class (Python names), got {spec!r}")  # refused by form, not imported
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name.split(".")[0] and e.name != module_name:
            raise _raised(spec, f"importing {module_name}", e) from None  # a module *it* imports is missing
        raise
    except Exception as e:  # a SyntaxError, anything its body raises: the user's code, said as such
        raise _raised(spec, f"importing {module_name}", e) from None
    cls = getattr(module, attr)
    roles = getattr(cls, "roles", None)
    if not isinstance(roles, (tuple, list)) or len(roles) < 2 or not all(isinstance(r, str) for r in roles):
        raise TypeError(f"{spec}: needs a class attribute `roles`, a tuple of at least two role names")
    missing = [m for m in (*REQUIRED, "training_scenarios") if not callable(getattr(cls, m, None))]
    if missing:
        raise TypeError(f"{spec}: missing methods {', '.join(missing)} (see marti_ibrl/envs/custom.py)")
    return cls


def custom_spec(name: str) -> EnvSpec:
    """The registry's spec of ``module:Class``: its roles, :func:`make_custom_env`, rule rewards, no judges."""
    return EnvSpec(name=name, roles=tuple(load_env_class(name).roles), factory=make_custom_env)


class CheckedEnv:
    """A user's environment behind its contract: every call the runner and trainer make is forwarded, and one that
    raises, or returns what the contract does not allow (``step`` something other than a ``TurnResult``,
    ``current_role`` a name not in ``roles``, ``system_prompt`` a non-string, ``outcome`` no ``Outcome``), is a
    :class:`UserCodeError` naming ``module:Class.method``. With ``--env.step_errors malformed`` an exception inside
    ``step`` passes through to the runner, which scores the turn malformed, as for the built-in environments."""

    def __init__(self, env: Any, spec: str, step_errors: str = "stop"):
        self._env, self._spec, self._step_errors = env, spec, step_errors
        self.roles = tuple(env.roles)

    def __getattr__(self, name: str) -> Any:  # optional hooks (counterpart_text, fixed_seats, ...) and attributes
        if name.startswith("__") or name in ("_env", "_spec", "_step_errors"):  # (a copy or unpickling: not set yet)
            raise AttributeError(name)
        return getattr(self._env, name)

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self._env, method)(*args)
        except UserCodeError:
            raise
        except Exception as e:
            if method == "step" and self._step_errors == "malformed":
                raise
            raise _raised(self._spec, f"{method}()", e) from None

    def _wrong(self, method: str, got: Any, want: str) -> UserCodeError:
        shown = " ".join(_shown(lambda: repr(got), "its repr").split())[:80]
        return UserCodeError(f"--env.name {self._spec}: {method}() returned {type(got).__name__} {shown}, not {want}")

    def system_prompt(self, scenario: Any, role: str) -> str:
        out = self._call("system_prompt", scenario, role)
        if not isinstance(out, str):
            raise self._wrong("system_prompt", out, "a str")
        return out

    def new_state(self, scenario: Any, seats: Any) -> Any:
        return self._call("new_state", scenario, seats)

    def current_role(self, state: Any) -> str:
        out = self._call("current_role", state)
        if out not in self.roles:
            raise self._wrong("current_role", out, f"one of its roles {list(self.roles)}")
        return out

    def step(self, state: Any, role: str, text: str) -> Any:
        from marti_ibrl.envs.base import TurnResult

        out = self._call("step", state, role, text)
        if not isinstance(out, TurnResult):
            raise self._wrong("step", out, "a marti_ibrl.envs.base.TurnResult")
        return out

    def finish_malformed(self, state: Any, role: str) -> None:
        self._call("finish_malformed", state, role)

    def abort(self, state: Any, reason: str) -> None:
        self._call("abort", state, reason)

    def outcome(self, state: Any) -> Any:
        from marti_ibrl.envs.base import Outcome

        out = self._call("outcome", state)
        if not isinstance(out, Outcome):
            raise self._wrong("outcome", out, "a marti_ibrl.envs.base.Outcome")
        return out

    def reward(self, state: Any, role: str) -> float:
        out = self._call("reward", state, role)
        if isinstance(out, bool) or not isinstance(out, int | float) or not math.isfinite(out):
            raise self._wrong("reward", out, "a finite number")
        return float(out)


def make_custom_env(cfg: Any, seed: int) -> tuple[Any, list[tuple[str, Any]]]:
    """The environment ``cfg.name`` built from the env config (behind :class:`CheckedEnv`), and its training
    scenarios for ``seed``, checked at once: constructed, scenarios drawn, and the first scenario's opening played
    (``new_state``, ``current_role``, ``system_prompt`` of every role, one ``step`` of :data:`PROBE_TEXT` on a fresh
    state), so a broken contract is one line before anything starts (:class:`UserCodeError`)."""
    spec = cfg.name
    cls = load_env_class(spec)
    try:
        raw = cls(cfg)
    except Exception as e:
        raise _raised(spec, "__init__()", e) from None
    env = CheckedEnv(raw, spec, getattr(cfg, "step_errors", "stop"))
    try:
        scenarios = list(raw.training_scenarios(seed))
    except Exception as e:
        raise _raised(spec, f"training_scenarios({seed})", e) from None
    if not scenarios:
        raise UserCodeError(f"--env.name {spec}: training_scenarios({seed}) returned no scenarios")
    bad = next((s for s in scenarios if not (isinstance(s, tuple | list) and len(s) == 2)), None)
    if bad is not None:
        shown = " ".join(_shown(lambda: repr(bad), "its repr").split())[:80]
        raise UserCodeError(f"--env.name {spec}: training_scenarios({seed}) holds {shown}, not a (uid, scenario) pair")
    scenario = scenarios[0][1]
    for role in env.roles:
        env.system_prompt(scenario, role)
    state = env.new_state(scenario, list(env.roles))
    first = env.current_role(state)
    try:
        env.step(state, first, PROBE_TEXT)
    except UserCodeError:
        raise
    except Exception:  # --env.step_errors malformed: a raising step is a malformed turn, in training as here
        pass
    return env, scenarios
