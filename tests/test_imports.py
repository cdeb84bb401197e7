"""The import structure the layout promises, read from the source (nothing imported):
no import cycles between the project's modules, and a runtime core (`avatar`, but for
its serving entry points) that imports neither the tooling (`export`, `training`,
`clients`, `perf`) nor torch, so that a server image needs none of them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("avatar", "export", "training", "networks", "clients", "perf", "gateway")
TOOLING = ("export", "training", "networks", "clients", "perf", "gateway", "torch")
ENTRY_POINTS = ("serving", "avatar.__main__")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, dotted: str) -> set[str]:
    names: set[str] = set()
    package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {m for m in _imports(path, name) if m in modules and not name.startswith(m + ".")}
        for name, path in modules.items()
    }


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_runtime_core_imports_no_tooling_and_no_torch():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        if not name.startswith("avatar") or name.startswith(ENTRY_POINTS):
            continue
        for imported in _imports(path, name):
            if imported.split(".")[0] in TOOLING:
                bad.append(f"{name} imports {imported}")
    assert not bad, bad
