"""The package's shape (issue 41): no import circles, imports only downward through :data:`LAYERS`, a schema that
depends on nothing, no function over 80 lines, no module over 500 lines but the named data tables.

The import graph is grimp's (import-linter's engine), type-checking imports included: a circle through an
annotation is still one a reader has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "marti_ibrl"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
DATA_TABLES = {"envs/telesales/profiles.py"}
"""Modules over :data:`MAX_MODULE_LINES` because they are mostly data: TeleSales' profile tables (names, cities,
vehicles, needs, concerns, timelines, personalities: Appendix D's generator), not code."""

LAYERS = [
    # what a user runs: the command line and what it dispatches to
    ["marti_ibrl.cli"],
    # an environment's registry entry binds its subcommands, evaluation and play hooks (imported lazily)
    ["marti_ibrl.entries"],
    [
        "marti_ibrl.commands",
        "marti_ibrl.demo",
        "marti_ibrl.serve",
        "marti_ibrl.models",
        "marti_ibrl.patch_export",
        "marti_ibrl.people",
    ],
    # evaluation, then training
    ["marti_ibrl.eval"],
    ["marti_ibrl.trainer", "marti_ibrl.training"],
    # the cluster: OpenRLHF stacks, colocated layouts, the device plan and the layouts that fit (plan --fit)
    [
        "marti_ibrl.backend",
        "marti_ibrl.cluster",
        "marti_ibrl.cluster.colocate",
        "marti_ibrl.cluster.nodes",
        "marti_ibrl.cluster.topology",
        "marti_ibrl.cluster.plan",
        "marti_ibrl.cluster.layouts",
    ],
    ["marti_ibrl.cluster.placement", "marti_ibrl.commit", "marti_ibrl.cluster.phases", "marti_ibrl.sft"],
    # a run's configuration, read and checked against everything below
    ["marti_ibrl.config", "marti_ibrl.cluster.device"],
    ["marti_ibrl.rewards"],
    # the algorithm and the dialogues it learns from
    ["marti_ibrl.algorithm", "marti_ibrl.rollout", "marti_ibrl.lora", "marti_ibrl.tiny"],
    ["marti_ibrl.envs"],
    # leaves: the schema, and helpers that import nothing of the package above them
    [
        "marti_ibrl.config.schema",
        "marti_ibrl.reward_types",
        "marti_ibrl.safeparse",
        "marti_ibrl.llm",
        "marti_ibrl.reply_schema",
        "marti_ibrl.procenv",
        "marti_ibrl.quiet",
        "marti_ibrl.patching",
        "marti_ibrl.outputs",
        "marti_ibrl.checkpoints",
        "marti_ibrl.progress",
        "marti_ibrl.stopping",
    ],
]
"""The package's layers, top to bottom: a module is in the layer of its longest listed prefix, and imports only from
its own layer or below (docs/testing.md, "The package's shape")."""


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("marti_ibrl", exclude_type_checking_imports=False)


def _circles(graph) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iteratively)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_circle_finder_finds_a_circle() -> None:
    class Graph:
        modules = {"a", "b", "c", "d"}
        imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, m):
            return self.imports[m]

    assert _circles(Graph()) == [["a", "b", "c"]]


def test_no_import_circles(graph) -> None:
    """No circle of imports: the schema imports nothing of the package, the cross-section checks sit above the
    environments and rewards, and an environment's :class:`EnvSpec` has its own module, so a ``module:Class`` spec
    needs no registry."""
    assert _circles(graph) == []


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the longest listed prefix of ``module`` (None: unlisted)."""
    best = None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return None if best is None else best[0]


def test_layer_of_takes_the_longest_prefix() -> None:
    assert layer_of("marti_ibrl.entries.dond") == 1 and layer_of("marti_ibrl.envs.dond.game") == 10
    assert layer_of("marti_ibrl.commands.eval") == 2 and layer_of("marti_ibrl.eval.dond.command") == 3
    assert layer_of("marti_ibrl.config.schema") == len(LAYERS) - 1 and layer_of("marti_ibrl.config.load") == 7
    assert layer_of("marti_ibrl") is None and layer_of("marti_ibrl.configx") is None


def test_every_module_has_a_layer_and_imports_only_downward(graph) -> None:
    """A new module gets a layer here; an import from a higher layer means the code lives in the wrong place (or
    the layer list is wrong: say why when moving it)."""
    assert sorted(m for m in graph.modules if m != "marti_ibrl" and layer_of(m) is None) == []
    upward = sorted(
        f"{m} -> {d}"
        for m in graph.modules
        for d in graph.find_modules_directly_imported_by(m)
        if "marti_ibrl" not in (m, d) and layer_of(m) > layer_of(d)
    )
    assert upward == []


def test_the_schema_imports_nothing_of_the_package(graph) -> None:
    """What lets environments, rewards and ablations import the config's types without a circle."""
    assert {m for m in graph.find_modules_directly_imported_by("marti_ibrl.config.schema")} == set()
    below = graph.find_upstream_modules("marti_ibrl.config.validate") - {"marti_ibrl.config.schema"}
    assert not {m for m in below if m == "marti_ibrl.config" or m.startswith("marti_ibrl.config.")}


def test_no_module_over_500_lines_but_the_data_tables() -> None:
    long = {
        path.relative_to(PACKAGE).as_posix(): n
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert set(long) <= DATA_TABLES, {k: v for k, v in long.items() if k not in DATA_TABLES}


def test_no_function_over_80_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


# -- private internals of OpenRLHF, Ray, DeepSpeed: reached only through marti_ibrl/backend/internals.py -------------

ADAPTER = "backend/internals.py"
PUBLIC_DESPITE_THE_NAME = {"os._exit", "_thread"}  # the standard library's documented API


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_accesses(source: str) -> list[str]:
    """Attributes and modules named with one leading underscore that ``source`` reaches on something not its own
    (not ``self``/``cls``, not a class it defines, not ``super()``: a subclass overriding a private method)."""
    import ast

    tree = ast.parse(source)
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)} | {"self", "cls"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            v = node.value
            if (isinstance(v, ast.Name) and v.id in own) or (
                isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super"
            ):
                continue
            if ast.unparse(node) not in PUBLIC_DESPITE_THE_NAME:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module and any(map(_private, node.module.split("."))):
            found.append(f"line {node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name not in PUBLIC_DESPITE_THE_NAME and any(map(_private, a.name.split(".")))
            ]
    return found


def test_private_access_checker_sees_attributes_and_modules_but_not_own_or_overridden():
    src = (
        "from ray._raylet import X\nimport a._b\nclass C(Base):\n    def _f(self):\n        return super()._f()\n"
        "    def g(self, h):\n        C._f(self); self._y; os._exit(1)\n        return h._actor_id\n"
    )
    assert private_accesses(src) == ["line 1: from ray._raylet import", "line 2: import a._b", "line 8: h._actor_id"]


def test_private_internals_are_reached_only_through_the_adapter():
    """Every private access to OpenRLHF, Ray or DeepSpeed is in backend/internals.py, each with the public API it
    lacks: the day one of them changes, the fix is in one module."""
    hits = {
        str(f.relative_to(PACKAGE)): found
        for f in sorted(PACKAGE.rglob("*.py"))
        if str(f.relative_to(PACKAGE)) != ADAPTER and (found := private_accesses(f.read_text()))
    }
    assert hits == {}, f"use marti_ibrl/backend/internals.py (or add the access there, naming the missing API): {hits}"
