"""The import structure the layout promises, read from the source (nothing imported): no
import cycles between the project's modules, and packages that import each other in one
direction only (`ALLOWED`), so that no package reaches above itself and a server image
needs none of the tooling."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]

# package -> the project's packages its modules may import (its own always), top to bottom.
# The check is on every import, lazy ones inside functions included.
ALLOWED: dict[str, frozenset[str]] = {
    # The app layer: the `avatar` command, server, supervisor, materialisation.
    "serving": frozenset(
        {
            "avatar",
            "model_configs",
            "evals",
            "networks",
            "export",
            "training",
            "clients",
            "gateway",
            "broadcast",
        }
    ),
    # Benchmarks of the served product: they start the server as `avatar serve` does and
    # drive it through the clients and the gateway; their in-process sides run the exported
    # graphs (export's registry and artifacts) and the 2D face. Nothing but tests imports
    # perf, serving included, so it sits beside the app layer, not under it.
    "perf": frozenset(
        {
            "avatar",
            "model_configs",
            "evals",
            "networks",
            "export",
            "clients",
            "gateway",
            "serving",
            "broadcast",
        }
    ),
    # The public edge and the thin clients talk to Triton over the network, never to the
    # tooling. A client may draw the 2D face itself (networks.face2d, torch: optional).
    "gateway": frozenset({"avatar", "evals"}),
    # On air: a chat queue feeding the served `avatar` turns, rendered and encoded on the
    # server. It talks to Triton as the gateway does (its typed client, access rules).
    "broadcast": frozenset({"avatar", "evals", "gateway"}),
    "clients": frozenset({"avatar", "evals", "networks"}),
    # Training makes its data with the exported TTS graph (export.tts.utterances) and its
    # cache; export never imports training: what both need (sentence sets, lipsync labels
    # and scores, the sentence encoder) lives in evals and networks.
    "training": frozenset({"avatar", "evals", "networks", "export"}),
    "export": frozenset({"avatar", "model_configs", "evals", "networks"}),
    # Metrics and data sets (WER, clips, recordings, sentence sets, lipsync scores, results).
    "evals": frozenset({"avatar"}),
    # The repository's config.pbtxt read as Triton's ModelConfig (tritonclient's protobuf):
    # what export, serving and perf read; kept out of the core, which imports no Triton.
    "model_configs": frozenset(),
    # Torch modules; the core's tables name their inputs and outputs.
    "networks": frozenset({"avatar"}),
    # Thin python-backend adapters over the core.
    "model_repository": frozenset({"avatar"}),
    # The runtime core.
    "avatar": frozenset(),
}
# The core is Triton-free: its python-backend side talks to Triton through pb_utils only
# (avatar/triton/), and a config.pbtxt is read as a protobuf in model_configs, not here.
NO_TRITONCLIENT = ("avatar", "evals", "networks", "model_repository")
# Packages that a torch-free image runs (the server's python models, the gateway), and the
# metrics every tool imports.
NO_TORCH = ("avatar", "model_repository", "model_configs", "gateway", "evals", "broadcast")


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _modules() -> dict[str, Path]:
    found = {}
    for package in ALLOWED:
        for path in (ROOT / package).rglob("*.py"):
            found[_dotted(path)] = path
    return found


def _statements(path: Path, dotted: str) -> list[tuple[ast.stmt, str, set[str]]]:
    """Every import statement of a module: (node, module it names, names it may bring)."""
    out = []
    package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node, a.name, {a.name}) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out.append((node, base, {base} | {f"{base}.{a.name}" for a in node.names}))
    return sorted(out, key=lambda statement: statement[0].lineno)


def _imports(path: Path, dotted: str) -> set[str]:
    return {name for _, _, names in _statements(path, dotted) for name in names}


def _graph() -> dict[str, set[str]]:
    modules = {n: p for n, p in _modules().items() if not n.startswith("model_repository")}
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


def test_every_package_has_a_row():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages <= set(ALLOWED), f"add {sorted(packages - set(ALLOWED))} to ALLOWED"


def test_packages_import_downwards_only():
    bad = []
    for name, path in sorted(_modules().items()):
        package = name.split(".")[0]
        for node, module, _ in _statements(path, name):
            top = module.split(".")[0]
            if top == package or top not in ALLOWED or top in ALLOWED[package]:
                continue
            allowed = ", ".join(sorted(ALLOWED[package])) or "nothing of the project"
            statement = " ".join(ast.unparse(node).split())
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {statement}  ({package} may "
                       f"import {allowed}: tests/test_imports.py ALLOWED)")  # fmt: skip
    assert not bad, "\n".join(bad)


def _imported_by(packages: tuple[str, ...], top: str) -> list[str]:
    """`module imports name` for every import of the top-level package `top` in `packages`."""
    return [
        f"{name} imports {imported}"
        for name, path in sorted(_modules().items())
        if name.startswith(packages)
        for imported in _imports(path, name)
        if imported.split(".")[0] == top
    ]


def test_no_torch_where_images_run_without_it():
    bad = _imported_by(NO_TORCH, "torch")
    assert not bad, bad


def test_no_tritonclient_in_the_core():
    bad = _imported_by(NO_TRITONCLIENT, "tritonclient")
    assert not bad, bad
