"""The paper's Table-17 DoND turn protocol: <try>, <selection>, <disagree>."""

from __future__ import annotations

import pytest

from marti_ibrl.envs.dond.protocol import Action, format_selection, format_try, markers_only, parse_utterance


@pytest.mark.parametrize(
    "text, expected",
    [
        ("I need the books, what do you want?", Action("chat")),
        ("item0=1 item1=2 item2=3 without markers is chat", Action("chat")),
        ("<try> item0=1 item1=2 item2=3 <try>", Action("try", (1, 2, 3))),
        ("How about this? <try> item0=1 item1=0 item2=3 <try> You keep the hats.", Action("try", (1, 0, 3))),
        ("<try>   item0 = 1\titem1=0   item2=3\n<try>", Action("try", (1, 0, 3))),
        ("<try> item0=1 item1=0 item2=3 </try>", Action("try", (1, 0, 3))),
        ("<TRY> item0=1 item1=0 item2=3 <TRY>", Action("try", (1, 0, 3))),
        ("<try> item0=10 item1=0 item2=0 <try>", Action("try", (10, 0, 0))),  # the env checks the counts
        ("Deal! <selection> item0=0 item1=4 item2=0 <selection>", Action("selection", (0, 4, 0))),
        ("< selection >item0=0 item1=4 item2=0< /selection >", Action("selection", (0, 4, 0))),
        ("<disagree>", Action("disagree")),
        ("  Sorry, no deal. <disagree>  ", Action("disagree")),
    ],
)
def test_valid_utterances(text: str, expected: Action) -> None:
    assert parse_utterance(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n\t",
        "<try> item0=1 item1=2 <try>",  # missing item
        "<try> item0=1 item1=2 item2=3",  # no closing marker
        "<try> item0=1 item1=2 item2=3 <try> <try> item0=0 item1=0 item2=0 <try>",  # two proposals
        "<try> item0=one item1=2 item2=3 <try>",
        "<try> item0=-1 item1=2 item2=3 <try>",
        "<try> item1=2 item0=1 item2=3 <try>",  # wrong order
        "<try> I take item0=1 item1=2 item2=3 <try>",  # extra words inside the body
        "</try> item0=1 item1=2 item2=3 <try>",  # wrong opening
        "<try> item0=1 item1=2 item2=3 <try> <selection> item0=1 item1=2 item2=3 <selection>",
        "<selection> item0=1 item1=2 item2=3 <selection> <disagree>",
        "<try> item0=1 item1=2 item2=3 <try> <disagree>",
        "</disagree>",
    ],
)
def test_malformed_utterances(text: str) -> None:
    action = parse_utterance(text)
    assert action.kind == "malformed"
    assert action.alloc is None
    assert action.error


def test_formatters_round_trip() -> None:
    assert format_try((1, 0, 3)) == "<try> item0=1 item1=0 item2=3 <try>"
    assert format_selection((0, 4, 0)) == "<selection> item0=0 item1=4 item2=0 <selection>"
    assert parse_utterance(format_try((2, 3, 4))) == Action("try", (2, 3, 4))
    assert parse_utterance(format_selection((2, 3, 4))) == Action("selection", (2, 3, 4))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Deal. <selection> item0=1 item1=0 item2=3 <selection>", "<selection> item0=1 item1=0 item2=3 <selection>"),
        ("How about this? <try> item0=2 item1=1 item2=0 </try> ok?", "<try> item0=2 item1=1 item2=0 </try>"),
        ("Sorry, no deal. <disagree>", "<disagree>"),
        ("Just chatting.", "Just chatting."),
    ],
)
def test_markers_only_keeps_the_move(text: str, expected: str) -> None:
    assert markers_only(text) == expected
    assert parse_utterance(markers_only(text)) == parse_utterance(text)
