"""The house rules for imports: each room may import only the rooms below it, and nothing imports
in a circle. Read from the source with `ast`: every import counts, at module level, in a
`TYPE_CHECKING` block or inside a function (a circle of types or of late imports is a circle all the
same), so a violation fails here before it tangles the tree. An import inside a function is allowed
only where `LAZY` names it with its reason.

The rooms and what each may import are in `RULES` and drawn in docs/architecture.md.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
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
    # agent/detect: the records and tests every detector shares at the top, three rooms inside it
    "agent.detect": GROUND,
    "agent.detect.memory": GROUND | {"agent.detect"},
    "agent.detect.slow": GROUND | {"agent.detect"},
    "agent.detect.explain": GROUND | {"agent.detect", "agent.state"},
    "agent.series": GROUND | {"agent.detect", "agent.detect.slow"},
    "agent.config": GROUND
    | {"probes", "probes.linux", "remediation", "agent.notify", "agent.detect", "agent.detect.slow"},
    "agent.notify": GROUND | {"agent.state", "agent.config", "probes.linux"},
    "agent.watch": GROUND
    | {"agent.config", "agent.state", "probes", "probes.linux", "native_hooks", "medic_hook"},
    "agent.jobs": GROUND
    | {
        "agent.config",
        "agent.state",
        "agent.detect",
        "agent.detect.memory",
        "agent.detect.slow",
        "agent.detect.explain",
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

# A package whose `__init__.py` names the entry points of a room inside it, with why; the package's
# other modules keep its own rule.
ENTRANCES: dict[str, tuple[set[str], str]] = {
    "agent.detect": (
        {"agent.detect.memory"},
        "`from agent.detect import evaluate, analyze`: memory's engine is the detectors' front door",
    ),
}

# The imports that may wait inside a function, as (importer, imported) module prefixes, each with its
# reason. Any other import belongs at the top of its module, where a reader (and this test) sees it.
LAZY: list[tuple[str, str, str]] = [
    ("agent.cli", "", "start-up speed: `medic status` loads only what its subcommand runs"),
    ("medic_hook", "medic_hook", "runs inside targets: a part loads only when the target asks for it"),
    ("agent.demo.server", "medic_hook", "the demo server hooks itself only when started with a hook socket"),
    (
        "agent.demo.workload",
        "medic_hook",
        "the demo workload hooks itself only when started with a hook socket",
    ),
    ("probes.canary", "probes.scrape", "httpx loads with the first canary (none by default)"),
    (
        "probes.latency",
        "probes.scrape",
        "httpx loads with the first scrape: no latency target, no httpx in RSS",
    ),
    ("agent.jobs.warmup", "probes.scrape", "httpx loads with the first warm-up, not with the agent"),
    (
        "probes.latency_source",
        "probes.promtext",
        "the exposition parser loads with the first scrape: no latency target, no parser in RSS",
    ),
    ("agent.api.histograms", "probes.jcmd", "loaded by the first JVM histogram diff: no JVM, no jcmd"),
    (
        "native_hooks.doctor",
        "native_hooks.shim",
        "an unbuilt shim is a finding of the doctor, not an import error",
    ),
    ("native_hooks.doctor", "native_hooks.client", "the hook client loads only when there is a hook to ask"),
    ("remediation.coordinator", "remediation.coordinator.etcd_security", "TLS material for etcd only"),
]


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
        if len(parts) == 1:
            return "agent"
        room = f"agent.{parts[1]}"
        inner = f"{room}.{parts[2]}" if len(parts) > 2 else ""
        return inner if inner in RULES else room  # a room inside a room (agent/detect/memory/)
    if parts[0] == "probes" and len(parts) > 1 and parts[1] == "linux":
        return "probes.linux"
    return parts[0]


def _statements(body: list[ast.stmt], in_function: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement under `body` (in `if`, `try`, `with`, classes and functions too), and
    whether it runs inside a function."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, in_function
            continue
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _statements([child], inside)
            elif isinstance(child, ast.excepthandler) or (
                hasattr(child, "body") and isinstance(child.body, list)
            ):
                yield from _statements(child.body, inside)


def imports(path: Path, known: set[str], root: Path = REPO) -> dict[str, bool]:
    """The modules of ours that `path` imports (resolved to modules that exist), each with whether
    every import of it waits inside a function."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: dict[str, bool] = {}
    for node, lazy in _statements(ast.parse(path.read_text(encoding="utf-8")).body):
        names: set[str] = set()
        if isinstance(node, ast.Import):
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
                names.add(candidate if candidate in known else target)
        for name in names:
            if name.split(".")[0] not in PACKAGES:
                continue
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != here:
                found[name] = found.get(name, True) and lazy
    return found


def imported_modules(path: Path, known: set[str], root: Path = REPO) -> set[str]:
    """The modules of ours that `path` imports, wherever the import stands."""
    return set(imports(path, known, root))


def import_graph() -> dict[str, set[str]]:
    modules = source_modules()
    known = set(modules)
    return {name: imported_modules(path, known) for name, path in modules.items()}


def _within(module: str, prefix: str) -> bool:
    return not prefix or module == prefix or module.startswith(prefix + ".")


def unlisted_lazy_imports() -> list[str]:
    """Imports inside functions that `LAZY` does not name."""
    modules = source_modules()
    known = set(modules)
    found = []
    for name, path in sorted(modules.items()):
        for target, lazy in sorted(imports(path, known).items()):
            if lazy and not any(_within(name, a) and _within(target, b) for a, b, _ in LAZY):
                found.append(
                    f"{name} imports {target} inside a function: move it to the top, or name it in LAZY"
                )
    return found


def circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One import circle through the component's first module, as a path that returns to it."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph.get(node, set()) & members):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    return component


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        room = room_of(module)
        allowed = RULES.get(room)
        if allowed is None:
            found.append(f"{module}: room {room} has no rule in tests/test_layers.py RULES")
            continue
        allowed = allowed | ENTRANCES.get(module, (set(), ""))[0]
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
    graph = import_graph()
    found = cycles(graph)
    assert not found, "\n".join(" → ".join(circle(graph, c)) for c in found)


def test_an_import_waits_inside_a_function_only_where_lazy_names_it():
    problems = unlisted_lazy_imports()
    assert not problems, "\n".join(problems)


def test_every_lazy_import_is_still_made_and_says_why():
    """A `LAZY` line that matches nothing any more is deleted, not kept for later."""
    modules = source_modules()
    known = set(modules)
    lazy = {(n, t) for n, p in modules.items() for t, late in imports(p, known).items() if late}
    for importer, imported, reason in LAZY:
        assert reason, (importer, imported)
        assert any(_within(n, importer) and _within(t, imported) for n, t in lazy), (importer, imported)


def test_every_entrance_is_still_made_and_says_why():
    """An `ENTRANCES` line whose package no longer imports that room is deleted, not kept for later."""
    graph = import_graph()
    for package, (rooms, reason) in ENTRANCES.items():
        assert reason, package
        for room in rooms:
            assert any(room_of(target) == room for target in graph[package]), (package, room)


@pytest.mark.parametrize(
    ("module", "target", "expected"),
    [
        ("probes.linux.procfs", "agent.state.store", "probes.linux may not import agent.state"),
        ("remediation.engine", "agent.watch.tracker", "remediation may not import agent.watch"),
        ("agent.core.errors", "probes.base", "agent.core may not import probes"),
        ("agent.state.store", "agent.api.app", "agent.state may not import agent.api"),
        ("agent.jobs.detection", "agent.cli.main", "agent.jobs may not import agent.cli"),
        (
            "agent.detect.model",
            "agent.detect.memory.engine",
            "agent.detect may not import agent.detect.memory",
        ),
        (
            "agent.detect.memory.leak",
            "agent.detect.slow.rules",
            "agent.detect.memory may not import agent.detect.slow",
        ),
        (
            "agent.detect.slow.replay",
            "agent.detect.memory.engine",
            "agent.detect.slow may not import agent.detect.memory",
        ),
        (
            "agent.detect.explain.suspects",
            "agent.detect.memory.fit",
            "agent.detect.explain may not import agent.detect.memory",
        ),
        ("agent.detect.memory.oom", "agent.state.store", "agent.detect.memory may not import agent.state"),
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
    assert circle(graph, ["a.x", "a.y", "a.z"]) == ["a.x", "a.y", "a.z", "a.x"]


def test_type_checking_and_function_level_imports_are_edges(tmp_path):
    module = tmp_path / "agent" / "state" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from agent.api.app import App\n"
        "def later():\n    from agent.watch.tracker import Tracker\n"
        "class Held:\n    def method(self):\n        import agent.state.y\n"
        "from agent.core.errors import MedicError\n"
        "from agent.core import units\n"
    )
    known = {
        "agent.api.app",
        "agent.watch.tracker",
        "agent.core.errors",
        "agent.core.units",
        "agent.state.x",
        "agent.state.y",
    }
    assert imports(module, known, root=tmp_path) == {
        "agent.api.app": False,
        "agent.watch.tracker": True,
        "agent.state.y": True,
        "agent.core.errors": False,
        "agent.core.units": False,
    }


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
