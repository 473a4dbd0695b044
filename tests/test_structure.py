"""The code's shape, as DESIGN.md states it: small modules and functions, data flowing
one way (engine, results, predict, check and probe never import launch or the CLI), and
no import cycles. Read from the source with ast, so a function-level import counts too."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "trainbench"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
BELOW_LAUNCH = ("engine", "results", "predict", "check", "probe")


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under `if TYPE_CHECKING:` (annotations, not run)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    lines.add(inner.lineno)
    return lines


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The trainbench modules `name` imports, anywhere in its file."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else []))
            targets = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_source_file_is_over_600_lines():
    long = {str(p.relative_to(SRC)): n for p in PACKAGE.rglob("*.py")
            if (n := p.read_text().count("\n")) > MAX_FILE_LINES}
    assert not long, long


def test_no_function_is_over_80_lines():
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(SRC)}:{node.lineno} {node.name}"] = length
    assert not long, long


def test_nothing_below_launch_imports_launch_or_the_cli():
    up = [f"{a} -> {b}" for a, targets in graph().items()
          if a.split(".")[1:2] and a.split(".")[1] in BELOW_LAUNCH
          for b in targets if b.startswith("trainbench.launch") or b == "trainbench.cli"]
    assert not up, up


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_checks_see_what_they_look_for():
    # The graph reads relative, absolute and function-level imports: the CLI registers
    # the launch commands, and the engine's trainer reads the run directory's names.
    edges = graph()
    assert "trainbench.rundir" in edges["trainbench.engine.trainer"]
    assert "trainbench.console" in edges["trainbench.launch.run_cli"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
