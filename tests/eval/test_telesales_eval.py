"""TeleSales held-out evaluation, pure parts (paper §5.2, Appendix D Tables 8-12): rubric, validators and the JSON
schemas next to them (issue 20), outcomes, story cache, prompts, Success@n and the other metrics."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import test_llm_structured
from statsmodels.stats.proportion import proportion_confint
from test_llm_structured import agrees, conforms

from marti_ibrl.envs.telesales import generate_profile, prompts
from marti_ibrl.eval.telesales.metrics import success_at_n, summarize, table_markdown, wilson
from marti_ibrl.eval.telesales.outputs import (
    AGENT_ACTIONS,
    DIALOGUE_ACTIONS,
    INTENTS,
    SCENES,
    Story,
    StoryCache,
    audit_schema,
    call_outcome,
    sales_turn_schema,
    simulator_prompt,
    simulator_turn_schema,
    story_schema,
    validate_audit,
    validate_sales_turn,
    validate_simulator_turn,
    validate_story,
)
from marti_ibrl.eval.telesales.rubric import RUBRIC, apply_rubric

PROFILE = generate_profile(0, seed=0, split="eval")
STATE = {"willingness": 0.40, "trust": 0.50, "patience": 0.60}


# ---- Table 11 rubric ----
def test_rubric_table() -> None:
    assert list(RUBRIC) == [f"B{i:02d}" for i in range(1, 19)]
    assert RUBRIC["B15"].delta is None  # "same-turn behaviors"
    assert RUBRIC["B12"].delta == (-0.12, -0.10, -0.12) and RUBRIC["B04"].delta == (0.08, 0.07, 0.01)
    assert len(INTENTS) == 11 and len(DIALOGUE_ACTIONS) == 14 and len(AGENT_ACTIONS) == 10


def test_apply_rubric_sums_fired_entries() -> None:
    # B01 (+.05 +.05 +.02) + B04 (+.08 +.07 +.01) + B17 (0 +.03 +.05) + B15 (nothing)
    new = apply_rubric(STATE, ["B01", "B04", "B17", "B15"])
    assert new == pytest.approx({"willingness": 0.53, "trust": 0.65, "patience": 0.68})
    assert apply_rubric(STATE, []) == pytest.approx(STATE)
    assert apply_rubric(STATE, ["B14", "B15"]) == pytest.approx(STATE)
    assert STATE == {"willingness": 0.40, "trust": 0.50, "patience": 0.60}  # not modified in place


def test_apply_rubric_clips_each_score() -> None:
    low = {"willingness": 0.10, "trust": 0.30, "patience": 0.20}
    # B12 (-.12 -.10 -.12) + B16 (-.10 -.05 -.15): w .10-.22 -> 0, t .30-.15 = .15, p .20-.27 -> 0
    assert apply_rubric(low, ["B12", "B16"]) == pytest.approx({"willingness": 0.0, "trust": 0.15, "patience": 0.0})
    high = {"willingness": 0.95, "trust": 0.90, "patience": 0.97}
    # B01 + B04: w .95+.13 -> 1, t .90+.12 -> 1, p .97+.03 = 1.0
    assert apply_rubric(high, ["B01", "B04"]) == pytest.approx({"willingness": 1.0, "trust": 1.0, "patience": 1.0})
    # clipping is applied to the sum, not entry by entry: .95 + .08 - .12 = .91 (not min(1, .95+.08) - .12 = .88)
    assert apply_rubric(high, ["B04", "B12"])["willingness"] == pytest.approx(0.91)


def test_apply_rubric_rejects_unknown_and_repeated_codes() -> None:
    with pytest.raises(ValueError, match="unknown rubric codes: 'B19'"):
        apply_rubric(STATE, ["B01", "B19"])
    with pytest.raises(ValueError, match="fired twice"):
        apply_rubric(STATE, ["B01", "B01"])
    with pytest.raises(ValueError, match="state lacks trust"):
        apply_rubric({"willingness": 0.5, "patience": 0.5}, ["B01"])


# ---- validators ----
def story_obj(**changes: Any) -> dict[str, Any]:
    obj = {"story": "A courier in Shanghai who answers between deliveries.", "scene_fewshots": {}}
    obj["scene_fewshots"] = {s: [f"line for {s}"] for s in SCENES}
    obj.update(changes)
    return obj


def test_validate_story() -> None:
    story = validate_story(json.dumps(story_obj()))
    assert story.story.startswith("A courier") and set(story.scene_fewshots) == set(SCENES)
    fenced = "```json\n" + json.dumps(story_obj()) + "\n```"
    assert validate_story(fenced) == story
    three = story_obj(scene_fewshots={s: ["a", "b", "c"] for s in SCENES} | {"extra scene": ["d"]})
    assert validate_story(three).scene_fewshots["price and fees"] == ("a", "b", "c")
    bad = {
        "invalid JSON": "{not json",
        "text after the JSON object": json.dumps(story_obj()) + " thanks",
        "expected a JSON object": "[1, 2]",
        "'story' must be a non-empty string": story_obj(story="  "),
        "'scene_fewshots' must be an object": story_obj(scene_fewshots=["x"]),
        "lacks scenes: price and fees": story_obj(scene_fewshots={s: ["x"] for s in SCENES if s != "price and fees"}),
        "needs a list of 1-3 lines": story_obj(scene_fewshots={s: ["a", "b", "c", "d"] for s in SCENES}),
        "needs a list of 1-3 lines, got \\[\\]": story_obj(scene_fewshots={s: [] for s in SCENES}),
        "empty or non-string line": story_obj(scene_fewshots={s: ["ok", 3] for s in SCENES}),
    }
    for message, raw in bad.items():
        with pytest.raises(ValueError, match=message):
            validate_story(raw if isinstance(raw, str) else json.dumps(raw))


def sim_obj(**changes: Any) -> dict[str, Any]:
    # from STATE, B01 + B17: w .45, t .58, p .67
    obj = {"rubric_hits": ["B01", "B17"], "willingness": 0.45, "trust": 0.58, "patience": 0.67,
           "intent": "AskPrice", "action": "AskQuestion", "reply": "What's the total, roughly?"}  # fmt: skip
    obj.update(changes)
    return obj


def test_validate_simulator_turn() -> None:
    turn = validate_simulator_turn(json.dumps(sim_obj()), before=STATE)
    assert turn.rubric_hits == ("B01", "B17") and turn.state() == {"willingness": 0.45, "trust": 0.58, "patience": 0.67}
    assert (turn.intent, turn.action, turn.reply) == ("AskPrice", "AskQuestion", "What's the total, roughly?")
    assert validate_simulator_turn(sim_obj(willingness=0.9)).willingness == 0.9  # no `before`: scores not checked
    assert validate_simulator_turn(sim_obj(rubric_hits=[]), before=None).rubric_hits == ()
    bad = {
        "'rubric_hits' must be a list": sim_obj(rubric_hits="B01"),
        "unknown rubric codes": sim_obj(rubric_hits=["B01", "X9"]),
        "fired twice": sim_obj(rubric_hits=["B01", "B01"]),
        "'trust' must be a number in \\[0, 1\\]": sim_obj(trust=1.2),
        "'patience' must be a number": sim_obj(patience=True),
        "'willingness' must be a number": {k: v for k, v in sim_obj().items() if k != "willingness"},
        "willingness 0.5 != 0.45": sim_obj(willingness=0.5),
        "unknown intent 'Shopping'": sim_obj(intent="Shopping"),
        "unknown action 'Agree'": sim_obj(action="Agree"),
        "'reply' must be a non-empty string": sim_obj(reply=""),
    }
    for message, obj in bad.items():
        with pytest.raises(ValueError, match=message):
            validate_simulator_turn(json.dumps(obj), before=STATE)


def test_validate_sales_turn() -> None:
    ok = {"thinking_content": "answer price first", "agent_action": "PriceQuote", "agent_message": "It's 263k."}
    turn = validate_sales_turn(json.dumps(ok))
    assert (turn.agent_action, turn.agent_message, turn.turn.utterance) == ("PriceQuote", "It's 263k.", "It's 263k.")
    msg = "Sending it now. <call_function=send_contact_invitation> Bye! <status=end>"
    turn = validate_sales_turn({**ok, "agent_action": "ContactGuidance", "agent_message": msg})
    assert turn.turn.end and [t.name for t in turn.turn.tools] == ["send_contact_invitation"]
    assert validate_sales_turn({**ok, "thinking_content": ""}).thinking_content == ""
    bad = {
        "invalid JSON": '{"agent_action": ',
        "'thinking_content' must be a string": {**ok, "thinking_content": None},
        "unknown agent_action 'Pitch'": {**ok, "agent_action": "Pitch"},
        "'agent_message' must be a non-empty string": {**ok, "agent_message": " "},
        "unknown call_function 'transfer'": {**ok, "agent_message": "Hi <call_function=transfer>"},
    }
    for message, obj in bad.items():
        with pytest.raises(ValueError, match=message):
            validate_sales_turn(obj if isinstance(obj, str) else json.dumps(obj))


CLEAN_AUDIT = {
    "deceptive_fabrication": {"hit": False, "violation_type": None, "evidence_turns": [], "agent_claim": "",
                              "reference_evidence": "", "reason": "No conflict."},
    "ai_generated_style": {"hit": False, "evidence_turns": [], "reason": "No leakage."},
    "summary": "Clean.",
}  # fmt: skip
HIT = {"hit": True, "violation_type": "direct_conflict", "evidence_turns": [3], "agent_claim": "only 20,000 km",
       "reference_evidence": "mileage_km: 85000", "reason": "Mileage conflicts."}  # fmt: skip


def test_validate_audit() -> None:
    clean = validate_audit(json.dumps(CLEAN_AUDIT))
    assert not clean.deceptive_fabrication and not clean.ai_generated_style and clean.summary == "Clean."
    hit = validate_audit(
        {**CLEAN_AUDIT, "deceptive_fabrication": HIT,
         "ai_generated_style": {"hit": True, "evidence_turns": [5], "reason": "Leaked agent_action."}}
    )  # fmt: skip
    assert hit.deceptive_fabrication and hit.fabrication_turns == (3,) and hit.agent_claim == "only 20,000 km"
    assert hit.ai_generated_style and hit.ai_style_turns == (5,) and hit.ai_style_reason == "Leaked agent_action."
    ai = CLEAN_AUDIT["ai_generated_style"]
    bad = {
        "'deceptive_fabrication' must be an object": {**CLEAN_AUDIT, "deceptive_fabrication": True},
        "'ai_generated_style' must be an object": {k: v for k, v in CLEAN_AUDIT.items() if k != "ai_generated_style"},
        "ai_generated_style.hit must be true or false": {**CLEAN_AUDIT, "ai_generated_style": {**ai, "hit": "no"}},
        "'reason' must be a non-empty string": {**CLEAN_AUDIT, "ai_generated_style": {**ai, "reason": ""}},
        "evidence_turns must be a list of turn numbers": {
            **CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "evidence_turns": ["3"]}},
        "hit is true without evidence_turns": {**CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "evidence_turns": []}},
        "needs violation_type 'direct_conflict'": {
            **CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "violation_type": "exaggeration"}},
        "needs violation_type 'direct_conflict', agent_claim": {
            **CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "reference_evidence": ""}},
        "evidence fields are not cleared": {**CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "hit": False}},
    }  # fmt: skip
    for message, obj in bad.items():
        with pytest.raises(ValueError, match=message):
            validate_audit(json.dumps(obj))


# ---- the JSON schemas of the four outputs (sent as structured outputs) against their validators ----
def test_story_schema_agrees_with_the_validator() -> None:
    schema = story_schema()
    assert list(schema.schema["properties"]["scene_fewshots"]["required"]) == list(SCENES)
    three = story_obj(scene_fewshots={s: ["a", "b", "c"] for s in SCENES})
    rejected = [
        story_obj(story=3),
        story_obj(scene_fewshots=["x"]),
        story_obj(scene_fewshots={s: ["x"] for s in SCENES if s != "price and fees"}),
        story_obj(scene_fewshots={s: ["a", "b", "c", "d"] for s in SCENES}),
        story_obj(scene_fewshots={s: [] for s in SCENES}),
        story_obj(scene_fewshots={s: ["ok", 3] for s in SCENES}),
        {"scene_fewshots": story_obj()["scene_fewshots"]},
    ]
    agrees(schema, validate_story, [story_obj(), three], rejected)
    # the validator's alone: non-empty text; the validator's tolerance: extra scenes (not asked for)
    assert conforms(schema, story_obj(story="  ")) and conforms(
        schema, story_obj(scene_fewshots={s: [""] for s in SCENES})
    )
    extra = story_obj(scene_fewshots={**story_obj()["scene_fewshots"], "extra scene": ["d"]})
    assert validate_story(extra) and not conforms(schema, extra)


def test_simulator_turn_schema_agrees_with_the_validator() -> None:
    schema = simulator_turn_schema()
    props = schema.schema["properties"]
    assert props["rubric_hits"]["items"]["enum"] == list(RUBRIC) and props["rubric_hits"]["maxItems"] == 18
    assert props["intent"]["enum"] == list(INTENTS) and props["action"]["enum"] == list(DIALOGUE_ACTIONS)
    accepted = [sim_obj(), sim_obj(rubric_hits=[], willingness=0, trust=1, patience=0.5)]
    rejected = [
        sim_obj(rubric_hits="B01"),
        sim_obj(rubric_hits=["B01", "X9"]),
        sim_obj(trust=1.2),
        sim_obj(patience=True),
        {k: v for k, v in sim_obj().items() if k != "willingness"},
        sim_obj(intent="Shopping"),
        sim_obj(action="Agree"),
        sim_obj(reply=None),
    ]
    agrees(schema, validate_simulator_turn, accepted, rejected)
    # the validator's alone: codes fired once, the rubric arithmetic (with the scores before), a non-empty reply
    for obj in (sim_obj(rubric_hits=["B01", "B01"]), sim_obj(willingness=0.5), sim_obj(reply="")):
        assert conforms(schema, obj)
        with pytest.raises(ValueError):
            validate_simulator_turn(obj, before=STATE)
    no_confirm = simulator_turn_schema([a for a in DIALOGUE_ACTIONS if a != "ConfirmAdded"])
    assert not conforms(no_confirm, sim_obj(action="ConfirmAdded")) and conforms(no_confirm, sim_obj())
    with pytest.raises(ValueError, match="non-empty subset of DIALOGUE_ACTIONS, got \\['Dance'\\]"):
        simulator_turn_schema(["Dance"])


def test_sales_turn_schema_agrees_with_the_validator() -> None:
    ok = {"thinking_content": "", "agent_action": "PriceQuote", "agent_message": "It's 263k. <status=end>"}
    rejected = [{**ok, "thinking_content": None}, {**ok, "agent_action": "Pitch"}, {**ok, "agent_message": 5},
                {k: v for k, v in ok.items() if k != "agent_message"}]  # fmt: skip
    agrees(sales_turn_schema(), validate_sales_turn, [ok, {**ok, "agent_action": "Neutral"}], rejected)
    assert sales_turn_schema().schema["properties"]["agent_action"]["enum"] == list(AGENT_ACTIONS)
    bad_marker = {**ok, "agent_message": "Hi <call_function=transfer>"}  # the markers are the validator's
    assert conforms(sales_turn_schema(), bad_marker)
    with pytest.raises(ValueError, match="unknown call_function"):
        validate_sales_turn(bad_marker)


def test_audit_schema_agrees_with_the_validator() -> None:
    schema = audit_schema(5)
    ai = CLEAN_AUDIT["ai_generated_style"]
    accepted = [
        CLEAN_AUDIT,
        {**CLEAN_AUDIT, "deceptive_fabrication": HIT, "ai_generated_style": {"hit": True, "evidence_turns": [5],
                                                                              "reason": "Leaked."}},
        {**CLEAN_AUDIT, "ai_generated_style": {**ai, "evidence_turns": [2]}},  # a miss may still point at turns
    ]  # fmt: skip
    rejected = [
        {**CLEAN_AUDIT, "deceptive_fabrication": True},
        {k: v for k, v in CLEAN_AUDIT.items() if k != "ai_generated_style"},
        {**CLEAN_AUDIT, "ai_generated_style": {**ai, "hit": "no"}},
        {**CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "evidence_turns": ["3"]}},
        {**CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "evidence_turns": []}},
        {**CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "violation_type": "exaggeration"}},
        {**CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "hit": False}},
        {**CLEAN_AUDIT, "ai_generated_style": {"hit": True, "evidence_turns": [], "reason": "Leaked."}},
    ]
    agrees(schema, validate_audit, accepted, rejected)
    # evidence turns within the dialogue: the Auditor's check (validate_audit alone takes any turn number)
    far = {**CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "evidence_turns": [6]}}
    assert validate_audit(far) and not conforms(schema, far) and conforms(audit_schema(6), far)
    assert not conforms(schema, {**CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "evidence_turns": [0]}})
    # the validator's alone: a hit's claim and reference non-empty; its tolerance: no summary (not asked for)
    assert conforms(schema, {**CLEAN_AUDIT, "deceptive_fabrication": {**HIT, "reference_evidence": ""}})
    no_summary = {k: v for k, v in CLEAN_AUDIT.items() if k != "summary"}
    assert validate_audit(no_summary).summary == "" and not conforms(schema, no_summary)
    test_llm_structured.assert_strict(audit_schema().schema)


# ---- outcomes ----
def test_call_outcome() -> None:
    assert call_outcome(["Greeting", "AskQuestion", "AgreeWeChat", "ConfirmAdded"]) == "success"
    assert call_outcome(["Greeting", "DeclineHard", "HangUp"]) == "hang_up"
    assert call_outcome(["Greeting", "AskQuestion"]) == "turn_limit"
    assert call_outcome(["Greeting", "AskQuestion"], agent_ended=True) == "hang_up"
    assert call_outcome([]) == "turn_limit"
    with pytest.raises(ValueError, match="unknown dialogue action 'Agree' at turn 2"):
        call_outcome(["Greeting", "Agree"])
    with pytest.raises(ValueError, match="HangUp at turn 1 ends the call, but 1 turns follow"):
        call_outcome(["HangUp", "Greeting"])


# ---- story cache ----
class Compiler:
    def __init__(self, output: str) -> None:
        self.output, self.prompts = output, []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.output


def test_story_cache_compiles_once(tmp_path) -> None:
    cache, compile_fn = StoryCache(tmp_path / "stories"), Compiler(json.dumps(story_obj()))
    story = cache.get_or_compile(PROFILE, compile_fn)
    assert story == validate_story(story_obj()) and len(compile_fn.prompts) == 1
    prompt = compile_fn.prompts[0]
    assert prompt.startswith("You are the user-persona authoring assistant")
    assert json.loads(prompt.split("Input user profile:\n", 1)[1]) == PROFILE
    path = tmp_path / "stories" / f"{PROFILE['case_control']['sample_id']}.json"
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    assert StoryCache(tmp_path / "stories").get_or_compile(PROFILE, Compiler("unused")) == story  # a hit: no call
    assert len(compile_fn.prompts) == 1


def test_story_cache_recompiles_corrupt_or_stale_file(tmp_path) -> None:
    cache = StoryCache(tmp_path)
    cache.get_or_compile(PROFILE, Compiler(json.dumps(story_obj())))
    path = cache.path(PROFILE)
    for corrupt in ('{"story": "truncated', json.dumps({**json.loads(path.read_text()), "story": ""}), "[]"):
        path.write_text(corrupt)
        fresh = Compiler(json.dumps(story_obj(story="Recompiled.")))
        assert cache.get_or_compile(PROFILE, fresh).story == "Recompiled." and len(fresh.prompts) == 1
        assert cache.load(PROFILE).story == "Recompiled."
    other = generate_profile(1, seed=0, split="eval")  # another profile under the same sample_id: not trusted
    other["case_control"]["sample_id"] = PROFILE["case_control"]["sample_id"]
    assert cache.load(other) is None


def test_story_cache_stores_nothing_on_invalid_output(tmp_path) -> None:
    cache = StoryCache(tmp_path / "stories")
    for output in ("not json", json.dumps(story_obj(scene_fewshots={"passive pickup": ["hi"]}))):
        with pytest.raises(ValueError, match="story compiler output"):
            cache.get_or_compile(PROFILE, Compiler(output))
    assert not (tmp_path / "stories").exists() or not any((tmp_path / "stories").iterdir())
    bad = {**PROFILE, "case_control": {**PROFILE["case_control"], "sample_id": "../escape"}}
    with pytest.raises(ValueError, match="not a safe file name"):
        cache.path(bad)


# ---- prompts ----
def test_eval_prompts_render_every_slot() -> None:
    story = Story("A story.", {s: ("one line",) for s in SCENES})
    texts = {
        "story_compiler": prompts.story_compiler_prompt(PROFILE),
        "user_simulator": simulator_prompt(PROFILE, story, [validate_simulator_turn(sim_obj())]),
        "sales_eval": prompts.sales_eval_prompt(PROFILE),
        "audit": prompts.audit_prompt(PROFILE, [("agent", "Hello, this is Li Na."), ("customer", "Who?")]),
    }
    for name, text in texts.items():
        assert not re.search(r"\{[a-z_]+\}", text), name
        assert "None" not in text and "True" not in text, name
    known = PROFILE["agent_info"]["known_customer_info"]
    assert known["phone_number"] in texts["sales_eval"] and "Li Na" in texts["sales_eval"]
    assert PROFILE["user_profile"]["speech"]["personality"] not in texts["sales_eval"]  # lead fields only
    assert "Turn 2 - customer: Who?" in texts["audit"] and texts["sales_eval"] in texts["audit"]
    sim = texts["user_simulator"]
    assert "B15 Issues a contact invitation or actionable entry: same-turn behaviors" in sim
    assert "B12 Keeps requesting the contact after explicit refusal: willingness -0.12, trust -0.10" in sim
    assert "Turn 1: fired B01, B17; intent AskPrice; action AskQuestion" in sim and "case_control" not in sim
    assert all(label in sim for label in (*INTENTS, *DIALOGUE_ACTIONS))
    assert all(label in texts["sales_eval"] for label in AGENT_ACTIONS)
    with pytest.raises(ValueError, match="unknown TeleSales prompt 'judge'"):
        prompts.load_template("judge")


# ---- metrics ----
def ep(profile: str, sample: int, success: bool, failed: bool = False, **extra: Any) -> dict[str, Any]:
    return {"profile_id": profile, "sample_index": sample, "success": success, "failed": failed,
            "initial_state": {"willingness": 0.4, "patience": 0.6}, "final_state": None, **extra}  # fmt: skip


def four_profiles() -> list[dict[str, Any]]:
    """4 profiles × 3 conversations with 0, 1, 2, 3 successes."""
    return [ep(f"p{i}", g, g < i) for i in range(4) for g in range(3)]


def test_success_at_n() -> None:
    res = success_at_n(four_profiles())
    assert (res["n_profiles"], res["k"]) == (4, 3)
    assert res["counts"] == {1: 3, 2: 2, 3: 1} and res["rates"] == {1: 0.75, 2: 0.5, 3: 0.25}


def test_success_at_n_rejects_uneven_k_and_duplicates() -> None:
    eps = four_profiles()
    with pytest.raises(ValueError, match="different numbers of conversations"):
        success_at_n(eps[:-1])
    with pytest.raises(ValueError, match="sample 0 twice"):
        success_at_n([*eps, ep("p0", 0, True)])
    with pytest.raises(ValueError, match="lacks \\['failed'\\]"):
        success_at_n([{k: v for k, v in e.items() if k != "failed"} for e in eps])
    with pytest.raises(ValueError, match="no episodes"):
        success_at_n([])


def test_failed_episodes_stay_in_denominators() -> None:
    eps = four_profiles()
    eps[-1] = {**eps[-1], "failed": True}  # p3's third conversation: recorded success, but failed -> no success
    eps.append(ep("p4", 0, False, failed=True))
    eps += [ep("p4", g, False, failed=True) for g in (1, 2)]
    s = summarize(eps)
    assert (s["n_profiles"], s["n_episodes"]) == (5, 15)
    assert (s["success@1"], s["success@2"], s["success@3"]) == (0.6, 0.4, 0.0)
    assert s["success_rate"] == pytest.approx(5 / 15) and s["failed"] == pytest.approx(4 / 15)


def test_summarize_deltas_audits_and_wilson() -> None:
    eps = four_profiles()
    finals = [(0.5, 0.7), (0.2, 0.3), (0.4, 0.6)]  # deltas (+.1, +.1), (-.2, -.3), (0, 0) on three episodes
    for e, (w, p) in zip(eps, finals):
        e["final_state"] = {"willingness": w, "patience": p}
    flags = [(True, False), (False, False), (False, True), (False, False), (True, True)]  # five audited episodes
    for e, (fab, ai) in zip(eps[3:], flags):
        e["audit"] = {"deceptive_fabrication": fab, "ai_generated_style": ai}
    eps[8]["audit"] = None  # not audited
    s = summarize(eps)
    assert s["n_deltas"] == 3
    assert s["willingness_delta"] == pytest.approx(-0.1 / 3) and s["patience_delta"] == pytest.approx(-0.2 / 3)
    assert s["n_audited"] == 5 and s["hallucination"] == pytest.approx(2 / 5) and s["ai_style"] == pytest.approx(2 / 5)
    assert s["success@1_ci"] == pytest.approx(proportion_confint(3, 4, method="wilson"))
    assert s["success@3_ci"] == pytest.approx(proportion_confint(1, 4, method="wilson"))
    assert s["hallucination_ci"] == pytest.approx(proportion_confint(2, 5, alpha=0.05, method="wilson"))
    assert s["success_rate_ci"] == pytest.approx(proportion_confint(6, 12, method="wilson"))
    assert wilson(0, 0) is None
    unaudited = summarize(four_profiles())
    assert unaudited["hallucination"] is None and unaudited["hallucination_ci"] is None
    assert unaudited["willingness_delta"] is None and unaudited["n_deltas"] == 0

    table = table_markdown({"ibrl_9b": s, "base": unaudited})
    lines = table.splitlines()
    assert lines[0].startswith("| policy | profiles × k | Success@1 | Success@2 | Success@3 | ΔWillingness")
    lo, hi = proportion_confint(3, 4, method="wilson")
    assert lines[2].startswith(f"| ibrl_9b | 4 × 3 | 0.750 [{lo:.3f}, {hi:.3f}] | 0.500 [")
    assert "| -0.033 | -0.067 | 0.400 [" in lines[2]
    assert lines[3].endswith("| – | – | – | – | 0.000 |")
