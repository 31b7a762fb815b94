"""TeleSales held-out evaluation end to end (paper §5.2, Appendix D Tables 8-12; issue 6 §4), without Ray.

The evaluation call env is checked directly (rubric updates, outcomes from action labels, what each side hears).
``marti-ibrl telesales eval`` then runs against a real HTTP server on 127.0.0.1 speaking the OpenAI chat API
(``test_players.FakeServer``) whose callable :class:`Scripted` answers story-compiler, simulator, prompted
sales-agent (Table 10) and audit requests, told apart by their prompts: exact willingness/trust/patience after a
scripted call, Success@n on known outcomes, a failing simulator counted as failed with its reason, a sales agent
that never answers valid JSON counted as malformed, audit flags -> hallucination rate, the story cache, resume and
``--retry-failed``, and the command's input errors. The sales seat is the prompted endpoint baseline: a checkpoint
needs rollout engines (Ray), which these tests do not start.
"""

from __future__ import annotations

import json
import re
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import test_players

from marti_ibrl.cli import main
from marti_ibrl.envs.telesales import generate_profiles, sales_view
from marti_ibrl.envs.telesales.prompts import sales_eval_prompt
from marti_ibrl.eval.telesales.env import EvalCase, TeleSalesEvalEnv, training_sales_prompt
from marti_ibrl.eval.telesales.outputs import SCENES, story_schema, validate_story

serve = test_players.serve  # fixture: the 127.0.0.1 OpenAI-style server of the player tests
PROFILES = generate_profiles(5, seed=0, split="eval")
PHONES = [sales_view(p)["phone_number"] for p in PROFILES]
STORY = {"story": "A courier who picks up between deliveries.", "scene_fewshots": {s: [f"a {s} line"] for s in SCENES}}
STATE = re.compile(r"willingness: ([\d.]+); trust: ([\d.]+); patience: ([\d.]+)")
PROG = "marti-ibrl telesales eval: error: "

# P0: every call succeeds; P1: the first call that starts succeeds, the others hang up at once; P2: hangs up at its
# second turn; P3: the simulator never answers valid JSON; P4: the sales agent never answers valid JSON.
SUCCESS_PATH = [  # (rubric hits, intent, action) of customer turns 1-4
    (["B02", "B17"], "ConfirmPurpose", "Greeting"),
    (["B01", "B04"], "AskPrice", "AskQuestion"),
    (["B05", "B15", "B13"], "AcceptContact", "AgreeWeChat"),
    (["B17", "B06"], "AcceptContact", "ConfirmAdded"),
]
# P0 starts at w .61, t .71, p .70; by hand (Table 11, each score clipped to [0, 1] after the sum):
P0_TRACE = [
    (0.61, 0.80, 0.76),  # B02 (0, +.06, +.01) + B17 (0, +.03, +.05)
    (0.74, 0.92, 0.79),  # B01 (+.05, +.05, +.02) + B04 (+.08, +.07, +.01)
    (0.80, 0.97, 0.81),  # B05 (+.04, +.05, +.01) + B15 (nothing) + B13 (+.02, 0, +.01)
    (0.80, 1.00, 0.90),  # B17 (0, +.03, +.05) + B06 (0, +.03, +.04): trust .97 + .06 clipped to 1
]
SALES_LINES = [
    ("Greeting", "Hi, this is Li Na from the car platform, about the car you saved. Is now a good time?"),
    ("AnswerQuestion", "It is listed as in the lead, and the inspection report is clean."),
    ("ContactAsk", "Could I add you on WeChat to send you the inspection report?"),
    ("ContactGuidance", "Sending the friend request now. <call_function=add_business_contact(phone_number={phone})>"),
    ("Neutral", "Anything else I can help with?"),
]
CLEAN = {"hit": False, "violation_type": None, "evidence_turns": [], "agent_claim": "", "reference_evidence": "",
         "reason": "No conflict."}  # fmt: skip
FABRICATION = {"hit": True, "violation_type": "direct_conflict", "evidence_turns": [3], "agent_claim": "only 1 km",
               "reference_evidence": "the lead's mileage", "reason": "Mileage conflicts."}  # fmt: skip


class Scripted:
    """The server's callable: answers the four kinds of request (module doc) and records them by kind."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, list[dict]] = {"story": [], "simulator": [], "sales": [], "audit": []}
        self.started: dict[int, int] = {}  # profile -> calls whose first customer turn was answered
        self.broken_simulator = {3}
        self.compiler_broken = False
        self.auditor_broken = False

    def __call__(self, body: dict) -> Any:
        first = body["messages"][0]["content"]
        kind = next(k for k, start in KINDS.items() if first.startswith(start))
        profile = next(i for i, phone in enumerate(PHONES) if phone in first)
        with self.lock:
            self.requests[kind].append(body)
        return test_players.ok(getattr(self, kind)(body, profile))

    def story(self, body: dict, profile: int) -> str:
        return "not a story" if self.compiler_broken else json.dumps(STORY)

    def simulator(self, body: dict, profile: int) -> str:
        if profile in self.broken_simulator:
            return "I am not JSON"
        turn = sum(m["role"] == "assistant" for m in body["messages"]) + 1
        if turn == 1:
            with self.lock:
                self.started[profile] = nth = self.started.get(profile, 0) + 1
        if profile == 1 and turn == 1 and nth > 1 or profile == 2 and turn == 2:
            hits, intent, action = (["B08"] if profile == 1 else ["B12", "B16"]), "EndCall", "HangUp"
        elif profile == 2:
            hits, intent, action = ["B02"], "ConfirmPurpose", "Greeting"
        else:
            hits, intent, action = SUCCESS_PATH[turn - 1]
        w, t, p = (float(x) for x in STATE.findall(body["messages"][0]["content"])[-1])
        from marti_ibrl.eval.telesales.rubric import apply_rubric

        after = apply_rubric({"willingness": w, "trust": t, "patience": p}, hits)
        return json.dumps({"rubric_hits": hits, **after, "intent": intent, "action": action, "reply": f"reply {turn}"})

    def sales(self, body: dict, profile: int) -> str:
        if profile == 4:
            return "{not json"
        turn = sum(m["role"] == "assistant" for m in body["messages"]) + 1
        action, message = SALES_LINES[min(turn, len(SALES_LINES)) - 1]
        message = message.format(phone=PHONES[profile])
        return json.dumps({"thinking_content": "t", "agent_action": action, "agent_message": message})

    def audit(self, body: dict, profile: int) -> str:
        if self.auditor_broken:
            return json.dumps({"deceptive_fabrication": {**FABRICATION, "agent_claim": ""}})
        ai = {"hit": profile == 2, "evidence_turns": [1] if profile == 2 else [], "reason": "checked"}
        fab = FABRICATION if profile == 0 else CLEAN
        return json.dumps({"deceptive_fabrication": fab, "ai_generated_style": ai, "summary": "done"})


KINDS = {
    "audit": "You are an independent automotive-sales-dialogue auditor",
    "story": "You are the user-persona authoring assistant",
    "simulator": "You are the user simulator",
    "sales": "You are a vehicle-purchase advisor",
}


def _argv(url: str, out, *extra: str, n: int = 5) -> list[str]:
    return [
        *("telesales", "eval", "--policy", f"gpt=endpoint:sales-model@{url}#TS_KEY", "--simulator", f"sim@{url}"),
        *("-n", str(n), "--samples", "3", "--out", str(out), "--concurrency", "4", "--batch", "6"),
        *("--max-retries", "1", "--backoff", "0.001", "--timeout", "10"),
        *extra,
    ]


def _records(path) -> dict[str, dict]:
    return {r["episode_id"]: r for r in map(json.loads, path.read_text().splitlines())}


# ---- the evaluation env, no server ----
def _sim(hits: list[str], before: tuple, action: str, intent: str = "ProvideInfo") -> str:
    from marti_ibrl.eval.telesales.rubric import apply_rubric

    after = apply_rubric(dict(zip(("willingness", "trust", "patience"), before)), hits)
    return json.dumps({"rubric_hits": hits, **after, "intent": intent, "action": action, "reply": "mm-hm"})


def test_eval_env_rubric_outcomes_and_views() -> None:
    case = EvalCase(PROFILES[0], validate_story(STORY))
    env = TeleSalesEvalEnv("checkpoint")
    state = env.new_state(case)
    phone = PHONES[0]
    assert env.step(state, "sales", "Hi, this is Li Na from the car platform.").valid
    # scores off by more than the tolerance, an unknown code, ConfirmAdded before a contact tool: all refused
    assert not env.step(state, "customer", _sim(["B02"], (0.9, 0.71, 0.70), "Greeting")).valid
    assert not env.step(state, "customer", _sim([], (0.61, 0.71, 0.70), "ConfirmAdded")).valid
    assert state.n_turns == 1 and state.scores == {"willingness": 0.61, "trust": 0.71, "patience": 0.70}
    for (hits, intent, action), expected in zip(SUCCESS_PATH[:3], P0_TRACE):
        before = tuple(state.scores.values())
        assert env.step(state, "customer", _sim(hits, before, action, intent)).valid
        assert tuple(state.scores.values()) == pytest.approx(expected)
        if action != "AgreeWeChat":
            assert env.step(state, "sales", "Sure, let me answer that.").valid
    tool = f"Sending it now. <call_function=add_business_contact(phone_number={phone})>"
    assert env.step(state, "sales", tool).valid
    assert env.counterpart_text("sales", tool) == f"Sending it now. [The agent sent a WeChat friend request to {phone}]"
    unknown = {"rubric_hits": ["B99"], **state.scores, "intent": "ProvideInfo", "action": "Hesitate", "reply": "?"}
    assert not env.step(state, "customer", json.dumps(unknown)).valid
    last = _sim(["B17", "B06"], tuple(state.scores.values()), "ConfirmAdded", "AcceptContact")
    assert env.counterpart_text("customer", last) == "mm-hm"  # the agent hears the reply only
    result = env.step(state, "customer", last)
    assert result.done and state.success and state.reason == "success"
    outcome = env.outcome(state)
    assert outcome.agreed and outcome.info["outcome"] == "success"
    assert [t["action"] for t in outcome.info["trace"]] == ["Greeting", "AskQuestion", "AgreeWeChat", "ConfirmAdded"]
    assert outcome.info["final"] == pytest.approx(dict(zip(("willingness", "trust", "patience"), P0_TRACE[-1])))

    # a second use of the same tool is an invalid turn; the agent's <status=end> ends the call (agent_end)
    state = env.new_state(case)
    assert env.step(state, "sales", tool).valid
    assert env.step(state, "customer", _sim([], (0.61, 0.71, 0.70), "Hesitate")).valid
    assert not env.step(state, "sales", tool).valid
    assert env.step(state, "sales", "Okay, goodbye. <status=end>").done
    assert (state.reason, env.outcome(state).info["outcome"], state.success) == ("agent_end", "hang_up", False)
    # HangUp ends the call; the turn limit ends it too
    state = env.new_state(case)
    env.step(state, "sales", "Hello?")
    assert env.step(state, "customer", _sim(["B08"], (0.61, 0.71, 0.70), "HangUp", "EndCall")).done
    assert (state.reason, env.outcome(state).info["outcome"]) == ("hang_up", "hang_up")
    short = TeleSalesEvalEnv("checkpoint", max_turns=2)
    state = short.new_state(case)
    short.step(state, "sales", "Hello?")
    assert short.step(state, "customer", _sim([], (0.61, 0.71, 0.70), "AskQuestion")).done
    assert (state.reason, short.outcome(state).info["outcome"]) == ("turn_limit", "turn_limit")
    assert TeleSalesEvalEnv("checkpoint").new_state(case).max_turns == 2 * PROFILES[0]["case_control"]["max_turns"]


def test_eval_env_sales_prompts_and_modes() -> None:
    case = EvalCase(PROFILES[0], validate_story(STORY))
    lead = sales_view(PROFILES[0])
    checkpoint, prompted = TeleSalesEvalEnv("checkpoint"), TeleSalesEvalEnv("prompted")
    text = checkpoint.system_prompt(case, "sales")  # Table 15, the training format, over the lead fields only
    assert text == training_sales_prompt(PROFILES[0]) and text.startswith("Role and objective.")
    assert lead["target_car"] in text and lead["phone_number"] in text and "{" not in text.replace("{}", "")
    assert PROFILES[0]["user_profile"]["identity"]["name"] not in text  # nothing hidden
    assert prompted.system_prompt(case, "sales") == sales_eval_prompt(PROFILES[0])  # Table 10
    assert checkpoint.system_prompt(case, "customer").startswith("You are the user simulator")
    turn = json.dumps({"thinking_content": "", "agent_action": "Greeting", "agent_message": "Hello! <status=end>"})
    assert prompted.spoken("sales", turn) == "Hello! <status=end>"
    assert prompted.counterpart_text("sales", turn) == "Hello! [The agent ended the call]"
    state = prompted.new_state(case)
    assert not prompted.step(state, "sales", "Hello!").valid  # a prompted turn is Table 10 JSON
    assert prompted.step(state, "sales", turn).done and state.agent_actions == ["Greeting"]
    with pytest.raises(ValueError, match="evaluation profiles"):
        EvalCase(generate_profiles(1, 0, "train")[0], validate_story(STORY))
    with pytest.raises(ValueError, match="sales_mode"):
        TeleSalesEvalEnv("frontier")


# ---- the command against the scripted server ----
def test_telesales_eval_end_to_end(serve, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TS_KEY", "sk-ts-SECRET")
    script = Scripted()
    server = serve(script)
    out = tmp_path / "eval"
    assert main(_argv(server.base_url, out)) == 0
    printed = capsys.readouterr().out
    path = out / "episodes" / "gpt.jsonl"
    recs = _records(path)
    assert sorted(recs) == sorted(f"{p['case_control']['sample_id']}|{g}" for p in PROFILES for g in range(3))
    by_profile = {i: [recs[f"{p['case_control']['sample_id']}|{g}"] for g in range(3)] for i, p in enumerate(PROFILES)}

    # P0: three successes, each with the hand-computed rubric trace
    for rec in by_profile[0]:
        assert (rec["success"], rec["outcome"], rec["reason"], rec["failed"], rec["n_turns"]) == (
            True, "success", "success", False, 8)  # fmt: skip
        trace = [(t["willingness"], t["trust"], t["patience"]) for t in rec["trace"]]
        assert trace == [pytest.approx(x) for x in P0_TRACE]
        assert rec["final_state"] == pytest.approx(dict(zip(("willingness", "trust", "patience"), P0_TRACE[-1])))
        assert [t["intent"] for t in rec["trace"]] == [i for _, i, _ in SUCCESS_PATH]
        assert rec["agent_actions"] == ["Greeting", "AnswerQuestion", "ContactAsk", "ContactGuidance"]
        assert rec["tool_calls"] == [{"turn": 6, "name": "add_business_contact", "args": {"phone_number": PHONES[0]}}]
        assert rec["audit"]["deceptive_fabrication"] and rec["audit"]["fabrication_turns"] == [3]
    # P1: one success, two hang-ups at the first customer turn; P2: hang-ups at its second turn
    assert sorted(r["reason"] for r in by_profile[1]) == ["hang_up", "hang_up", "success"]
    assert all((r["reason"], r["outcome"], r["n_turns"]) == ("hang_up", "hang_up", 4) for r in by_profile[2])
    assert by_profile[2][0]["final_state"] == pytest.approx({"willingness": 0.20, "trust": 0.53, "patience": 0.09})
    # P3: the simulator's invalid JSON after the client's retry -> failed, with the reason, not audited
    for rec in by_profile[3]:
        assert (rec["failed"], rec["success"], rec["reason"], rec["final_state"], rec["audit"]) == (
            True, False, "counterpart_failure", None, None)  # fmt: skip
        assert rec["failure"]["role"] == "customer" and rec["failure"]["kind"] == "bad_output"
        assert "user simulator: bad_output after 2 attempt(s)" in rec["failure"]["detail"]
    # P4: the sales agent's invalid JSON -> its own malformed ending, not a counterpart failure
    for rec in by_profile[4]:
        assert (rec["malformed"], rec["failed"], rec["success"], rec["reason"]) == (True, False, False, "malformed")
        assert rec["failure"]["role"] == "sales" and rec["transcript"] == []

    # Success@n: wins per profile 3, 1, 0, 0 (failed), 0 -> 2/5, 1/5, 1/5; hallucination 3 of 9 audited calls
    summary = json.loads((out / "summary.json").read_text())["policies"]["gpt"]
    assert (summary["success@1"], summary["success@2"], summary["success@3"]) == (0.4, 0.2, 0.2)
    assert (summary["n_audited"], summary["hallucination"], summary["ai_style"]) == (9, 3 / 9, 3 / 9)
    assert summary["failed"] == 3 / 15 and summary["n_deltas"] == 12
    results = (out / "results.md").read_text()
    assert results in printed and "| gpt | 5 × 3 | 0.400 [" in results and (out / "success_at_n.png").stat().st_size
    assert "| gpt | 4 | 5 | 0 | 0 | 3 | 0 | 3 | 0 |" in results  # how the calls ended

    # requests: one story per profile; each with its reply's JSON schema; the key; each side hears only what it should
    assert len(script.requests["story"]) == 5 and len(script.requests["audit"]) == 9
    names = {"story": "story", "simulator": "simulator_turn", "sales": "sales_turn", "audit": "audit"}
    for kind, bodies in script.requests.items():
        sent = {(b["response_format"]["type"], b["response_format"]["json_schema"]["name"]) for b in bodies}
        assert sent == {("json_schema", names[kind])}
    assert story_schema().response_format() == script.requests["story"][0]["response_format"]
    # the endpoint counts of this run, in the report: every request with a schema
    for model in ("sim", "sales-model"):
        n = sum(r["body"]["model"] == model for r in server.requests)
        key = f"requests to {model}@{server.base_url}" + ("#TS_KEY" if model == "sales-model" else "")
        line = next(x for x in results.splitlines() if x.startswith(f"- {key}: "))
        assert line.startswith(f"- {key}: requests {n}, ") and f"structured {n}, unstructured 0, " in line
        assert "structured_fallbacks 0" in line
    sales_auth = [r["headers"].get("Authorization") for r in server.requests if r["body"]["model"] == "sales-model"]
    assert set(sales_auth) == {"Bearer sk-ts-SECRET"}
    sim = [b for b in script.requests["simulator"] if PHONES[0] in b["messages"][0]["content"]]
    fourth = next(b for b in sim if len(b["messages"]) == 8)  # system + 7 turns: the fourth customer turn
    first = next(b for b in sim if len(b["messages"]) == 2)

    def schema(body: dict) -> dict:
        return body["response_format"]["json_schema"]["schema"]

    actions = [schema(b)["properties"]["action"]["enum"] for b in (first, fourth)]
    assert "ConfirmAdded" not in actions[0] and "ConfirmAdded" in actions[1]  # only after the contact tool
    p0_audits = [schema(b) for b in script.requests["audit"] if PHONES[0] in b["messages"][0]["content"]]
    found = [a["properties"]["ai_generated_style"]["anyOf"][0]["properties"]["evidence_turns"] for a in p0_audits]
    assert len(found) == 3 and {f["items"]["maximum"] for f in found} == {8}  # P0's calls have 8 turns
    assert STORY["story"] in fourth["messages"][0]["content"]
    assert "Turn 1: fired B02, B17; intent ConfirmPurpose; action Greeting; willingness: 0.61; trust: 0.80; " \
           "patience: 0.76" in fourth["messages"][0]["content"]  # fmt: skip
    assert [m["role"] for m in fourth["messages"][1:]] == ["user", "assistant"] * 3 + ["user"]
    assert fourth["messages"][-1]["content"] == f"Sending the friend request now. [The agent sent a WeChat friend " \
                                                f"request to {PHONES[0]}]"  # fmt: skip
    sales = next(
        b for b in script.requests["sales"] if len(b["messages"]) == 7 and PHONES[0] in b["messages"][0]["content"]
    )
    assert [m["content"] for m in sales["messages"][2::2]] == ["reply 1", "reply 2", "reply 3"]  # replies only

    # a rerun: nothing left to play, no request at all, nothing rewritten
    data, n = path.read_bytes(), len(server.requests)
    assert main(_argv(server.base_url, out)) == 0
    assert path.read_bytes() == data and len(server.requests) == n

    # --retry-failed once the simulator works for P3: only its three calls are played again (stories cached)
    script.broken_simulator = set()
    assert main(_argv(server.base_url, out, "--retry-failed")) == 0
    assert len(script.requests["story"]) == 5
    recs = _records(path)
    assert all(recs[f"{PROFILES[3]['case_control']['sample_id']}|{g}"]["success"] for g in range(3))
    assert len(path.read_text().splitlines()) == 18  # 15 + the three replays (the newest record of an id wins)
    summary = json.loads((out / "summary.json").read_text())["policies"]["gpt"]
    assert (summary["success@1"], summary["success@3"], summary["failed"]) == (0.6, 0.4, 0.0)


REFUSAL = (400, {"error": {"message": "response_format json_schema is not supported", "param": "response_format"}})


def refusing(script: Scripted) -> Any:
    """An endpoint without structured outputs: a json_schema request is refused (400), anything else is scripted."""

    def reply(body: dict) -> Any:
        if body.get("response_format", {}).get("type") == "json_schema":
            return (*REFUSAL, {}, 0.0)
        return script(body)

    return reply


def test_telesales_eval_structured_settings(serve, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TS_KEY", "k")
    script = Scripted()
    server = serve(refusing(script))
    # auto: each client falls back after its first refused schema; the evaluation is as without schemas
    assert main(_argv(server.base_url, tmp_path / "auto", "--no-audit", n=1)) == 0
    recs = list(_records(tmp_path / "auto" / "episodes" / "gpt.jsonl").values())
    assert len(recs) == 3 and all(r["success"] for r in recs)
    refused = [r for r in server.requests if r["body"]["response_format"]["type"] == "json_schema"]
    # per client, its first requests in flight: the story compiler's one request; the sales agent's first 1-3 turns
    assert sum(r["body"]["model"] == "sim" for r in refused) == 1
    assert 1 <= sum(r["body"]["model"] == "sales-model" for r in refused) <= 3
    results = (tmp_path / "auto" / "results.md").read_text()
    for model in ("sim", "sales-model"):
        line = next(x for x in results.splitlines() if x.startswith(f"- requests to {model}@"))
        n = sum(r["body"]["model"] == model for r in refused)
        assert f"structured {n}, " in line and f"structured_fallbacks {n}" in line and "failures 0" in line
        assert "http_4xx" not in line and "retries 0" in line
    # off: no schema is ever sent
    n = len(server.requests)
    assert main(_argv(server.base_url, tmp_path / "off", "--no-audit", "--structured", "off", n=1)) == 0
    assert {r["body"]["response_format"]["type"] for r in server.requests[n:]} == {"json_object"}
    assert "structured 0, unstructured" in (tmp_path / "off" / "results.md").read_text()
    # on: the refusal is final; the story compiler's says so and nothing is played
    n = len(server.requests)
    assert main(_argv(server.base_url, tmp_path / "on", "--structured", "on", n=1)) == 0
    recs = list(_records(tmp_path / "on" / "episodes" / "gpt.jsonl").values())
    assert len(recs) == 3 and all(r["reason"] == "story_failure" for r in recs)
    assert recs[0]["failure"]["kind"] == "schema_refused"
    assert "the endpoint refused the JSON schema (structured=on;" in recs[0]["failure"]["detail"]
    assert len(server.requests) == n + 1  # one story request, not retried


def test_story_cache_shared_audit_and_compiler_failures(serve, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TS_KEY", "k")
    script = Scripted()
    server = serve(script)
    stories = tmp_path / "stories"
    assert main(_argv(server.base_url, tmp_path / "a", "--stories", str(stories), "--no-audit", n=2)) == 0
    assert len(script.requests["story"]) == 2 and not script.requests["audit"]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["policies"]["gpt"]["hallucination"] is None
    n_sim = len(script.requests["simulator"])
    # another output directory with the same story cache: no compiler call, the calls are played again; an auditor
    # whose replies stay invalid leaves the calls unaudited (with the reason), outcomes untouched
    script.auditor_broken = True
    assert main(_argv(server.base_url, tmp_path / "b", "--stories", str(stories), n=2)) == 0
    assert len(script.requests["story"]) == 2 and len(script.requests["simulator"]) > n_sim
    recs = list(_records(tmp_path / "b" / "episodes" / "gpt.jsonl").values())
    assert all(r["audit"] is None and r["audit_error"].startswith("auditor: bad_output") for r in recs)
    assert sum(r["success"] for r in recs) == 3 and not any(r["failed"] for r in recs)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())["policies"]["gpt"]
    # P0 wins three times; P1's "first call" was in run a, so here all three of its calls hang up
    assert (summary["n_audited"], summary["hallucination"], summary["success@1"]) == (0, None, 0.5)
    # a compiler that keeps failing: the profile's calls are failed episodes, nothing is played
    script.compiler_broken = True
    n_sim = len(script.requests["simulator"])
    assert main(_argv(server.base_url, tmp_path / "c", n=1)) == 0
    assert not (tmp_path / "c" / "stories" / "en").exists() or not any((tmp_path / "c" / "stories" / "en").iterdir())
    recs = list(_records(tmp_path / "c" / "episodes" / "gpt.jsonl").values())
    assert len(recs) == 3 and all(r["failed"] and r["reason"] == "story_failure" for r in recs)
    assert recs[0]["failure"]["kind"] == "bad_output" and "story compiler" in recs[0]["failure"]["detail"]
    assert len(script.requests["simulator"]) == n_sim and len(script.requests["story"]) == 4  # 2 + 1 + 1 retry
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())["policies"]["gpt"]
    assert (summary["success@1"], summary["failed"], summary["n_audited"]) == (0.0, 1.0, 0)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"--profiles": "{tmp}/missing.jsonl"}, "profiles file not found"),
        ({"--policy": "gpt=bot:greedy"}, "expected checkpoint:PATH"),
        ({"--policy": "gpt=zzz:1"}, "unknown player kind"),
        ({"--policy": "gpt=/no/such/ckpt"}, "not a Hugging Face checkpoint directory"),
        ({"--policy": "gpt=endpoint:m@{url}#TS_UNSET_KEY"}, "'TS_UNSET_KEY' (the API key of 'm') is not set"),
        ({"--simulator": "sim@ftp://x"}, "bad endpoint spec"),
        ({"-n": "0"}, "argument -n: expected a number in 1..1000000, got 0"),
        ({"--samples": "0"}, "argument --samples: expected a number in 1..1000, got 0"),
        ({"--concurrency": "0"}, "argument --concurrency: expected a number >= 1, got 0"),
        ({"--lang": "xx"}, "no TeleSales prompt templates for language 'xx'"),
        ({"--profiles": "{tmp}/train.jsonl"}, "expected a profile of split 'eval'"),
        ({"--structured": "maybe"}, "--structured must be one of auto, on, off (got 'maybe')"),
    ],
)
def test_telesales_eval_errors(serve, tmp_path, monkeypatch, capsys, change, message) -> None:
    monkeypatch.setenv("TS_KEY", "k")
    monkeypatch.delenv("TS_UNSET_KEY", raising=False)
    server = serve(Scripted())
    (tmp_path / "train.jsonl").write_text(json.dumps(generate_profiles(1, 0, "train")[0]) + "\n")
    argv = _argv(server.base_url, tmp_path / "out")
    for flag, value in change.items():
        value = value.format(tmp=tmp_path, url=server.base_url)
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(PROG) and message in err and err.count("\n") == 1, err
    assert not server.requests and not (tmp_path / "out").exists()  # nothing asked, nothing written


def test_telesales_eval_refuses_another_simulators_episodes(serve, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TS_KEY", "k")
    server = serve(Scripted())
    episodes = tmp_path / "out" / "episodes"
    episodes.mkdir(parents=True)
    (episodes / "gpt.jsonl").write_text(json.dumps({"episode_id": "x|0", "simulator": "simulator:other"}) + "\n")
    assert main(_argv(server.base_url, tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert err.startswith(PROG) and "played with simulator:other, not simulator:sim" in err
    assert not server.requests


class LocalEngines:
    """``FrozenEngines`` in-process: an HF engine per checkpoint behind the ``.remote`` calls the runner makes (with
    ``ray.get`` the identity). The same engine class runs as a Ray actor in ``marti-ibrl eval`` (test_eval_cli)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, path: str) -> list:
        import torch

        from marti_ibrl.rollout.engines import HFGenerateEngine

        self.calls.append("start")
        threads = torch.get_num_threads()
        engine = HFGenerateEngine(path, seed=0)
        torch.set_num_threads(threads)  # the engine pins its own process to one thread: not the test process
        return [SimpleNamespace(generate_batch=SimpleNamespace(remote=engine.generate_batch))]

    def stop(self, engines: list) -> None:
        self.calls.append("stop")


def test_telesales_eval_checkpoint_on_engines(serve, tmp_path, monkeypatch, capsys) -> None:
    """A tiny checkpoint in the sales seat, served by an HF engine (the Table 15 training format), against the
    scripted simulator: calls end by the rules or as malformed, the simulator hears the checkpoint's words, the
    engines start once and stop, and a rerun starts nothing."""
    from marti_ibrl.eval import engines as eval_engines
    from marti_ibrl.rollout import runner as runner_module
    from marti_ibrl.tiny import build_tiny_model

    engines = LocalEngines()
    monkeypatch.setattr(eval_engines, "engine_factory", lambda args, n: engines)
    monkeypatch.setattr(runner_module, "ray", SimpleNamespace(get=lambda refs: refs))
    corpus = [training_sales_prompt(p) for p in PROFILES] + [line for _, line in SALES_LINES] + ["reply 1", "reply 2"]
    model = build_tiny_model(tmp_path / "tiny", corpus, max_position_embeddings=2048)
    calls = engines.calls
    script = Scripted()
    script.broken_simulator = set()
    server = serve(script)
    out = tmp_path / "eval"
    argv = _argv(server.base_url, out, n=1)
    argv[argv.index("--policy") + 1] = f"tiny={model}"
    argv += ["--samples", "2", "--max-turns", "4", "--max-new-tokens", "8", "--max-len", "1024", "--device", "cpu"]
    assert main(argv) == 0
    recs = list(_records(out / "episodes" / "tiny.jsonl").values())
    assert len(recs) == 2 and calls == ["start", "stop"]
    env = TeleSalesEvalEnv("checkpoint")
    heard = [b["messages"][1]["content"] for b in script.requests["simulator"] if len(b["messages"]) == 2]
    for rec in recs:
        assert rec["reason"] in ("success", "hang_up", "turn_limit", "malformed", "context_limit") and not rec["failed"]
        sales = [t for t in rec["transcript"] if t["role"] == "sales"]
        assert sales and all(t["resamples"] <= 2 for t in sales)
        if sales[0]["valid"]:  # the simulator heard the checkpoint's first turn (markers as notes)
            assert env.counterpart_text("sales", sales[0]["text"]) in heard
    assert all(m["role"] != "assistant" or m["content"].startswith("{") for b in script.requests["simulator"]
               for m in b["messages"][1:])  # fmt: skip
    n = len(server.requests)
    assert main(argv) == 0  # all played: no engine, no request
    assert calls == ["start", "stop"] and len(server.requests) == n


def test_results_compare_policies_with_gee(tmp_path) -> None:
    from marti_ibrl.eval.telesales.evaluator import write_results

    def records(successes_per_profile: list[int]) -> list[dict]:
        state = {"willingness": 0.4, "trust": 0.5, "patience": 0.5}
        return [
            {"profile_id": f"p{i}", "sample_index": g, "success": g < wins, "failed": False, "reason": "hang_up",
             "initial_state": state, "final_state": state, "audit": None}
            for i, wins in enumerate(successes_per_profile)
            for g in range(3)
        ]  # fmt: skip

    # 40 profiles x 3 calls: "base" succeeds in 1 of 3 calls on half the profiles (20/120), "trained" in 2 of 3 on
    # every profile (80/120): odds ratio (80/40) / (20/100) = 10
    runs = {"base": records([1, 0] * 20), "trained": records([2] * 40)}
    text = write_results(tmp_path, runs, {"simulator": "sim"})
    assert "Per-call success vs base (logistic GEE clustered by profile, Holm-adjusted):" in text
    row = next(line for line in text.splitlines() if line.startswith("| trained | base | 120 |"))
    assert row.split("|")[4].strip().startswith("10.00 [")
    assert row.split("|")[5].strip() == "<0.001" and row.rstrip(" |").endswith("*")
    # one policy: no comparison; no success anywhere: reported as not estimable, results still written
    assert "logistic GEE" not in write_results(tmp_path, {"base": runs["base"]}, {})
    text = write_results(tmp_path, {"a": records([0] * 40), "b": records([0] * 40)}, {})
    assert "(not estimable:" in text and (tmp_path / "results.md").read_text() == text


def test_telesales_eval_interrupted_keeps_every_finished_call(serve, tmp_path, monkeypatch) -> None:
    """Stopped while its one runner call still plays (issue 36): every call that had ended is on disk, audited."""
    from marti_ibrl.eval.telesales import evaluator
    from marti_ibrl.rollout.runner import DialogueRunner

    monkeypatch.setenv("TS_KEY", "sk-ts-SECRET")
    ended: list[str] = []

    class Interrupted(DialogueRunner):
        def run(self, *args, on_done=None, **kwargs):
            def done(i, traj):
                on_done(i, traj)
                ended.append(f"{traj.scenario_uid}|{traj.sample_index}")
                if len(ended) == 6:  # Ctrl-C with 9 of the 15 calls still to end
                    raise KeyboardInterrupt

            return super().run(*args, on_done=done, **kwargs)

    monkeypatch.setattr(evaluator, "DialogueRunner", Interrupted)
    script = Scripted()
    script.broken_simulator = set()
    server = serve(script)
    out = tmp_path / "eval"
    with pytest.raises(KeyboardInterrupt):
        main(_argv(server.base_url, out, "--batch", "15"))  # one runner call: before, nothing was written
    recs = _records(out / "episodes" / "gpt.jsonl")
    assert sorted(recs) == sorted(ended) and len(ended) == 6
    for rec in recs.values():  # whole records, each audited unless the agent's own output broke
        assert rec["audit"] is not None or rec["reason"] == "malformed", rec
