"""The text of an external-cli agent file, as the tests write them."""

from __future__ import annotations

import json
import textwrap


def agent_text(
    name: str,
    *,
    interpreter: str,
    python: str | None = None,
    command: str | None = None,
    args: list[str] | None = None,
    body: str = "",
    **extra: object,
) -> str:
    """The agent file for ``name``; ``python`` is a script run by ``interpreter``, else
    ``command`` and ``args``; ``extra`` are more frontmatter keys (camelCase)."""
    if python is not None:
        command, args = interpreter, ["-c", textwrap.dedent(python)]
    lines = ["---", f"name: {name}", f"command: {json.dumps(command)}", f"args: {json.dumps(args or [])}"]
    lines += [f"{key}: {json.dumps(value)}" for key, value in extra.items()]
    lines += ["---", body]
    return "\n".join(lines) + "\n"
