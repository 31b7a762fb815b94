"""DoND role prompts: the paper's Table 17 ("Deal-or-No-Deal role prompt") and a compact variant.

``paper`` reproduces Table 17 with its LaTeX/markdown escapes removed; ``{your_input}`` is the Lewis input
"c0 v0 c1 v1 c2 v2" and ``{parsed_input}`` its plain-English reading. ``compact`` (≤ 60 words) keeps the same
private input and protocol for tiny models trained from scratch.
"""

from __future__ import annotations

from marti_ibrl.envs.dond.scenarios import DondScenario

PAPER_TEMPLATE = """\
You are playing the Deal-or-No-Deal negotiation game as one participant in a two-player negotiation. \
Refer to your side as yourself and the other side as the other participant.

Private input.
<input> {your_input} </input>
{parsed_input}
There are three item types: item0, item1, and item2. The private input always has six numbers in this order: \
count0 value0 count1 value1 count2 value2. Thus, item0 has count0 units, each worth value0 points to yourself, \
and analogously for item1 and item2. Only the count fields are quantities; the value fields are point values, \
not quantities or item names.

Reward.
Reward is determined solely by the points received from the items allocated to yourself. The other \
participant's score does not affect the role's reward, and the role is not rewarded for total welfare: \
score = n0*value0 + n1*value1 + n2*value2, where nj is the number of units of itemj received by this role. \
The goal is to maximize this score while ensuring that a deal is reached. A moderate-score agreement is \
preferable to no deal, which yields zero.

Negotiation strategy.
Prioritize high-value items; open with a reasonable but favorable offer; evaluate counteroffers by your own \
score while remaining at the table; concede low-value items strategically; infer the counterpart's preferences \
only from its utterances; compromise when progress stalls; and use no-deal only after repeated negotiation \
attempts have failed or the other participant's demands leave essentially no value.

Operational rules.
1. Use only your own private input and prior chat messages. The other participant's private values are never \
visible.
2. Infer the other participant's preferences only from what it says. Generate only your own next turn and never \
generate the counterpart's response.
3. Keep the utterance natural, concise, and negotiation-like. You may ask a question, make an offer, accept, or \
compromise. Avoid ending the negotiation while a counteroffer remains possible.
4. Use item0, item1, and item2 exactly as the item names; do not call values or counts item types.
5. A non-final proposal must include a concrete allocation in exactly the form \
<try> item0=N item1=N item2=N <try>. The numbers specify the units received by your side; the counterpart \
receives the remaining units.
6. A final agreement is valid only when every item has a concrete allocation and both participants confirm the \
same deal. A complete valid dialogue contains at least one <try> allocation and two matching <selection> \
confirmations, one from each participant.
7. Output <selection> item0=N item1=N item2=N <selection> only after the allocation is explicit, both sides \
have agreed, and all three values are valid non-negative integers. The numbers again denote the units received \
by your side.
8. If both participants explicitly agree that no deal is possible, repeated attempts fail, or the proposed final \
allocation is impossible, output exactly <disagree>.
9. If the counterpart's proposal is merely unfavorable, do not immediately output no-deal; make a counteroffer.
10. Otherwise, output one concise negotiation sentence. If it proposes a concrete allocation, include the \
required <try> allocation.

Generate only your own next turn."""

COMPACT_TEMPLATE = """\
Your input: <input> {your_input} </input> ({parsed_input}). Split the items with the other \
player. Your score: your units times your values; no deal scores 0. N = your units. \
Offer: <try> item0=N item1=N item2=N <try>. Accept: <selection> item0=N item1=N item2=N <selection>. \
Quit: <disagree>."""


def lewis_input(scenario: DondScenario, role_index: int) -> str:
    """The Lewis et al. (2017) private input "c0 v0 c1 v1 c2 v2" of role ``role_index``."""
    values = scenario.values[role_index]
    return " ".join(f"{c} {v}" for c, v in zip(scenario.counts, values, strict=True))


def parsed_input(scenario: DondScenario, role_index: int) -> str:
    """Plain-English reading, e.g. "item0: 3 units, each worth 1 point to you; item1: ..."."""
    values = scenario.values[role_index]
    parts = []
    for j, (c, v) in enumerate(zip(scenario.counts, values, strict=True)):
        units = "unit" if c == 1 else "units"
        each = "worth" if c == 1 else "each worth"
        points = "point" if v == 1 else "points"
        parts.append(f"item{j}: {c} {units}, {each} {v} {points} to you")
    return "; ".join(parts) + "."


def _compact_parse(scenario: DondScenario, role_index: int) -> str:
    values = scenario.values[role_index]
    return ", ".join(f"item{j}: {c} worth {v}" for j, (c, v) in enumerate(zip(scenario.counts, values, strict=True)))


def role_prompt(scenario: DondScenario, role_index: int, style: str = "paper") -> str:
    """The system prompt of role ``role_index`` for ``scenario`` in the given style ("paper" or "compact")."""
    if not 0 <= role_index < len(scenario.values):
        raise ValueError(f"role_index {role_index} out of range for {len(scenario.values)} roles")
    if style == "paper":
        return PAPER_TEMPLATE.format(
            your_input=lewis_input(scenario, role_index), parsed_input=parsed_input(scenario, role_index)
        )
    if style == "compact":
        return COMPACT_TEMPLATE.format(
            your_input=lewis_input(scenario, role_index), parsed_input=_compact_parse(scenario, role_index)
        )
    raise ValueError(f"unknown prompt style {style!r}; use 'paper' or 'compact'")
