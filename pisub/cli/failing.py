"""How a command ends when something fails: one redacted line with its code, never a
traceback (``PISUB_DEBUG=1`` shows it). Without typer or click, so that a command run
without them (:mod:`pisub.cli.fast`) ends exactly as one run through them."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable
from typing import NoReturn

from pisub.errors import InternalError, PisubError, StorageError, storage_error
from pisub.termsafe import printable

CLOSED_STDOUT = "stdout is closed: nothing was done; run it with an open stdout (e.g. >/dev/null)"


def guarded(command: Callable[[], object]) -> NoReturn:
    """Run ``command`` and exit: with its code (an int), else 0; a failure as one line
    (:func:`_fail`, exit 1), an interrupt 130, a reader gone away 141."""
    if sys.stdout is None:  # fd 1 closed (`>&-`): no command could say what it did
        _fail(StorageError(CLOSED_STDOUT))
    try:
        code = command()
        sys.stdout.flush()  # (here: a reader gone away is told apart from other failures)
    except PisubError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        quiet_broken_pipe()
    except OSError as exc:
        _fail(storage_error(exc, "use"), exc)
    except Exception as exc:
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        _fail(InternalError(f"internal error (please report it): {what}"), exc)
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)


def _fail(error: PisubError, cause: BaseException | None = None) -> NoReturn:
    """Print one line for ``error`` (redacted) and exit 1."""
    from pisub.api.text import redact

    if cause is not None and os.environ.get("PISUB_DEBUG"):
        import traceback

        traceback.print_exception(cause)
    # one line: every run of whitespace that breaks a line becomes one space; a value's own
    # spaces stay as given ('npm  test' is not 'npm test')
    line = re.sub(r"\s*[^\S ]\s*", " ", redact(error.message)).strip()
    print(f"pisub: {printable(line, one_line=True)} [{error.code}]", file=sys.stderr)
    sys.exit(1)


def quiet_broken_pipe() -> NoReturn:
    """The reader of our output went away (``pisub list | head``): exit without a word."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(141)
