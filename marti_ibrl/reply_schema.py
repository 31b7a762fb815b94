"""The JSON schemas of LLM replies, sent as strict structured outputs by :class:`marti_ibrl.llm.AsyncChatClient`
(its module doc says how an endpoint that refuses them is handled): :class:`ReplySchema` and the few builders the
judges' and the simulator's reply types are written with. Strict mode wants every object closed and every property
required; "non-empty" and the like are left to the validators that check every reply either way."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ReplySchema:
    """The JSON schema of one reply type, sent as strict structured outputs (module doc). ``name``: 1-64 letters,
    digits, ``_`` or ``-`` (OpenAI's rule); ``schema``: an object schema (strict mode wants an object at the root)."""

    name: str
    schema: Mapping[str, Any]

    def __post_init__(self) -> None:
        if not _SCHEMA_NAME.match(self.name):
            raise ValueError(f"a reply schema name is 1-64 letters, digits, _ or -, got {self.name!r}")
        if self.schema.get("type") != "object":
            raise ValueError(f"reply schema {self.name!r}: the root must be an object schema")

    def response_format(self) -> dict[str, Any]:
        """The request's ``response_format`` field."""
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": dict(self.schema), "strict": True}}


TEXT: dict[str, Any] = {"type": "string"}
"""Any string: "non-empty" is left to the validators (no ``pattern`` / ``minLength``, module doc)."""


def closed_object(properties: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """An object with exactly ``properties``, every one required (strict mode needs both), in this order."""
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(properties),
        "additionalProperties": False,
    }


def one_of(values: Sequence[Any], kind: str = "string") -> dict[str, Any]:
    """A ``kind`` value among ``values``."""
    return {"type": kind, "enum": list(values)}


def number_in(low: float, high: float, kind: str = "number") -> dict[str, Any]:
    """A number (or ``kind="integer"``) in ``[low, high]``."""
    return {"type": kind, "minimum": low, "maximum": high}


def list_of(items: Mapping[str, Any], min_items: int = 0, max_items: int | None = None) -> dict[str, Any]:
    """An array of ``items``, ``min_items`` to ``max_items`` long (no upper bound when ``None``)."""
    schema: dict[str, Any] = {"type": "array", "items": dict(items)}
    if min_items:
        schema["minItems"] = min_items
    if max_items is not None:
        schema["maxItems"] = max_items
    return schema
