"""Streaming text: stop strings never leak, UTF-8 characters are never split."""

from __future__ import annotations

from edgespec.engine.text import TextStream

PIECES = {1: b"Hello", 2: b" wor", 3: b"ld", 4: b"!\n", 5: b"\xe2\x82", 6: b"\xac", 7: b"<|", 8: b"end|>"}


def run(tokens: list[int], stop: list[str]) -> tuple[list[str], TextStream]:
    stream = TextStream(PIECES.__getitem__, stop)
    out = []
    for t in tokens:
        out.append(stream.push(t))
        if stream.stopped:
            break
    out.append(stream.flush())
    return out, stream


def test_plain_text_streams_through() -> None:
    out, s = run([1, 2, 3, 4], [])
    assert "".join(out) == "Hello world!\n" and not s.stopped


def test_stop_string_spanning_tokens_is_cut_and_never_emitted() -> None:
    out, s = run([1, 2, 3, 4], ["world"])
    assert "".join(out) == "Hello " and s.stopped
    assert out[1] == " "  # " wor" could start "world": only the space was released


def test_partial_stop_is_released_when_it_does_not_complete() -> None:
    out, s = run([1, 2, 4], ["world"])
    assert "".join(out) == "Hello wor!\n" and not s.stopped


def test_earliest_of_several_stop_strings_wins() -> None:
    out, _ = run([1, 2, 3, 7, 8], ["<|end|>", "ld"])
    assert "".join(out) == "Hello wor"


def test_multibyte_character_split_across_tokens() -> None:
    out, _ = run([1, 5, 6], [])
    assert out[1] == "" and out[2] == "€"
    assert "".join(out) == "Hello€"
