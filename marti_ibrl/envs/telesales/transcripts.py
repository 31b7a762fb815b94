"""TeleSales call transcripts for the SFT initialisation of both roles (paper §5.1: the sales agent and the customer
start from SFT checkpoints; Appendix E, Tables 15 and 16): :func:`load_transcripts` reads and replays them through
:class:`TeleSalesEnv` (a call is accepted iff the RL environment accepts each of its turns; one error line per bad
call), :func:`role_records` turns a call into one OpenRLHF multiturn SFT record per role, the role's view exactly as
the RL rollout renders it. The format, the rules a call is checked against and an example: docs/telesales.md,
"Call transcripts".
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from marti_ibrl.envs.base import role_messages
from marti_ibrl.envs.telesales import protocol
from marti_ibrl.envs.telesales.env import TeleSalesEnv, TeleSalesState
from marti_ibrl.envs.telesales.profiles import generate_profile, sales_view
from marti_ibrl.envs.telesales.prompts import DEFAULT_SERVICE

Call = dict[str, Any]
Record = dict[str, Any]
CALL_KEYS = ("call_id", "profile", "turns")
INVITE = "<call_function=send_contact_invitation>"


class TranscriptError(ValueError):
    """Bad transcripts: ``errors`` holds one located message per bad call (the first one is the message)."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        more = f" (and {len(errors) - 1} more bad calls)" if len(errors) > 1 else ""
        super().__init__(errors[0] + more)


@dataclass
class Transcripts:
    """The accepted calls of a file, in file order; ``skipped``: one located error per skipped call (lenient)."""

    calls: list[Call]
    skipped: list[str] = field(default_factory=list)


# ---- turns ----
def customer_text(record: Mapping[str, Any]) -> str:
    """The customer's JSON turn of a Table 16 record, as :func:`protocol.format_customer_turn` writes it."""
    before = {s: record[f"{s}_before"] for s in protocol.SCORES}
    delta = {s: record[f"{s}_delta"] for s in protocol.SCORES}
    return protocol.format_customer_turn(record["behavior"], record["stage"], record["reply"], before, delta)


def customer_record(text: str) -> dict[str, Any]:
    """The transcript record of a well-formed customer JSON turn (e.g. one sampled in an RL rollout)."""
    turn = protocol.parse_customer_turn(text)
    if turn.error:
        raise ValueError(f"not a valid customer turn: {turn.error}")
    return {k: getattr(turn, k) for k in protocol.KEYS}


def turn_text(turn: Mapping[str, Any]) -> str:
    """What the speaker of a (valid) transcript turn says: the sales text, or the customer's JSON turn."""
    return turn["text"] if turn["speaker"] == "sales" else customer_text(turn["record"])


# ---- validation ----
def _step(env: TeleSalesEnv, state: TeleSalesState, turn: Any) -> str | None:
    """Apply one transcript turn; why it is invalid, or None."""
    if not isinstance(turn, dict) or "speaker" not in turn:
        return 'a turn must be an object {"speaker": "sales", "text": ...} or {"speaker": "customer", "record": ...}'
    if state.done:
        return f"the call already ended after turn {state.n_turns} ({state.reason}): remove the turns after it"
    speaker = turn["speaker"]
    if speaker not in env.roles:
        return f"unknown speaker {speaker!r} (sales or customer)"
    if speaker != state.next_role:
        return f"expected a {state.next_role} turn (the sales agent opens, then the speakers alternate)"
    if speaker == "sales":
        if not isinstance(turn.get("text"), str):
            return 'a sales turn needs "text" (a string)'
        result = env.step(state, speaker, turn["text"])
        return None if result.valid else result.reason.removeprefix("malformed: ")
    record = turn.get("record")
    if not isinstance(record, dict):
        return 'a customer turn needs "record" (the Table 16 JSON object)'
    # the record on its own (keys, types, ranges, after = clip(before + delta)), then against the call's state
    error = protocol.parse_customer_turn(json.dumps(record)).error
    if error is None:
        result = env.step(state, speaker, customer_text(record))
        error = None if result.valid else result.reason.removeprefix("malformed: ")
    return None if error is None else f"customer record: {error}"


def check_call(call: Any, env: TeleSalesEnv) -> str | None:
    """Why ``call`` is not a valid transcript (``"turn K: ..."`` for a bad turn), or None: replays it in ``env``."""
    if not isinstance(call, dict):
        return "a call must be a JSON object with call_id, profile and turns"
    missing = [k for k in CALL_KEYS if k not in call]
    if missing:
        return f"missing keys: {', '.join(missing)}"
    if not isinstance(call["call_id"], str) or not call["call_id"].strip():
        return "call_id must be a non-empty string"
    try:
        for role in env.roles:
            env.system_prompt(call["profile"], role)
        state = env.new_state(call["profile"])
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        reason = str(e.args[0]) if e.args else type(e).__name__
        if isinstance(e, KeyError) and " " not in reason:
            reason = f"missing {reason!r}"
        return f"profile: {reason} (expected a training profile: profiles.generate_profile(..., split='train'))"
    turns = call["turns"]
    if not isinstance(turns, list) or not turns:
        return "turns must be a non-empty list"
    for k, turn in enumerate(turns, 1):
        reason = _step(env, state, turn)
        if reason:
            return f"turn {k}: {reason}"
    return None


def load_transcripts(
    path: str | os.PathLike[str], env: TeleSalesEnv | None = None, *, strict: bool = True
) -> Transcripts:
    """Read and validate a transcript file (module doc). ``strict``: any bad call raises :class:`TranscriptError`
    listing every bad call; else bad calls are skipped and listed in ``skipped``. No valid call at all raises too."""
    env = env or TeleSalesEnv()
    calls: list[Call] = []
    errors: list[str] = []
    first_line: dict[str, int] = {}
    with open(path, encoding="utf-8") as fp:
        for lineno, line in enumerate(fp, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                call = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(f"{where}: invalid JSON: {e.msg} (column {e.colno})")
                continue
            call_id = call.get("call_id") if isinstance(call, dict) else None
            named = isinstance(call_id, str) and bool(call_id.strip())
            if named and call_id in first_line:
                reason: str | None = f"duplicate call_id (first at line {first_line[call_id]})"
            else:
                reason = check_call(call, env)
            if reason:
                errors.append(f"{where}: {call_id}: {reason}" if named else f"{where}: {reason}")
                continue
            first_line[call_id] = lineno
            calls.append(call)
    if errors and strict:
        raise TranscriptError(errors)
    if not calls:
        skipped = f" ({len(errors)} skipped, the first: {errors[0]})" if errors else ""
        raise TranscriptError([f"{path}: no valid calls{skipped}"])
    return Transcripts(calls, errors)


def write_transcripts(path: str | os.PathLike[str], calls: Iterable[Call]) -> str:
    """Write ``calls`` one per line (the format :func:`load_transcripts` reads); returns the path as str."""
    with open(path, "w", encoding="utf-8") as fp:
        for call in calls:
            fp.write(json.dumps(call, ensure_ascii=False) + "\n")
    return str(path)


# ---- training views ----
def role_records(call: Call, role: str, env: TeleSalesEnv) -> list[Record]:
    """``role``'s SFT record of a valid call, ``[{"messages": [...]}]`` (module doc), or ``[]`` when it never
    spoke. One record per call and role: OpenRLHF's multiturn dataset trains on every assistant turn of it."""
    if role not in env.roles:
        raise ValueError(f"unknown role {role!r}; roles are {list(env.roles)}")
    history = [(turn["speaker"], turn_text(turn)) for turn in call["turns"]]
    messages = role_messages(env, call["profile"], history, role)
    return [{"messages": messages}] if len(messages) > 1 else []


def records_for_role(calls: Iterable[Call], role: str, env: TeleSalesEnv) -> list[Record]:
    """:func:`role_records` of every call, in order."""
    return [record for call in calls for record in role_records(call, role, env)]


# ---- synthetic calls (tests, demos) ----
def synthetic_calls(n: int, seed: int = 0) -> list[Call]:
    """``n`` short scripted calls on the training profiles ``0..n-1`` of ``seed``; deterministic in ``seed``.

    Each opens with a greeting, a question and an answer with a WeChat ask; about half end in success
    (AgreeWeChat, the contact tool the customer's WeChat allows, ConfirmAdded), a quarter in HangUp and a quarter
    in the agent's ``<status=end>``. The replies never mention the customer's hidden fields (personality, concerns).
    """
    env = TeleSalesEnv()
    return [
        _synthetic_call(env, generate_profile(i, seed, "train"), random.Random(f"{seed}/synthetic/{i}"), seed, i)
        for i in range(n)
    ]


def _synthetic_call(env: TeleSalesEnv, profile: dict, rng: random.Random, seed: int, index: int) -> Call:
    lead, state, turns = sales_view(profile), env.new_state(profile), []

    def play(speaker: str, text: str) -> None:
        result = env.step(state, speaker, text)
        if not result.valid:  # a bug in the script
            raise RuntimeError(f"synthetic call {seed}/{index}: invalid {speaker} turn {text!r}: {result.reason}")
        body = {"text": text} if speaker == "sales" else {"record": customer_record(text)}
        turns.append({"speaker": speaker, **body})

    def customer(behavior: str, stage: str, reply: str, dw: float, dp: float) -> None:
        delta = {"willingness": dw, "patience": dp}
        play("customer", protocol.format_customer_turn(behavior, stage, reply, state.scores, delta))

    car, info, phone = lead["vehicle"], lead["vehicle_info"], lead["phone_number"]
    agent = DEFAULT_SERVICE["service_name"]
    play("sales", rng.choice((
        f"Hello, this is {agent} from the car platform. You asked about a {car} in {lead['car_city']}. "
        "Is now a good time?",
        f"Hi, {agent} here from the car platform, about the {car} you looked at. Do you have a minute?",
    )))  # fmt: skip
    customer("Greeting", "opening", rng.choice(("Oh, hello. Yes, go ahead.", "Hi. What is it about?")), 0.0, -0.02)
    play("sales", f"The {car} is listed at {info['listing_price_k']}k RMB and passed our full inspection. "
         "Are you still looking for a car?")  # fmt: skip
    question = rng.choice(("Maybe. How many kilometers has it done?", "I am still comparing. Is it in good shape?"))
    customer("AskQuestion", "exploration", question, 0.05, -0.03)
    play("sales", f"It has done {info['mileage_km']:,} km. I can send you the inspection report and a video on "
         "WeChat. May I add you?")  # fmt: skip
    ending = rng.choices(("success", "hang_up", "sales_end"), weights=(2, 1, 1))[0]
    if ending == "success":
        linked = profile["contact"]["can_add_wechat"]
        customer("AgreeWeChat", "wechat_pending", "Okay, add me with this number." if linked else
                 "Okay, but my WeChat is not on this number. Can you text me a link?", 0.1, -0.02)  # fmt: skip
        tool = f"<call_function=add_business_contact(phone_number={phone})>" if linked else INVITE
        play(
            "sales",
            f"{'Sending the friend request' if linked else 'Sure, I am texting you the invitation'} now. {tool}",
        )
        customer("ConfirmAdded", "wechat_pending", "Got it, I accepted the request.", 0.05, 0.0)
    elif ending == "hang_up":
        customer("DeclineHard", "objection", "No, I do not want to add anyone on WeChat.", -0.1, -0.15)
        play("sales", "I understand. May I text you the report instead?")
        customer("HangUp", "objection", "I said no. Goodbye.", -0.05, -0.2)
    else:
        customer("DeclineSoft", "decision", "Not now, I am busy. Maybe another time.", -0.05, -0.05)
        play("sales", "No problem. Thank you for your time, have a nice day. <status=end>")
    return {"call_id": f"synthetic-{seed}-{index:04d}", "profile": profile, "turns": turns}
