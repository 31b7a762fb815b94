"""TeleSales training roles (paper Appendix E, Tables 15 and 16) and :class:`TeleSalesEnv` (issue 6 §2): sales
markers, customer JSON validation, scripted calls to every ending, the customer fallback, what each role sees, and
the prompt templates."""

from __future__ import annotations

import json
import re

import pytest

from marti_ibrl.envs.base import DialogueEnv
from marti_ibrl.envs.telesales import prompts
from marti_ibrl.envs.telesales.env import (
    FALLBACK_REPLY,
    HANG_UP,
    MALFORMED,
    SALES_END,
    SUCCESS,
    TURN_LIMIT,
    TeleSalesEnv,
    TeleSalesState,
    initial_scores,
)
from marti_ibrl.envs.telesales.profiles import flat_fields, generate_profile, generate_profiles
from marti_ibrl.envs.telesales.protocol import (
    BEHAVIORS,
    STAGES,
    ToolCall,
    format_customer_turn,
    parse_customer_turn,
    parse_sales_turn,
)

PROFILE = generate_profile(0, seed=0, split="train")
ADD = "<call_function=add_business_contact(phone_number={})>"
INVITE = "<call_function=send_contact_invitation>"
END = "<status=end>"


@pytest.fixture
def env() -> TeleSalesEnv:
    return TeleSalesEnv(max_turns=12)


def customer(state: TeleSalesState, behavior: str, reply: str = "Hm, okay.", dw: float = 0.0, dp: float = 0.0) -> str:
    """A valid customer turn for the current state."""
    return format_customer_turn(behavior, "exploration", reply, state.scores, {"willingness": dw, "patience": dp})


def play(env: TeleSalesEnv, state: TeleSalesState, role: str, text: str) -> None:
    result = env.step(state, role, text)
    assert result.valid, result.reason


# ---- sales markers (Table 15) ----
def test_sales_turn_plain_tools_and_end() -> None:
    t = parse_sales_turn("Hello, this is Li Na from the car platform. Is now a good time?")
    assert (t.error, t.tools, t.end) == (None, (), False)
    assert t.utterance == "Hello, this is Li Na from the car platform. Is now a good time?"
    t = parse_sales_turn(f"Great, I'll add you now. {ADD.format('13800001111')} And I'll text you too. {INVITE}")
    assert t.error is None
    assert t.tools == (
        ToolCall("add_business_contact", {"phone_number": "13800001111"}),
        ToolCall("send_contact_invitation"),
    )
    assert t.utterance == "Great, I'll add you now. And I'll text you too."
    t = parse_sales_turn(f"Thanks for your time, goodbye! {END}")
    assert (t.error, t.end, t.utterance) == (None, True, "Thanks for your time, goodbye!")
    assert parse_sales_turn(END).end  # markers alone are a turn
    assert parse_sales_turn("<call_function=add_business_contact(phone_number='138 0000 1111')>").tools[0].args == {
        "phone_number": "138 0000 1111"
    }


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (f"Adding you. {INVITE} Oh, again: {INVITE}", "twice"),
        ("<call_function=add_friend(phone_number=1)>", "unknown call_function"),
        ("<call_function=add_business_contact>", "takes phone_number"),
        ("<call_function=add_business_contact(wechat=abc)>", "takes phone_number"),
        ("<call_function=send_contact_invitation(phone_number=1)>", "takes no arguments"),
        ("Bye <status=done>", "unknown status"),
        ("Let me add you <call_function=add_business_contact(phone_number=1>", "malformed marker"),
        ("Bye status=end", "malformed marker"),
        ("   ", "empty"),
    ],
)
def test_sales_turn_errors(text: str, error: str) -> None:
    assert error in (parse_sales_turn(text).error or "")


# ---- customer JSON (Table 16) ----
BEFORE = {"willingness": 0.40, "patience": 0.60}


def turn_obj(**changes) -> dict:
    obj = json.loads(format_customer_turn("AskQuestion", "exploration", "Which car?", BEFORE, {"willingness": 0.05}))
    return obj | changes


def test_customer_turn_valid_and_fenced() -> None:
    text = json.dumps(turn_obj())
    t = parse_customer_turn(text, BEFORE)
    assert t.error is None and t.behavior == "AskQuestion" and t.reply == "Which car?"
    assert t.after() == pytest.approx({"willingness": 0.45, "patience": 0.60})
    assert parse_customer_turn(f"\n ```json\n{text}\n```  ", BEFORE).error is None
    assert parse_customer_turn(json.dumps(turn_obj(extra="ignored")), BEFORE).error is None
    # after is clipped: 0.95 + 0.1 -> 1.0
    high = {"willingness": 0.95, "patience": 0.6}
    assert (
        parse_customer_turn(format_customer_turn("PartialAgree", "decision", "Ok.", high, {"willingness": 0.1})).error
        is None
    )
    assert len(BEHAVIORS) == 14 and len(STAGES) == 5


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Sure, which car?", "invalid JSON"),
        (json.dumps(turn_obj()) + " {}", "exactly one JSON object"),
        (json.dumps([turn_obj()]), "JSON object"),
        (json.dumps({k: v for k, v in turn_obj().items() if k != "reply"}), "missing keys: reply"),
        (json.dumps(turn_obj(behavior="Agree")), "unknown behavior"),
        (json.dumps(turn_obj(stage="closing")), "unknown stage"),
        (json.dumps(turn_obj(reply="  ")), "empty reply"),
        (json.dumps(turn_obj(willingness_delta="0.05")), "must be a number"),
        (json.dumps(turn_obj(patience_before=True)), "must be a number"),
        (json.dumps(turn_obj(willingness_before=1.2, willingness_after=1.0, willingness_delta=0.0)), "[0, 1]"),
        (json.dumps(turn_obj(willingness_delta=0.2, willingness_after=0.6)), "outside [-0.2, 0.15]"),
        (json.dumps(turn_obj(patience_delta=-0.25, patience_after=0.35)), "outside [-0.2, 0.15]"),
        (json.dumps(turn_obj(willingness_after=0.5)), "willingness_after 0.5 != clip"),
    ],
)
def test_customer_turn_errors(text: str, error: str) -> None:
    assert error in (parse_customer_turn(text, BEFORE).error or "")


def test_customer_turn_state_checks() -> None:
    text = json.dumps(turn_obj())
    assert "!= the current willingness" in parse_customer_turn(text, {"willingness": 0.3, "patience": 0.6}).error
    assert parse_customer_turn(text, {"willingness": 0.405, "patience": 0.6}).error is None  # within tolerance
    for behavior in ("ConfirmAdded", "IgnoreRequest", "RejectRequest"):
        late = json.dumps(turn_obj(behavior=behavior))
        assert "only available after AgreeWeChat" in parse_customer_turn(late, BEFORE, wechat_agreed=False).error
        assert parse_customer_turn(late, BEFORE, wechat_agreed=True, contact_sent=True).error is None
    confirm = json.dumps(turn_obj(behavior="ConfirmAdded"))
    assert "contact request" in parse_customer_turn(confirm, BEFORE, wechat_agreed=True, contact_sent=False).error
    assert (
        parse_customer_turn(
            json.dumps(turn_obj(behavior="IgnoreRequest")), wechat_agreed=True, contact_sent=False
        ).error
        is None
    )


# ---- scripted calls through the environment ----
def test_protocol_and_seats(env: TeleSalesEnv) -> None:
    for name in (
        "system_prompt",
        "new_state",
        "current_role",
        "step",
        "finish_malformed",
        "abort",
        "outcome",
        "reward",
    ):
        assert callable(getattr(env, name)) and hasattr(DialogueEnv, name)
    assert env.roles == ("sales", "customer")
    assert env.new_state(PROFILE).seats == ("sales", "customer")
    with pytest.raises(ValueError, match="sales agent opens"):
        env.new_state(PROFILE, ["customer", "sales"])
    eval_profile = generate_profile(0, split="eval")
    with pytest.raises(ValueError, match="training profiles"):
        env.new_state(eval_profile)
    initial = eval_profile["runtime_state"]["initial_state"]
    assert initial_scores(eval_profile) == {"willingness": initial["willingness"], "patience": initial["patience"]}
    assert all(0.05 <= v <= 0.95 for p in generate_profiles(50, split="train") for v in initial_scores(p).values())
    state = env.new_state(PROFILE)
    with pytest.raises(ValueError, match="'sales''s turn"):
        env.step(state, "customer", customer(state, "Greeting"))


def test_call_reaches_success(env: TeleSalesEnv) -> None:
    state = env.new_state(PROFILE, ["sales", "customer"])
    start = dict(state.scores)
    assert start == initial_scores(PROFILE)
    play(env, state, "sales", "Hello, this is Li Na from the car platform, do you have a minute?")
    play(env, state, "customer", customer(state, "Greeting", "Yes, what is it?", 0.05, -0.02))
    assert state.scores == pytest.approx(
        {"willingness": start["willingness"] + 0.05, "patience": start["patience"] - 0.02}
    )
    # ConfirmAdded before any agreement / tool call: invalid, state untouched
    play(env, state, "sales", "Could I add you on WeChat to send the inspection report?")
    snapshot = (state.n_turns, dict(state.scores), state.stage, list(state.behaviors))
    for bad in (
        customer(state, "ConfirmAdded"),
        format_customer_turn("Greeting", "opening", "Hi", {"willingness": 0.9, "patience": 0.9}),
    ):
        assert not env.step(state, "customer", bad).valid
    assert (state.n_turns, state.scores, state.stage, state.behaviors) == snapshot
    play(env, state, "customer", customer(state, "AgreeWeChat", "Okay, add me.", 0.1))
    assert state.wechat_agreed
    play(env, state, "sales", f"Great, sending the request now. {ADD.format(PROFILE['lead']['phone_number'])}")
    play(env, state, "customer", customer(state, "AskQuestion", "Is it from the platform account?"))
    # each tool at most once per call: a second use in a later turn is invalid
    assert "already used in this call" in env.step(state, "sales", f"Again: {ADD.format('1')}").reason
    play(env, state, "sales", f"Yes, the official one. I'll also text you a link. {INVITE}")
    result = env.step(state, "customer", customer(state, "ConfirmAdded", "Got it, added."))
    assert result.valid and result.done and result.reason == SUCCESS
    out = env.outcome(state)
    assert out.agreed and not out.malformed
    assert out.utilities == {"sales": 1.0, "customer": 0.0}
    assert out.info["reason"] == SUCCESS and out.info["n_turns"] == 8 and out.info["fallbacks"] == 0
    assert [c["name"] for c in out.info["tool_calls"]] == ["add_business_contact", "send_contact_invitation"]
    assert out.info["behaviors"] == ["Greeting", "AgreeWeChat", "AskQuestion", "ConfirmAdded"]
    assert (env.reward(state, "sales"), env.reward(state, "customer")) == (1.0, 0.0)
    with pytest.raises(ValueError, match="already over"):
        env.step(state, "sales", "Hello?")


def test_call_ends_on_hang_up(env: TeleSalesEnv) -> None:
    state = env.new_state(PROFILE)
    play(env, state, "sales", "Hello, this is the car platform.")
    result = env.step(state, "customer", customer(state, "HangUp", "Not interested, bye.", -0.1, -0.2))
    assert result.done and state.reason == HANG_UP
    out = env.outcome(state)
    assert not out.agreed and out.utilities["sales"] == 0.0 and env.reward(state, "sales") == 0.0


def test_call_ends_on_status_end(env: TeleSalesEnv) -> None:
    state = env.new_state(PROFILE)
    play(env, state, "sales", "Hello, this is the car platform.")
    play(env, state, "customer", customer(state, "DeclineHard", "I'm not buying anything."))
    result = env.step(state, "sales", f"Understood, sorry to bother you. Goodbye! {END}")
    assert result.done and state.reason == SALES_END and not env.outcome(state).agreed


def test_call_ends_on_turn_limit() -> None:
    env = TeleSalesEnv(max_turns=4)
    state = env.new_state(PROFILE)
    for i in range(4):
        assert not state.done
        role = env.current_role(state)
        text = f"Sales turn {i}" if role == "sales" else customer(state, "Hesitate")
        result = env.step(state, role, text)
    assert result.done and state.reason == TURN_LIMIT and env.outcome(state).info["n_turns"] == 4


def test_customer_fallback_continues_and_counts(env: TeleSalesEnv) -> None:
    state = env.new_state(PROFILE)
    play(env, state, "sales", "Hello, this is the car platform.")
    play(env, state, "customer", customer(state, "AskQuestion", "About what?", -0.05, 0.05))
    scores = dict(state.scores)
    play(env, state, "sales", "About the sedan you looked at.")
    assert not env.step(state, "customer", "I don't remember that.").valid  # not JSON: no reply to reuse
    env.finish_malformed(state, "customer")
    assert not state.done and state.fallbacks == 1 and state.scores == scores and state.stage == "exploration"
    assert state.behaviors[-1] == "Hesitate" and json.loads(state.history[-1][1])["reply"] == FALLBACK_REPLY
    assert env.current_role(state) == "sales"
    # a well-formed JSON that contradicts the state: the fallback keeps its reply (what the sales agent heard)
    play(env, state, "sales", "Shall I add you on WeChat?")
    wrong = format_customer_turn("ConfirmAdded", "decision", "Sure, done.", scores)
    assert not env.step(state, "customer", wrong).valid
    env.finish_malformed(state, "customer")
    assert state.fallbacks == 2 and json.loads(state.history[-1][1])["reply"] == "Sure, done."
    assert env.counterpart_text("customer", wrong, PROFILE) == "Sure, done."
    assert not state.success and state.behaviors[-1] == "Hesitate"
    # the next valid turn carries the unchanged scores forward
    play(env, state, "sales", "Okay.")
    play(env, state, "customer", customer(state, "DeclineSoft", "Maybe later."))
    env.abort(state, "context_limit")
    out = env.outcome(state)
    assert out.info["fallbacks"] == 2 and out.info["reason"] == "context_limit" and not out.malformed


def test_fallback_at_turn_limit_ends_the_call() -> None:
    env = TeleSalesEnv(max_turns=2)
    state = env.new_state(PROFILE)
    play(env, state, "sales", "Hello.")
    env.finish_malformed(state, "customer")
    assert state.done and state.reason == TURN_LIMIT and state.fallbacks == 1


def test_sales_malformed_ends_the_call(env: TeleSalesEnv) -> None:
    state = env.new_state(PROFILE)
    assert not env.step(state, "sales", "<call_function=buy_car>").valid
    env.finish_malformed(state, "sales")
    out = env.outcome(state)
    assert state.done and out.malformed and out.info["reason"] == MALFORMED and out.info["fault_role"] == "sales"
    assert env.reward(state, "sales") == -1.0 and env.reward(state, "customer") == 0.0


# ---- what each role sees ----
HIDDEN = ("concerns", "personality", "wechat_id", "lead_memory", "intent_level", "speaking_style")


@pytest.mark.parametrize("profile", generate_profiles(20, seed=3, split="train"))
def test_sales_prompt_hides_the_customer(profile: dict) -> None:
    env = TeleSalesEnv()
    text = env.system_prompt(profile, "sales")
    fields = flat_fields(profile)
    assert profile["lead"]["phone_number"] in text and profile["lead"]["vehicle"] in text
    for key in HIDDEN:
        values = fields[key] if isinstance(fields[key], list) else [fields[key]]
        for value in values:
            assert str(value) not in text, (key, value)
    assert "willingness" not in text.lower() and "patience" not in text.lower()
    customer_text = env.system_prompt(profile, "customer")
    for key in HIDDEN:
        assert prompts.fmt(fields[key]) in customer_text
    assert f"{initial_scores(profile)['willingness']:.2f}" in customer_text


def test_counterpart_views(env: TeleSalesEnv) -> None:
    state = env.new_state(PROFILE)
    turn = customer(state, "RequestValue", "What's in it for me?", 0.05, -0.05)
    shown = env.counterpart_text("customer", turn, PROFILE)
    assert shown == "What's in it for me?"
    assert "willingness" not in shown and "{" not in shown
    assert env.counterpart_text("customer", "not json at all", PROFILE) == FALLBACK_REPLY
    assert env.counterpart_text("customer", json.dumps(turn_obj(willingness_after=0.9)), PROFILE) == FALLBACK_REPLY
    phone = PROFILE["lead"]["phone_number"]
    shown = env.counterpart_text("sales", f"Adding you now. {ADD.format(phone)} {INVITE} Bye! {END}", PROFILE)
    assert shown.startswith("Adding you now. Bye!") and f"friend request to {phone}" in shown
    assert "SMS" in shown and "ended the call" in shown and "call_function" not in shown
    assert env.counterpart_text("sales", "Hi <call_function=oops>", PROFILE) == "Hi <call_function=oops>"


# ---- prompts ----
def test_prompts_render_every_slot() -> None:
    env = TeleSalesEnv(service={"service_name": "Wang Lei", "service_gender": "male"})
    for profile in generate_profiles(30, seed=1, split="train"):
        for role in env.roles:
            text = env.system_prompt(profile, role)
            assert not re.search(r"\{[a-z_]+\}", text), (role, text)
            for python_repr in ("None", "True", "False", "['", "{'"):
                assert python_repr not in text, (role, python_repr)
    assert "Wang Lei" in env.system_prompt(PROFILE, "sales")
    assert prompts.slots(prompts.load_template("customer")) >= {"name", "willingness_before", "wechat_status"}
    with pytest.raises(ValueError, match="no TeleSales prompt templates for language 'fr'"):
        TeleSalesEnv(lang="fr").system_prompt(PROFILE, "sales")
    with pytest.raises(KeyError, match="customer_phone"):
        prompts.render("{customer_phone}", {})


# ---- through the real runner (text players in both seats: no engines, no Ray) ----
class ScriptPlayer:
    """Plays one role from a script; a customer entry is a behavior (a valid JSON turn for the current state) or
    raw text (sent as is, e.g. an invalid turn)."""

    def __init__(self, name: str, script: list[str]) -> None:
        self.name, self.script, self.calls = name, list(script), 0

    def respond(self, env, role, trajectories):
        self.calls += 1
        entry = self.script.pop(0)
        if role == "customer" and entry in BEHAVIORS:
            entry = customer(trajectories[0].state, entry, f"({entry})")
        return [entry]


def test_runner_resamples_then_applies_the_fallback() -> None:
    from marti_ibrl.rewards import env_reward
    from marti_ibrl.rollout.runner import DialogueRunner, Policy, requests

    env = TeleSalesEnv()
    phone = PROFILE["lead"]["phone_number"]
    sales = ScriptPlayer("bot:sales", ["Hello!", "Can I add you on WeChat?", f"Sending it. {ADD.format(phone)}"])
    cust = ScriptPlayer("bot:customer", ["{bad", "{bad", "still bad", "AgreeWeChat", "ConfirmAdded"])
    runner = DialogueRunner(env, {r: env_reward(env) for r in env.roles}, {"max_new_tokens": 8}, max_len=1 << 20)
    policies = {"sales": Policy("bot:sales", player=sales), "customer": Policy("bot:customer", player=cust)}
    (traj,) = runner.run(requests([("p0", PROFILE)], policies), n_samples=1)  # env.fixed_seats: sales opens
    assert cust.calls == 5 and not cust.script and not sales.script
    assert [(t.role, t.valid, t.resamples) for t in traj.turns] == [
        ("sales", True, 0), ("customer", False, 2), ("sales", True, 0), ("customer", True, 0),
        ("sales", True, 0), ("customer", True, 0),
    ]  # fmt: skip
    assert traj.state.fallbacks == 1 and traj.outcome.agreed and traj.outcome.info["reason"] == SUCCESS
    assert traj.rewards == {"sales": 1.0, "customer": 0.0}
