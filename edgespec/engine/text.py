"""Token bytes → text, streamed safely: no broken UTF-8 characters and no stop string ever emitted."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class TextStream:
    """Turns tokens into text pieces that are final once emitted.

    A multi-byte character split across tokens is held until complete. Text that could still become a
    stop string is held back until it cannot; when a stop string appears, everything from its start on
    is dropped and ``stopped`` becomes true.
    """

    def __init__(self, piece: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.stop = [s for s in stop if s]
        self.text = ""  # everything decoded so far (after a stop: up to the stop string)
        self.emitted = 0  # len of the prefix of text already handed out
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one token; return the text that became final."""
        self.text += self._decoder.decode(self._piece(token))
        if self.stop:
            start = min((i for i in (self.text.find(s, self.emitted) for s in self.stop) if i >= 0),
                        default=-1)
            if start >= 0:
                self.text = self.text[:start]
                self.stopped = True
                return self._release(len(self.text))
            return self._release(len(self.text) - self._partial_stop())
        return self._release(len(self.text))

    def flush(self) -> str:
        """End of generation: whatever was held back (a partial stop string, an incomplete character)."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        return self._release(len(self.text))

    def _partial_stop(self) -> int:
        """Length of the longest suffix of the unreleased text that is a proper prefix of a stop string."""
        tail = self.text[self.emitted:]
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:n]):
                    best = n
                    break
        return best

    def _release(self, upto: int) -> str:
        piece = self.text[self.emitted:upto]
        self.emitted = max(self.emitted, upto)
        return piece
