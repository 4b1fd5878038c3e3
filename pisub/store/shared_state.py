"""State namespaces: JSON values shared by the workflows started with the same ``--state-ns``.

One file, ``<home>/state/<ns>.json``, and its lock, ``<home>/state/<ns>.lock`` (never replaced,
so everyone locks the same inode). Every ``get`` and ``set`` takes the lock and reads the file
(never a stale snapshot); ``set`` merges one key and replaces the file atomically. The whole
file is at most :data:`MAX_STATE_BYTES`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pisub.core.fsio import atomic_write, load_json, private_mkdir
from pisub.core.locks import exclusive
from pisub.errors import InvalidInput, ProtocolError, storage_error
from pisub.protocol.codec import encode_pretty, now_iso
from pisub.protocol.workflow import KEY_RE, SharedState

MAX_STATE_BYTES = 256 * 1024
MAX_DEPTH = 64


def check_namespace(name: str) -> str:
    """``name`` when it is a usable namespace name.

    Raises:
        InvalidInput: it is not ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``.
    """
    if not isinstance(name, str) or not KEY_RE.fullmatch(name):
        raise InvalidInput(f"state namespace {name!r} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return name


class StateNamespace:
    """One namespace's file."""

    def __init__(self, directory: Path, name: str) -> None:
        self.dir = directory
        self.name = check_namespace(name)
        self.file = directory / f"{name}.json"
        self.lock = directory / f"{name}.lock"

    def get(self, key: str) -> Any:
        """The value of ``key`` (None when unset)."""
        _check_key(key)
        with self._locked():
            return self._read().values.get(key)

    def snapshot(self) -> SharedState:
        """Every value and when they last changed (under the lock: never stale)."""
        with self._locked():
            return self._read()

    def set(self, key: str, value: Any) -> None:
        """Set ``key`` to the JSON value ``value`` (merged with the others' keys).

        Raises:
            InvalidInput: the value is not JSON (NaN, a set, an object...), or the file would
                exceed :data:`MAX_STATE_BYTES`.
        """
        _check_key(key)
        check_json(value, f"the value of {key!r}")
        with self._locked():
            state = self._read()
            state.values[key] = value
            state.updated_at = now_iso()
            data = encode_pretty(state)
            if len(data) > MAX_STATE_BYTES:
                raise InvalidInput(
                    f"state namespace {self.name!r} would be {len(data)} bytes; at most {MAX_STATE_BYTES}"
                )
            try:
                atomic_write(self.file, data)
            except OSError as exc:
                raise storage_error(exc, "write", self.file) from exc

    def _locked(self) -> Any:
        try:
            private_mkdir(self.dir)
        except OSError as exc:
            raise storage_error(exc, "create", self.dir) from exc
        return exclusive(self.lock)

    def _read(self) -> SharedState:
        try:
            return load_json(self.file, SharedState, limit=MAX_STATE_BYTES)
        except FileNotFoundError:
            return SharedState()
        except ProtocolError as exc:
            raise ProtocolError(f"state namespace {self.name!r} is unreadable: {exc}") from exc


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 256:
        raise InvalidInput(
            f"a state key must be a non-empty string of at most 256 characters, not {key!r:.80}"
        )


def check_json(value: Any, what: str, depth: int = 0) -> None:
    """Raises InvalidInput (naming ``what`` and where inside it) unless ``value`` is plain JSON:
    None, bool, finite numbers, strings, lists and string-keyed dicts, at most
    :data:`MAX_DEPTH` deep."""
    if depth > MAX_DEPTH:
        raise InvalidInput(f"{what} is nested more than {MAX_DEPTH} deep")
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(f"{what} is not JSON: a string that is not valid UTF-8") from None
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(f"{what} is not JSON: {value} is not a finite number")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_json(item, f"{what}[{index}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInput(f"{what} is not JSON: key {key!r} is not a string")
            check_json(item, f"{what}[{key!r}]", depth + 1)
        return
    raise InvalidInput(f"{what} is not JSON: a {type(value).__name__}")


def plain_json(value: Any, what: str) -> Any:
    """``value`` as plain JSON data — pisub's records (a child's result) become objects — after
    :func:`check_json` (nothing is turned into JSON silently: a set, NaN or an object is an
    error).

    Raises:
        InvalidInput: naming ``what`` and where inside it.
    """
    import msgspec

    def plain(item: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise InvalidInput(f"{what} is nested more than {MAX_DEPTH} deep")
        if isinstance(item, msgspec.Struct):
            return msgspec.to_builtins(item)
        if isinstance(item, list | tuple):
            return [plain(v, depth + 1) for v in item]
        if isinstance(item, dict):
            return {k: plain(v, depth + 1) for k, v in item.items()}
        return item

    converted = plain(value, 0)
    check_json(converted, what)
    return converted
