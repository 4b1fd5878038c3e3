from __future__ import annotations

from pathlib import Path

import pytest

from pisub.errors import InvalidInput
from pisub.store.paths import RunPaths, default_home, is_run_id, validate_run_ref


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "  ",
        "../x",
        "/abs",
        "abc",
        "1234567",
        "zzzzzzzz",
        "a" * 37,
        "12345678/..",
        "12345678\n",
        "-12345678",
    ],
)
def test_bad_run_refs_are_refused_before_the_disk(ref: str) -> None:
    with pytest.raises(InvalidInput):
        validate_run_ref(ref)


@pytest.mark.parametrize(
    "ref", ["12345678", "ABCDEF12", "3f2a1b4c-1234", "3f2a1b4c-1234-4abc-8def-0123456789ab"]
)
def test_ids_and_long_prefixes_are_accepted_lowercased(ref: str) -> None:
    assert validate_run_ref(ref) == ref.lower()


def test_is_run_id() -> None:
    assert is_run_id("3f2a1b4c-1234-4abc-8def-0123456789ab")
    assert not is_run_id("3f2a1b4c")
    assert not is_run_id(".creating-3f2a1b4c-1234-4abc-8def-0123456789ab")


def test_the_home_is_pisub_home_else_xdg_state_else_local_state() -> None:
    assert default_home({"PISUB_HOME": "/x/y"}) == Path("/x/y")
    assert default_home({"XDG_STATE_HOME": "/state"}) == Path("/state/pisub")
    assert default_home({"XDG_STATE_HOME": "relative"}) == Path.home() / ".local/state/pisub"
    assert default_home({}) == Path.home() / ".local/state/pisub"


def test_every_name_of_a_run_is_the_one_the_protocol_documents() -> None:
    """RunPaths is the one place that names a run's files: each name it gives is in spec/protocol.md."""
    spec = (Path(__file__).resolve().parents[2] / "spec" / "protocol.md").read_text()
    paths = RunPaths(Path("/h/runs/r"))
    names = {
        name: getattr(paths, name)
        for name, member in vars(RunPaths).items()
        if isinstance(member, property) and name not in ("run_id", "home", "repair_lock")
    }
    names |= {
        "output_log": paths.output_log(0),
        "stderr_log": paths.stderr_log(3),
        "receipt": paths.receipt("x"),
    }
    for name, path in names.items():
        relative = str(path.relative_to(paths.root))
        documented = relative.replace("0", "<N>").replace("3", "<N>").replace("x.json", "<id>.json")
        assert (
            f"`{documented}" in spec or f"{documented}/" in spec or f"`{documented.split('/')[-1]}" in spec
        ), f"RunPaths.{name} ({relative}) is not in spec/protocol.md"
    assert [p.name for p in paths.control_dirs()] == ["inbox", "tmp", "new", "cur", "rejected", "outbox"]
