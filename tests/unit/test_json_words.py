"""The plain words for JSON text a strict reader refused (``pisub/protocol/json_words.py``): the
wrong ones msgspec gives for half a surrogate pair, an empty text or a byte order mark, and a key
given twice (which msgspec would read as its last), each with its place."""

from __future__ import annotations

import pytest

from pisub.errors import ProtocolError
from pisub.protocol.control import decode_request

HALF = "not valid JSON (a \\u escape of half a surrogate pair, which is no character - at `{}`)"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (rb'{"v":1,"type":"steer","message":"a\ud800"}', HALF.format("$.message")),
        (rb'{"v":1,"type":"steer","message":"a\udc00"}', HALF.format("$.message")),
        (rb'{"v":1,"type":"steer","message":"a\udc00\ud800"}', HALF.format("$.message")),
        (rb'{"v":1,"type":"steer","message":"\ud800\u0041"}', HALF.format("$.message")),
        (rb'{"v":1,"type":"\ud800"}', HALF.format("$.type")),
        (rb'{"v":1,"type":"stop","id":"\ud800"}', HALF.format("$.id")),
        (rb'{"v":1,"type":"stop","\ud800":1}', HALF.format("$.\\ud800")),
        (rb'{"v":1,"type":"steer","message":"a","message":"b"}', "`message` is given twice - at `$.message`"),
        (rb'{"v":1,"type":"stop","type":"steer","message":"a"}', "`type` is given twice - at `$.type`"),
        (
            rb'{"v":1,"type":"steer","message":"a","reason":{"x":1,"x":2}}',
            "`x` is given twice - at `$.reason.x`",
        ),
        (
            rb'{"v":1,"type":"steer","message":"a","reason":[{"k":1,"k":2}]}',
            "`k` is given twice - at `$.reason[0].k`",
        ),
        (
            b'{"v":1,"type":"steer","message":"\xed\xa0\x80"}',
            "not valid JSON (it is not valid UTF-8 at byte 33)",
        ),
        (b"", "not valid JSON (the text is empty)"),
        (b" \n", "not valid JSON (the text is empty)"),
        (
            b'\xef\xbb\xbf{"v":1,"type":"stop"}',
            "not valid JSON (it starts with a UTF-8 byte order mark; the text must be UTF-8 without one)",
        ),
        (
            '{"v":1,"type":"stop"}'.encode("utf-16"),
            "not valid JSON (it starts with a UTF-16 byte order mark; the text must be UTF-8 without one)",
        ),
    ],
)
def test_a_refused_request_says_what_is_wrong_and_where(text: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_request(text)
    assert caught.value.message == reason


def test_a_pair_and_an_escaped_backslash_are_text() -> None:
    request = decode_request(rb'{"v":1,"type":"stop","reason":"\ud83d\ude00 \\ud800"}')
    assert getattr(request, "reason", None) == "\N{GRINNING FACE} \\ud800"


def test_nesting_too_deep_for_the_second_reading_is_still_one_reason() -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_request(b"[" * 100_000 + b"]" * 100_000)
    assert caught.value.message == "Expected `object`, got `array`"
