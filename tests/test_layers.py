"""The house as drawn: imports flow tools -> environments -> grpo -> launch / bench, without
circles; no module or test file grows past 450 lines (what import-linter checks in larger
codebases); no module reaches into another package's private names; no dates in the library."""

from __future__ import annotations

import ast
import io
import re
import tokenize
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


PRIVATE_ALLOWED = {
    "_attn_implementation": "transformers keeps a loaded model's attention choice only on its config "
                            "(set_attn_implementation sets it; nothing public reads it)",
    "_forward_hooks": "torch keeps a module's forward hooks only there (the lean forward must know "
                      "whether it would skip one; the embedding-gradient hook removes its own)",
    "_forward_pre_hooks": "torch keeps a module's forward pre-hooks only there (as _forward_hooks)",
    "_forward_hooks_with_kwargs": "torch's bookkeeping of a hook's kind, cleared with the hook",
    "_forward_hooks_always_called": "torch's bookkeeping of a hook's kind, cleared with the hook",
    "_global_forward_hooks": "torch's registry of global forward hooks (no public reader)",
    "_global_forward_pre_hooks": "torch's registry of global forward pre-hooks (no public reader)",
    "_reorder_linear_weight": "torch.ops.mkldnn: oneDNN's weight packing has no public Python API",
    "_linear_pointwise": "torch.ops.mkldnn: the product with a oneDNN-packed weight",
    "_mkl_reorder_linear_weight": "torch.ops.mkl: MKL's sgemm weight packing has no public Python API",
    "_mkl_linear": "torch.ops.mkl: the product with an MKL-packed weight",
    "_softmax": "torch.ops.aten: the softmax whose backward takes the output alone",
    "_softmax_backward_data": "torch.ops.aten: that softmax's backward from its output",
    "_C": "torch's C extension, for the storage use count below",
    "_storage_Use_Count": "torch has no public count of a storage's users",
    "_cdata": "a storage's handle, the argument of that count",
    "_use_count": "torch.Tensor has no public count of its storage's users",
    "_inductor": "torch.compile's inductor config (a bench sets freezing for one compile)",
    "_Environ": "the type of os.environ (what a mapping of the environment is)",
    "_exit": "os._exit: a forked sandbox child ends without the parent's cleanup",
    "_load_scenario": "BFCL's tool classes load a scenario only through it",
}
"""Private attributes of other libraries that this project reads, each with the reason it has no
public form. Any other `obj._name` must be the reaching module's own package's."""
DATED = re.compile(
    r"\b(19|20)\d\d-[01]\d-[0-3]\d\b"
    r"|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?\s+(\d{1,2},?\s+)?(19|20)\d\d\b"
)
"""A date (2026-11-22, November 2026, Nov 22, 2026): measurements with dates belong in generated
reports and commit messages, not in the library."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _package(module: str, modules: dict[str, Path]) -> str:
    """The package a module belongs to (a package's __init__ is its package)."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def _private_definitions(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Private names by the packages that define them: functions, classes, module or class
    variables, and attributes a class sets on `self` or `cls`."""
    defined: dict[str, set[str]] = {}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names = [node.attr] if getattr(node.value, "id", None) in ("self", "cls") else []
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in filter(_private, names):
                defined.setdefault(name, set()).add(_package(module, modules))
    return defined


def _private_reaches(module: str, source: str, modules: dict[str, Path],
                     defined: dict[str, set[str]]) -> list[str]:
    """`module`'s reaches into private names of another package of this project (by import or
    attribute), and into other libraries' private names that PRIVATE_ALLOWED does not name."""
    package, found = _package(module, modules), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            owner = _package(node.module, modules)
            found += [f"{module}:{node.lineno} imports {node.module}.{a.name}"
                      for a in node.names if _private(a.name) and owner != package]
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        value = node.value
        if getattr(value, "id", None) in ("self", "cls") or getattr(getattr(value, "func", None), "id", None) == "super":
            continue
        owners = defined.get(node.attr)
        if owners and package not in owners:
            found.append(f"{module}:{node.lineno} reaches {ast.unparse(node)} ({', '.join(sorted(owners))})")
        elif not owners and node.attr not in PRIVATE_ALLOWED:
            found.append(f"{module}:{node.lineno} reaches {ast.unparse(node)} (another library's: "
                         "name it in PRIVATE_ALLOWED with the reason)")
    return found


def test_no_module_reaches_into_another_packages_private_names():
    modules = _modules()
    defined = _private_definitions(modules)
    found = [reach for module, path in sorted(modules.items())
             for reach in _private_reaches(module, path.read_text(encoding="utf-8"), modules, defined)]
    assert found == [], "private names reached from outside their package:\n  " + "\n  ".join(found)


def test_the_private_check_catches_imports_attributes_and_unnamed_library_internals():
    modules = {"grpo.a.engine": Path("grpo/a/engine.py"), "grpo.a.loop": Path("grpo/a/loop.py"),
               "grpo.b": Path("grpo/b/__init__.py"), "bench.c": Path("bench/c.py")}
    defined = {"_lock": {"grpo.a"}, "_helper": {"grpo.a"}}
    source = ("from grpo.a.engine import _helper\n"
              "def f(engine, torch):\n"
              "    engine._lock, torch.ops.mkl._mkl_linear, torch._dynamo, self_._x\n")
    assert _private_reaches("grpo.a.loop", source, modules, defined) == [
        "grpo.a.loop:3 reaches torch._dynamo (another library's: name it in PRIVATE_ALLOWED with the reason)",
        "grpo.a.loop:3 reaches self_._x (another library's: name it in PRIVATE_ALLOWED with the reason)",
    ]  # the same package may: its own import and engine._lock
    assert _private_reaches("bench.c", source, modules, defined)[:2] == [
        "bench.c:1 imports grpo.a.engine._helper",
        "bench.c:3 reaches engine._lock (grpo.a)",
    ]


def _prose(path: Path) -> list[tuple[int, str]]:
    """The lines of a file's prose with their numbers: a Markdown file whole; in Python, its
    comments and its docstrings (a string standing alone as a statement), not its string values
    (a sample date in code is data, not a measurement)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return list(enumerate(text.splitlines(), 1))
    lines = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines += [(node.lineno + i, line) for i, line in enumerate(node.value.value.splitlines())]
    return lines


def test_no_dated_measurements_in_the_library():
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
             for top in ("grpo", "environments", "tools") for path in sorted((REPO / top).rglob("*"))
             if path.suffix in (".py", ".md") for n, line in _prose(path) if DATED.search(line)]
    assert found == [], "dates in the library's prose (git keeps history):\n  " + "\n  ".join(found)


def test_the_date_check_finds_dates_in_prose_and_leaves_versions_and_data_alone(tmp_path):
    dated = ["on one H200 (2026-11-27)", "measured November 2026", "Nov 22, 2026: 4.7 ms"]
    plain = ["vllm 0.33", "torch 2.13.0", "bfcl-eval==2026.3.23", "a 2026-token prompt", "May be 2 026"]
    assert [bool(DATED.search(text)) for text in dated + plain] == [True] * 3 + [False] * 5
    module = tmp_path / "m.py"
    module.write_text('"""Measured 2026-11-27."""\nX = "2025-03-14"  # a sample date, 2025-03-14\n'
                      'Y = 1\n"""Y\'s story: Nov 2026."""\n')
    assert [(n, line) for n, line in _prose(module) if DATED.search(line)] == [
        (2, "# a sample date, 2025-03-14"), (1, "Measured 2026-11-27."), (4, "Y's story: Nov 2026.")]
