"""Fault injection for pisub's own processes, loaded through ``PYTHONPATH`` (tests only).

While the file named by ``PISUB_FAULT_FILE`` exists, every write-side call of a process whose
command line matches ``PISUB_FAULT_WHO`` (``runner`` or ``cli``) on a path under
``PISUB_FAULT_DIR`` fails with the errno named in that file (``ENOSPC``, ``EIO``, ...) — the
way a full disk, a quota, a dying disk or a read-only remount would make it fail. ``runner.log``
is spared: it stands for the space the runner reserves for saying why it could not write.
Other processes (the agent's child, the test itself) are untouched.

Launch points: while ``PISUB_FAULT_AT`` names one of :data:`POINTS` and ``PISUB_FAULT_KEY`` a
workflow child's key, the first process of pisub's own (the test itself is not one: it does not
load this file) that reaches that point of launching that key claims
``$PISUB_FAULT_LATCH/<point>`` (once: ``O_EXCL``; ``PISUB_FAULT_TIMES=N``: the first N times),
writes its pid there and then kills itself (``SIGKILL``) — or, for ``launch.before-commit``
(reached in the child's runner, not in its launcher), stops itself (``SIGSTOP``) for the test to
kill the coordinator and continue it. ``PISUB_FAULT_ACTION=kill`` or ``stop`` chooses.

``PISUB_FAULT_FINAL_WRITE_S=N``: in a process of ``PISUB_FAULT_WHO``, the retry of the final
writes under a full disk (``FINAL_WRITE_S``, 30 s) lasts N seconds — for the tests about what
happens once it gives up, not about how long it tries (one test keeps the real 30 s).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

_CONTROL = os.environ.get("PISUB_FAULT_FILE")
_ROOT = os.environ.get("PISUB_FAULT_DIR", "")
_WHO = os.environ.get("PISUB_FAULT_WHO", "runner")


def _is_target() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    runner = b"pisub.runner" in argv
    cli = b"pisub" in argv and not runner
    return (_WHO == "runner" and runner) or (_WHO == "cli" and cli)


def _install() -> None:
    real_open, real_write, real_exists = os.open, os.write, os.path.exists
    names = ("link", "rename", "replace", "mkdir", "fsync", "ftruncate")
    real: dict[str, Callable[..., Any]] = {name: getattr(os, name) for name in names}

    def failing() -> int | None:
        if not real_exists(_CONTROL or "/nonexistent"):
            return None
        try:
            with open(_CONTROL or "", encoding="ascii") as fh:
                return int(getattr(errno, fh.read().strip() or "ENOSPC"))
        except (OSError, AttributeError, ValueError):
            return errno.ENOSPC

    def hit(path: object) -> int | None:
        text = os.fsdecode(path) if isinstance(path, str | bytes | os.PathLike) else ""
        if not text.startswith(_ROOT) or text.endswith("runner.log"):
            return None
        return failing()

    def fd_path(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def fail(code: int, path: object) -> OSError:
        return OSError(
            code, os.strerror(code), os.fsdecode(path) if isinstance(path, str | bytes) else str(path)
        )

    def under(dir_fd: int | None, path: object) -> object:
        """The path a ``dir_fd``-relative name stands for (pisub writes relative to folders)."""
        if dir_fd is None or not isinstance(path, str | bytes):
            return path
        return os.path.join(fd_path(dir_fd), os.fsdecode(path))

    def open_(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and (code := hit(under(dir_fd, path))):
            raise fail(code, path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def write(fd, data):  # type: ignore[no-untyped-def]
        if fd > 2 and (code := hit(fd_path(fd))):
            raise fail(code, fd_path(fd))
        return real_write(fd, data)

    def by_path(name: str):  # type: ignore[no-untyped-def]
        fn = real[name]

        def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
            target = args[1] if name in ("link", "rename", "replace") else args[0]
            target = under(kwargs.get("dst_dir_fd", kwargs.get("dir_fd")), target)
            if isinstance(target, int):
                target = fd_path(target)
            if code := hit(target):
                raise fail(code, target)
            return fn(*args, **kwargs)

        return wrapped

    os.open = open_
    os.write = write
    for name in real:
        setattr(os, name, by_path(name))


if _CONTROL and _ROOT and _is_target():
    _install()


# -- launch points ---------------------------------------------------------------------------

POINTS = (
    "launch.before-create",  # the start is journaled; the child's run directory does not exist
    "launch.created",  # the run directory exists; nothing was handed to a runner yet
    "launch.handoff-sent",  # the run is sent to the warm runner; no acknowledgement read yet
    "launch.got",  # the warm runner acknowledged (got); the launcher has not said go
    "launch.go",  # the launcher said go; it has not read the runner's answer
    "launch.before-commit",  # the child's runner took the run; its startup commit is not written
    "schedule.claimed",  # a tick's claim of a slot is on disk; its run does not exist yet
    "schedule.created",  # the fire's run directory exists; its runner was never started
    "schedule.launched",  # the fire's run was started; the tick has not recorded it
)
"""(The ``schedule.*`` points match ``PISUB_FAULT_KEY`` against the label of the fire's run.)"""
_AT = os.environ.get("PISUB_FAULT_AT", "")
_KEY = os.environ.get("PISUB_FAULT_KEY", "")
_LATCH = os.environ.get("PISUB_FAULT_LATCH", "")


_TIMES = int(os.environ.get("PISUB_FAULT_TIMES", "1") or "1")
_ACTION = os.environ.get("PISUB_FAULT_ACTION", "")


def _fire(point: str, key: object) -> None:
    import signal

    if point != _AT or key != _KEY:
        return
    for n in range(_TIMES):
        name = point if n == 0 else f"{point}.{n}"
        try:
            fd = os.open(os.path.join(_LATCH, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # fired this time already
        break
    else:
        return  # fired as often as asked (a later launch of the key goes on)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    stop = _ACTION == "stop" or (not _ACTION and point == "launch.before-commit")
    os.kill(os.getpid(), signal.SIGSTOP if stop else signal.SIGKILL)


def _key_of(run_dir: object) -> object:
    import json

    try:
        with open(os.path.join(os.fsdecode(run_dir), "manifest.json"), encoding="utf-8") as fh:  # type: ignore[arg-type]
            return json.load(fh).get("key")
    except (OSError, ValueError):
        return None


def _patch(module: Any) -> None:
    """Wrap the launch steps of ``module`` (called once it is imported)."""
    import threading

    name = module.__name__
    if name == "pisub.store.runs":
        create = module.RunStore.create

        def create_(self, manifest, *args, **kwargs):  # type: ignore[no-untyped-def]
            _fire("launch.before-create", manifest.key)
            made = create(self, manifest, *args, **kwargs)
            _fire("launch.created", manifest.key)
            _fire("schedule.created", manifest.label)
            return made

        module.RunStore.create = create_
    elif name == "pisub.backends.warm":
        hand_off, receive = module.hand_off, module._receive
        current = threading.local()

        def hand_off_(warm, run_dir, *args, **kwargs):  # type: ignore[no-untyped-def]
            current.key = _key_of(run_dir)
            answer = hand_off(warm, run_dir, *args, **kwargs)
            _fire("launch.go", current.key)
            return answer

        def receive_(sock, timeout):  # type: ignore[no-untyped-def]
            key = getattr(current, "key", None)
            _fire("launch.handoff-sent", key)
            ack = receive(sock, timeout)
            _fire("launch.got", key)
            return ack

        module.hand_off, module._receive = hand_off_, receive_
    elif name == "pisub.runner.supervise":
        startup = module.Supervisor._startup

        def startup_(self):  # type: ignore[no-untyped-def]
            _fire("launch.before-commit", self.manifest.key)
            return startup(self)

        module.Supervisor._startup = startup_
    elif name == "pisub.api.client":
        launch_workflow = module.launch_workflow

        def launch_workflow_(*args, **kwargs):  # type: ignore[no-untyped-def]
            if kwargs.get("run_id") is not None:  # a schedule's fire
                _fire("schedule.claimed", kwargs.get("label"))
            made = launch_workflow(*args, **kwargs)
            if kwargs.get("run_id") is not None:
                _fire("schedule.launched", kwargs.get("label"))
            return made

        module.launch_workflow = launch_workflow_


def _after_import(wanted: Callable[[str], bool], patch: Callable[[Any], None]) -> None:
    """Call ``patch(module)`` on every module whose name ``wanted`` takes, once it has been
    executed (an import hook at the front of ``sys.meta_path``)."""
    import importlib.abc
    import importlib.machinery
    import sys

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
            if not wanted(fullname):
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            execute = loader.exec_module

            def exec_module(module):  # type: ignore[no-untyped-def]
                execute(module)
                patch(module)

            loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


def _install_points() -> None:
    """Patch the modules of the launch points as they are imported."""
    wanted = {"pisub.store.runs", "pisub.backends.warm", "pisub.runner.supervise", "pisub.api.client"}
    _after_import(wanted.__contains__, _patch)


if _AT in POINTS and _LATCH:
    _install_points()


def _install_final_write(seconds: float) -> None:
    """Every pisub module defining ``FINAL_WRITE_S`` gets ``seconds`` as it is imported (before
    any module importing the name from it can copy it)."""

    def shorten(module: Any) -> None:
        if hasattr(module, "FINAL_WRITE_S"):
            module.FINAL_WRITE_S = seconds

    _after_import(lambda name: name.startswith("pisub."), shorten)


_FINAL_WRITE_S = os.environ.get("PISUB_FAULT_FINAL_WRITE_S", "")
if _FINAL_WRITE_S and _is_target():
    _install_final_write(float(_FINAL_WRITE_S))


# -- queue promotion points ------------------------------------------------------------------
# ``PISUB_FAULT_QUEUE_AT`` names a step of a promotion (:func:`pisub.runs.queue._step`:
# ``queue.locked``, ``queue.left``, ``queue.admitted``, ``queue.rung``); while the file
# ``PISUB_FAULT_QUEUE_ARM`` exists, the first process of pisub's own that reaches it claims
# ``$PISUB_FAULT_LATCH/<point>`` (``O_EXCL``: once), writes its pid there and kills itself.

_QUEUE_AT = os.environ.get("PISUB_FAULT_QUEUE_AT", "")
_QUEUE_ARM = os.environ.get("PISUB_FAULT_QUEUE_ARM", "")


def _queue_step(point: str) -> None:
    import signal

    if point != _QUEUE_AT or not os.path.exists(_QUEUE_ARM):
        return
    try:
        fd = os.open(os.path.join(_LATCH, point), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


if _QUEUE_AT and _QUEUE_ARM and _LATCH:
    _after_import(
        lambda name: name == "pisub.runs.queue", lambda module: setattr(module, "_step", _queue_step)
    )
