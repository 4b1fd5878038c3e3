"""Agent frontmatter in its plainest form, read without YAML: importing PyYAML costs a command
that reads agents some 10 ms (its resolver and reader compile their patterns at import), and
nearly every agent file is a few ``key: value`` lines.

:func:`plain` reads a frontmatter made only of lines ``key: value`` whose values are written in
a way that means the same in YAML and here: a double-quoted string (escapes ``\\"``, ``\\\\``,
``\\n``, ``\\t``, ``\\r``, ``\\b``, ``\\f`` only), a whole number without sign or leading zero,
``true``/``false``, a flow list of such strings and plain words (``[read, "grep"]``), or a plain
word or sentence that starts with a letter, holds no ``:``, ``#``, double quote, bracket, brace
or backslash and is no word YAML 1.1 gives a meaning (``yes``, ``off``, ``null``...). Anything
else — a comment, an indented line, a repeated key, a tab, any other value — is YAML's to read
(:func:`plain` answers None), so that what a file means never depends on which reader read it
(``tests/unit/test_frontmatter.py`` holds the two equal).
"""

from __future__ import annotations

import re
from typing import Any

_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*): +(\S(?:.*\S)?) *")
_QUOTED = re.compile(r'"((?:[^"\\\x00-\x1f\x7f]|\\["\\ntrbf])*)"')
_INT = re.compile(r"0|[1-9][0-9]{0,17}")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_SENTENCE = re.compile(r"[A-Za-z][^:#\"\[\]{}\x00-\x1f\x7f\\]*")
_SEP = re.compile(r" *(,) *| *$")
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}
_MEANINGFUL = frozenset(
    w
    for word in ("yes", "no", "on", "off", "true", "false", "null", "y", "n")
    for w in (word, word.capitalize(), word.upper())
)
"""Plain words YAML 1.1 (or a YAML 1.2 reader) takes as a boolean or null: never a string here."""


def plain(text: str) -> dict[str, Any] | None:
    """The frontmatter ``text`` as YAML reads it, when it is in the plain form; else None."""
    if not text.isascii() or "\t" in text or "\r" in text:
        return None
    data: dict[str, Any] = {}
    for line in text.split("\n"):
        if not line:
            continue
        found = _LINE.fullmatch(line)
        if found is None or found[1] in data or found[1] in _MEANINGFUL:
            return None
        value = _value(found[2])
        if value is None:
            return None
        data[found[1]] = value[0]
    return data or None


def _value(text: str) -> tuple[Any] | None:
    if text.startswith('"'):
        string = _string(text)
        return None if string is None else (string,)
    if text.startswith("["):
        items = _list(text)
        return None if items is None else (items,)
    if _INT.fullmatch(text):
        return (int(text),)
    if text in ("true", "false"):
        return (text == "true",)
    if text in _MEANINGFUL or _SENTENCE.fullmatch(text) is None:
        return None
    return (text,)


def _string(text: str) -> str | None:
    found = _QUOTED.fullmatch(text)
    if found is None:
        return None
    return re.sub(r"\\(.)", lambda m: _ESCAPES[m[1]], found[1])


def _list(text: str) -> list[str] | None:
    if not text.endswith("]"):
        return None
    inner = text[1:-1].strip(" ")
    if not inner:
        return []
    items: list[str] = []
    pos = 0
    while True:
        if inner.startswith('"', pos):
            found = _QUOTED.match(inner, pos)
            if found is None:
                return None
            items.append(re.sub(r"\\(.)", lambda m: _ESCAPES[m[1]], found[1]))
        else:
            found = _WORD.match(inner, pos)
            if found is None or found[0] in _MEANINGFUL:
                return None
            items.append(found[0])
        pos = found.end()
        rest = _SEP.match(inner, pos)
        if rest is None:
            return None
        if rest[1] is None:
            return items if rest.end() == len(inner) else None
        pos = rest.end()
