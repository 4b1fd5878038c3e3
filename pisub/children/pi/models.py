"""The models pi knows (``pi --list-models``), and ``--model`` values: ``provider/id``, an
optional ``:<thinking>`` suffix, or a bare id that names exactly one known model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from pisub.core.procs import run_bounded
from pisub.errors import InvalidInput, LaunchFailed
from pisub.protocol.manifest import ThinkingLevel

LIST_TIMEOUT_S = 30.0
MAX_LIST_BYTES = 4 * 1024 * 1024
THINKING_LEVELS: tuple[str, ...] = get_args(ThinkingLevel)


@dataclass(frozen=True)
class Model:
    provider: str
    id: str
    context: str = ""
    max_out: str = ""
    thinking: bool = False
    images: bool = False

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.id}"


def list_models(pi_bin: str, search: str | None = None) -> list[Model]:
    """What ``pi --list-models [search]`` prints, one :class:`Model` per row (its process group
    is ended whole; at most 30 s).

    Raises:
        LaunchFailed: pi cannot run, hangs, or fails (its last words in the message).
    """
    argv = [pi_bin, "--list-models", *([search] if search else [])]
    try:
        code, out, err = run_bounded(argv, LIST_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        raise LaunchFailed(f"cannot run {pi_bin} --list-models: {exc}") from exc
    except TimeoutError:
        raise LaunchFailed(f"{pi_bin} --list-models did not answer within {LIST_TIMEOUT_S:g}s") from None
    if code != 0:
        said = " ".join(err[-2000:].decode("utf-8", "replace").split())[-300:]
        raise LaunchFailed(f"{pi_bin} --list-models failed (exit code {code}): {said}")
    return parse_table(out[:MAX_LIST_BYTES].decode("utf-8", "replace"))


def parse_table(text: str) -> list[Model]:
    """pi's table: a header line (``provider model context max-out thinking images``), then one
    row per model; other lines are ignored."""
    models = []
    header = False
    for line in text.splitlines():
        cells = line.split()
        if cells[:2] == ["provider", "model"]:
            header = True
            continue
        if not header or len(cells) < 2:
            continue  # before the table ("No models matching ...") or blank
        extra = cells[2:] + [""] * 4
        models.append(Model(cells[0], cells[1], extra[0], extra[1], extra[2] == "yes", extra[3] == "yes"))
    return models


def split_thinking(value: str) -> tuple[str, str | None]:
    """``provider/id:high`` → (``provider/id``, ``high``); a suffix that is no thinking level
    stays part of the model."""
    head, sep, tail = value.rpartition(":")
    if sep and tail in THINKING_LEVELS and head:
        return head, tail
    return value, None


def resolve(value: str, known: list[Model]) -> str:
    """A bare id as ``provider/id`` when exactly one known model has it.

    Raises:
        InvalidInput: no known model has it, or several do (naming them).
    """
    if "/" in value:
        provider, _, model = value.partition("/")
        if not provider.strip() or not model.strip():
            raise InvalidInput(f"model {value[:128]!r}: give provider/id (both parts)")
        return value
    matches = [m.name for m in known if m.id == value]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise InvalidInput(
            f"model {value[:128]!r}: pi knows no model with that id (pisub models); give provider/id"
        )
    raise InvalidInput(f"model {value!r} is ambiguous: {', '.join(matches[:10])}; give provider/id")
