"""One ``runs.host`` command of a named workflow resource: its parameters checked strictly, the
command run (argv, never through a shell) in a process group of its own in the workflow's cwd,
bounded in time and ended with the workflow, its log kept, and its ``output`` file written
atomically inside the cwd (``spec/resources.md``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pisub.core.fsio import _create_exclusive, private_mkdir, read_bytes, read_tail
from pisub.core.procs import OutputUnwritable, kill_all, marked_processes, run_bounded
from pisub.errors import InvalidInput
from pisub.protocol.host import (
    MAX_COMMAND_BYTES,
    MAX_OUTPUT_PATH_BYTES,
    HostParams,
    HostReason,
    HostResult,
    HostState,
)
from pisub.runs.launch import in_pisub_files
from pisub.store.paths import Home
from pisub.termsafe import printable

PREVIEW_BYTES = 4 * 1024
"""The result's ``output``: the last 4 KiB of the command's output."""

LOG_BYTES = 1024 * 1024
"""A host command's log keeps at most its first and last half MiB (1 MiB)."""

STEP_MARKER_ENV = "PISUB_HOST_STEP"
"""Set, to a fresh token, in each host command's environment: what it started that left its
group (``setsid``) is found by it and ended when the step ends."""

KILL_GRACE_S = 1.0
"""``SIGTERM``, then this long for the command's group to go, then ``SIGKILL``."""

NO_CWD = (
    "there is no per-step cwd: the command and a relative output path use the workflow's cwd; "
    "launch the workflow with the cwd you need (cwd on the request, --cwd)"
)

_camel = {"timeout_ms": "timeoutMs"}


def check_params(params: object, where: str) -> HostParams:
    """``runs.host``'s parameters, strictly.

    Raises:
        InvalidInput: naming the field (an unknown one, ``cwd``, a bad value).
    """
    if not isinstance(params, dict):
        raise InvalidInput(f"{where}: the parameters must be an object, not {type(params).__name__}")
    if "cwd" in params:
        raise InvalidInput(f"{where}: cwd: {NO_CWD}")
    try:
        checked = msgspec.convert(params, type=HostParams, strict=True)
    except msgspec.ValidationError as exc:
        raise InvalidInput(f"{where}: {printable(str(exc), one_line=True)[:300]}") from None
    except RecursionError:
        raise InvalidInput(f"{where}: nested too deeply") from None
    if len(checked.command.encode("utf-8", "surrogatepass")) > MAX_COMMAND_BYTES:
        raise InvalidInput(f"{where}: command is longer than {MAX_COMMAND_BYTES} bytes")
    if "\0" in checked.command:
        raise InvalidInput(f"{where}: command holds a NUL character")
    if checked.output is not None:
        output_parts(checked.output, where)
    return checked


def output_parts(output: str, where: str) -> list[str]:
    """The components of a relative ``output`` path.

    Raises:
        InvalidInput: absolute, longer than 240 bytes, with ``..``, ``.`` or an empty component,
            or a NUL or control character.
    """
    shown = printable(repr(output)[:80], one_line=True)
    if len(output.encode("utf-8", "surrogatepass")) > MAX_OUTPUT_PATH_BYTES:
        raise InvalidInput(f"{where}: output {shown} is longer than {MAX_OUTPUT_PATH_BYTES} bytes")
    if any(ord(c) < 32 or ord(c) == 127 for c in output):
        raise InvalidInput(f"{where}: output {shown} holds a control character")
    if output.startswith("/"):
        raise InvalidInput(f"{where}: output {shown} must be relative to the workflow's cwd")
    parts = output.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidInput(
            f"{where}: output {shown}: no '..', '.' or empty component (it must stay inside the "
            "workflow's cwd)"
        )
    return parts


@dataclass
class Outcome:
    """How one host command ended: the result, and why it failed (``error`` its message)."""

    result: HostResult
    state: HostState
    reason: HostReason | None = None
    error: str | None = None


def run_host(
    key: str,
    params: HostParams,
    *,
    cwd: Path,
    log: Path,
    should_stop: Callable[[], bool],
    env: dict[str, str] | None = None,
    home: Home | None = None,
) -> Outcome:
    """Run one host command to its end (never raises for the command's own failure). An
    ``output`` that lands inside pisub's ``home`` (a run's own files) is refused before it runs."""
    began = time.monotonic()
    where = f"runs.host({key!r})"
    result = HostResult(key=key, ok=False, log_path=str(log))

    def failed(reason: HostReason, message: str, state: HostState = HostState.ERROR) -> Outcome:
        result.duration_ms = int((time.monotonic() - began) * 1000)
        return Outcome(result, state, reason, f"{where}: {message}")

    try:
        argv = shlex.split(params.command)
    except ValueError as exc:
        return failed(HostReason.START, f"cannot split the command: {exc}")
    if not argv:
        return failed(HostReason.START, "the command is empty")
    if params.output is not None:
        target = Path(os.path.abspath(cwd)).joinpath(*output_parts(params.output, "output"))
        if home is not None and in_pisub_files(target, home):
            return failed(
                HostReason.OUTPUT,
                f"output {params.output!r} would be {target}, inside pisub's home {home.root} (its runs' "
                "own files); launch the workflow with a cwd outside the home",
            )
        try:
            check_output_target(cwd, params.output)
        except OSError as exc:
            return failed(HostReason.OUTPUT, f"output {params.output!r}: {_why(exc)}")
    marker = secrets.token_hex(8)
    try:
        private_mkdir(log.parent)
        done = run_bounded(
            argv,
            timeout=params.timeout_ms / 1000,
            cwd=cwd,
            env={**(os.environ if env is None else env), STEP_MARKER_ENV: marker},
            output=log,
            cap=LOG_BYTES // 2 - 64,
            should_stop=should_stop,
            grace=KILL_GRACE_S,
        )
    except OutputUnwritable as exc:
        return failed(HostReason.START, f"cannot write its log {log}: {_why(exc)}")
    except (OSError, ValueError) as exc:
        return failed(HostReason.START, f"cannot start {argv[0]!r}: {_why(exc)}")
    finally:
        end_escapees(marker)
    result.exit_code = done.returncode
    result.output = preview(log)
    result.duration_ms = int((time.monotonic() - began) * 1000)
    if done.stopped:
        return failed(HostReason.CANCELLED, "cancelled: the workflow is stopping", HostState.CANCELLED)
    if done.timed_out:
        return failed(HostReason.TIMEOUT, f"timed out after {params.timeout_ms} ms (log: {log})")
    if params.output is not None:
        try:
            result.report_path = str(write_output(cwd, params.output, log))
        except OSError as exc:
            return failed(HostReason.OUTPUT, f"cannot write output {params.output!r}: {_why(exc)}")
    if done.returncode != 0:
        code = done.returncode
        said = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return failed(
            HostReason.EXIT, f"{printable(params.command[:200], one_line=True)} {said} (log: {log})"
        )
    result.ok = True
    return Outcome(result, HostState.DONE)


def end_escapees(marker: str) -> None:
    """End what the step started that left its process group (``setsid``): the processes whose
    environment still carries the step's marker."""
    left = marked_processes(marker, name=STEP_MARKER_ENV)
    if left:
        kill_all(left, grace=KILL_GRACE_S)


def _why(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or exc)


def preview(log: Path) -> str:
    """The last :data:`PREVIEW_BYTES` of the log, as text."""
    text = read_tail(log, PREVIEW_BYTES).decode("utf-8", "replace")
    while len(text.encode("utf-8")) > PREVIEW_BYTES:  # a replaced byte is three
        text = text[1:]
    return text


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_parent(cwd: Path, parts: list[str], *, create: bool) -> int | None:
    """A descriptor of the directory ``parts[:-1]`` below ``cwd``, walked one component at a
    time without following a symlink (created 0755 when ``create``); None when it is missing.

    Raises:
        OSError: a component is a symlink (``ELOOP``) or not a directory.
    """
    fd = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(part, 0o755, dir_fd=fd)
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _component_error(exc, part) from None
            os.close(fd)
            fd = inner
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return fd


def _component_error(exc: OSError, part: str) -> OSError:
    import errno

    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return OSError(
            exc.errno, f"{part!r} is a symlink or not a directory (output is never written through one)"
        )
    return exc


def _check_name(dfd: int, name: str) -> None:
    """The output's own name is absent, or a regular file with one link.

    Raises:
        OSError: a symlink, not a regular file, or hard-linked.
    """
    import errno

    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "it is a symlink (output is never written through one)")
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "it exists and is not a regular file")
    if st.st_nlink > 1:
        raise OSError(errno.EMLINK, f"it is hard-linked ({st.st_nlink} links): refused")


def check_output_target(cwd: Path, output: str) -> None:
    """Refuse, before the command runs, an output path that could not be written safely.

    Raises:
        OSError: as :func:`write_output` would.
    """
    parts = output_parts(output, "output")
    dfd = _open_parent(cwd, parts, create=False)
    if dfd is None:
        return
    try:
        _check_name(dfd, parts[-1])
    finally:
        os.close(dfd)


def write_output(cwd: Path, output: str, log: Path) -> Path:
    """Write the command's log to ``<cwd>/<output>`` atomically (a temp file renamed over it),
    never through a symlink, never over a hard-linked file; the file's absolute path.

    Raises:
        OSError: it cannot be written there safely.
    """
    parts = output_parts(output, "output")
    data = read_bytes(log, limit=LOG_BYTES + 4096)
    dfd = _open_parent(cwd, parts, create=True)
    assert dfd is not None
    name = parts[-1]
    tmp = f".{name[:200]}.pisub-{secrets.token_hex(6)}.tmp"
    try:
        _check_name(dfd, name)
        _create_exclusive(dfd, tmp, data, 0o644)
        try:
            _check_name(dfd, name)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return Path(os.path.abspath(cwd)).joinpath(*parts)


def result_json(result: HostResult) -> dict[str, Any]:
    """The result as the script sees it (camelCase; ``reportPath`` only when there is one)."""
    shown: dict[str, Any] = msgspec.to_builtins(result)
    if shown.get("reportPath") is None:
        shown.pop("reportPath", None)
    return shown
