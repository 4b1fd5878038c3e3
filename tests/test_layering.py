"""The floor plan: each layer imports only the layers below it, and no modules import each other
in a circle. The layers are declared once, in pyproject.toml's ``[tool.importlinter]`` contract
(checked here with import-linter's ``lint-imports``); README.md quotes them."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pisub

PKG = Path(pisub.__file__).parent
ROOT = PKG.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
NOT_LAYERED = {"__init__.py", "__main__.py", "py.typed", "__pycache__"}


def _contract() -> dict[str, object]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts[0]


def _layers() -> list[str]:
    layers = _contract()["layers"]
    assert isinstance(layers, list)
    return [str(layer) for layer in layers]


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_top_level_name_is_in_a_layer() -> None:
    declared = {name.strip() for layer in _layers() for name in layer.split("|")}
    present = {p.name.removesuffix(".py") for p in PKG.iterdir() if p.name not in NOT_LAYERED}
    assert present == declared
    assert len(list(p for p in PKG.iterdir() if p.name != "__pycache__")) <= 20


def test_the_layers_contract_holds() -> None:
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_contract_fails_when_a_lower_layer_imports_a_higher_one(tmp_path: Path) -> None:
    shutil.copytree(PKG, tmp_path / "pisub", ignore=shutil.ignore_patterns("__pycache__"))
    fsio = tmp_path / "pisub" / "core" / "fsio.py"
    fsio.write_text(fsio.read_text() + "\n\ndef _upward() -> None:\n    import pisub.api.client  # noqa\n")
    proc = _lint(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "pisub.core.fsio -> pisub.api.client" in proc.stdout, proc.stdout


def test_the_readme_quotes_the_layers() -> None:
    quoted = "\n".join(_layers())
    assert f"```\n{quoted}\n```" in (ROOT / "README.md").read_text()


def _imports(path: Path) -> list[str]:
    """The pisub modules ``path`` imports, inside functions and under ``if TYPE_CHECKING:``
    included; ``from pisub import X`` counts as importing X's home module."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "pisub":
            found += [pisub._HOMES.get(alias.name, f"pisub.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pisub."):
            found += [node.module]
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("pisub.")]
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycles() -> None:
    """No modules import each other in a circle, counting imports inside functions and
    type-only ones (``if TYPE_CHECKING:``): a cycle of types is a cycle of knowledge."""
    modules = {_module_name(path): path for path in PKG.rglob("*.py")}
    graph = {
        name: {target for target in _imports(path) if target in modules and target != name}
        for name, path in modules.items()
        if name != "pisub"
    }
    cycles = []

    def visit(module: str, stack: list[str], done: set[str]) -> None:
        if module in stack:
            cycles.append(" -> ".join([*stack[stack.index(module) :], module]))
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
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
            "group_add",
            "group_list",
            "group_pause",
            "group_resume",
            "group_rm",
            "group_set_limit",
            "launch",
            "launch_chain",
            "launch_lanes",
            "retained_children",
            "launch_parallel",
            "launch_resource",
            "launch_workflow",
            "list_resources",
            "list_runs",
            "resume",
            "resume_workflow",
            "schedule_create",
            "schedule_delete",
            "schedule_history",
            "schedule_list",
            "schedule_pause",
            "schedule_resume",
            "schedule_run",
            "schedule_run_due",
            "schedule_show",
            "schedule_tick",
            "validate_workflow",
        ]
    )
    for name in pisub.__all__:
        assert hasattr(pisub, name)
    assert (PKG / "py.typed").exists()
