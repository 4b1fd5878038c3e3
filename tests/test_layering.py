"""Imports go one way: protocol → primitives → store → children/runner → client → CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pisub

PKG = Path(pisub.__file__).parent

LAYERS: dict[str, int] = {
    "errors": 0,
    "defaults": 0,
    "protocol": 0,
    "termsafe": 0,
    "paths": 1,
    "fsio": 1,
    "locks": 1,
    "procs": 1,
    "redact": 1,
    "polling": 1,
    "lineage": 1,
    "fencing": 1,
    "store": 2,
    "live_index": 2,
    "listing": 2,
    "leases": 2,
    "briefs": 2,
    "mailbox": 2,
    "agents": 2,
    "agent_files": 2,
    "output": 2,
    "results": 2,
    "reconcile": 2,
    "pi_versions": 2,
    "journal": 2,
    "spawn_budget": 2,
    "usage_budget": 2,
    "on_done": 2,
    "acceptance": 2,
    "shared_state": 2,
    "doctor": 2,
    "config": 2,
    "worktrees": 2,
    "backends": 2,
    "children": 3,
    "runner": 3,
    "launcher": 3,
    "models": 3,
    "workflow": 3,
    "client": 4,
    "revive": 4,
    "views": 4,
    "top": 4,
    "retained": 4,
    "worktree_ops": 4,
    "lane_evidence": 4,
    "pi_integration": 4,
    "pi_extension": 4,
    "guide": 4,
    "cli": 5,
    "__main__": 5,
    "entry": 5,
    "testing": 6,
}


def _module_layer(path: Path) -> tuple[str, int]:
    rel = path.relative_to(PKG)
    top = rel.parts[0].removesuffix(".py")
    return top, LAYERS[top]


def test_every_module_has_a_layer() -> None:
    for path in PKG.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == PKG:
            continue
        _module_layer(path)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """The pisub modules ``path`` imports, each with whether it is only for type checking
    (``if TYPE_CHECKING:``). ``from pisub import X`` counts as importing X's home module."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module == "pisub":
            names = [pisub._HOMES.get(alias.name, f"pisub.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pisub."):
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("pisub.")]
        found += [(name, id(node) in typing_only) for name in names]
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_upward_imports() -> None:
    """Also inside functions, and through ``from pisub import X``."""
    bad = []
    for path in PKG.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == PKG:
            continue
        _top, layer = _module_layer(path)
        for name, _typing in _imports(path):
            target = name.split(".")[1]
            if LAYERS[target] > layer:
                bad.append(f"{path.relative_to(PKG)} (layer {layer}) imports {name} (layer {LAYERS[target]})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    """Modules of one layer may import each other, but never in a circle — counting imports
    inside functions (only ``if TYPE_CHECKING:`` imports are left out)."""
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == PKG:
            continue
        graph[_module_name(path)] = {name for name, typing in _imports(path) if not typing}
    cycles = []

    def visit(module: str, stack: list[str], done: set[str]) -> None:
        if module in stack:
            cycles.append(" -> ".join([*stack[stack.index(module) :], module]))
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            if target in graph and target != module:
                visit(target, [*stack, module], done)
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        visit(module, [], done)
    assert not cycles, "\n".join(sorted(set(cycles)))


def test_the_public_api_is_exactly_these_names() -> None:
    assert sorted(pisub.__all__) == sorted(
        [
            "PisubError",
            "Result",
            "Run",
            "RunState",
            "Status",
            "WorkflowFailed",
            "__version__",
            "agent_catalog",
            "launch",
            "launch_chain",
            "launch_lanes",
            "retained_children",
            "launch_parallel",
            "launch_workflow",
            "list_runs",
            "resume",
            "resume_workflow",
        ]
    )
    for name in pisub.__all__:
        assert hasattr(pisub, name)
    assert (PKG / "py.typed").exists()
