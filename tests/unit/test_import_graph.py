"""No import circles in edgespec/ and export/: the modules' import graph, read from the source with ``ast``, is
acyclic. Imports inside functions count too (a lazy import placed to dodge a circle still ties the two modules),
and so does importing the package itself (``import edgespec``, ``from .. import load``): a module the package's
``__init__`` imports must not import the package back. Importing ``edgespec.x`` also runs ``edgespec/__init__``;
that implicit edge is not one a module writes, so it is not counted."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name → (its file, whether it is a package's ``__init__``). The top-level export/ folder is
    ``edgespec.export`` (edgespec/export/__init__.py only maps it there)."""
    modules = {}
    for folder, prefix in ((ROOT / "edgespec", ("edgespec",)), (ROOT / "export", ("edgespec", "export"))):
        for path in folder.rglob("*.py"):
            parts = (*prefix, *path.relative_to(folder).with_suffix("").parts)
            if parts[:2] == ("edgespec", "export") and folder.name == "edgespec":
                continue  # the stub
            package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if package else parts)] = (path, package)
    return modules


def _imported(node: ast.Import | ast.ImportFrom, name: str, package: bool) -> list[str]:
    """The module names an import statement of module ``name`` names (a ``from X import y`` names X.y too, in case
    y is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = name.split(".") if package else name.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    return [module, *(f"{module}.{alias.name}" for alias in node.names)]


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            named = _imported(node, name, package)
            # `from pkg import sub` imports pkg.sub; `from pkg import name` imports pkg
            found = [m for m in named[1:] if m in modules] if isinstance(node, ast.ImportFrom) else []
            if not found or len(found) < len(named) - 1:
                found.append(named[0])
            for target in found:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as the path that closes it (a → b → … → a), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycles_in_edgespec_and_export() -> None:
    graph = import_graph()
    assert len(graph) > 80 and "edgespec.export.gguf.hf" in graph and "edgespec.tuning.race" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_the_graph_sees_lazy_imports_and_imports_of_the_package() -> None:
    """What the check counts, on the edges the issue named (now broken the right way round)."""
    graph = import_graph()
    assert "edgespec.tuning.race" in graph["edgespec.tuning.default"]  # top level
    assert "edgespec.export.onnx.graphs" in graph["edgespec.tuning.race"]  # inside a function
    assert "edgespec" in graph["edgespec.server.pool"]  # `from .. import load`
    assert "edgespec.export.gguf.ggufio" in graph["edgespec.export.gguf.hf"]
    assert "edgespec.catalog.discovery" in graph["edgespec.catalog.models"]
    discovery, models = "edgespec.catalog.discovery", "edgespec.catalog.models"
    cycle = find_cycle({**graph, discovery: {models}})  # the circle as it was
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {discovery, models}


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_decode_loop_depends_on_no_catalog_server_cli_or_exporter() -> None:
    """The arrows run one way: the engine, the drafters and the γ controller reach a backend's contract and the
    stored measurements, never model discovery (Ollama and LM Studio scanning), the server, the command line
    or the exporter. The package's ``__init__`` (``load``) is where the parts meet, so it is not followed."""
    graph = import_graph()
    graph = {name: edges - {"edgespec"} for name, edges in graph.items()}
    loop = [m for m in graph if m.split(".")[:2] in (["edgespec", "engine"], ["edgespec", "drafters"],
                                                      ["edgespec", "controller"])]
    assert "edgespec.engine.engine" in loop and "edgespec.drafters.proposal" in loop
    far = ("edgespec.catalog", "edgespec.server", "edgespec.cli", "edgespec.export", "edgespec.bench",
           "edgespec.tuning.race", "edgespec.tuning.default")
    for module in loop:
        wrong = sorted(m for m in _reach(graph, module) if m.startswith(far))
        assert not wrong, f"{module} reaches {wrong}"
