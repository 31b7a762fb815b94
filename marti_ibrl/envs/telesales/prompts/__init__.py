"""TeleSales prompts: training-time system prompts (paper Appendix E: Table 15 sales agent, Table 16 customer),
held-out evaluation prompts (Appendix D: Table 8 story compiler, Table 9 user simulator, Table 10 sales agent,
Table 12 post-dialogue audit) and the training-reward judges (§5.1; our own prompts, :mod:`..judges`).

Templates live in ``prompts/<lang>/NAME.txt`` (NAME in :data:`TEMPLATES`) with ``{field}`` slots (only
``{identifier}`` patterns are slots, so literal JSON braces need no escaping). Only English renderings exist so far;
a Chinese version is a ``zh/`` folder with the same files and slots.

Evaluation templates follow the paper's translations; the paper's ``{{UPPER_CASE}}`` slots are lower-case here. Two
deviations: Table 10 gains one line naming Table 15's two tool markers (Table 10 refers to "tool markers" without
listing them) and says "spoken phone language" instead of "spoken Chinese"; Table 9's body is not printed in the
paper (only its caption), so ``user_simulator.txt`` is assembled from what §5.2 and Appendix D say the simulator
does, with the rubric, intents, actions and output schema of :mod:`..simulator`, which renders it.

Visibility (Appendix D, "Information visibility"): the sales prompt is filled from :func:`profiles.sales_view`
(the lead fields) plus the service identity, never from hidden fields; the customer prompt from every profile
field plus the conversation state at the start of the call. The paper re-instantiates Table 16's state fields
every turn; here the system prompt is rendered once per dialogue, so it carries the *initial* state and tells the
customer to carry its scores forward from its own previous JSON output (see :mod:`..env`). Table 16 lists 21 of
the 28 training fields; the other seven (gender, car city, vehicle lead info, lead memory, purchase timeline,
can-add-WeChat, alternate phone) are added so that the customer conditions on its full profile.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marti_ibrl.envs.telesales.profiles import flat_fields, sales_view

ROLES = ("sales", "customer")
EVAL_TEMPLATES = ("story_compiler", "user_simulator", "sales_eval", "audit")
"""Held-out evaluation prompts: Tables 8, 9, 10 and 12 (Appendix D)."""
JUDGE_TEMPLATES = ("judge_sales", "judge_customer")
"""Training-reward judges (§5.1 "Task-Specific Rewards"; the paper prints no judge prompt, these are ours):
rendered by :mod:`..judges`."""
TEMPLATES = (*ROLES, *EVAL_TEMPLATES, *JUDGE_TEMPLATES)
DEFAULT_SERVICE = {"service_name": "Li Na", "service_gender": "female", "service_phone": "400-000-0000"}
"""The sales agent's own identity (Table 15 "Dynamic service information"); not part of the customer profile."""
INITIAL_CONVERSATION = {"stage": "opening", "wechat_status": "not discussed yet", "guidance_type": "none yet",
                        "guidance_quality": "not applicable yet"}  # fmt: skip
_DIR = Path(__file__).parent
_SLOT = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


def languages() -> list[str]:
    return sorted(p.name for p in _DIR.iterdir() if p.is_dir() and (p / "sales.txt").is_file())


def load_template(role: str, lang: str = "en") -> str:
    """The raw template ``role`` (a training role, "sales" | "customer", or an :data:`EVAL_TEMPLATES` name) in
    ``lang``."""
    if role not in TEMPLATES:
        raise ValueError(f"unknown TeleSales prompt {role!r} (templates: {', '.join(TEMPLATES)})")
    path = _DIR / lang / f"{role}.txt"
    if not path.is_file():
        raise ValueError(f"no TeleSales prompt templates for language {lang!r} (available: {', '.join(languages())})")
    return path.read_text(encoding="utf-8").strip()


def slots(template: str) -> set[str]:
    return set(_SLOT.findall(template))


def render(template: str, fields: Mapping[str, Any]) -> str:
    """Fill every ``{slot}``; a slot without a field is an error (no ``{...}`` is ever left over)."""
    missing = sorted(slots(template) - set(fields))
    if missing:
        raise KeyError(f"no value for template slots: {', '.join(missing)}")
    return _SLOT.sub(lambda m: fmt(fields[m.group(1)]), template)


def fmt(value: Any) -> str:
    """A profile value as prompt text (budget ranges, vehicle info dicts, lists, booleans, missing values)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and all(isinstance(v, int) for v in value):  # budget range, k RMB
            return f"{value[0]}-{value[1]}k RMB"
        return ", ".join(fmt(v) for v in value)
    if isinstance(value, dict):
        if {"year", "body", "energy", "mileage_km", "listing_price_k"} <= set(value):
            text = (f"{value['year']} {value['energy']} {value['body']}, {value['mileage_km']:,} km, "
                    f"listed at {value['listing_price_k']}k RMB")  # fmt: skip
            if "lead_type" in value:
                text += f"; lead: {value['lead_type']}, {value.get('lead_days_ago', '?')} days ago"
            return text
        return "; ".join(f"{k.replace('_', ' ')}: {fmt(v)}" for k, v in value.items())
    return str(value)


def sales_prompt(profile: dict, lang: str = "en", service: Mapping[str, str] | None = None) -> str:
    """Table 15, filled from the lead fields only (:func:`profiles.sales_view`) and the service identity."""
    lead = sales_view(profile)
    fields = {
        **DEFAULT_SERVICE,
        **(service or {}),
        "vehicle_series": lead["vehicle"],
        "registration_city": lead["car_city"],
        "purchase_budget": lead["budget"],
        "purchase_time": lead["purchase_timeline"],
        "vehicle_information": lead["vehicle_info"],
        "customer_phone": lead["phone_number"],
    }
    return render(load_template("sales", lang), fields)


def customer_prompt(profile: dict, scores: Mapping[str, float], lang: str = "en") -> str:
    """Table 16, filled from every profile field and the initial conversation state (``scores``: willingness and
    patience before the first customer turn)."""
    state = {**INITIAL_CONVERSATION, **{f"{k}_before": v for k, v in scores.items()}}
    return render(load_template("customer", lang), {**flat_fields(profile), **state})


# ---- held-out evaluation (Appendix D) ----
def story_compiler_prompt(profile: dict, lang: str = "en") -> str:
    """Table 8, with the whole evaluation profile (Appendix D layout) as its input JSON."""
    return render(load_template("story_compiler", lang), {"profile_json": json.dumps(profile, ensure_ascii=False)})


def sales_eval_prompt(profile: dict, lang: str = "en", service: Mapping[str, str] | None = None) -> str:
    """Table 10, filled from ``agent_info.known_customer_info`` only and the agent's own identity (SALE_PROFILE)."""
    fields = {**sales_view(profile), "sale_profile": {**DEFAULT_SERVICE, **(service or {})}}
    return render(load_template("sales_eval", lang), fields)


def format_dialogue(turns: Sequence[tuple[str, str]]) -> str:
    """``(speaker, text)`` pairs as numbered lines ("Turn 1 - agent: ..."): the turn numbers the audit cites."""
    return "\n".join(f"Turn {i} - {speaker}: {text}" for i, (speaker, text) in enumerate(turns, 1))


def audit_prompt(
    profile: dict, turns: Sequence[tuple[str, str]], lang: str = "en", service: Mapping[str, str] | None = None
) -> str:
    """Table 12: the agent's rules (its Table 10 prompt), the agent-visible lead info, the agent's identity and the
    observable dialogue (``(speaker, visible text)`` pairs; no simulator labels or scores)."""
    fields = {
        "customer_service_system_prompt": sales_eval_prompt(profile, lang, service),
        "agent_known_info": sales_view(profile),
        "sale_profile": {**DEFAULT_SERVICE, **(service or {})},
        "dialogue": format_dialogue(turns),
    }
    return render(load_template("audit", lang), fields)
