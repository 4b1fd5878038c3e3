"""Names of a package loaded on first use (PEP 562): the package's ``__getattr__``.

``pisub`` and ``pisub.protocol`` re-export names from their modules without importing them, so
that ``import pisub.<module>`` (the CLI, the runner) pays only for what it uses.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # (not typing's: ``import pisub`` stays free of typing, see pisub.__main__)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping
    from typing import Any


def lazy_names(
    package: str, homes: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` loading ``name`` from the module ``homes[name]``
    on first use and keeping it in ``namespace`` (the package's ``globals()``)."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        namespace[name] = value
        return value

    return __getattr__
