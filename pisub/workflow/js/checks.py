"""Static checks of a JavaScript workflow script (``validate``; also refused at launch and load).

The script is a JavaScript *statement body*: the engine runs it as the body of an async
function, so top-level ``await`` and ``return`` are allowed. Nothing here runs it. The syntax
is the engine's own: QuickJS compiles ``(async function(){\\n<body>\\n})`` (never called) and its
``SyntaxError`` is the message. The structure comes from tree-sitter's syntax tree, walked
without recursion:

- nested ``async`` functions, arrows and methods are refused (``nested-async``), as the seed
  refuses them;
- literal keys of ``runs.run``/``runs.all``/``runs.host``/``runs.lanes``/``runs.steer`` are keys,
  and one ``runs.all`` batch names each literal key once;
- a literal ``baseRef`` passes pisub's ref rule; a literal lanes manifest passes ``runs.lanes``'
  checks;
- literal ``runs.host`` parameters: the allowed fields, ``kind: "command"``, ``command`` and
  ``timeoutMs`` given, a relative ``output`` of at most 240 bytes without ``..``, no ``cwd``;
- values that are definitely not JSON (a function, ``NaN``, ``Infinity``, a symbol, a BigInt, a
  regular expression) given to ``emit``, ``state.set``, a child's parameters or ``return``;
- ``x.name`` / ``x["name"]`` on ``const x = await runs.all([...])`` (an ordered array);
- more distinct literal keys outside loops and helpers than ``max_spawns`` (``spawn-budget``);
  a count known only at run time warns (``dynamic-spawn-count``);
- a literal agent name that is no agent here (``agent``; when ``agents`` is given).

What the text does not settle (a computed key, a value built at run time) is checked by the
coordinator when the script runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from pisub.protocol.fields import KEY_PATTERN
from pisub.protocol.host import MAX_COMMAND_BYTES, MAX_OUTPUT_PATH_BYTES, MAX_TIMEOUT_MS, HostParams
from pisub.protocol.workflow import KEY_RE, MAX_SCRIPT_BYTES
from pisub.workflow.validate import Problem, Report, unknown_agent_message

if TYPE_CHECKING:
    from tree_sitter import Node, Tree

NESTED_ASYNC = (
    "workflowScript does not support nested async functions. Use top-level await, plain helper "
    "functions that return runs.run(...), or explicit Promise chains so workflows stay portable "
    "across Node and Bun."
)
HOST_FIELDS = tuple(f.encode_name for f in msgspec.structs.fields(HostParams))
"""``runs.host``'s parameters, as a script spells them (those of ``HostParams``)."""
HOST_REQUIRED = tuple(f.encode_name for f in msgspec.structs.fields(HostParams) if f.required)
HOST_ROLES = ("ci", "gate")
NO_CWD = (
    "runs.host has no per-step cwd: put the directory change in the command "
    "(cd dir && npm test) or set cwd on the outer request"
)
RUNS_METHODS = ("run", "all", "host", "lanes", "steer")
ENGINE_SECONDS = 10
"""How long the engine may spend compiling a script (it runs none of it)."""
_WRAP_HEAD = "(async function(){\n"
_WRAP_TAIL = "\n})"
_DECLARED = "__pisub_validate__"
_DECLARED_HEAD = f"function {_DECLARED}(){{ return {_WRAP_HEAD}"
_COMMENTS = frozenset({"comment", "html_comment"})
ENGINE_MEMORY = 256 * 1024 * 1024
MAX_PROBLEMS = 200
"""At most this many errors are listed (``Report.total`` counts them all)."""
LITERAL_DEPTH = 64
"""How deep a literal is followed (deeper: treated as computed at run time)."""

_FUNCTIONS = frozenset(
    {
        "function_declaration",
        "function_expression",
        "function",
        "arrow_function",
        "method_definition",
        "generator_function",
        "generator_function_declaration",
    }
)
_LOOPS = frozenset({"for_statement", "for_in_statement", "while_statement", "do_statement"})
_ARRAY_NAMES = frozenset(
    {
        "length", "at", "concat", "copyWithin", "entries", "every", "fill", "filter", "find",
        "findIndex", "findLast", "findLastIndex", "flat", "flatMap", "forEach", "includes",
        "indexOf", "join", "keys", "lastIndexOf", "map", "pop", "push", "reduce", "reduceRight",
        "reverse", "shift", "slice", "some", "sort", "splice", "toLocaleString", "toReversed",
        "toSorted", "toSpliced", "toString", "unshift", "values", "with", "constructor",
        "hasOwnProperty", "isPrototypeOf", "propertyIsEnumerable", "valueOf", "__proto__",
        "__defineGetter__", "__defineSetter__", "__lookupGetter__", "__lookupSetter__",
        "then", "toJSON",
    }
)  # fmt: skip
"""What a ``runs.all`` result may be asked for: an array's and an object's names (and ``then``
and ``toJSON``, which the engine answers with ``undefined``)."""
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}
_LINE_RE = re.compile(r"<input>:(\d+)(?::(\d+))?")
_TOKEN_RE = re.compile(r": '(.{1,40})'$")


class _Computed:
    """A value the text does not settle (a name, a call, a spread...)."""


COMPUTED = _Computed()


@dataclass
class _Site:
    """Where a node is: inside a loop, inside a helper function (not the script's body)."""

    node: Node
    in_loop: bool
    in_function: bool


def validate_js(
    source: str, agents: set[str] | None, filename: str = "<workflow>", max_spawns: int | None = None
) -> Report:
    """Every problem of the JavaScript statement body ``source`` (see the module docstring).

    ``agents``: the agent names that exist (None: not checked); ``max_spawns``: the run's spawn
    budget (None: not checked). Never raises for any text.
    """
    report = Report()
    refused = _hostile(source)
    if refused is not None:
        report.errors.append(Problem(1, 1, refused, kind="input"))
        return report
    try:
        tree = _parse(source)
        syntax = _engine_syntax(source, tree)
        if syntax is not None:
            report.errors.append(syntax)
            return report
        _Checks(source, tree, agents, max_spawns, report).run()
    except (RecursionError, MemoryError) as exc:
        report.errors.append(
            Problem(1, 1, f"the script is nested too deeply to check ({type(exc).__name__})", kind="input")
        )
    report.errors.sort(key=lambda p: (p.line, p.col))
    report.cap(MAX_PROBLEMS)
    return report


def _hostile(source: str) -> str | None:
    """Why ``source`` is not checked at all, or None."""
    if not isinstance(source, str):
        return f"the script must be text, not {type(source).__name__}"
    try:
        size = len(source.encode("utf-8"))
    except UnicodeEncodeError:
        return "the script is not UTF-8 text (it holds a lone surrogate)"
    if size > MAX_SCRIPT_BYTES:
        return f"the script is {size} bytes; at most {MAX_SCRIPT_BYTES}"
    if "\0" in source:
        return f"the script holds a NUL character (line {source.count(chr(10), 0, source.index(chr(0))) + 1})"
    if not source.strip():
        return "the workflow script is empty: write a JavaScript statement body"
    return None


def _parse(source: str) -> Tree:
    import tree_sitter_javascript as tsj
    from tree_sitter import Language, Parser

    return Parser(Language(tsj.language())).parse(source.encode("utf-8"))


def _engine_syntax(source: str, tree: Tree) -> Problem | None:
    """The engine's ``SyntaxError`` for ``source`` as a function body, on the script's own lines,
    or None when it compiles. Nothing of the script runs: tree-sitter first refuses a body that
    closes its wrapper (:func:`_structure_problem`, QuickJS is not called); then QuickJS compiles
    the wrapper as a never-called function *declaration* after a ``throw`` that is the script's
    first statement, so whatever the text holds, no statement of it runs; the thrown value is the
    declared function's text length, which must be the wrapper's (defence in depth: the engine
    parsed it as tree-sitter did)."""
    problem = _structure_problem(source, _parse(_WRAP_HEAD + source + _WRAP_TAIL))
    if problem is not None:
        return problem
    import quickjs

    lines = source.count("\n") + 1
    declared = _DECLARED_HEAD + source + _WRAP_TAIL + " }"
    context = quickjs.Context()
    context.set_time_limit(ENGINE_SECONDS)
    context.set_memory_limit(ENGINE_MEMORY)
    try:
        context.eval(f"throw {_DECLARED}.toString().length;\n" + declared)
    except quickjs.JSException as exc:
        text = str(exc)
        message = text.split("\n", 1)[0].strip() or "SyntaxError"
        if message == str(len(declared.encode("utf-16-le")) // 2):
            return None
        if not message.startswith("SyntaxError"):
            if message.isdigit():  # the declared function is not the whole wrapper
                return _escaped(source, tree)
            if "interrupted" in message:
                message = f"the engine takes more than {ENGINE_SECONDS} s to compile the script"
            else:
                message = f"the engine cannot compile the script ({message})"
            return Problem(1, 1, message, kind="syntax")
        found = _LINE_RE.search(text)
        line = min(max(int(found.group(1)) - 2, 1), lines) if found else 1
        column = (
            int(found.group(2)) if found and found.group(2) else _error_column(source, tree, line, message)
        )
        return Problem(line, column, message, kind="syntax")
    finally:
        del context
    return _escaped(source, tree)  # pragma: no cover - the first statement always throws


def _structure_problem(source: str, wrapped: Tree) -> Problem | None:
    """The refusal of a body that closes its wrapper, from tree-sitter alone: ``wrapped`` (the
    tree of ``(async function(){\\n<source>\\n})``) must be one expression statement, the
    parenthesized async function spanning the whole text, comments aside. A tree with syntax
    errors is left to the engine's message (its compile runs nothing)."""
    root = wrapped.root_node
    if root.has_error:
        return None
    statements = [c for c in root.named_children if c.type not in _COMMENTS]
    if len(statements) == 1 and statements[0].type == "expression_statement":
        inner = [c for c in statements[0].named_children if c.type not in _COMMENTS]
        wrapper = inner[0] if len(inner) == 1 else None
        if (
            wrapper is not None
            and wrapper.type == "parenthesized_expression"
            and wrapper.start_byte == 0
            and wrapper.end_byte == len((_WRAP_HEAD + source + _WRAP_TAIL).encode("utf-8"))
            and [c.type for c in wrapper.named_children] == ["function_expression"]
            and wrapper.named_children[0].start_byte == 1
            and wrapper.named_children[0].end_byte == wrapper.end_byte - 1
        ):
            return None
    problem = _escaped(source, _parse(source))
    first = root.named_children[0] if root.named_child_count else None
    while first is not None and first.type in ("expression_statement", "parenthesized_expression"):
        first = first.named_children[0] if first.named_child_count else None
    if first is not None and first.end_point[0] >= 1:
        # where the wrapper closes: the ``}`` that ends its function, on the script's own line
        row, byte_col = first.end_point
        line = min(row, source.count("\n") + 1)
        text = source.split("\n")[line - 1].encode("utf-8")
        problem.line, problem.col = line, len(text[: max(byte_col - 1, 0)].decode("utf-8", "replace")) + 1
    return problem


def _escaped(source: str, tree: Tree) -> Problem:
    node = _first_error(tree)
    line, col = _position(source.encode("utf-8"), node) if node is not None else (1, 1)
    message = "SyntaxError: the script does not parse as one statement body (the body of an async function)"
    return Problem(line, col, message, kind="syntax")


def _first_error(tree: Tree) -> Node | None:
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            return node
        if node.has_error:
            stack.extend(reversed(node.children))
    return None


def _error_column(source: str, tree: Tree, line: int, message: str) -> int:
    """Where on ``line`` the engine's error is (it gives no column): the token its message names
    (``unexpected token in expression: ';'``) at or after tree-sitter's first error there, else
    that error, else 1."""
    node = _first_error(tree)
    where = _position(source.encode("utf-8"), node) if node is not None else (0, 1)
    col = where[1] if where[0] == line else 1
    token = _TOKEN_RE.search(message)
    text = source.split("\n")[line - 1] if line <= source.count("\n") + 1 else ""
    if token is not None:
        found = text.find(token.group(1), col - 1)
        if found >= 0:
            return found + 1
    return col


def _position(data: bytes, node: Node) -> tuple[int, int]:
    """1-based line and character column of ``node`` in the script's UTF-8 ``data``."""
    row, byte_col = node.start_point
    start = node.start_byte - byte_col
    prefix = data[start : node.start_byte]
    return row + 1, len(prefix.decode("utf-8", "replace")) + 1


def _walk(root: Node) -> Iterator[_Site]:
    """Every named node below ``root``, with where it is, without recursion."""
    stack: list[tuple[Node, bool, bool]] = [(root, False, False)]
    while stack:
        node, in_loop, in_function = stack.pop()
        yield _Site(node, in_loop, in_function)
        inner_loop = in_loop or node.type in _LOOPS
        inner_function = in_function or node.type in _FUNCTIONS
        stack.extend((child, inner_loop, inner_function) for child in reversed(node.named_children))


def _is_async(node: Node) -> bool:
    return node.type in _FUNCTIONS and any(c.type == "async" and not c.is_named for c in node.children)


def _runs_method(call: Node) -> str | None:
    """``run`` for ``runs.run(...)`` (and so on), else None."""
    callee = call.child_by_field_name("function")
    if callee is None or callee.type != "member_expression":
        return None
    obj, prop = callee.child_by_field_name("object"), callee.child_by_field_name("property")
    if obj is None or prop is None or obj.type != "identifier" or _text(obj) != "runs":
        return None
    name = _text(prop)
    return name if name in RUNS_METHODS else None


def _callee_text(call: Node) -> str:
    callee = call.child_by_field_name("function")
    return _text(callee) if callee is not None else ""


def _args(call: Node) -> list[Node]:
    args = call.child_by_field_name("arguments")
    return [] if args is None else [a for a in args.named_children if a.type != "comment"]


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def _unwrap(node: Node) -> Node:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        inner = node.named_children[0]
        if inner is None:
            break
        node = inner
    return node


def literal(node: Node, depth: int = 0) -> object:
    """The JSON-like value a literal node spells (``COMPUTED`` where the text does not settle it;
    ``undefined`` is None, a BigInt an int, ``NaN``/``Infinity`` floats)."""
    node = _unwrap(node)
    kind = node.type
    if depth > LITERAL_DEPTH:
        return COMPUTED
    if kind == "string":
        return _string(node)
    if kind == "template_string":
        if any(c.type == "template_substitution" for c in node.named_children):
            return COMPUTED
        return _string(node)
    if kind == "number":
        return _number(_text(node))
    if kind in ("true", "false"):
        return kind == "true"
    if kind in ("null", "undefined"):
        return None
    if kind == "identifier":
        return {"undefined": None, "NaN": float("nan"), "Infinity": float("inf")}.get(_text(node), COMPUTED)
    if kind == "unary_expression" and _text(node)[:1] in "-+":
        arg = node.child_by_field_name("argument")
        value = literal(arg, depth + 1) if arg is not None else COMPUTED
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if _text(node).startswith("-") else value
        return COMPUTED
    if kind == "array":
        items = [literal(c, depth + 1) for c in node.named_children if c.type != "comment"]
        return COMPUTED if any(i is COMPUTED for i in items) else items
    if kind == "object":
        fields = object_fields(node)
        if fields is None:
            return COMPUTED
        values = {k: literal(v, depth + 1) for k, (_, v) in fields.items()}
        return COMPUTED if any(v is COMPUTED for v in values.values()) else values
    return COMPUTED


def object_fields(node: Node) -> dict[str, tuple[Node, Node]] | None:
    """An object literal's ``name → (name node, value node)``, or None when it has a spread, a
    computed name or a shorthand, methods aside (then :func:`object_known` gives the literal
    part)."""
    fields, complete = object_known(node)
    return fields if complete else None


def object_known(node: Node) -> tuple[dict[str, tuple[Node, Node]], bool]:
    """The literally named fields of an object literal, and whether that is every field."""
    fields: dict[str, tuple[Node, Node]] = {}
    complete = True
    for child in node.named_children:
        if child.type == "pair":
            key, value = child.child_by_field_name("key"), child.child_by_field_name("value")
            name = _key_name(key) if key is not None else None
            if name is None or value is None:
                complete = False
                continue
            fields[name] = (key, value)  # type: ignore[assignment]
        elif child.type == "method_definition":
            name_node = child.child_by_field_name("name")
            name = _key_name(name_node) if name_node is not None else None
            if name is None or name_node is None:
                complete = False
            else:
                fields[name] = (name_node, child)
        elif child.type != "comment":
            complete = False  # a spread, a shorthand name
    return fields, complete


def _key_name(node: Node) -> str | None:
    if node.type in ("property_identifier", "identifier"):
        return _text(node)
    if node.type in ("string", "number"):
        value = literal(node)
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(int(value)) if float(value).is_integer() else str(value)
    return None


def _string(node: Node) -> str:
    parts: list[str] = []
    for child in node.named_children:
        if child.type == "string_fragment":
            parts.append(_text(child))
        elif child.type == "escape_sequence":
            parts.append(_escape(_text(child)))
    return "".join(parts)


def _escape(text: str) -> str:
    body = text[1:]
    if body in _ESCAPES:
        return _ESCAPES[body]
    if body.startswith("\n") or body.startswith("\r"):
        return ""  # a line continuation
    try:
        if body.startswith("x") and len(body) == 3:
            return chr(int(body[1:], 16))
        if body.startswith("u{") and body.endswith("}"):
            return chr(int(body[2:-1], 16))
        if body.startswith("u") and len(body) == 5:
            return chr(int(body[1:], 16))
    except (ValueError, OverflowError):
        return text
    return body


def _number(text: str) -> object:
    raw = text.replace("_", "")
    if raw.endswith("n"):
        return _BigInt()
    try:
        low = raw.lower()
        if low.startswith(("0x", "0o", "0b")):
            return int(raw, 0)
        if len(raw) > 1 and raw.startswith("0") and raw.isdigit():
            return int(raw, 8) if set(raw) <= set("01234567") else int(raw)
        value = float(raw)
        return int(value) if value.is_integer() and "." not in raw and "e" not in low else value
    except ValueError:
        return COMPUTED


class _BigInt:
    """A BigInt literal (``10n``): never JSON."""


def not_json(node: Node) -> tuple[Node, str] | None:
    """The first part of a literal value that is definitely not JSON, and what it is, or None
    (a part computed at run time is not judged)."""
    stack = [(node, 0)]
    while stack:
        here, depth = stack.pop()
        here = _unwrap(here)
        why = _not_json_leaf(here)
        if why is not None:
            return here, why
        if depth < LITERAL_DEPTH and here.type in ("array", "object"):
            for child in reversed(here.named_children):
                if child.type == "pair":
                    value = child.child_by_field_name("value")
                    if value is not None:
                        stack.append((value, depth + 1))
                elif child.type != "spread_element":
                    stack.append((child, depth + 1))
    return None


def _not_json_leaf(node: Node) -> str | None:
    kind = node.type
    if kind in _FUNCTIONS or kind in ("class", "class_declaration"):
        return "a function"
    if kind == "identifier" and _text(node) in ("NaN", "Infinity"):
        return _text(node)
    if kind == "unary_expression":
        arg = node.child_by_field_name("argument")
        return _not_json_leaf(_unwrap(arg)) if arg is not None else None
    if kind == "number" and isinstance(_number(_text(node)), _BigInt):
        return "a BigInt"
    if kind == "regex":
        return "a regular expression"
    if kind == "call_expression" and _callee_text(node) == "Symbol":
        return "a symbol"
    if kind == "member_expression":
        obj = node.child_by_field_name("object")
        if obj is not None and obj.type == "identifier" and _text(obj) == "Symbol":
            return "a symbol"
    return None


class _Checks:
    """One pass over the tree collecting what each rule needs, then the rules."""

    def __init__(
        self, source: str, tree: Tree, agents: set[str] | None, max_spawns: int | None, report: Report
    ) -> None:
        self.data = source.encode("utf-8")
        self.tree = tree
        self.agents = agents
        self.max_spawns = max_spawns
        self.report = report
        self.spawn_keys: dict[str, Node] = {}
        """Distinct literal child keys started outside loops and helpers."""
        self.dynamic: list[tuple[Node, str]] = []
        """Child starts whose count the text does not settle, and why."""

    def error(self, node: Node, message: str, kind: str, *, unknown_agent: bool = False) -> None:
        line, col = _position(self.data, node)
        self.report.errors.append(Problem(line, col, message, unknown_agent=unknown_agent, kind=kind))

    def warn(self, node: Node, message: str, kind: str) -> None:
        line, col = _position(self.data, node)
        self.report.warnings.append(Problem(line, col, message, kind=kind))

    def run(self) -> None:
        batches: list[tuple[Node, Node]] = []
        uses: dict[str, list[Node]] = {}
        """Member and subscript expressions, by the name they read from."""
        for site in _walk(self.tree.root_node):
            node = site.node
            if _is_async(node):
                self.error(node, NESTED_ASYNC, "nested-async")
            elif node.type == "call_expression":
                self._call(site)
            elif node.type == "return_statement" and not site.in_function:
                value = node.named_children[0] if node.named_child_count else None
                if value is not None and value.type != "comment":
                    self._json(value, "the workflow's return value")
            elif node.type == "variable_declarator":
                batch = self._all_binding(node)
                if batch is not None:
                    batches.append(batch)
            elif node.type in ("member_expression", "subscript_expression"):
                obj = node.child_by_field_name("object")
                if obj is not None and obj.type == "identifier":
                    uses.setdefault(_text(obj), []).append(node)
        for name_node, scope in batches:
            self._keyed_access(name_node, scope, uses.get(_text(name_node), []))
        self._budget()

    # --- calls -------------------------------------------------------------------------------

    def _call(self, site: _Site) -> None:
        call = site.node
        method = _runs_method(call)
        args = _args(call)
        if method is None:
            callee = _callee_text(call)
            if callee == "emit" and args:
                self._json(args[0], "emit(...)")
            elif callee == "state.set" and len(args) > 1:
                self._json(args[1], "state.set(...)")
            return
        dynamic = site.in_loop or site.in_function
        if method in ("run", "host", "steer"):
            key = self._key(args[0] if args else None, f"runs.{method}")
            params = args[1] if len(args) > 1 else None
            if method == "run":
                self._spawn(call, key, dynamic, "runs.run")
                if params is not None:
                    self._params(params, "runs.run")
            elif method == "host" and params is not None:
                self._host(_unwrap(params))
        elif method == "all":
            self._all(call, args[0] if args else None, dynamic)
        elif method == "lanes":
            self._lanes(call, args[0] if args else None, dynamic)

    def _key(self, node: Node | None, owner: str) -> str | _Computed | None:
        """The literal key ``node`` spells; ``COMPUTED`` when the text does not settle it, None
        when it is refused here."""
        if node is None:
            return None
        value = literal(node)
        if value is COMPUTED:
            return COMPUTED
        if not isinstance(value, str) or not KEY_RE.fullmatch(value):
            shown = repr(value)[:80] if isinstance(value, str) else _text(node)[:80]
            self.error(node, f"{owner} key {shown} is not a key: it must match {KEY_PATTERN}", "key")
            return None
        return value

    def _spawn(self, node: Node, key: str | _Computed | None, dynamic: bool, what: str) -> None:
        if isinstance(key, _Computed):
            self.dynamic.append((node, f"{what} with a key computed at run time"))
        elif key is not None and dynamic:
            self.dynamic.append((node, f"{what} in a loop or a helper function"))
        elif key is not None:
            self.spawn_keys.setdefault(key, node)

    def _params(self, node: Node, owner: str) -> None:
        node = _unwrap(node)
        self._json(node, f"{owner} parameters")
        if node.type != "object":
            return
        fields, _ = object_known(node)
        if "agent" in fields:
            self._agent(fields["agent"][1])
        if "baseRef" in fields:
            self._base_ref(fields["baseRef"][1], owner)

    def _all(self, call: Node, batch: Node | None, dynamic: bool) -> None:
        batch = _unwrap(batch) if batch is not None else None
        if batch is None or batch.type != "array":
            self.dynamic.append((call, "runs.all over a list built at run time"))
            return
        seen: dict[str, int] = {}
        for index, entry in enumerate(batch.named_children):
            entry = _unwrap(entry)
            if entry.type == "comment":
                continue
            if entry.type == "call_expression" and _runs_method(entry) == "run":
                continue  # a runs.run promise: checked as that call
            if entry.type != "object":
                self.dynamic.append((entry, "a runs.all entry built at run time"))
                continue
            fields, _ = object_known(entry)
            key = self._key(fields["key"][1], f"runs.all item {index}") if "key" in fields else None
            if isinstance(key, str) and key in seen:
                self.error(
                    fields["key"][1],
                    f"runs.all item {index}: the key {key!r} is item {seen[key]}'s too; one batch names "
                    "each child once",
                    "duplicate-key",
                )
            elif isinstance(key, str):
                seen[key] = index
            self._spawn(entry, key, dynamic, "runs.all item")
            self._params(entry, f"runs.all item {index}")

    def _lanes(self, call: Node, manifest: Node | None, dynamic: bool) -> None:
        value = literal(manifest) if manifest is not None else COMPUTED
        if value is COMPUTED or manifest is None:
            self.dynamic.append((call, "runs.lanes over lanes built at run time"))
            if manifest is not None:
                self._lane_parts(_unwrap(manifest), keys=True)
            return
        from pisub.errors import InvalidInput
        from pisub.workflow.lanes import check_lanes, child_key

        try:
            lanes = check_lanes(value, "runs.lanes")
        except InvalidInput as exc:
            self.error(manifest, exc.message, "lanes")
            return
        for lane in lanes:
            for stage in lane.stages:
                self._spawn(manifest, child_key(lane, stage), dynamic, "runs.lanes stage")
        self._lane_parts(_unwrap(manifest), keys=False)

    def _lane_parts(self, manifest: Node, *, keys: bool) -> None:
        """Agents and base refs of the literal parts of a lanes manifest (and their literal keys,
        when ``keys``: the manifest as a whole is not literal, so runs.lanes' check did not run)."""
        if manifest.type != "array":
            return
        for lane in manifest.named_children:
            lane = _unwrap(lane)
            if lane.type != "object":
                continue
            fields, _ = object_known(lane)
            if keys and "key" in fields:
                self._key(fields["key"][1], "runs.lanes lane")
            parts = [fields["defaults"][1]] if "defaults" in fields else []
            stages = _unwrap(fields["stages"][1]) if "stages" in fields else None
            if stages is not None and stages.type == "array":
                parts += stages.named_children
            for part in parts:
                self._params(part, "runs.lanes stage")
                part = _unwrap(part)
                stage_key = object_known(part)[0].get("key") if part.type == "object" else None
                if keys and stage_key is not None:
                    self._key(stage_key[1], "runs.lanes stage")

    def _agent(self, node: Node) -> None:
        value = literal(node)
        if self.agents is None or not isinstance(value, str) or value in self.agents:
            return
        self.error(node, unknown_agent_message(value, self.agents), "agent", unknown_agent=True)

    def _base_ref(self, node: Node, owner: str) -> None:
        from pisub.errors import InvalidInput
        from pisub.worktrees.repo import check_ref_text

        value = literal(node)
        if value is COMPUTED or value is None:
            return
        if not isinstance(value, str):
            self.error(node, f"{owner} baseRef must be a string (a branch, tag or commit id)", "base-ref")
            return
        try:
            check_ref_text(value)
        except InvalidInput as exc:
            self.error(node, f"{owner} baseRef: {exc.message}", "base-ref")

    # --- runs.host ---------------------------------------------------------------------------

    def _host(self, params: Node) -> None:
        if params.type != "object":
            return
        self._json(params, "runs.host parameters")
        fields, complete = object_known(params)
        for name, (name_node, _) in fields.items():
            if name == "cwd":
                self.error(name_node, NO_CWD, "host")
            elif name not in HOST_FIELDS:
                allowed = ", ".join(HOST_FIELDS)
                self.error(name_node, f"runs.host: unknown field {name!r}; allowed: {allowed}", "host")
        if complete:
            for name in HOST_REQUIRED:
                if name not in fields:
                    need = '{kind: "command", command, timeoutMs}'
                    self.error(params, f"runs.host needs {name} ({need})", "host")
        for name, (_, value_node) in fields.items():
            value = literal(value_node)
            if value is COMPUTED or name not in HOST_FIELDS:
                continue
            problem = _host_value(name, value)
            if problem is not None:
                self.error(value_node, f"runs.host {name}: {problem}", "host")

    # --- values ------------------------------------------------------------------------------

    def _json(self, node: Node, what: str) -> None:
        found = not_json(node)
        if found is not None:
            part, why = found
            plain = "plain objects, arrays, strings, finite numbers"
            self.error(part, f"{what}: {why} is not JSON ({plain})", "json")

    # --- runs.all results --------------------------------------------------------------------

    def _all_binding(self, declarator: Node) -> tuple[Node, Node] | None:
        """``(name, scope)`` for ``const name = await runs.all([...])``; an object pattern on it
        is an error at once."""
        value = declarator.child_by_field_name("value")
        target = declarator.child_by_field_name("name")
        if value is None or target is None:
            return None
        value = _unwrap(value)
        if value.type != "await_expression" or not value.named_children:
            return None
        call = _unwrap(value.named_children[0])
        if call.type != "call_expression" or _runs_method(call) != "all":
            return None
        if target.type == "object_pattern":
            self.error(target, _destructured(_text(target)), "keyed-access")
            return None
        scope = declarator.parent.parent if declarator.parent is not None else None
        if target.type != "identifier" or scope is None:
            return None
        return target, scope

    def _keyed_access(self, name_node: Node, scope: Node, uses: list[Node]) -> None:
        """``name.x`` / ``name["x"]`` after ``const name = await runs.all(...)`` in its block."""
        name = _text(name_node)
        for node in uses:
            if not name_node.end_byte <= node.start_byte < scope.end_byte:
                continue
            if node.type == "member_expression":
                prop = node.child_by_field_name("property")
                if prop is None or _text(prop) in _ARRAY_NAMES:
                    continue
                access = f"{name}.{_text(prop)}"
            else:
                index = node.child_by_field_name("index")
                value = literal(index) if index is not None else COMPUTED
                if not isinstance(value, str) or value.isdigit() or value in _ARRAY_NAMES:
                    continue
                access = f"{name}[{value!r}]"
            if not _shadowed(node, name, scope):
                self.error(node, _ordered(access, name, name), "keyed-access")

    # --- spawn budget ------------------------------------------------------------------------

    def _budget(self) -> None:
        if self.max_spawns is None:
            return
        if len(self.spawn_keys) > self.max_spawns:
            nodes = list(self.spawn_keys.values())
            self.error(
                nodes[self.max_spawns],
                f"the script starts {len(self.spawn_keys)} children by literal keys; the spawn budget is "
                f"{self.max_spawns} (maxSubagentSpawnsPerRun): start fewer, or raise --max-spawns",
                "spawn-budget",
            )
        if self.dynamic:
            node, why = self.dynamic[0]
            more = f" (and {len(self.dynamic) - 1} more)" if len(self.dynamic) > 1 else ""
            self.warn(
                node,
                f"{why}{more}: how many children start is known only at run time; the spawn budget "
                f"({self.max_spawns}) is checked then",
                "dynamic-spawn-count",
            )


def _ordered(access: str, name: str, shown: str) -> str:
    return (
        f"{access}: runs.all resolves to an ordered array, not a key map. Use {shown}[0], array "
        f"destructuring (const [first, second] = await runs.all([...])), or "
        f"{shown}.map((result) => result.output), not {access}"
    )


def _destructured(pattern: str) -> str:
    shown = pattern if len(pattern) <= 80 else pattern[:79] + "…"
    return (
        f"const {shown} = await runs.all(...): runs.all resolves to an ordered array, not a key map. "
        "Use array destructuring in the batch's order (const [first, second] = await runs.all([...])), "
        "an index, or .map((result) => result.output)"
    )


def _shadowed(node: Node, name: str, scope: Node) -> bool:
    """Whether a function between ``node`` and ``scope`` takes a parameter ``name``."""
    here = node.parent
    while here is not None and here != scope:
        if here.type in _FUNCTIONS:
            params = here.child_by_field_name("parameters") or here.child_by_field_name("parameter")
            if params is not None and re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", _text(params)):
                return True
        here = here.parent
    return False


def _host_value(name: str, value: object) -> str | None:
    """What is wrong with a literal ``runs.host`` field, or None."""
    if name == "kind":
        return None if value == "command" else 'must be "command"'
    if name == "command":
        if not isinstance(value, str) or not value.strip():
            return "must be a non-empty string"
        size = len(value.encode("utf-8", "replace"))
        return None if size <= MAX_COMMAND_BYTES else f"{size} bytes; at most {MAX_COMMAND_BYTES}"
    if name == "timeoutMs":
        number = isinstance(value, int | float) and not isinstance(value, bool)
        ok = number and 1 <= value <= MAX_TIMEOUT_MS  # type: ignore[operator]
        return None if ok else f"must be a number of milliseconds from 1 to {MAX_TIMEOUT_MS} (24 h)"
    if name == "output":
        return _host_output(value)
    if name == "role":
        return None if value in HOST_ROLES else f"must be one of {', '.join(HOST_ROLES)}"
    if name == "provider":
        return None if isinstance(value, str) and value else "must be a non-empty string"
    return None


def _host_output(value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return "must be a non-empty relative path"
    if len(value.encode("utf-8", "replace")) > MAX_OUTPUT_PATH_BYTES:
        return f"at most {MAX_OUTPUT_PATH_BYTES} bytes"
    if value.startswith("/") or value.startswith("~") or re.match(r"^[A-Za-z]:", value):
        return "must be relative to the workflow's cwd"
    if ".." in re.split(r"[\\/]", value):
        return "must not hold '..'"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "must not hold a control character"
    return None
