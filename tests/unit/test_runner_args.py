"""The runner's command line (``python -m pisub.runner``): the shapes launchers write are read
without argparse, with the same meaning; anything else goes to argparse, which refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pisub.runner.__main__ import _parse, _parse_any


@pytest.mark.parametrize(
    "argv",
    [
        ["--warm-fd", "3"],
        ["/r/run", "--ready-fd", "5", "--lock-fd", "6"],
        ["/r/run", "--foreground"],
        ["--lock-fd", "6", "/r/run", "--ready-fd", "5"],  # (argparse's: another order)
    ],
)
def test_every_shape_means_what_argparse_says(argv: list[str]) -> None:
    fast, slow = _parse(argv), _parse_any(argv)
    assert vars(fast) == vars(slow)


def test_the_shapes_read_directly() -> None:
    args = _parse(["/r/run", "--ready-fd", "5", "--lock-fd", "6"])
    assert (args.run_dir, args.ready_fd, args.lock_fd, args.warm_fd) == (Path("/r/run"), 5, 6, None)


@pytest.mark.parametrize(
    "argv", [["--warm-fd", "x"], ["/r/run", "--ready-fd", "5"], ["--foreground"], ["/r/run", "--bogus"]]
)
def test_anything_else_is_argparses_to_refuse(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(argv)
