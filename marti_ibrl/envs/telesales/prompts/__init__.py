"""TeleSales prompts: training-time system prompts (paper Appendix E: Table 15 sales agent, Table 16 customer),
held-out evaluation prompts (Appendix D: Table 8 story compiler, Table 9 user simulator, Table 10 sales agent,
Table 12 post-dialogue audit) and the training-reward judges (§5.1; our own prompts, :mod:`..judges`).

Templates live in ``prompts/<lang>/NAME.txt`` (NAME in :data:`TEMPLATES`) with ``{field}`` slots (only
``{identifier}`` patterns are slots, so literal JSON braces need no escaping). Two languages: English (``en``) and
Simplified Chinese (``zh``, the paper's original language), with the same files and slots. In ``zh`` only the
instructions are Chinese: JSON keys, labels, rubric codes, tool and end markers, and the ``scene_fewshots`` keys stay
as in English, so the validators are the same. Prompt-side values owned here (the default service identity, the
initial conversation state, :func:`fmt`'s words) have one entry per language; the profile values themselves
(:mod:`..profiles` pools) are English in both.

Evaluation templates follow the paper's translations; the paper's ``{{UPPER_CASE}}`` slots are lower-case here. Two
deviations: Table 10 gains one line naming Table 15's two tool markers (Table 10 refers to "tool markers" without
listing them) and, in English, says "spoken phone language" instead of "spoken Chinese" (``zh`` keeps 口语化的中文);
Table 9's body is not printed in the paper (only its caption), so ``user_simulator.txt`` is assembled from what §5.2
and Appendix D say the simulator does, with the rubric (:mod:`marti_ibrl.eval.telesales.rubric`), intents, actions
and output schema of :mod:`marti_ibrl.eval.telesales.outputs`, which renders it.

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
DEFAULT_SERVICES = {
    "en": {"service_name": "Li Na", "service_gender": "female", "service_phone": "400-000-0000"},
    "zh": {"service_name": "李娜", "service_gender": "女", "service_phone": "400-000-0000"},
}
"""The sales agent's own identity per language (Table 15 "Dynamic service information"); not part of the customer
profile. :func:`default_service` picks one."""
DEFAULT_SERVICE = DEFAULT_SERVICES["en"]
INITIAL_CONVERSATIONS = {
    "en": {"stage": "opening", "wechat_status": "not discussed yet", "guidance_type": "none yet",
           "guidance_quality": "not applicable yet"},
    "zh": {"stage": "opening", "wechat_status": "尚未谈及", "guidance_type": "暂无", "guidance_quality": "暂不适用"},
}  # fmt: skip
"""Table 16's conversation state before the first customer turn, per language (``stage`` is a label: never
translated)."""
INITIAL_CONVERSATION = INITIAL_CONVERSATIONS["en"]
PHRASES = {
    "en": {
        "note:add_business_contact": "[The agent sent a WeChat friend request to {phone_number}]",
        "note:send_contact_invitation": "[The agent sent an SMS with a WeChat invitation link]",
        "note:end": "[The agent ended the call]",
        "fallback_reply": "Sorry, could you say that again?",
        "judge_system": "You are a careful evaluator. Reply with one JSON object only.",
        "malformed_record": "[malformed record; the environment replaced it with a neutral fallback] ",
        "ending:contact_added": "success: the customer confirmed that the business WeChat contact was added",
        "ending:hang_up": "the customer hung up",
        "ending:sales_end": "the agent ended the call",
        "ending:turn_limit": "the turn limit was reached without a decision",
        "ending:malformed": "the call was cut after a malformed agent turn",
        "ending:other": "the call stopped ({reason})",
    },
    "zh": {
        "note:add_business_contact": "[顾问已向{phone_number}发送微信好友申请]",
        "note:send_contact_invitation": "[顾问已发送带微信邀请链接的短信]",
        "note:end": "[顾问结束了通话]",
        "fallback_reply": "不好意思，您能再说一遍吗？",
        "judge_system": "你是一名认真的评审。只回复一个 JSON 对象。",
        "malformed_record": "[格式错误的记录；环境已用中性的兜底回合替换] ",
        "ending:contact_added": "成功：客户确认已添加企业微信",
        "ending:hang_up": "客户挂断了电话",
        "ending:sales_end": "顾问结束了通话",
        "ending:turn_limit": "达到轮数上限，客户仍未做出决定",
        "ending:malformed": "顾问的一轮输出格式错误，通话被中断",
        "ending:other": "通话中止（{reason}）",
    },
}
"""Fixed phrases the environment and the judges put into prompts, per language: the bracketed tool notes a customer
hears, the fallback reply, the judges' system message, malformed-record note and call endings."""


def phrase(key: str, lang: str = "en", **fields: Any) -> str:
    """:data:`PHRASES` entry ``key`` in ``lang`` (English for a language without its own), ``{field}``s filled."""
    text = PHRASES.get(lang, PHRASES["en"])[key]
    return text.format(**fields) if fields else text


_WORDS = {
    "en": {"none": "none", "yes": "yes", "no": "no", "sep": ", ", "item": "; ", "colon": ": "},
    "zh": {"none": "无", "yes": "是", "no": "否", "sep": "、", "item": "；", "colon": "："},
}
""":func:`fmt`'s words and separators per language."""
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


def default_service(lang: str = "en") -> dict[str, str]:
    """The default service identity in ``lang`` (English for a language without its own entry)."""
    return dict(DEFAULT_SERVICES.get(lang, DEFAULT_SERVICE))


def slots(template: str) -> set[str]:
    return set(_SLOT.findall(template))


def render(template: str, fields: Mapping[str, Any], lang: str = "en") -> str:
    """Fill every ``{slot}`` (values through :func:`fmt` in ``lang``); a slot without a field is an error (no
    ``{...}`` is ever left over)."""
    missing = sorted(slots(template) - set(fields))
    if missing:
        raise KeyError(f"no value for template slots: {', '.join(missing)}")
    return _SLOT.sub(lambda m: fmt(fields[m.group(1)], lang), template)


def fmt(value: Any, lang: str = "en") -> str:
    """A profile value as prompt text (budget ranges, vehicle info dicts, lists, booleans, missing values). ``lang``
    picks the words and units (``zh``: money in 万元); a language without its own words gets English."""
    words = _WORDS.get(lang, _WORDS["en"])
    zh = lang == "zh"
    if value is None:
        return words["none"]
    if isinstance(value, bool):
        return words["yes"] if value else words["no"]
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and all(isinstance(v, int) for v in value):  # budget range, k RMB
            return f"{_wan(value[0])}-{_wan(value[1])}万元" if zh else f"{value[0]}-{value[1]}k RMB"
        return words["sep"].join(fmt(v, lang) for v in value)
    if isinstance(value, dict):
        if {"year", "body", "energy", "mileage_km", "listing_price_k"} <= set(value):
            if zh:
                text = (f"{value['year']}年 {value['energy']} {value['body']}，行驶{value['mileage_km']:,}公里，"
                        f"挂牌价{_wan(value['listing_price_k'])}万元")  # fmt: skip
                if "lead_type" in value:
                    text += f"；线索：{value['lead_type']}，{value.get('lead_days_ago', '?')}天前"
                return text
            text = (f"{value['year']} {value['energy']} {value['body']}, {value['mileage_km']:,} km, "
                    f"listed at {value['listing_price_k']}k RMB")  # fmt: skip
            if "lead_type" in value:
                text += f"; lead: {value['lead_type']}, {value.get('lead_days_ago', '?')} days ago"
            return text
        return words["item"].join(f"{k.replace('_', ' ')}{words['colon']}{fmt(v, lang)}" for k, v in value.items())
    return str(value)


def _wan(k_rmb: int | float) -> str:
    """Thousand RMB as 万 (ten thousand): 85 -> "8.5", 120 -> "12"."""
    return f"{k_rmb / 10:g}"


def sales_prompt(profile: dict, lang: str = "en", service: Mapping[str, str] | None = None) -> str:
    """Table 15, filled from the lead fields only (:func:`profiles.sales_view`) and the service identity."""
    lead = sales_view(profile)
    fields = {
        **default_service(lang),
        **(service or {}),
        "vehicle_series": lead["vehicle"],
        "registration_city": lead["car_city"],
        "purchase_budget": lead["budget"],
        "purchase_time": lead["purchase_timeline"],
        "vehicle_information": lead["vehicle_info"],
        "customer_phone": lead["phone_number"],
    }
    return render(load_template("sales", lang), fields, lang)


def customer_prompt(profile: dict, scores: Mapping[str, float], lang: str = "en") -> str:
    """Table 16, filled from every profile field and the initial conversation state (``scores``: willingness and
    patience before the first customer turn)."""
    initial = INITIAL_CONVERSATIONS.get(lang, INITIAL_CONVERSATION)
    state = {**initial, **{f"{k}_before": v for k, v in scores.items()}}
    return render(load_template("customer", lang), {**flat_fields(profile), **state}, lang)


# ---- held-out evaluation (Appendix D) ----
def story_compiler_prompt(profile: dict, lang: str = "en") -> str:
    """Table 8, with the whole evaluation profile (Appendix D layout) as its input JSON."""
    fields = {"profile_json": json.dumps(profile, ensure_ascii=False)}
    return render(load_template("story_compiler", lang), fields, lang)


def sales_eval_prompt(profile: dict, lang: str = "en", service: Mapping[str, str] | None = None) -> str:
    """Table 10, filled from ``agent_info.known_customer_info`` only and the agent's own identity (SALE_PROFILE)."""
    fields = {**sales_view(profile), "sale_profile": {**default_service(lang), **(service or {})}}
    return render(load_template("sales_eval", lang), fields, lang)


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
        "sale_profile": {**default_service(lang), **(service or {})},
        "dialogue": format_dialogue(turns),
    }
    return render(load_template("audit", lang), fields, lang)
