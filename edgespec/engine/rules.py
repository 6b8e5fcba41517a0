"""What a request does to the target's logits before a token is chosen, row by row: a constraint's mask, the
presence, frequency and repetition penalties; and the log-probabilities it asks for.

Exact under speculation: a verify pass gives k + 1 rows, row i following the draft's first i tokens. ``Rules.rows``
processes row i as target-only decoding would at that position: the grammar's state after draft[:i] (llguidance
computes the k + 1 masks in one call and rolls its matcher back), the penalties' counts with draft[:i] added. So
greedy speculation picks the same argmax as constrained target-only decoding, and speculative sampling's rule,
applied to the processed p, samples the constrained distribution exactly.

The penalties (docs/constrained-decoding.md):

- ``presence_penalty``, ``frequency_penalty``: OpenAI's, over the generated tokens only: a token's logit minus
  ``frequency * count + presence * (count > 0)``.
- ``repetition_penalty``: Hugging Face's, vLLM's and llama.cpp's ``repeat_penalty`` (one formula): a positive logit of
  a token seen is divided by it, a negative one multiplied, over the last ``repeat_last_n`` tokens of prompt and
  output (llama.cpp's server feeds its prompt to the penalty too); ``repeat_last_n`` -1 (the default): all of them,
  as Hugging Face and vLLM count; 0: none (the penalty off).

Repetition first, then presence and frequency (vLLM's and llama.cpp's order).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import EdgespecError, InvalidParameterError

if TYPE_CHECKING:
    import llguidance

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


@dataclass(frozen=True)
class Penalties:
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0
    last_n: int = -1  # repetition's window: -1 the whole sequence, 0 off, N the last N tokens

    def __post_init__(self) -> None:
        for name, value in (("presence_penalty", self.presence), ("frequency_penalty", self.frequency)):
            if not isinstance(value, int | float) or not -2.0 <= value <= 2.0:
                raise InvalidParameterError(f"{name} must be in [-2, 2], got {value!r}")
        if not isinstance(self.repetition, int | float) or not 0.0 < self.repetition <= 10.0 or not math.isfinite(
                self.repetition):
            raise InvalidParameterError(f"repetition_penalty must be in (0, 10], got {self.repetition!r}")
        if not isinstance(self.last_n, int) or isinstance(self.last_n, bool) or self.last_n < -1:
            raise InvalidParameterError(f"repeat_last_n must be -1 (all), 0 (off) or a count, got {self.last_n!r}")

    @property
    def counting(self) -> bool:
        """Presence or frequency is on."""
        return self.presence != 0.0 or self.frequency != 0.0

    @property
    def repeating(self) -> bool:
        return self.repetition != 1.0 and self.last_n != 0

    @property
    def active(self) -> bool:
        return self.counting or self.repeating


@dataclass
class TokenLogprob:
    """An emitted token's log-probability under the processed distribution, and the likeliest tokens there."""

    token: int
    logprob: float
    top: list[tuple[int, float]]  # (token, log-probability), likeliest first; empty unless top_logprobs was asked


class Rules:
    """One request's row processing. ``rows`` for a verify pass, ``commit`` for what was emitted; ``forced`` and
    ``valid_prefix`` tell the engine what the grammar forces and how much of a draft it allows."""

    def __init__(self, n_vocab: int, prompt: Sequence[int], matcher: llguidance.LLMatcher | None = None,
                 penalties: Penalties | None = None, top_logprobs: int | None = None) -> None:
        """``top_logprobs`` None: no log-probabilities; 0: the emitted token's only."""
        self.n_vocab = n_vocab
        self.matcher = matcher
        self.penalties = penalties if penalties is not None and penalties.active else None
        self.top_logprobs = top_logprobs
        self._counts: Counter[int] = Counter()  # generated tokens (presence, frequency)
        p = self.penalties
        # repetition: all distinct tokens so far (window -1), or the last N tokens
        self._seen = np.unique(np.asarray(prompt, dtype=np.int64)) if p and p.last_n < 0 else np.empty(0, np.int64)
        self._window = list(prompt[-p.last_n:]) if p and p.last_n > 0 else []
        if matcher is not None:
            from llguidance import LLExecutor

            self._executor = LLExecutor(1)  # one request's masks: the decode loop's own thread does the work
            self._words = (n_vocab + 31) // 32

    def forced(self) -> list[int]:
        """Tokens the grammar forces next (llguidance's fast-forward tokens), empty where it leaves a choice."""
        return self.matcher.compute_ff_tokens() if self.matcher is not None else []

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the grammar allows in turn from here."""
        return self.matcher.validate_tokens(list(tokens)) if self.matcher is not None else len(tokens)

    def rows(self, logits: np.ndarray, draft: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
        """The processed copy of a pass's ``len(draft) + 1`` rows (row i after draft[:i]; the draft must be one the
        grammar allows: ``valid_prefix``), and the grammar's masks (True: allowed; None without a grammar)."""
        out = np.array(logits, dtype=np.float32).reshape(len(draft) + 1, -1)
        if self.penalties is not None:
            for i, row in enumerate(out):
                self._penalize(row, draft[:i])
        allowed = None
        if self.matcher is not None:
            bits = np.zeros((len(out), self._words), dtype=np.int32)
            if draft:  # the k + 1 masks in one call, the matcher rolled back after it
                self._executor.unsafe_compute_mask_ptr_with_draft_token([(self.matcher, 0, list(draft))],
                                                                        bits.ctypes.data, self._words * 4, len(out))
            else:
                self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, self._words * 4)
            allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :out.shape[1]].astype(bool)
            if not allowed.any(axis=1).all():
                raise EdgespecError(f"the constraint allows no token here: {self.matcher.get_error() or 'a dead end'}")
            out[~allowed] = -np.inf
        return out, allowed

    def _penalize(self, row: np.ndarray, extra: Sequence[int]) -> None:
        p = self.penalties
        assert p is not None
        if p.repeating:
            if p.last_n < 0:
                seen = np.union1d(self._seen, np.asarray(extra, dtype=np.int64)) if extra else self._seen
            else:
                seen = np.unique(np.asarray((self._window + list(extra))[-p.last_n:], dtype=np.int64))
            values = row[seen]
            row[seen] = np.where(values > 0, values / p.repetition, values * p.repetition)
        if p.counting:
            counts = self._counts + Counter(extra) if extra else self._counts
            if counts:
                ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
                n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
                row[ids] -= n * np.float32(p.frequency) + np.float32(p.presence)

    def commit(self, tokens: Sequence[int]) -> None:
        """The tokens emitted (a prefix of the rows' draft, then the chosen token): the grammar and counts move on."""
        if not tokens:
            return
        if self.matcher is not None and not self.matcher.consume_tokens(list(tokens)):
            raise EdgespecError(f"internal: the constraint refused an emitted token: {self.matcher.get_error()}")
        p = self.penalties
        if p is not None:
            self._counts.update(tokens)
            if p.repeating and p.last_n < 0:
                self._seen = np.union1d(self._seen, np.asarray(tokens, dtype=np.int64))
            elif p.repeating:
                self._window = (self._window + list(tokens))[-p.last_n:]

    def logprobs(self, rows: np.ndarray, tokens: Sequence[int]) -> list[TokenLogprob] | None:
        """Each token's log-probability in its processed row (rows[i] for tokens[i]), and the top ones asked for;
        None when the request asked for none."""
        if self.top_logprobs is None:
            return None
        out = []
        for row, token in zip(rows, tokens, strict=False):
            x = row.astype(np.float64)
            peak = x.max()
            logp = x - (peak + np.log(np.exp(x - peak).sum()))
            top: list[tuple[int, float]] = []
            if self.top_logprobs:
                best = np.argpartition(-logp, self.top_logprobs - 1)[:self.top_logprobs]
                best = best[np.argsort(-logp[best], kind="stable")]
                top = [(int(t), float(logp[t])) for t in best if logp[t] > -np.inf]
            out.append(TokenLogprob(int(token), float(logp[token]), top))
        return out


def check_top_logprobs(value: int | None) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or not 0 <= value <= MAX_TOP_LOGPROBS):
        raise InvalidParameterError(f"top_logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}, got {value!r}")
    return value
