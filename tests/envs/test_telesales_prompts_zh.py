"""Chinese TeleSales prompts (issue 6 §6): ``prompts/zh`` next to ``prompts/en``, with the same slots, the same
machine-parsed tokens (JSON keys, labels, rubric codes, markers) and the same output schemas; only the instructions
and the prompt-side values owned by :mod:`marti_ibrl.envs.telesales.prompts` are Chinese."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import test_telesales_eval as eval_tests
import test_telesales_judges as judge_tests

from marti_ibrl.envs.telesales import prompts
from marti_ibrl.envs.telesales.env import TeleSalesEnv
from marti_ibrl.envs.telesales.judges import CustomerJudge, SalesJudge, validate_verdict
from marti_ibrl.envs.telesales.profiles import generate_profiles
from marti_ibrl.envs.telesales.protocol import BEHAVIORS, KEYS, STAGES, parse_customer_turn
from marti_ibrl.eval.telesales.outputs import (
    AGENT_ACTIONS,
    INTENTS,
    SCENES,
    Story,
    simulator_prompt,
    validate_audit,
    validate_sales_turn,
    validate_simulator_turn,
    validate_story,
)
from marti_ibrl.eval.telesales.rubric import RUBRIC

CJK = re.compile(r"[\u4e00-\u9fff]")
LEFTOVER = re.compile(r"\{[a-z_][a-z0-9_]*\}")
PYTHON_REPRS = ("None", "True", "False", "['", "{'")
JUDGE_KEYS = ("turns", "turn", "reason", "outcome", *SalesJudge.criteria, *CustomerJudge.criteria)
LABELS = frozenset({*BEHAVIORS, *STAGES, *KEYS, *AGENT_ACTIONS, *INTENTS, *RUBRIC, *SCENES, *JUDGE_KEYS,
                    "direct_conflict", "STORY", "SALE_PROFILE", "PHONE_NUMBER"})  # fmt: skip
"""Tokens code parses or that name parsed things: they must reach a Chinese prompt untranslated."""


def machine_tokens(en_template: str) -> set[str]:
    """:data:`LABELS` plus what the English template spells for code: quoted JSON keys, ``<...>`` markers and
    snake_case identifiers (``deceptive_fabrication``, ``agent_info.known_customer_info``, ...). Bare lower-case
    words and phrases ("opening", "price and fees") are left out: English prose uses them too (the JSON examples and
    the stage list are checked on their own)."""
    keys = re.findall(r'("[^"]+")\s*:', en_template)
    markers = re.findall(r"<[^<>\s]+>", en_template)
    snake = re.findall(r"\b[a-z]+(?:[._][a-z]+)+\b", en_template)
    return {t for t in (*LABELS, *keys, *markers, *snake) if not re.fullmatch(r"[a-z ]+", t)}


def check_pair(name: str, en: str, zh: str) -> None:
    """``zh`` (a rendered Chinese prompt) is complete, Chinese, free of Python reprs and holds every machine token
    of the English rendering ``en`` of the same inputs at least as often."""
    assert not LEFTOVER.search(zh), (name, LEFTOVER.search(zh))
    assert CJK.search(zh), name
    for python_repr in PYTHON_REPRS:
        assert python_repr not in zh, (name, python_repr)
    kept = {t for t in machine_tokens(prompts.load_template(name, "en")) if t in en}
    lost = sorted(t for t in kept if zh.count(t) < en.count(t))  # as often: a label list keeps every label
    assert not lost, (name, lost)


# ---- the templates ----
def test_languages_and_slots() -> None:
    assert {"en", "zh"} <= set(prompts.languages())
    for name in prompts.TEMPLATES:
        en, zh = prompts.load_template(name, "en"), prompts.load_template(name, "zh")
        assert prompts.slots(zh) == prompts.slots(en), name
        assert CJK.search(zh) and not CJK.search(en), name
        tokens = machine_tokens(prompts.load_template(name, "en"))
        for line in zh.splitlines():  # every instruction line is Chinese: nothing left untranslated
            rest = LEFTOVER.sub(" ", line)
            for token in sorted(tokens, key=len, reverse=True):
                rest = rest.replace(token, " ")
            if not line.startswith('{"') and re.search("[A-Za-z]", rest):
                assert CJK.search(line), (name, line)


def examples(template: str) -> list[Any]:
    """The JSON output examples of a template (its lines that are JSON objects)."""
    return [json.loads(line) for line in template.splitlines() if line.startswith('{"')]


def shape(obj: Any) -> Any:
    """``obj`` with free-text strings blanked: keys, numbers, booleans, nulls and labels are kept."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(v) for v in obj]
    return "<text>" if isinstance(obj, str) and obj not in LABELS else obj


VALIDATORS = {
    "customer": lambda o: parse_customer_turn(json.dumps(o), {"willingness": 0.40, "patience": 0.60}).error is None,
    "story_compiler": lambda o: validate_story(o).scene_fewshots.keys() == set(SCENES),
    "user_simulator": lambda o: validate_simulator_turn(o).rubric_hits == ("B01", "B17"),
    "sales_eval": lambda o: validate_sales_turn(o).agent_action == "AnswerQuestion",
    "audit": lambda o: not validate_audit(o).deceptive_fabrication,
    "judge_sales": lambda o: validate_verdict(o, [1], SalesJudge.criteria, "outcome", "sales").episode == 6,
    "judge_customer": lambda o: validate_verdict(o, [2], CustomerJudge.criteria, "realism", "customer").episode == 8,
}


def test_output_schemas_unchanged() -> None:
    """Every template's JSON example has the English keys, numbers and labels and passes the validator of its
    output in both languages (only the free-text values differ)."""
    for name in prompts.TEMPLATES:
        en, zh = examples(prompts.load_template(name, "en")), examples(prompts.load_template(name, "zh"))
        assert [shape(o) for o in zh] == [shape(o) for o in en], name
        assert (len(en) == 1) == (name in VALIDATORS), name  # sales (Table 15) answers in free text
        for obj in (*en, *zh):
            assert VALIDATORS[name](obj), (name, obj)


# ---- rendering: training roles, evaluation prompts, judges ----
def test_training_prompts_render_in_chinese() -> None:
    en_env, zh_env = TeleSalesEnv(), TeleSalesEnv(lang="zh")
    for profile in generate_profiles(12, seed=2, split="train"):
        for role in zh_env.roles:
            check_pair(role, en_env.system_prompt(profile, role), zh_env.system_prompt(profile, role))
    profile = judge_tests.PROFILE
    sales, customer = zh_env.system_prompt(profile, "sales"), zh_env.system_prompt(profile, "customer")
    assert "你的员工姓名是李娜" in sales and "客服性别：女" in sales  # the zh default identity
    lead = profile["lead"]
    assert lead["phone_number"] in sales and lead["vehicle"] in sales
    assert profile["persona"]["personality"] not in sales  # lead fields only, as in English
    low, high = lead["budget"]
    assert f"购车预算：{low / 10:g}-{high / 10:g}万元" in sales
    assert all(label in customer for label in (*STAGES, *BEHAVIORS))
    assert "微信状态：尚未谈及" in customer and "引导方式：暂无" in customer and "阶段：opening" in customer
    can_add = profile["contact"]["can_add_wechat"]
    assert f"能否通过这个手机号添加微信：{'是' if can_add else '否'}" in customer
    own = TeleSalesEnv(lang="zh", service={"service_name": "王磊", "service_gender": "男"})
    assert "你的员工姓名是王磊" in own.system_prompt(profile, "sales")
    assert "Your employee name is Li Na" in en_env.system_prompt(profile, "sales")  # English unchanged


def test_eval_prompts_render_in_chinese() -> None:
    story = Story("一位在送货间隙接电话的快递员。", {s: ("喂？哪位？",) for s in SCENES})
    trace = [validate_simulator_turn(eval_tests.sim_obj())]
    turns = [("agent", "您好，我是李娜。"), ("customer", "哪位？")]
    for profile in [eval_tests.PROFILE, *generate_profiles(6, seed=2, split="eval")]:
        for name, build in {
            "story_compiler": lambda lang, p=profile: prompts.story_compiler_prompt(p, lang),
            "user_simulator": lambda lang, p=profile: simulator_prompt(p, story, trace, lang=lang),
            "sales_eval": lambda lang, p=profile: prompts.sales_eval_prompt(p, lang),
            "audit": lambda lang, p=profile: prompts.audit_prompt(p, turns, lang),
        }.items():
            check_pair(name, build("en"), build("zh"))
    profile = eval_tests.PROFILE
    compiled = prompts.story_compiler_prompt(profile, "zh")
    assert json.loads(compiled.split("输入的用户画像：\n", 1)[1]) == profile
    sales_eval = prompts.sales_eval_prompt(profile, "zh")
    assert "口语化的中文" in sales_eval and "service name：李娜" in sales_eval
    assert profile["user_profile"]["speech"]["personality"] not in sales_eval  # lead fields only
    audit = prompts.audit_prompt(profile, turns, "zh")
    assert sales_eval in audit and "Turn 2 - customer: 哪位？" in audit
    sim = simulator_prompt(profile, story, trace, lang="zh")
    assert all(f"- {code} " in sim for code in RUBRIC) and all(label in sim for label in (*INTENTS, *BEHAVIORS))


def test_judge_prompts_render_in_chinese() -> None:
    llm = judge_tests.client("http://127.0.0.1:9")  # never contacted: messages() only renders
    hang_up = judge_tests.call("Greeting:0.05:-0.02", "May I add you on WeChat?", "HangUp:-0.1:-0.2")
    for traj in (judge_tests.success_call(), hang_up):
        for judge in (SalesJudge, CustomerJudge):
            en, zh = judge(llm).messages(traj), judge(llm, lang="zh").messages(traj)
            assert [m["role"] for m in zh] == [m["role"] for m in en]
            check_pair(judge.template, en[-1]["content"], zh[-1]["content"])
    text = SalesJudge(llm, lang="zh").messages(judge_tests.success_call())[-1]["content"]
    assert "需要评分的轮次：恰好以下这些顾问轮次，每个一次：1, 3, 5。" in text
    assert "<call_function" not in text and "Turn 1 - agent: " in text  # tool calls shown as bracketed notes
    # the fixed phrases around the template (system message, ending, tool notes, fallback) are Chinese too
    zh = SalesJudge(llm, lang="zh").messages(judge_tests.success_call())
    assert zh[0]["content"] == prompts.phrase("judge_system", "zh") and CJK.search(zh[0]["content"])
    assert "成功：客户确认已添加企业微信" in zh[-1]["content"] and "[顾问已" in zh[-1]["content"]
    assert "The agent" not in zh[-1]["content"] and "success:" not in zh[-1]["content"]
    env = TeleSalesEnv(lang="zh")
    assert env.counterpart_text("sales", "Bye. <status=end>", None) == "Bye. [顾问结束了通话]"
    assert env.counterpart_text("customer", "not json", None) == "不好意思，您能再说一遍吗？"
    assert set(prompts.PHRASES["zh"]) == set(prompts.PHRASES["en"])


# ---- prompt-side values and errors ----
def test_fmt_in_chinese_and_english_unchanged() -> None:
    car = {"year": 2020, "energy": "electric", "body": "sedan", "mileage_km": 45000, "listing_price_k": 98,
           "lead_type": "price inquiry", "lead_days_ago": 3}  # fmt: skip
    assert [prompts.fmt(v, "zh") for v in (None, True, False, 0.4, [85, 120], ["space", "safety"])] == [
        "无", "是", "否", "0.40", "8.5-12万元", "space、safety"
    ]  # fmt: skip
    assert prompts.fmt(car, "zh") == "2020年 electric sedan，行驶45,000公里，挂牌价9.8万元；线索：price inquiry，3天前"
    assert (
        prompts.fmt({"service_name": "李娜", "alternate_phone": None}, "zh")
        == "service name：李娜；alternate phone：无"
    )
    assert [prompts.fmt(v) for v in (None, True, [85, 120], ["space", "safety"])] == [
        "none", "yes", "85-120k RMB", "space, safety"
    ]  # fmt: skip
    assert prompts.fmt(car) == "2020 electric sedan, 45,000 km, listed at 98k RMB; lead: price inquiry, 3 days ago"
    assert (
        prompts.default_service("zh")["service_name"] == "李娜" and prompts.default_service() == prompts.DEFAULT_SERVICE
    )
    assert prompts.render("{a}/{b}", {"a": None, "b": [1, 2]}, "zh") == "无/0.1-0.2万元"


def test_unknown_language_is_a_clear_error() -> None:
    message = r"no TeleSales prompt templates for language 'fr' \(available: .*\ben\b.*\bzh\b"
    with pytest.raises(ValueError, match=message):
        prompts.load_template("sales", "fr")
    with pytest.raises(ValueError, match=message):
        TeleSalesEnv(lang="fr").system_prompt(judge_tests.PROFILE, "customer")
    with pytest.raises(ValueError, match=message):
        prompts.sales_eval_prompt(eval_tests.PROFILE, "fr")
    with pytest.raises(ValueError, match=message):
        SalesJudge(judge_tests.client("http://127.0.0.1:9"), lang="fr")
