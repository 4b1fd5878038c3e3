"""pisub inside pi: the ``subagent`` tool's extension file (where it is, installing it for a
user) and the guide topics it and ``pisub guide`` print."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pisub.errors import InvalidInput, storage_error

EXTENSION = Path(__file__).parent / "pi_extension" / "subagent.ts"
INSTALLED_NAME = "pisub-subagent.ts"
GUIDE_DIR = Path(__file__).parent / "guide"
TOPICS = (
    "overview",
    "workflows",
    "agents",
    "control",
    "acceptance",
    "configuration",
    "tool-reference",
    "models",
    "missions",
    "observability",
    "watchdog",
    "extension-api",
)
_DEFAULT_LINE = "const PISUB_ARGV_DEFAULT: string[] | null = null;"


def extension_path() -> Path:
    """The packaged extension (for ``pi -e``; it runs ``pisub`` from PATH or ``$PISUB_ARGV``)."""
    return EXTENSION


def pi_extensions_dir(env: dict[str, str] | None = None) -> Path:
    """pi's global extension directory: ``$PI_CODING_AGENT_DIR/extensions``, else
    ``~/.pi/agent/extensions``."""
    env = dict(os.environ) if env is None else env
    agent_dir = env.get("PI_CODING_AGENT_DIR")
    base = Path(agent_dir) if agent_dir else Path.home() / ".pi" / "agent"
    return base / "extensions"


def install_extension(target: Path | None = None) -> Path:
    """Write the extension into pi's extension directory (or ``target``), set to run this
    pisub (``sys.executable -m pisub``) whatever PATH says; atomic, 0600. Its path.

    Raises:
        StorageError: the directory cannot be created or written.
    """
    from pisub.core.fsio import atomic_write

    directory = target if target is not None else pi_extensions_dir()
    text = EXTENSION.read_text(encoding="utf-8")
    argv = json.dumps([sys.executable, "-m", "pisub"])
    text = text.replace(_DEFAULT_LINE, f"const PISUB_ARGV_DEFAULT: string[] | null = {argv};", 1)
    if target is not None and not str(target).strip():
        raise InvalidInput("--into: give a directory")
    path = directory / INSTALLED_NAME
    try:
        for parent in reversed([directory, *directory.parents]):
            if not parent.exists():
                parent.mkdir(mode=0o700)  # every directory it creates is private
        atomic_write(path, text.encode("utf-8"))
    except OSError as exc:
        raise storage_error(exc, "install the pi extension in", directory) from exc
    return path


def guide(topic: str | None = None) -> str:
    """A guide topic's Markdown (``overview`` by default).

    Raises:
        InvalidInput: an unknown topic, listing the valid ones.
    """
    name = topic or "overview"
    if name not in TOPICS:
        raise InvalidInput(f"no guide topic {name[:64]!r}; topics: {', '.join(TOPICS)}")
    return (GUIDE_DIR / f"{name}.md").read_text(encoding="utf-8")
