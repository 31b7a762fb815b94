"""Deal-or-No-Deal scenarios: the Lewis et al. (2017) game rules, a seeded generator and the Lewis file format.

Rules (Lewis et al. 2017, "Deal or No Deal? End-to-End Learning for Negotiation Dialogues"; DESIGN.md §3):
three item types (item0 book, item1 hat, item2 ball), each count 1-4, 5-7 items in total; each agent's private
values are non-negative integers with Σ count·value = 10; no item type is worth 0 to both agents; at least one
type is worth >0 to both; each agent has at most two zero-valued types.

The generator also reproduces the distribution of the original train split (10,095 lines): the total number of
items is 5 / 6 / 7 in ≈41% / 40% / 20% of lines, all 28 valid count vectors occur, and the number of item types
valued by both agents is 1 / 2 / 3 in ≈50% / 43% / 8% of lines.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

N_ITEMS = 3
VALUE_TOTAL = 10  # Σ count·value for every agent
MIN_COUNT, MAX_COUNT = 1, 4
MIN_TOTAL, MAX_TOTAL = 5, 7

# Target marginals of the Lewis train split (DESIGN.md §3); the sampler normalises the weights.
TOTAL_WEIGHTS: dict[int, float] = {5: 0.41, 6: 0.40, 7: 0.20}
OVERLAP_WEIGHTS: dict[int, float] = {1: 0.50, 2: 0.43, 3: 0.08}

NO_DEAL_TOKENS = frozenset({"<disagree>", "<no_agreement>", "<disconnect>"})

Alloc = tuple[int, int, int]


@dataclass(frozen=True)
class DondScenario:
    """One DoND game: item counts and one private value vector per role (index 0 = ``env.roles[0]``)."""

    counts: Alloc
    values: tuple[Alloc, ...]
    uid: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON form ``{"counts": [...], "values": [[...], [...]]}`` (the uid is not part of it)."""
        return {"counts": list(self.counts), "values": [list(v) for v in self.values]}

    @classmethod
    def from_json(cls, obj: dict[str, Any], uid: str = "") -> DondScenario:
        """Inverse of :meth:`to_json`."""
        counts = _triple(obj["counts"], "counts")
        values = tuple(_triple(v, "values") for v in obj["values"])
        return cls(counts=counts, values=values, uid=uid)


def _triple(seq: Any, what: str) -> Alloc:
    items = [int(x) for x in seq]
    if len(items) != N_ITEMS:
        raise ValueError(f"{what} must have {N_ITEMS} entries, got {seq!r}")
    return items[0], items[1], items[2]


def overlap(values_a: Alloc, values_b: Alloc) -> int:
    """Number of item types worth >0 to both agents."""
    return sum(1 for a, b in zip(values_a, values_b, strict=True) if a > 0 and b > 0)


def rule_violations(scenario: DondScenario) -> list[str]:
    """Every Lewis et al. (2017) rule the scenario breaks (empty list: valid two-agent scenario)."""
    problems: list[str] = []
    counts = scenario.counts
    if len(counts) != N_ITEMS:
        return [f"expected {N_ITEMS} counts, got {len(counts)}"]
    if any(not MIN_COUNT <= c <= MAX_COUNT for c in counts):
        problems.append(f"counts {counts} outside {MIN_COUNT}..{MAX_COUNT}")
    if not MIN_TOTAL <= sum(counts) <= MAX_TOTAL:
        problems.append(f"total items {sum(counts)} outside {MIN_TOTAL}..{MAX_TOTAL}")
    if len(scenario.values) != 2:
        return problems + [f"expected 2 value vectors, got {len(scenario.values)}"]
    for i, vals in enumerate(scenario.values):
        if len(vals) != N_ITEMS or any(v < 0 for v in vals):
            problems.append(f"agent {i} values {vals} are not {N_ITEMS} non-negative ints")
            continue
        total = sum(c * v for c, v in zip(counts, vals, strict=True))
        if total != VALUE_TOTAL:
            problems.append(f"agent {i}: Σ count·value = {total} != {VALUE_TOTAL}")
        if sum(1 for v in vals if v == 0) > 2:
            problems.append(f"agent {i} has more than two zero-valued types")
    va, vb = scenario.values
    if any(a == 0 and b == 0 for a, b in zip(va, vb, strict=True)):
        problems.append("an item type is worth 0 to both agents")
    if overlap(va, vb) == 0:
        problems.append("no item type is worth >0 to both agents")
    return problems


def valid_count_vectors(total: int | None = None) -> list[Alloc]:
    """All count vectors with counts 1-4 and 5-7 items in total (28 of them), or those with the given total."""
    out: list[Alloc] = []
    for c in itertools.product(range(MIN_COUNT, MAX_COUNT + 1), repeat=N_ITEMS):
        if MIN_TOTAL <= sum(c) <= MAX_TOTAL and (total is None or sum(c) == total):
            out.append((c[0], c[1], c[2]))
    return out


@cache
def value_vectors(counts: Alloc) -> tuple[Alloc, ...]:
    """All non-negative value vectors with Σ count·value = 10 (at most two zeros holds automatically)."""
    out: list[Alloc] = []
    c0, c1, c2 = counts
    for v0 in range(VALUE_TOTAL // c0 + 1):
        for v1 in range((VALUE_TOTAL - c0 * v0) // c1 + 1):
            rest = VALUE_TOTAL - c0 * v0 - c1 * v1
            if rest % c2 == 0:
                out.append((v0, v1, rest // c2))
    return tuple(out)


@cache
def value_pairs(counts: Alloc, n_overlap: int) -> tuple[tuple[Alloc, Alloc], ...]:
    """All ordered value-vector pairs for ``counts`` that obey the rules and have exactly ``n_overlap`` shared types."""
    vecs = value_vectors(counts)
    return tuple(
        (a, b)
        for a in vecs
        for b in vecs
        if overlap(a, b) == n_overlap and not any(x == 0 and y == 0 for x, y in zip(a, b, strict=True))
    )


def _weighted_choice(rng: random.Random, weights: dict[int, float]) -> int:
    keys = sorted(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys])[0]


def sample_scenario(rng: random.Random, uid: str = "") -> DondScenario:
    """Draw one scenario with the train-split marginals of Lewis et al. (2017).

    Sampler: (1) draw the total number of items from ``TOTAL_WEIGHTS``; (2) draw a count vector uniformly among
    the valid ones with that total (6 / 10 / 12 vectors for 5 / 6 / 7 items, so all 28 occur); (3) draw the
    target number of doubly-valued types from ``OVERLAP_WEIGHTS``; (4) draw an ordered pair of value vectors
    uniformly among all rule-abiding pairs for that count vector with that overlap, found by enumeration. When
    no pair exists for the drawn overlap, step (3) is repeated; with the Lewis rules every one of the 28 count
    vectors admits overlaps 1, 2 and 3, so the redraw is only a safeguard and the overlap marginal is exact.
    The pair is ordered, so both roles have the same value distribution.
    """
    total = _weighted_choice(rng, TOTAL_WEIGHTS)
    counts = rng.choice(valid_count_vectors(total))
    while True:
        pairs = value_pairs(counts, _weighted_choice(rng, OVERLAP_WEIGHTS))
        if pairs:
            break
    va, vb = rng.choice(pairs)
    return DondScenario(counts=counts, values=(va, vb), uid=uid)


def generate_scenarios(n: int, seed: int) -> list[DondScenario]:
    """``n`` reproducible scenarios from ``random.Random(seed)``; uids are ``f"gen-{seed}-{i}"``."""
    rng = random.Random(seed)
    return [sample_scenario(rng, uid=f"gen-{seed}-{i}") for i in range(n)]


# --------------------------------------------------------------------------------------------------------------
# The Lewis et al. (2017) data format, one perspective per line:
# <input> c0 v0 c1 v1 c2 v2 </input> <dialogue> THEM: ... <eos> YOU: ... <eos> THEM: <selection> </dialogue>
# <output> item0=a item1=b item2=c item0=a' item1=b' item2=c' </output> <partner_input> c0 w0 c1 w1 c2 w2 </partner_input>
# The output holds the speaker's own picks then the partner's picks (units received), or six no-deal tokens.

_LEWIS_LINE = re.compile(
    r"^\s*<input>(?P<input>.*?)</input>\s*<dialogue>(?P<dialogue>.*?)</dialogue>\s*"
    r"<output>(?P<output>.*?)</output>\s*<partner_input>(?P<partner>.*?)</partner_input>\s*$"
)
_PICK = re.compile(r"^item([0-2])=(\d+)$")


@dataclass(frozen=True)
class LewisRecord:
    """One parsed line of a Lewis-format file, from the perspective of "YOU"."""

    counts: Alloc
    values: Alloc  # own values
    partner_values: Alloc
    dialogue: str
    output_tokens: tuple[str, ...]  # the six tokens of <output>
    agreed: bool  # the output records picks (not <disagree>/<no_agreement>/<disconnect>)
    own_picks: Alloc | None  # units of each item type "YOU" received; None without agreement
    partner_picks: Alloc | None

    def to_scenario(self, uid: str = "") -> DondScenario:
        """The scenario of this line; role index 0 is "YOU", index 1 is "THEM"."""
        return DondScenario(counts=self.counts, values=(self.values, self.partner_values), uid=uid)


def _parse_input(text: str, what: str) -> tuple[Alloc, Alloc]:
    fields = text.split()
    if len(fields) != 2 * N_ITEMS or not all(f.isdigit() for f in fields):
        raise ValueError(f"{what} must be six non-negative integers 'c0 v0 c1 v1 c2 v2', got {text.strip()!r}")
    nums = [int(f) for f in fields]
    return (nums[0], nums[2], nums[4]), (nums[1], nums[3], nums[5])


def _parse_picks(tokens: list[str]) -> Alloc:
    picks: list[int] = []
    for j, tok in enumerate(tokens):
        m = _PICK.match(tok)
        if m is None or int(m.group(1)) != j:
            raise ValueError(f"expected 'item{j}=N' in <output>, got {tok!r}")
        picks.append(int(m.group(2)))
    return picks[0], picks[1], picks[2]


def parse_lewis_line(line: str) -> LewisRecord:
    """Parse one line of a Lewis et al. (2017) data file; raise ``ValueError`` when it does not fit the format."""
    m = _LEWIS_LINE.match(line)
    if m is None:
        raise ValueError(
            "line is not '<input> .. </input> <dialogue> .. </dialogue> <output> .. </output> "
            "<partner_input> .. </partner_input>'"
        )
    counts, values = _parse_input(m.group("input"), "<input>")
    partner_counts, partner_values = _parse_input(m.group("partner"), "<partner_input>")
    if counts != partner_counts:
        raise ValueError(f"<input> counts {counts} differ from <partner_input> counts {partner_counts}")
    tokens = m.group("output").split()
    if len(tokens) != 2 * N_ITEMS:
        raise ValueError(f"<output> must hold six tokens, got {len(tokens)}")
    if all(t in NO_DEAL_TOKENS for t in tokens):
        agreed, own, partner = False, None, None
    elif any(t in NO_DEAL_TOKENS for t in tokens):
        raise ValueError(f"<output> mixes picks and no-deal tokens: {' '.join(tokens)!r}")
    else:
        agreed, own, partner = True, _parse_picks(tokens[:N_ITEMS]), _parse_picks(tokens[N_ITEMS:])
    return LewisRecord(
        counts=counts,
        values=values,
        partner_values=partner_values,
        dialogue=m.group("dialogue").strip(),
        output_tokens=tuple(tokens),
        agreed=agreed,
        own_picks=own,
        partner_picks=partner,
    )


def load_lewis_file(path: str | Path) -> list[DondScenario]:
    """One scenario per non-blank line of a Lewis-format file (both perspectives of a dialogue are kept).

    uid = ``f"{basename}:{lineno}"`` (1-based line numbers). A bad line raises ``ValueError`` naming it, and so does
    a file that cannot be read as text (missing, a directory, binary).
    """
    path = Path(path)
    scenarios: list[DondScenario] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a text file ({e.reason})") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_lewis_line(line)
        except ValueError as err:
            raise ValueError(f"{path}:{lineno}: {err}") from err
        scenarios.append(record.to_scenario(uid=f"{path.name}:{lineno}"))
    return scenarios
