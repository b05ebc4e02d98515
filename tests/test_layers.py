"""The house as drawn: imports flow tools -> environments -> grpo -> launch / bench, without
circles, and no module or test file grows past 450 lines (what import-linter checks in larger codebases)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = {"tools": 0, "environments": 1, "grpo": 2, "launch": 3, "bench": 3}
"""A package may import its own layer and lower ones; launch and bench are entry points that
nothing imports (not even each other)."""
MAX_LINES = 450


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in LAYERS for p in (REPO / top).rglob("*.py")}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside `if TYPE_CHECKING:` blocks (no runtime import)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports at run time (module level or inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import name` imports pkg.name when that is a module, else pkg itself.
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                     for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in LAYERS and n in modules)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _against_layers(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, imported in graph.items():
        top = module.split(".")[0]
        for target in imported:
            target_top = target.split(".")[0]
            entry_point = target_top in ("launch", "bench") and target_top != top
            if LAYERS[target_top] > LAYERS[top] or entry_point:
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def test_imports_never_go_up_a_layer_or_into_entry_points():
    wrong = _against_layers(_graph())
    assert not wrong, "imports against the layering:\n  " + "\n  ".join(wrong)


def test_the_layer_check_catches_upward_and_entry_point_imports():
    graph = {"tools.a": {"environments.b"}, "environments.b": {"tools.a"}, "grpo.c": {"launch.d"},
             "launch.d": {"grpo.c", "bench.e"}, "bench.e": {"bench.f"}}
    assert _against_layers(graph) == ["grpo.c -> launch.d", "launch.d -> bench.e", "tools.a -> environments.b"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_or_test_file_is_over_450_lines():
    paths = [*_modules().values(), *(REPO / "tests").rglob("*.py")]
    long = {str(path.relative_to(REPO)): n for path in paths
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}
