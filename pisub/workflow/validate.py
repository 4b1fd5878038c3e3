"""``pisub workflow validate``: check a workflow script without starting anything.

From the syntax tree alone (the script is never run): it parses; it defines
``async def main(runs, state, args)``; every ``runs.run`` / ``runs.all`` / ``runs.steer`` call
is awaited, returned, or handed to an asyncio combinator (``gather``, ``wait``,
``as_completed``...), or kept in a name that is later awaited or handed to one; literal keys
are keys and unique; literal agent names exist. The coordinator checks the same rules again at
run time, where a static check cannot see (a call in a loop, a key computed at run time).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pisub.errors import InvalidInput
from pisub.protocol.workflow import KEY_RE, MAX_SCRIPT_BYTES
from pisub.workflow.calls import PYTHON_NAMES as _PYTHON_NAMES

RUNS_METHODS = ("run", "all", "lanes", "steer")
COMBINATORS = ("gather", "wait", "as_completed", "wait_for", "shield", "create_task", "ensure_future")


@dataclass
class Problem:
    line: int
    col: int
    message: str
    unknown_agent: bool = False
    """The problem is a name that is no agent here."""
    kind: str | None = None
    """What rule it breaks, where a reader acts on it (``syntax``, ``nested-async``,
    ``spawn-budget``, ``agent``, ``dynamic-spawn-count``...)."""

    def as_json(self) -> dict[str, object]:
        """The seed's ``{message, line, column, kind?}`` (and ``col``, which older readers read)."""
        shown: dict[str, object] = {"message": self.message, "line": self.line, "column": self.col}
        shown["col"] = self.col
        if self.kind is not None:
            shown["kind"] = self.kind
        return shown


@dataclass
class Report:
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    """What may fail at run time but cannot be told from the text (a run count in a loop)."""
    total: int | None = None
    """How many errors there are when ``errors`` lists only the first of them (None: all listed)."""

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def error_count(self) -> int:
        """Every error, listed or not."""
        return len(self.errors) if self.total is None else self.total

    def cap(self, limit: int) -> None:
        """List at most ``limit`` errors; :attr:`error_count` still counts them all."""
        if len(self.errors) > limit:
            self.total = len(self.errors)
            del self.errors[limit:]

    def add(self, node: ast.AST | None, message: str, *, unknown_agent: bool = False) -> None:
        line = getattr(node, "lineno", 1) if node is not None else 1
        col = getattr(node, "col_offset", 0) + 1 if node is not None else 1
        self.errors.append(Problem(line=line, col=col, message=message, unknown_agent=unknown_agent))

    def as_json(self) -> dict[str, object]:
        """The seed's ``{ok, errors: [{message, line, column, kind?}], warnings: [...]}``, and
        ``total`` (how many errors there are) when ``errors`` lists only the first of them."""
        shown: dict[str, object] = {
            "ok": self.ok,
            "errors": [p.as_json() for p in self.errors],
            "warnings": [p.as_json() for p in self.warnings],
        }
        if self.total is not None:
            shown["total"] = self.total
        return shown


def validate_file(path: Path, agents: set[str] | None) -> Report:
    """Check the Python script at ``path``; ``agents``: the agent names that exist (None: not
    checked)."""
    report = Report()
    source = read_script(path, report)
    return report if source is None else validate_source(source, agents, filename=str(path))


def read_script(path: Path, report: Report) -> str | None:
    """The text of the script at ``path`` (a symlink is followed: it is the user's own), or
    None with the one problem in ``report`` (unreadable, not a regular file, too large, not
    UTF-8)."""
    try:
        return read_script_text(Path(os.path.realpath(path)), str(path), allow_empty=True)
    except InvalidInput as exc:
        report.add(None, exc.message)
        return None


def read_script_text(path: Path, name: str, *, allow_empty: bool = False) -> str:
    """The text of the workflow script at ``path`` (``name`` in messages), in any language.

    Raises:
        InvalidInput: unreadable, larger than :data:`MAX_SCRIPT_BYTES`, not UTF-8, or empty
            (unless ``allow_empty``).
    """
    from pisub.core.fsio import read_bytes

    try:
        data = read_bytes(path, limit=MAX_SCRIPT_BYTES)
    except OSError as exc:
        raise InvalidInput(f"{name}: cannot read the script: {exc.strerror or exc}") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise InvalidInput(f"{name}: the script is larger than {MAX_SCRIPT_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{name}: the script is not UTF-8: {exc}") from None
    if not allow_empty and not text.strip():
        raise InvalidInput(f"{name}: the script is empty")
    return text


def validate_source(source: str, agents: set[str] | None, filename: str = "<workflow>") -> Report:
    report = Report()
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        report.errors.append(
            Problem(line=exc.lineno or 1, col=exc.offset or 1, message=f"SyntaxError: {exc.msg}")
        )
        return report
    except (ValueError, RecursionError, MemoryError) as exc:
        report.add(None, f"the script cannot be parsed: {type(exc).__name__} {exc}".rstrip())
        return report
    try:
        runs_name = _check_main(tree, report)
        if runs_name is not None:
            _Calls(tree, runs_name, agents, report).check()
    except (RecursionError, MemoryError) as exc:
        report.add(None, f"the script is nested too deeply to check ({type(exc).__name__})")
    report.errors.sort(key=lambda p: (p.line, p.col))
    return report


def _check_main(tree: ast.Module, report: Report) -> str | None:
    """The name ``main`` gives its first parameter (``runs``), or None when main is wrong."""
    mains = [
        n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "main"
    ]
    if not mains:
        report.add(None, "the script defines no main: write async def main(runs, state, args)")
        return None
    main = mains[-1]
    if not isinstance(main, ast.AsyncFunctionDef):
        report.add(main, "main must be an async function: async def main(runs, state, args)")
        return None
    params = [*main.args.posonlyargs, *main.args.args]
    if len(params) != 3 or main.args.vararg or main.args.kwonlyargs or main.args.defaults:
        report.add(main, "main must take exactly three arguments: async def main(runs, state, args)")
        return None
    return params[0].arg


class _Calls:
    """The ``runs.*`` calls of a script, and whether something waits for each."""

    def __init__(self, tree: ast.Module, runs_name: str, agents: set[str] | None, report: Report) -> None:
        self.tree = tree
        self.runs = runs_name
        self.agents = agents
        self.report = report
        self.parents: dict[ast.AST, ast.AST] = {}
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        self.keys: dict[str, tuple[int, str]] = {}
        """Literal key → where it was first used, and its call's parameters."""

    def check(self) -> None:
        awaited_names = self._awaited_names()
        for call in self._runs_calls():
            method = call.func.attr if isinstance(call.func, ast.Attribute) else "?"
            self._check_literals(call, method)
            verdict = self._fate(call)
            if verdict == "ok":
                continue
            if verdict.startswith("name:"):
                name = verdict[5:]
                if name in awaited_names:
                    continue
                self.report.add(call, f"runs.{method}(...) is kept in {name!r}, which is never awaited")
            else:
                self.report.add(
                    call, f"runs.{method}(...) is not awaited: await it or pass it to asyncio.gather/wait"
                )

    def _runs_calls(self) -> Iterator[ast.Call]:
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == self.runs
                and node.func.attr in RUNS_METHODS
            ):
                yield node

    def _fate(self, call: ast.Call) -> str:
        """``ok`` (awaited, returned, or in a combinator that is), ``name:<n>`` (kept in a name),
        or ``lost``."""
        node: ast.AST = call
        while True:
            parent = self.parents.get(node)
            if parent is None:
                return "lost"
            if isinstance(parent, ast.Await | ast.Return | ast.Yield | ast.YieldFrom | ast.Lambda):
                return "ok"  # awaited, or handed to the caller (which is checked at run time)
            if isinstance(parent, ast.For | ast.AsyncFor) and node is parent.iter:
                return "ok" if isinstance(node, ast.Call) and _callee(node) in COMBINATORS else "lost"
            if isinstance(parent, ast.Call) and node is not parent.func:
                callee = _callee(parent)
                if callee in _COLLECTING:
                    return _kept_in(parent.func.value if isinstance(parent.func, ast.Attribute) else None)
                if callee not in COMBINATORS:
                    return "lost"
            elif isinstance(parent, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
                targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                return _kept_in(targets[0])
            elif isinstance(parent, ast.stmt):
                return "lost"
            node = parent

    def _awaited_names(self) -> set[str]:
        """Names read inside an ``await``, a combinator call, an ``async for`` or a ``for`` over a
        combinator, or returned."""
        found: set[str] = set()
        for node in ast.walk(self.tree):
            scope: list[ast.AST] = []
            if isinstance(node, ast.Await | ast.Return) and node.value is not None:
                scope.append(node.value)
            elif isinstance(node, ast.Call) and _callee(node) in COMBINATORS:
                scope += [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, ast.AsyncFor):
                scope.append(node.iter)
            for part in scope:
                found |= {n.id for n in ast.walk(part) if isinstance(n, ast.Name)}
        return found

    def _check_literals(self, call: ast.Call, method: str) -> None:
        if method == "run":
            key = call.args[0] if call.args else _keyword(call, "key")
            given = {k.arg: k.value for k in call.keywords if k.arg not in (None, "key")}
            self._check_key(key, _same_call(given))
            self._check_agent(_keyword(call, "agent"))
        elif method == "all" and call.args and isinstance(call.args[0], ast.List | ast.Tuple):
            for entry in call.args[0].elts:
                if isinstance(entry, ast.Dict):
                    fields = {
                        k.value: v
                        for k, v in zip(entry.keys, entry.values, strict=True)
                        if isinstance(k, ast.Constant)
                    }
                    given = {str(k): v for k, v in fields.items() if k != "key"}
                    self._check_key(fields.get("key"), _same_call(given))
                    self._check_agent(fields.get("agent"))
        elif method == "lanes" and call.args:
            self._check_lanes(call.args[0])
        elif method == "steer":
            key = call.args[0] if call.args else _keyword(call, "key")
            if (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and not KEY_RE.fullmatch(key.value)
            ):
                self.report.add(key, f"{key.value!r} is not a key ([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})")

    def _check_lanes(self, node: ast.expr) -> None:
        """A literal lanes manifest is checked as ``runs.lanes`` would check it."""
        from pisub.errors import InvalidInput
        from pisub.workflow.lanes import check_lanes

        try:
            lanes = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return  # computed at run time: checked then
        try:
            checked = check_lanes(lanes, "runs.lanes")
        except InvalidInput as exc:
            self.report.add(node, exc.message)
            return
        for lane in checked:
            for stage in lane.stages:
                agent = stage.agent or (lane.defaults.agent if lane.defaults else None)
                if agent is not None and self.agents is not None and agent not in self.agents:
                    from pisub.agents.catalog import did_you_mean

                    mean = did_you_mean(agent, list(self.agents))
                    self.report.add(
                        node, f"lane {lane.key!r} stage {stage.key!r}: no agent named {agent!r}.{mean}"
                    )

    def _check_key(self, node: ast.AST | None, params: str) -> None:
        """A literal key must be a key, and unique — unless the calls are the same call (the
        same key with the same parameters returns the same child's result)."""
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            return
        key = node.value
        if not KEY_RE.fullmatch(key):
            self.report.add(node, f"{key!r} is not a key ([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})")
        elif key in self.keys and self.keys[key][1] != params:
            line = self.keys[key][0]
            self.report.add(
                node, f"key {key!r} is used on line {line} with other parameters: a key names one child"
            )
        else:
            self.keys.setdefault(key, (getattr(node, "lineno", 0), params))

    def _check_agent(self, node: ast.AST | None) -> None:
        if self.agents is None or not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            return
        if node.value not in self.agents:
            self.report.add(node, unknown_agent_message(node.value, self.agents), unknown_agent=True)


def unknown_agent_message(name: str, agents: set[str]) -> str:
    """``unknown agent 'x'; Did you mean y? agents: ...`` for a name that is no agent here."""
    from pisub.agents.catalog import did_you_mean, shown_name

    known = ", ".join(sorted(agents)) or "(none)"
    mean = did_you_mean(name, list(agents))
    shown = shown_name(name)
    shown = shown if shown.startswith("'") else repr(shown)
    return f"unknown agent {shown};{mean} agents: {known}"


_COLLECTING = ("append", "add", "extend", "insert", "appendleft")


def _same_call(params: dict[str, ast.expr]) -> str:
    """What makes two literal calls of a key the same call: their parameters (by Python name),
    by value where they are literals (``5`` and ``5.0`` are the same timeout), else as written."""
    return repr(sorted((_PYTHON_NAMES.get(name, name), _value(value)) for name, value in params.items()))


def _value(node: ast.expr) -> str:
    try:
        literal = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ast.dump(node)
    if isinstance(literal, float) and literal.is_integer():
        literal = int(literal)
    return repr(literal)


def _kept_in(target: ast.AST | None) -> str:
    name = _root_name(target)
    return f"name:{name}" if name else "lost"


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _root_name(node: ast.AST | None) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Starred):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None
