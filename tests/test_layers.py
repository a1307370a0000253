"""The house rules for imports: each room may import only the rooms below it, and nothing imports
in a circle. Read from the source with `ast` (module-level imports; `TYPE_CHECKING` blocks and
imports inside functions are not edges), so a violation fails here before it tangles the tree.

The rooms and what each may import are in `RULES` and drawn in docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "probes", "remediation", "native_hooks", "dashboards", "medic_hook")

# room -> the rooms it may import (its own room is always allowed). `agent` alone is the package
# root (it holds only `__version__`), which every room may import.
GROUND = {"agent", "agent.core"}
RULES: dict[str, set[str]] = {
    "agent": set(),
    "medic_hook": set(),
    "dashboards": set(),
    "agent.core": set(),
    "probes.linux": GROUND,
    "native_hooks": GROUND | {"probes.linux", "medic_hook"},
    "probes": GROUND | {"probes.linux", "native_hooks", "medic_hook"},
    "remediation": GROUND | {"probes.linux"},
    "agent.state": GROUND | {"probes.linux"},
    "agent.detect": GROUND | {"agent.state"},
    "agent.series": GROUND | {"agent.detect"},
    "agent.config": GROUND | {"probes", "probes.linux", "remediation", "agent.notify", "agent.detect"},
    "agent.notify": GROUND | {"agent.state", "agent.config", "probes.linux"},
    "agent.watch": GROUND
    | {"agent.config", "agent.state", "probes", "probes.linux", "native_hooks", "medic_hook"},
    "agent.jobs": GROUND
    | {
        "agent.config",
        "agent.state",
        "agent.detect",
        "agent.watch",
        "agent.notify",
        "probes",
        "probes.linux",
        "native_hooks",
        "medic_hook",
        "remediation",
        "agent.series",  # the history job pulls with the offline readers
    },
}
# The top: imported by nobody but the entry point (`agent.cli.main`) and each other as drawn here.
BELOW_TOP = set(RULES) | {"agent.series"}
RULES["agent.api"] = BELOW_TOP | {"dashboards"}
RULES["agent.runtime"] = BELOW_TOP | {"agent.api", "dashboards"}
RULES["agent.demo"] = BELOW_TOP | {"agent.api", "agent.runtime"}
RULES["agent.cli"] = BELOW_TOP | {"agent.api", "agent.runtime", "agent.demo"}
# `medic guardrail`: what agent/jobs may import, and agent/jobs; only agent/cli imports it
RULES["agent.guardrail"] = RULES["agent.jobs"] | {"agent.jobs", "agent.series"}
RULES["agent.cli"] = RULES["agent.cli"] | {"agent.guardrail"}


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def room_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "agent":
        return "agent" if len(parts) == 1 else f"agent.{parts[1]}"
    if parts[0] == "probes" and len(parts) > 1 and parts[1] == "linux":
        return "probes.linux"
    return parts[0]


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(path: Path, known: set[str], root: Path = REPO) -> set[str]:
    """The modules of ours that `path` imports at module level (resolved to modules that exist)."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if not _is_type_checking(node):
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    candidate = f"{target}.{alias.name}"
                    if (root / candidate.replace(".", "/")).with_suffix(".c").exists():
                        continue  # a compiled extension beside the sources: a leaf, not its package
                    if candidate in known:
                        names.add(candidate)
                    else:
                        names.add(target)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    resolved = set()
    for name in names:
        if name.split(".")[0] not in PACKAGES:
            continue
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != here:
            resolved.add(name)
    return resolved


def import_graph() -> dict[str, set[str]]:
    modules = source_modules()
    known = set(modules)
    return {name: imported_modules(path, known) for name, path in modules.items()}


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        room = room_of(module)
        allowed = RULES.get(room)
        if allowed is None:
            found.append(f"{module}: room {room} has no rule in tests/test_layers.py RULES")
            continue
        for target in sorted(targets):
            other = room_of(target)
            if other != room and other not in allowed:
                found.append(f"{module} imports {target}: {room} may not import {other}")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_import_follows_the_room_rules():
    problems = violations(import_graph())
    assert not problems, "\n".join(problems)


def test_no_module_imports_itself_in_a_circle():
    found = cycles(import_graph())
    assert not found, "\n".join(" → ".join(c) for c in found)


@pytest.mark.parametrize(
    ("module", "target", "expected"),
    [
        ("probes.linux.procfs", "agent.state.store", "probes.linux may not import agent.state"),
        ("remediation.engine", "agent.watch.tracker", "remediation may not import agent.watch"),
        ("agent.core.errors", "probes.base", "agent.core may not import probes"),
        ("agent.state.store", "agent.api.app", "agent.state may not import agent.api"),
        ("agent.jobs.detection", "agent.cli.main", "agent.jobs may not import agent.cli"),
    ],
)
def test_a_deliberate_violation_is_caught(module, target, expected):
    graph = import_graph()
    assert module in graph and target in graph
    graph[module] = graph[module] | {target}
    assert any(expected in line for line in violations(graph))


def test_a_deliberate_cycle_is_caught():
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": set()}
    assert cycles(graph) == [["a.x", "a.y", "a.z"]]


def test_type_checking_and_function_level_imports_are_not_edges(tmp_path):
    module = tmp_path / "agent" / "state" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from agent.api.app import App\n"
        "def later():\n    from agent.watch.tracker import Tracker\n"
        "from agent.core.errors import MedicError\n"
        "from agent.core import units\n"
    )
    known = {"agent.api.app", "agent.watch.tracker", "agent.core.errors", "agent.core.units", "agent.state.x"}
    assert imported_modules(module, known, root=tmp_path) == {"agent.core.errors", "agent.core.units"}


def test_the_architecture_doc_lists_every_module_in_its_room():
    """docs/architecture.md names each module by its path; a new module must be placed there too."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for path in sorted(source_modules().values()):
        relative = path.relative_to(REPO).as_posix()
        if path.name == "__init__.py" or "/workloads/" in relative:
            continue
        short = relative.rsplit("/", 1)[-1]
        room = relative.rsplit("/", 1)[0] if "/" in relative else ""
        if f"`{relative}`" not in doc and not (room and f"`{room}/`" in doc and f"`{short}`" in doc):
            missing.append(relative)
    assert not missing, "modules missing from docs/architecture.md: " + ", ".join(missing)
