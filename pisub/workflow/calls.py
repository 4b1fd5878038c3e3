"""Child calls: checking what a script or a tasks file asks for, and its fingerprint."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import msgspec

from pisub.errors import InvalidInput, PisubError
from pisub.protocol.codec import convert, decode_input
from pisub.protocol.workflow import KEY_RE, ChildCall
from pisub.termsafe import printable

PYTHON_NAMES = {
    "outputMode": "output_mode",
    "idleTimeout": "idle_timeout",
    "baseRef": "base_ref",
    "toolTimeoutMs": "tool_timeout_ms",
    "checkpointBeforeDeadlineMs": "checkpoint_before_deadline_ms",
    "toolBudget": "tool_budget",
}
"""A call parameter's camelCase name (files, JavaScript) → its Python name (``runs.run``)."""
_CAMEL = {python: camel for camel, python in PYTHON_NAMES.items()}


def camel_name(name: str) -> str:
    """A call parameter's file spelling (``idle_timeout`` → ``idleTimeout``); others as given."""
    return _CAMEL.get(name, name)


MAX_TASKS = 1000
MAX_TASKS_FILE = 16 * 1024 * 1024

_fingerprint_encoder = msgspec.json.Encoder(order="sorted")


def check_key(key: object, where: str) -> str:
    """``key`` when it is a usable child key.

    Raises:
        InvalidInput: it is not ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``.
    """
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        # (worded so that the redaction of "key: value" in error lines leaves the value shown)
        shown = printable(repr(key)[:80], one_line=True)
        raise InvalidInput(f"{where}: the key {shown} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}")
    return key


def from_python(key: object, params: dict[str, Any], where: str) -> ChildCall:
    """The call ``runs.run(key, **params)`` asks for (Python names), checked strictly.

    Raises:
        InvalidInput: naming the parameter (in its Python spelling).
    """
    check_key(key, where)
    data = {"key": key}
    for name, value in params.items():
        if value is not None:
            data[_CAMEL.get(name, name)] = value
    return _convert(data, where, python=True)


def from_mapping(data: object, where: str, *, default_key: str | None = None) -> ChildCall:
    """One call from a mapping (a ``runs.all`` entry in Python names, or a tasks-file entry in
    its camelCase names).

    Raises:
        InvalidInput: naming ``where`` and the field.
    """
    if not isinstance(data, dict):
        raise InvalidInput(f"{where}: expected an object with agent and task, not {type(data).__name__}")
    fields: dict[str, Any] = {}
    for name, value in data.items():
        if not isinstance(name, str):
            raise InvalidInput(f"{where}: field names must be strings, not {name!r:.40}")
        if value is not None:
            fields[_CAMEL.get(name, name)] = value
    if "key" not in fields and default_key is not None:
        fields["key"] = default_key
    call = _convert(fields, where, python=False)
    if call.key is None:
        raise InvalidInput(f"{where}: key is required")
    return call


def _convert(data: dict[str, Any], where: str, *, python: bool) -> ChildCall:
    try:
        call = convert(data, ChildCall, where)
    except PisubError as exc:
        message = str(exc)
        if python:
            for camel, name in PYTHON_NAMES.items():
                message = message.replace(f"`$.{camel}`", f"`{name}`").replace(f"`{camel}`", f"`{name}`")
        raise InvalidInput(message) from None
    for what in ("task", "agent", "output", "cwd", "model", "resume"):
        value = getattr(call, what)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInput(f"{where}: {what} is not valid UTF-8") from None
    if call.output is not None and "\0" in call.output:
        raise InvalidInput(f"{where}: output must not contain NUL bytes")
    return call


def load_tasks(path: Path) -> list[ChildCall]:
    """The tasks of a ``--parallel`` / ``--chain`` file: a JSON list of
    ``{key?, agent, task, ...}`` (keys default to ``task-1``, ``task-2``...).

    Raises:
        InvalidInput: the file cannot be read or an entry is bad (naming ``[i].field``).
    """
    from pisub.core.fsio import read_bytes

    try:
        data = read_bytes(os.path.realpath(path), limit=MAX_TASKS_FILE)  # the user's own path
    except OSError as exc:
        raise InvalidInput(f"cannot read tasks file {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_TASKS_FILE:
        raise InvalidInput(f"tasks file {path} is larger than {MAX_TASKS_FILE} bytes")
    try:
        entries = decode_input(data, list[Any], str(path))
    except PisubError as exc:
        raise InvalidInput(str(exc)) from None
    return tasks_from(entries, str(path))


def tasks_from(entries: list[Any], where: str) -> list[ChildCall]:
    """Checked calls from a list of task objects; keys unique.

    Raises:
        InvalidInput: naming ``where[i]`` and the field.
    """
    if not entries:
        raise InvalidInput(f"{where}: no tasks")
    if len(entries) > MAX_TASKS:
        raise InvalidInput(f"{where}: {len(entries)} tasks; at most {MAX_TASKS}")
    calls = [from_mapping(e, f"{where}[{i}]", default_key=f"task-{i + 1}") for i, e in enumerate(entries)]
    unique_keys(calls, where)
    return calls


def unique_keys(calls: list[ChildCall], where: str) -> None:
    seen: set[str] = set()
    for index, call in enumerate(calls):
        assert call.key is not None
        if call.key in seen:
            raise InvalidInput(f"{where}[{index}]: key {call.key!r} is used twice")
        seen.add(call.key)


def fingerprint(call: msgspec.Struct) -> str:
    """The identity of a call's parameters (a child's :class:`ChildCall`, a host step's
    parameters): same key and same fingerprint is the same call."""
    return hashlib.sha256(_fingerprint_encoder.encode(call)).hexdigest()[:32]
