"""The packaged guide topics and `pisub guide`."""

from __future__ import annotations

import pytest

from pisub.api.pi_integration import TOPICS, extension_path, guide
from pisub.errors import InvalidInput
from tests.conftest import pisub_cli


@pytest.mark.parametrize("topic", TOPICS)
def test_every_topic_is_shipped(topic: str) -> None:
    assert guide(topic).startswith("# ")


def test_an_unknown_topic_lists_the_valid_ones() -> None:
    with pytest.raises(InvalidInput, match="topics: overview, workflows"):
        guide("nope")
    proc = pisub_cli("guide", "x" * 5000)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "[INVALID_INPUT]" in proc.stderr


def test_the_extension_is_shipped() -> None:
    text = extension_path().read_text()
    assert 'name: "subagent"' in text and "PISUB_ARGV_DEFAULT" in text
