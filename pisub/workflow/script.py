"""A workflow's Python script: loading it and running its ``main`` in a thread of its own.

The script is user code run with the user's permissions inside the workflow's runner. It is
not a sandbox. It runs in its own thread with its own event loop, so the coordinator — which
answers control requests and supervises the children — goes on while the script computes or
blocks; a stop cancels the script's ``main`` and does not wait for a script that ignores it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import threading
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pisub.errors import InvalidInput, WorkflowFailed
from pisub.workflow.futures import call_soon

MainFn = Callable[[Any, Any, Any], Coroutine[Any, Any, Any]]

SCRIPT_STACK_BYTES = 256 * 1024 * 1024
"""The script thread's stack (address space; pages are used only as deep as the script goes)."""
Done = Callable[[Any, BaseException | None], None]


def load_main(path: Path, name: str | None = None) -> MainFn:
    """The ``async def main(runs, state, args)`` of the script at ``path`` (called ``name`` in
    messages: the file it was copied from).

    Raises:
        InvalidInput: the script does not load (naming the line) or has no such ``main``.
    """
    spec = importlib.util.spec_from_file_location("pisub_workflow_script", path)
    if spec is None or spec.loader is None:
        raise InvalidInput(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    shown = name or path.name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise InvalidInput(f"{shown}:{exc.lineno}: SyntaxError: {exc.msg}") from None
    except Exception as exc:
        raise InvalidInput(f"loading the workflow failed: {describe(exc, path, shown)}") from None
    main = getattr(module, "main", None)
    check_main(main, shown)
    assert main is not None
    return main  # type: ignore[no-any-return]


def check_main(main: object, where: str) -> None:
    """Raises InvalidInput unless ``main`` is ``async def main(runs, state, args)``."""
    if main is None:
        raise InvalidInput(f"{where}: defines no main; write async def main(runs, state, args)")
    if not inspect.iscoroutinefunction(main):
        raise InvalidInput(f"{where}: main must be an async function: async def main(runs, state, args)")
    try:
        inspect.signature(main).bind(None, None, None)
    except TypeError:
        raise InvalidInput(
            f"{where}: main must take three arguments: async def main(runs, state, args)"
        ) from None


def describe(exc: BaseException, script: Path, name: str | None = None) -> str:
    """``<file>:<line>: <Type>: <message>``, naming the script's innermost line in the traceback
    (or the exception alone when the script is not in it)."""
    line = None
    try:
        for frame in traceback.extract_tb(exc.__traceback__):
            if Path(frame.filename) == script:
                line = frame.lineno
    except Exception:  # a traceback that cannot be read: the exception alone
        line = None
    try:
        said = str(exc)[:100_000]
    except Exception:  # an exception whose __str__ raises (a hostile script)
        said = "(its message cannot be shown)"
    text = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
    return f"{name or script.name}:{line}: {text}" if line is not None else text


class ScriptThread:
    """Loads the script and runs its ``main(runs, state, args)`` to its end, in a daemon thread
    (a script's top-level code runs there too, so a script that blocks blocks only itself);
    ``done(value, error)`` is called from that thread when it returns or raises
    (``CancelledError`` after a cancel)."""

    def __init__(self, load: Callable[[], MainFn], arguments: tuple[Any, Any, Any], done: Done) -> None:
        self.load = load
        self.main: MainFn | None = None
        self.arguments = arguments
        self.done = done
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._ready = threading.Event()
        self._cancelled = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="workflow-script", daemon=True)

    def start(self) -> None:
        # A big stack (virtual: only what is touched is memory): the JavaScript engine's
        # JSON.stringify recurses without a stack check, and deep data must fail, not crash.
        old = threading.stack_size(SCRIPT_STACK_BYTES)
        try:
            self.thread.start()
        finally:
            threading.stack_size(old)

    def _run(self) -> None:
        try:
            self.main = self.load()
        except InvalidInput as exc:  # does not load: its own message, no traceback line
            self.done(None, WorkflowFailed(exc.message))
            return
        except BaseException as exc:
            self.done(None, exc)
            return
        try:
            value = asyncio.run(self._main())
        except BaseException as exc:  # the script's own failure, reported, never raised here
            self.done(None, exc)
            return
        self.done(value, None)

    async def _main(self) -> Any:
        with self._lock:
            self.loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            cancelled = self._cancelled
        if cancelled:
            raise asyncio.CancelledError
        assert self.main is not None
        return await self.main(*self.arguments)

    def cancel(self) -> None:
        """Cancel ``main`` (thread-safe; before it started, it never starts)."""
        with self._lock:
            self._cancelled = True
            loop, task = self.loop, self._task
        if loop is not None and task is not None:
            call_soon(loop, task.cancel)
