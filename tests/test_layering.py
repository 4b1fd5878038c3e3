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
    "paths": 1,
    "fsio": 1,
    "locks": 1,
    "procs": 1,
    "redact": 1,
    "polling": 1,
    "store": 2,
    "leases": 2,
    "briefs": 2,
    "mailbox": 2,
    "agents": 2,
    "output": 2,
    "results": 2,
    "reconcile": 2,
    "pi_versions": 2,
    "doctor": 2,
    "children": 3,
    "runner": 3,
    "client": 4,
    "revive": 4,
    "cli": 5,
    "__main__": 5,
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


def test_no_upward_imports() -> None:
    bad = []
    for path in PKG.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == PKG:
            continue
        _top, layer = _module_layer(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pisub."):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("pisub.")]
            for name in names:
                target = name.split(".")[1]
                if LAYERS[target] > layer:
                    bad.append(
                        f"{path.relative_to(PKG)} (layer {layer}) imports {name} (layer {LAYERS[target]})"
                    )
    assert not bad, "\n".join(bad)


def test_public_api() -> None:
    assert sorted(pisub.__all__) == sorted(
        [
            "PisubError",
            "Result",
            "Run",
            "RunState",
            "Status",
            "__version__",
            "agent_catalog",
            "launch",
            "list_runs",
            "resume",
        ]
    )
    for name in pisub.__all__:
        assert hasattr(pisub, name)
    assert (PKG / "py.typed").exists()
