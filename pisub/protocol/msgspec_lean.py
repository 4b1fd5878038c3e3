"""Import msgspec without ``typing_extensions`` (and the ``inspect`` it imports): ~12 ms of a
command that reads a run (~25 % of what ``pisub list --state running`` costs above the
interpreter's start), and of every runner's start.

msgspec takes ``get_type_hints`` from ``typing_extensions`` when it can and from :mod:`typing`
otherwise. From Python 3.11 on, ``typing_extensions.get_type_hints(..., include_extras=True)``
— the only call msgspec makes — *is* ``typing.get_type_hints`` (it adds the ``Optional``
clean-up of 3.10 and older, and stripping that ``include_extras=True`` turns off), and
``typing`` has ``Required``/``NotRequired``. pisub's structs use no ``typing_extensions`` form.

Only pisub's own entry points call :func:`import_msgspec` (the command line's fast paths, the
runner, the zygote), before anything imports msgspec; ``import pisub`` in someone else's
process changes nothing. ``typing_extensions`` stays importable afterwards: only msgspec's own
first import is steered, and only when nothing has imported ``typing_extensions`` yet.
"""

from __future__ import annotations

import sys


def import_msgspec() -> None:
    """Import msgspec (once) so that it uses :mod:`typing`'s ``get_type_hints``; a msgspec
    that cannot be imported that way is imported as usual."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules or sys.version_info < (3, 11):
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # its import raises ImportError
    try:
        import msgspec
    except ImportError:
        _forget_msgspec()
    finally:
        if sys.modules.get("typing_extensions", 0) is None:
            del sys.modules["typing_extensions"]
    import msgspec  # noqa: F401  (a no-op when the first import succeeded)


def _forget_msgspec() -> None:
    """Drop a half-imported msgspec, so that the next import starts afresh."""
    for name in [n for n in sys.modules if n == "msgspec" or n.startswith("msgspec.")]:
        del sys.modules[name]
