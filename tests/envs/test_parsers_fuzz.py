"""Every parser of text a model wrote, fuzzed (hypothesis): it never raises, and reads any reply in bounded time.

The parsers (:data:`CHECKS`): the DoND utterance (Table 17), the three-party DoND turn, the TeleSales sales turn
(Table 15) and customer JSON (Table 16), the JSON replies of endpoints (:func:`marti_ibrl.llm.parse_json_reply`),
the judges' verdicts, and the TeleSales evaluation's LLM outputs (Tables 8-10 and 12). Texts are built from the
protocols' fragments, numbers (huge ones too), random text and long runs of one character (whitespace, digits,
brackets, backticks, ``<``, ...: the inputs that made the old regexes quadratic or cubic, ``int()`` raise past 4300
digits and ``json`` recurse past its limit). Every parser reads every text, within :data:`BOUND` seconds each:
:data:`EXAMPLES` cases per parser (10,000: 37 s wall, 22 s CPU, for all seven on the 2-core machine at load 11-18;
set ``MARTI_FUZZ_EXAMPLES`` to run fewer while editing). Next to the fuzzing, the parsers' accepted language is checked unchanged: round trips
of the formatters, and the rewritten regexes against the old ones on short texts.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marti_ibrl import safeparse
from marti_ibrl.envs.dond import protocol as dond
from marti_ibrl.envs.dond import three_party
from marti_ibrl.envs.telesales import judges
from marti_ibrl.envs.telesales import protocol as telesales
from marti_ibrl.eval.telesales import outputs
from marti_ibrl.llm import Fault, parse_json_reply

EXAMPLES = int(os.environ.get("MARTI_FUZZ_EXAMPLES", "10000"))
BOUND = 0.5  # seconds per parser and text; a linear parser reads the longest text here in a few milliseconds
LONGEST_RUN = 12_000  # characters of one run (the old DoND marker regex: ~25 s on "<" and 12,000 spaces)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # the bound is per parser (BOUND), checked in the test
    database=None,  # no .hypothesis/ directory in the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # the same cases on every run (CI never flakes on a new draw)
)
LANGUAGE = settings(FUZZ, max_examples=min(EXAMPLES, 300))  # short texts, against the old regexes

RUN_CHARS = " \t\n\r\x0b\u3000\u00a00159[]{}`<>/\\\"'|:=,;()-.eE"


def texts(fragments: list[str], longest: int = LONGEST_RUN) -> st.SearchStrategy[str]:
    """Texts of up to 10 pieces: the protocols' fragments, numbers (huge ones too), runs of up to ``longest`` of one
    character, random text."""
    runs = st.builds(lambda c, n: c * n, st.sampled_from(RUN_CHARS), st.integers(0, longest))
    big = st.integers(95, 6000 if longest > 6000 else longest).map(lambda n: "9" * n)
    numbers = st.one_of(st.integers(-(10**12), 10**12).map(str), big)
    piece = st.one_of(st.sampled_from(fragments), numbers, runs, st.text(max_size=6))
    return st.lists(piece, max_size=10).map("".join)


def timed(check, text) -> float:
    """Seconds ``check(text)`` takes."""
    t0 = time.perf_counter()
    check(text)
    return time.perf_counter() - t0


DOND = ["<try>", "</try>", "< TRY >", "<selection>", "</selection>", "< / selection >", "<disagree>", "</disagree>",
        "item0=", "item1=", "item2=", " item1 = ", "Deal. ", "\n"]  # fmt: skip
THREE = ["<try> ", "<selection> ", "<disagree>", "agent1:", "agent2: ", "agent3:", " | ", "x_y:", "1 0 2"]
SALES = ["<call_function=add_business_contact(phone_number=", "<call_function=send_contact_invitation>",
         "<call_function=", "<status=end>", "<status", "status=end", "call_function", ")>", "(", "13800138000",
         "<call_function = send_contact_invitation ( ) >"]  # fmt: skip
JSON = ["{", "}", "[", "]", ",", ":", '"', "```json", "```", "NaN", "-Infinity", "1e999", "true", "null",
        '"behavior": ', '"Greeting"', '"stage": "opening"', '"reply": "hi"', '"willingness_before": ',
        '"turns": ', '"turn": 1', '"reason": "ok"', '"outcome": ', '"rubric_hits": []', '"\\u00e9"', "\\"]  # fmt: skip
SALES_JUDGE = judges.SalesJudge.criteria


# -- never raises, bounded time ------------------------------------------------------------------------------------


def check_dond_utterance(text):
    action = dond.parse_utterance(text)
    assert action.kind in ("chat", "try", "selection", "disagree", "malformed")
    assert (action.alloc is not None) == (action.kind in ("try", "selection"))
    assert action.alloc is None or all(0 <= n < 10**safeparse.MAX_NUMBER_CHARS for n in action.alloc)


def check_three_party(text):
    action = three_party.parse_three_party(text)
    assert action.kind in ("try", "selection", "disagree", "malformed")
    allocs = [action.alloc] if action.alloc else list((action.split or {}).values())
    assert all(0 <= n < 10**safeparse.MAX_NUMBER_CHARS for alloc in allocs for n in alloc)


def check_sales_turn(text):
    turn = telesales.parse_sales_turn(text)
    assert isinstance(turn, telesales.SalesTurn)
    assert turn.error is None or not (turn.tools or turn.end or turn.utterance)


def check_customer_json(text):
    turn = telesales.parse_customer_turn(text, {"willingness": 0.5, "patience": 0.5})
    assert isinstance(turn, telesales.CustomerTurn)
    assert (turn.error is None) == (turn.behavior in telesales.BEHAVIORS)


def _reply(text, validator):
    """parse_json_reply's outcome: the validated value, or None for a ``bad_output`` fault; nothing else escapes."""
    try:
        return parse_json_reply(text, validator)
    except Fault as fault:
        assert fault.kind == "bad_output" and fault.detail
        return None


def check_json_reply(text):
    value = _reply(text, lambda obj: obj)
    assert value is None or isinstance(value, dict)


def check_judge_reply(text):
    value = _reply(text, lambda obj: judges.validate_verdict(obj, [1, 3], SALES_JUDGE, "outcome", "sales judge"))
    assert value is None or isinstance(value, judges.Verdict)


def check_telesales_eval_outputs(text):
    for validate in (outputs.validate_story, outputs.validate_simulator_turn, outputs.validate_sales_turn,
                     outputs.validate_audit):  # fmt: skip
        try:  # each returns its dataclass or raises ValueError naming the problem
            validate(text)
        except ValueError as e:
            assert str(e)


CHECKS = {
    "DoND utterance": check_dond_utterance,
    "DoND three-party turn": check_three_party,
    "TeleSales sales turn": check_sales_turn,
    "TeleSales customer JSON": check_customer_json,
    "JSON reply (parse_json_reply)": check_json_reply,
    "judge reply": check_judge_reply,
    "TeleSales eval outputs": check_telesales_eval_outputs,
}
FRAGMENTS = DOND + THREE + SALES + JSON + ['"relevance": 5', '"compliance": 5', '"contact_push": 5',
                                          '"rubric_hits": ["B01"]', '"agent_message": "hi <status=end>"']  # fmt: skip


@FUZZ
@given(texts(FRAGMENTS))
def test_fuzz_every_parser(text):
    """One text, every parser: each a case per example (hypothesis' per-example overhead, ~0.5 ms here, paid once)."""
    for name, check in CHECKS.items():
        seconds = timed(check, text)
        if seconds >= BOUND:  # a busy machine's pause, or a slow parser: a slow one is slow again
            seconds = min(seconds, timed(check, text))
        assert seconds < BOUND, f"{name}: {seconds:.2f} s for {len(text)} characters"


# -- the limits, exactly ------------------------------------------------------------------------------------------


def test_number_limit_exact():
    n = safeparse.MAX_NUMBER_CHARS
    ok, long = "9" * n, "9" * (n + 1)
    assert dond.parse_utterance(f"<try> item0={ok} item1=0 item2=0 <try>") == dond.Action("try", (int(ok), 0, 0))
    assert dond.parse_utterance(f"<try> item0={long} item1=0 item2=0 <try>").kind == "malformed"
    assert three_party.parse_three_party(f"<selection> 0 {ok} 1").alloc == (0, int(ok), 1)
    assert three_party.parse_three_party(f"<selection> 0 {long} 1").kind == "malformed"
    assert safeparse.loads(f'{{"a": [{ok}, -{ok[3:]}.5]}}') == {"a": [int(ok), -float(ok[3:] + ".5")]}
    with pytest.raises(json.JSONDecodeError, match=f"a number of {n + 1} characters"):
        safeparse.loads(f'{{"a": {long}}}')


def test_nesting_limit_exact():
    d = safeparse.MAX_DEPTH
    assert safeparse.loads("[" * d + "]" * d) == json.loads("[" * d + "]" * d)
    assert safeparse.loads('["' + "[" * 5000 + '"]') == ["[" * 5000]  # brackets inside a string do not nest
    with pytest.raises(json.JSONDecodeError, match=f"nested more than {d} levels"):
        safeparse.loads("[" * (d + 1) + "]" * (d + 1))
    with pytest.raises(json.JSONDecodeError, match="nested more than"):
        safeparse.raw_decode('{"a":' * 50_000)


def test_deep_nesting_is_invalid_json_not_a_crash():
    deep = '{"reply": ' * 5000  # json recursed once per level: RecursionError
    assert "nested more than" in telesales.parse_customer_turn(deep).error
    with pytest.raises(Fault, match="nested more than") as fault:
        parse_json_reply("```json\n" + deep + "\n```", lambda obj: obj)
    assert fault.value.kind == "bad_output"
    with pytest.raises(ValueError, match="nested more than"):
        outputs.validate_audit("[" * 5000)
    huge = '{"turns": [], "outcome": ' + "9" * 5000 + ', "reason": ""}'  # int() refused it: ValueError, not a Fault
    with pytest.raises(Fault, match="a number of 5000 characters"):
        parse_json_reply(huge, lambda obj: obj)


@pytest.mark.parametrize(
    "parse, text",
    [
        (telesales.parse_customer_turn, "```" + " " * 3000 + "x"),  # the fence regex: cubic (~9 s before)
        (lambda t: _reply(t, dict), "```json" + "\n" * 3000 + "x"),
        (dond.parse_utterance, "<" + " " * 6000 + "x"),  # the marker regex: quadratic (~6 s before)
        (three_party.parse_three_party, "Deal <" + "\t" * 6000 + "/"),
        (telesales.parse_sales_turn, "<call_function=add_business_contact" + " " * 6000 + "x"),  # (~1 s before)
    ],
    ids=["customer fence", "JSON reply fence", "DoND marker", "three-party marker", "sales marker"],
)
def test_pathological_whitespace_is_read_in_linear_time(parse, text):
    assert timed(parse, text) < 0.2 and timed(parse, text * 2) < 0.2


# -- the accepted language is unchanged ----------------------------------------------------------------------------

OLD_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL | re.IGNORECASE)
OLD_DOND_MARKER = re.compile(r"<\s*(/?)\s*(try|selection|disagree)\s*>", re.IGNORECASE)
OLD_SALES_MARKER = re.compile(r"<\s*(call_function|status)\s*=\s*([A-Za-z_]\w*)\s*(?:\(([^()<>]*)\))?\s*>")
short = st.lists(st.one_of(st.sampled_from(["```", "json", "JSON", "jſon", " ", "\n", "`", "x", "{}"]), st.text(max_size=3)),
                 max_size=8).map("".join)  # fmt: skip


@LANGUAGE
@given(short)
def test_unfence_equals_the_old_regex(text):
    old = m.group(1) if (m := OLD_FENCE.match(text.strip())) else text.strip()
    assert safeparse.unfence(text) == old


def _marks(pattern, text, slash: bool):
    if slash:
        return [(m.span(), bool(m.group(1)), m.group(2)) for m in pattern.finditer(text)]
    return [(m.span(), m.groups()) for m in pattern.finditer(text)]


@LANGUAGE
@given(texts(DOND, longest=120))
def test_dond_marker_equals_the_old_regex(text):
    assert _marks(dond._MARKER, text, True) == _marks(OLD_DOND_MARKER, text, True)


@LANGUAGE
@given(texts(SALES, longest=120))
def test_sales_marker_equals_the_old_regex(text):
    assert _marks(telesales._MARKER, text, False) == _marks(OLD_SALES_MARKER, text, False)


alloc = st.tuples(*[st.integers(0, 10**safeparse.MAX_NUMBER_CHARS - 1)] * 3)
chat = st.text(max_size=20).filter(lambda t: "<" not in t and ">" not in t)


@LANGUAGE
@given(alloc, chat, chat)
def test_dond_round_trip(a, before, after):
    assert dond.parse_utterance(f"{before}{dond.format_try(a)}{after}") == dond.Action("try", a)
    assert dond.parse_utterance(dond.format_selection(a)) == dond.Action("selection", a)


@LANGUAGE
@given(st.permutations(three_party.ROLES3), st.lists(alloc, min_size=3, max_size=3), chat)
def test_three_party_round_trip(order, allocs, before):
    split = dict(zip(order, allocs))
    action = three_party.parse_three_party(before + three_party.format_three_party_try(split))
    assert action.kind == "try" and action.split == split
    assert three_party.parse_three_party(three_party.format_three_party_selection(allocs[0])).alloc == allocs[0]


scores = st.integers(0, 100).map(lambda n: n / 100)


@LANGUAGE
@given(st.sampled_from(telesales.BEHAVIORS[:7]), st.sampled_from(telesales.STAGES), scores, scores,
       st.text(min_size=1, max_size=30).filter(str.strip), st.booleans())  # fmt: skip
def test_customer_round_trip(behavior, stage, w, p, reply, fenced):
    before = {"willingness": w, "patience": p}
    text = telesales.format_customer_turn(behavior, stage, reply, before, {"willingness": 0.1, "patience": -0.2})
    turn = telesales.parse_customer_turn(f"```json\n{text}\n```" if fenced else text, before)
    assert turn.error is None and (turn.behavior, turn.stage, turn.reply) == (behavior, stage, reply.strip())
