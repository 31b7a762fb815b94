"""``marti-ibrl train --help``: every flag of the schema with its default and its documentation, grouped by section,
generated from :mod:`marti_ibrl.config.schema` (the attribute docstrings under each field, read with ``ast``), so the
help can never drift from the schema."""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import MISSING, fields, is_dataclass

from marti_ibrl.config import schema


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of the dataclass ``cls`` (an attribute docstring: a string right after it)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _default(f) -> str:
    if f.default is not MISSING:
        return repr(f.default)
    if f.default_factory is not MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return "(section)" if is_dataclass(value) else repr(value)
    return "(required)"


def _entries(cls: type, prefix: str) -> list[tuple[str, str, str]]:
    docs = field_docs(cls)
    return [(f"--{prefix}{f.name}", _default(f), docs.get(f.name, "")) for f in fields(cls)]


def sections() -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(section title, [(flag, default, documentation)]) for every field a command line may set."""
    out = [("roles (--roleN.*, N = 1, 2, ...: one per role of the environment)", _entries(schema.RoleConfig, "roleN."))]
    for f in fields(schema.Config):
        value = f.default_factory() if f.default_factory is not MISSING else None  # type: ignore[misc]
        if is_dataclass(value):
            out.append((f"{f.name} (--{f.name}.*)", _entries(type(value), f"{f.name}.")))
    top = [(flag, default, doc) for flag, default, doc in _entries(schema.Config, "") if default != "(section)"]
    top = [e for e in top if e[0] != "--roles"]
    if top:
        out.append(("other", top))
    return out


def flags_help(width: int = 100) -> str:
    """Every flag, its default and its documentation, section by section."""
    lines = ["flags (--config FILE.yaml is read first; every flag overrides it):"]
    for title, entries in sections():
        lines.append("")
        lines.append(title)
        for flag, default, doc in entries:
            lines.append(f"  {flag} (default {default})")
            for para in doc.split("\n\n") if doc else []:
                lines += textwrap.wrap(
                    " ".join(para.split()), width, initial_indent="      ", subsequent_indent="      "
                )
    return "\n".join(lines) + "\n"
