"""The DoND turn protocol of the paper's Table 17 (Deal-or-No-Deal role prompt, rules 5-8).

* a non-final proposal: ``<try> item0=N item1=N item2=N <try>``;
* a final confirmation: ``<selection> item0=N item1=N item2=N <selection>``;
* ending without a deal: ``<disagree>``;
* anything else is a plain negotiation sentence ("chat").

The numbers are the units received by the SPEAKER; the counterpart receives the rest. Markers may be surrounded
by natural-language text. For leniency the closing marker may also be written ``</try>`` / ``</selection>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from marti_ibrl.safeparse import MAX_NUMBER_CHARS, too_long

Alloc = tuple[int, int, int]
ActionKind = Literal["chat", "try", "selection", "disagree", "malformed"]

# ``< / try >``: whitespace, an optional slash (group 1: "/" or None), whitespace; written so that whitespace before a
# missing slash has one reading only (``\s*(/?)\s*`` is quadratic in it: 12 s for "<" and 8000 spaces)
_MARKER = re.compile(r"<\s*(?:(/)\s*)?(try|selection|disagree)\s*>", re.IGNORECASE)
_BODY = re.compile(r"^\s*item0\s*=\s*(\d+)[\s,;]+item1\s*=\s*(\d+)[\s,;]+item2\s*=\s*(\d+)\s*$")


@dataclass(frozen=True)
class Action:
    """The parsed content of one utterance."""

    kind: ActionKind
    alloc: Alloc | None = None  # the speaker's own units, for "try" and "selection"
    error: str = ""  # why the utterance is malformed


def _malformed(error: str) -> Action:
    return Action(kind="malformed", error=error)


def parse_utterance(text: str) -> Action:
    """Classify one utterance by the Table-17 protocol.

    Malformed: an empty utterance; markers of more than one kind; a ``<try>``/``<selection>`` that is not exactly
    one opening and one closing marker around ``item0=N item1=N item2=N``; a closing ``</disagree>``; a number
    longer than :data:`~marti_ibrl.safeparse.MAX_NUMBER_CHARS` digits.
    """
    if not text or not text.strip():
        return _malformed("empty utterance")
    markers = list(_MARKER.finditer(text))
    if not markers:
        return Action(kind="chat")
    kinds = {m.group(2).lower() for m in markers}
    if len(kinds) > 1:
        return _malformed(f"more than one kind of marker: {sorted(kinds)}")
    kind = kinds.pop()
    if kind == "disagree":
        if any(m.group(1) for m in markers):
            return _malformed("'</disagree>' is not a marker; write '<disagree>'")
        return Action(kind="disagree")
    if len(markers) != 2:
        return _malformed(f"<{kind}> must appear exactly twice (opening and closing), found {len(markers)}")
    opening, closing = markers
    if opening.group(1):
        return _malformed(f"the allocation must open with '<{kind}>'")
    body = _BODY.match(text[opening.end() : closing.start()])
    if body is None:
        return _malformed(f"<{kind}> body must be exactly 'item0=N item1=N item2=N'")
    if long := too_long(*body.groups()):
        return _malformed(f"<{kind}> holds a number of {len(long)} digits (at most {MAX_NUMBER_CHARS})")
    alloc = (int(body.group(1)), int(body.group(2)), int(body.group(3)))
    return Action(kind="try" if kind == "try" else "selection", alloc=alloc)


def format_body(alloc: Alloc) -> str:
    """``item0=N item1=N item2=N``."""
    return f"item0={alloc[0]} item1={alloc[1]} item2={alloc[2]}"


def format_try(alloc: Alloc) -> str:
    """``<try> item0=N item1=N item2=N <try>`` for the speaker's own units."""
    return f"<try> {format_body(alloc)} <try>"


def format_selection(alloc: Alloc) -> str:
    """``<selection> item0=N item1=N item2=N <selection>`` for the speaker's own units."""
    return f"<selection> {format_body(alloc)} <selection>"


DISAGREE = "<disagree>"


def markers_only(text: str) -> str:
    """``text`` without its natural-language part: the protocol marker(s) and what lies between them.

    ``"Deal. <selection> item0=1 item1=0 item2=3 <selection>"`` -> ``"<selection> item0=1 item1=0 item2=3
    <selection>"``; a plain sentence (no marker) is returned unchanged. Parses the same as ``text``.
    """
    markers = list(_MARKER.finditer(text))
    if not markers:
        return text
    return text[markers[0].start() : markers[-1].end()]
