"""What is wrong with JSON text a strict reader refused, said plainly and with its place.

msgspec, which decodes every file, keeps the last of a key given twice (strict input refuses
it: which one was meant?) and words some refusals so that they mislead — a ``\\uD800``-``\\uDFFF``
escape that is not half of a surrogate pair is "truncated" or a "hex escape" that ends early,
an empty file is "truncated", a byte order mark an "invalid character". Python's own parser,
which lets both by, reads the text a second time to say where: only for input from outside
(requests) and only once something was refused or is to be checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from pisub.termsafe import is_utf8, printable

_BOMS = {b"\xef\xbb\xbf": "UTF-8", b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}


class _Object(dict[str, Any]):
    """A parsed JSON object that remembers the first key it was given twice."""

    twice: str | None = None


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
    found = _first_lone_surrogate(data)
    if found is not None:
        return f"a \\u escape of half a surrogate pair, which is no character - at `{found}`"
    return str(exc)


def duplicate_key(data: bytes | str) -> str | None:
    """`` `KEY` is given twice - at `$.path.KEY` `` for the first object of ``data`` (outermost
    first) that gives a key twice; None when none does, or the text is not JSON."""
    for where, value in _walk(_parse(data), "$"):
        if isinstance(value, _Object) and value.twice is not None:
            key = printable(value.twice, one_line=True)
            return f"`{key}` is given twice - at `{where}.{key}`"
    return None


def _first_lone_surrogate(data: bytes | str) -> str | None:
    """Where the first string (or key) holding a lone surrogate is, when ``data`` parses."""
    for where, value in _walk(_parse(data), "$"):
        if isinstance(value, str) and not is_utf8(value):
            return where
        if isinstance(value, dict):
            for key in value:
                if not is_utf8(key):
                    return f"{where}.{printable(key, one_line=True)}"
    return None


def _parse(data: bytes | str) -> Any:
    """``data`` as Python's parser reads it (None when it is not JSON at all)."""
    import json

    def pairs(items: list[tuple[str, Any]]) -> _Object:
        obj = _Object(items)
        seen: set[str] = set()
        for key, _value in items:
            if key in seen:
                obj.twice = key
                break
            seen.add(key)
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
