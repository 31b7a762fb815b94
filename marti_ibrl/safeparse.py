"""Bounds shared by every parser of text a model wrote (a counterpart's turn, an endpoint's or a judge's JSON reply).

Such text is untrusted: it may be arbitrarily long or strange, and no reply may crash a run or take more than linear
time to read. The parsers (:mod:`marti_ibrl.envs.dond.protocol`, :mod:`~marti_ibrl.envs.dond.three_party`,
:mod:`~marti_ibrl.envs.telesales.protocol`, :func:`marti_ibrl.llm.parse_json_reply`,
:mod:`marti_ibrl.eval.telesales.outputs`) take their limits from here:

* numbers: at most :data:`MAX_NUMBER_CHARS` characters (``int()`` raises ``ValueError`` past 4300 digits, and is
  quadratic below that) — :func:`too_long`;
* JSON: nesting at most :data:`MAX_DEPTH` levels (``json`` recurses once per level: ``RecursionError`` at ~1000),
  numbers as above — :func:`loads` and :func:`raw_decode` raise ``json.JSONDecodeError`` naming the limit;
* one markdown fence around a reply (```json ... ```) is removed without a regex (:func:`unfence`; the regex it
  replaces, ``^```(?:json)?\\s*(.*?)\\s*```$``, was cubic in the whitespace: 167 s for 8000 spaces).

Valid replies are read exactly as before: the limits are far above anything a turn or a verdict holds.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_NUMBER_CHARS = 100
"""The longest number (its characters: digits, sign, point, exponent) a parser reads; a longer one is malformed."""
MAX_DEPTH = 100
"""The deepest nesting of JSON arrays and objects a parser reads (every reply schema here is at most 4 deep)."""

_FENCE = "```"
_JSON_TAG = re.compile("json", re.IGNORECASE)  # the fence's optional language tag, matched as the old regex did
# a JSON string (to the end of the text when unterminated: this never backtracks) or one bracket
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def too_long(*numbers: str) -> str | None:
    """The first of ``numbers`` (a parser's digit strings) longer than :data:`MAX_NUMBER_CHARS`, or None."""
    return next((n for n in numbers if len(n) > MAX_NUMBER_CHARS), None)


def unfence(text: str) -> str:
    """``text`` stripped, and the body of one markdown fence around it (```` ```json ... ``` ````, the tag optional
    and case-insensitive) when it is one; linear time. Equal to the regex of the module doc on every input."""
    text = text.strip()
    if len(text) < 2 * len(_FENCE) or not (text.startswith(_FENCE) and text.endswith(_FENCE)):
        return text
    inner = text[len(_FENCE) : -len(_FENCE)]
    if _JSON_TAG.match(inner):
        inner = inner[4:]
    return inner.strip()


def too_deep(body: str) -> bool:
    """Whether the bracket nesting of ``body`` outside JSON strings (its JSON nesting, when it is JSON) exceeds
    :data:`MAX_DEPTH`; linear, and it stops at the first level too deep."""
    if body.count("[") + body.count("{") <= MAX_DEPTH:  # the usual reply: too few brackets to be too deep
        return False
    level = 0
    for m in _TOKEN.finditer(body):
        c = m.group()
        if c in "[{":
            level += 1
            if level > MAX_DEPTH:
                return True
        elif c in "]}":
            level -= 1
    return False


class _NumberTooLong(ValueError):
    def __init__(self, number: str) -> None:
        super().__init__(number)
        self.number = number


def _number(convert):
    def parse(token: str):
        if len(token) > MAX_NUMBER_CHARS:
            raise _NumberTooLong(token)
        return convert(token)

    return parse


_DECODER = json.JSONDecoder(parse_int=_number(int), parse_float=_number(float))


def _bounded(decode, body: str):
    if too_deep(body):
        raise json.JSONDecodeError(f"nested more than {MAX_DEPTH} levels deep", body, 0)
    try:
        return decode(body)
    except _NumberTooLong as e:
        where = max(0, body.find(e.number))
        raise json.JSONDecodeError(
            f"a number of {len(e.number)} characters (at most {MAX_NUMBER_CHARS})", body, where
        ) from None


def loads(body: str) -> Any:
    """``json.loads(body)`` within the limits of the module doc (``json.JSONDecodeError`` past them)."""
    return _bounded(_DECODER.decode, body)


def raw_decode(body: str) -> tuple[Any, int]:
    """``json.JSONDecoder().raw_decode(body)`` (the first JSON value, where it ends) within the limits."""
    return _bounded(_DECODER.raw_decode, body)
