"""What is wrong with JSON text a strict reader refused, said plainly and with its place.

msgspec, which decodes every file, keeps the last of a key given twice (strict input refuses
it: which one was meant?) and words some refusals so that they mislead — a ``\\uD800``-``\\uDFFF``
escape that is not half of a surrogate pair is "truncated" or a "hex escape" that ends early,
an empty file is "truncated", a byte order mark an "invalid character". Python's own parser,
which lets both by, reads the text a second time to say where: only for input from outside
(requests) and only once something was refused or is to be checked. :func:`first_not_utf8`
also names the field of a parsed value (a launch's manifest) that no UTF-8 file can hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from pisub.termsafe import is_utf8, printable

_BOMS = {b"\xef\xbb\xbf": "UTF-8", b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}


class _Object(dict[str, Any]):
    """A parsed JSON object that remembers the keys it was given twice, in order."""

    twice: tuple[str, ...] = ()


def problem(data: bytes | str, exc: msgspec.DecodeError) -> str:
    """The words for JSON text msgspec refused with ``exc``: its own, except where they mislead."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if not raw.strip():
        return "the text is empty"
    for bom, encoding in _BOMS.items():
        if raw.startswith(bom):
            return f"it starts with a {encoding} byte order mark; the text must be UTF-8 without one"
    try:
        raw.decode()
    except UnicodeDecodeError as bad:
        return f"it is not valid UTF-8 at byte {bad.start}"
    found = first_not_utf8(read_loosely(data))
    if found is not None:
        return f"a \\u escape of half a surrogate pair, which is no character - at `{found[0]}`"
    return str(exc)


def duplicate_key(data: bytes | str) -> str | None:
    """`` `KEY` is given twice - at `$.path.KEY` `` for the first object of ``data`` (outermost
    first) that gives a key twice; None when none does, or the text is not JSON."""
    for where, value in _walk(read_loosely(data), "$"):
        if given_twice(value):
            key = printable(given_twice(value)[0], one_line=True)
            return f"`{key}` is given twice - at `{where}.{key}`"
    return None


def given_twice(value: Any) -> tuple[str, ...]:
    """The keys an object :func:`read_loosely` read was given twice, in order; none else."""
    return value.twice if isinstance(value, _Object) else ()


def first_not_utf8(value: Any) -> tuple[str, str] | None:
    """The path and text of the first string (or key) in parsed ``value`` that is not UTF-8 (a
    lone surrogate: half a pair, or an undecodable byte read with ``surrogateescape``)."""
    for where, item in _walk(value, "$"):
        if isinstance(item, str) and not is_utf8(item):
            return where, item
        if isinstance(item, dict):
            for key in item:
                if not is_utf8(key):
                    return f"{where}.{printable(key, one_line=True)}", key
    return None


def read_loosely(data: bytes | str) -> Any:
    """``data`` as Python's parser reads it — lone surrogates let by, each object remembering the
    keys it was given twice (:func:`given_twice`); None when it is not JSON at all."""
    import json

    def pairs(items: list[tuple[str, Any]]) -> _Object:
        obj = _Object(items)
        if len(obj) != len(items):  # (a key given twice)
            seen: set[str] = set()
            twice = []
            for key, _value in items:
                if key in seen:
                    twice.append(key)
                seen.add(key)
            obj.twice = tuple(twice)
        return obj

    try:
        return json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None


def _walk(value: Any, where: str) -> Iterator[tuple[str, Any]]:
    """Every value in ``value`` with its path, outermost first (an iterative walk: the text may
    nest as deep as Python's parser allowed)."""
    stack = [(where, value)]
    while stack:
        where, value = stack.pop()
        yield where, value
        if isinstance(value, dict):
            items = [(f"{where}.{printable(str(k), one_line=True)}", v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        else:
            continue
        stack.extend(reversed(items))
