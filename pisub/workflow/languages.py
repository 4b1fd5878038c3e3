"""The script languages of a workflow: one small interface, two implementations.

A language turns a script file into the coordinator's ``main(runs, state, args)``
(:meth:`ScriptRuntime.load`) and checks a script's text without running it
(:meth:`ScriptRuntime.check`, ``pisub workflow validate``). Everything else — the journal,
replay on resume, stop, steer, the children — is the coordinator's, shared by both languages
(tests/contract/test_script_language_contract.py runs the same suite against each).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from pisub.errors import InvalidInput
from pisub.protocol.workflow import ScriptLanguage
from pisub.workflow.validate import Report

MainFn = Callable[[Any, Any, Any], Coroutine[Any, Any, Any]]

SUFFIXES = {
    ".py": ScriptLanguage.PYTHON,
    ".js": ScriptLanguage.JAVASCRIPT,
    ".mjs": ScriptLanguage.JAVASCRIPT,
    ".cjs": ScriptLanguage.JAVASCRIPT,
}


class ScriptRuntime(Protocol):
    """What the coordinator and ``validate`` need of a script language."""

    language: ScriptLanguage

    def load(self, path: Path, name: str, seed: int) -> MainFn:
        """The script's ``main``; ``name`` names it in messages, ``seed`` makes what the
        language offers as randomness the same on every replay.

        Raises:
            InvalidInput: the script cannot run (naming the line).
        """

    def check(self, source: str, agents: set[str] | None, filename: str, max_spawns: int | None) -> Report:
        """Every problem a static look at ``source`` finds (``agents``: the names that exist,
        None: not checked)."""


class Python:
    language = ScriptLanguage.PYTHON

    def load(self, path: Path, name: str, seed: int) -> MainFn:
        import random

        from pisub.workflow.script import load_main

        random.seed(seed)  # the coordinator's process is the script's: random replays too
        return load_main(path, name)

    def check(self, source: str, agents: set[str] | None, filename: str, max_spawns: int | None) -> Report:
        from pisub.workflow.validate import validate_source

        return validate_source(source, agents, filename)


class JavaScript:
    language = ScriptLanguage.JAVASCRIPT

    def load(self, path: Path, name: str, seed: int) -> MainFn:
        from pisub.workflow.js.engine import load_js_main

        return load_js_main(path, name, seed)

    def check(self, source: str, agents: set[str] | None, filename: str, max_spawns: int | None) -> Report:
        from pisub.workflow.js.checks import validate_js

        return validate_js(source, agents, filename, max_spawns)


def runtime(language: ScriptLanguage) -> ScriptRuntime:
    """The implementation of ``language``."""
    return JavaScript() if language is ScriptLanguage.JAVASCRIPT else Python()


def language_of(path: Path, given: str | None = None) -> ScriptLanguage:
    """The language of the script at ``path``: ``given`` (``python``/``javascript``), else by
    its suffix.

    Raises:
        InvalidInput: an unknown language or suffix (TypeScript is refused by name).
    """
    if given is not None:
        try:
            return ScriptLanguage(given)
        except ValueError:
            raise InvalidInput(f"language {given!r:.40}: one of python, javascript") from None
    suffix = path.suffix.lower()
    if suffix in SUFFIXES:
        return SUFFIXES[suffix]
    if suffix in (".ts", ".mts", ".cts"):
        raise InvalidInput(f"{path}: TypeScript is not run; write the workflow as a .js (or .py) file")
    raise InvalidInput(f"{path}: a workflow script is a .js (JavaScript) or .py (Python) file")


def replay_seed(journal: str) -> int:
    """The seed of a workflow's randomness: the same for every run that resumes it."""
    return int.from_bytes(hashlib.sha256(journal.encode("utf-8", "surrogatepass")).digest()[:4], "big") or 1
