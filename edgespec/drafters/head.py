"""A trained draft head (EAGLE, Li et al. 2024): a one-layer model that reads the target's own last hidden states.

At position i the target has computed f_i, its last hidden state (before the final norm), and chosen x_{i+1}. The
head maps [f_i / scale, embedding(x_{i+1})] to its width, runs one decoder layer that attends over all earlier
positions' pairs (its own KV cache), and predicts f_{i+1}; the target's final norm and output rows (those of the
tokens the head was trained to say) turn that into a guess for x_{i+2}. A second guess feeds the head its own
prediction and guess back. Written by ``edgespec export head`` (docs/draft-head.md), run by ONNX Runtime beside the
target as one session (``HeadModel``, edgespec/backends/onnx/head.py).

Where prompt lookup reads the text, the head reads the context: it is asked where lookup has nothing to offer, and
beside lookup's weakest drafts (mode ``head``: lookup, then the head; edgespec/drafters/proposal.py). It proposes
greedily (one-hot q), so sampled verification stays exact.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..engine.arena import common_prefix
from ..engine.sampling import SamplingParams
from .base import Draft

if TYPE_CHECKING:
    from ..backends.onnx.head import HeadModel

# A draft path stops before a token that takes the head's own probability of the whole path below this: a further
# guess costs a head pass and a verify row, and one the head itself doubts is rarely accepted (EAGLE-2's
# confidence). The first guess comes out of the pass that feeds the committed tokens, which is paid either way.
# Replayed on recorded outputs (docs/draft-head.md) 0.1-0.4 all paid; 0.4 kept the most per head token. A round
# value, not tuned.
MIN_PATH_PROBABILITY = 0.4
# A proposal's key is the range its first guess's probability (by the head's own softmax) falls in. The γ controller
# keeps acceptance per key, as it does per lookup match length, and cuts a draft to what its key's acceptance makes
# worth a verify row: the head's softmax is far too sure of itself and by a factor that varies (24 Spec-Bench
# questions, ad hoc: first guesses it put at ~0.97 were accepted 76% of the time, ~0.8 41%, ~0.4 17%, ~0.15 8%),
# so what a range is worth is learned, not read off the number. Keys 1..6.
CONFIDENCE_EDGES = (0.2, 0.35, 0.5, 0.7, 0.9)
MAX_GUESSES = 16  # room the head keeps in its context for a proposal's guesses (γ never exceeds it)
# Embeddings of other tokens kept at hand (2.3 kB each for SmolLM2): the embed graph costs a session call, ~80 µs in
# the decode loop. Those of the tokens the head can say are read once, at load: most of what is generated.
EMBEDDINGS_KEPT = 8192


class FeatureModel(Protocol):
    """What the head needs of its target (``OnnxModel``): it keeps its features and embeds tokens."""

    def keep_features(self) -> None: ...

    def features(self, lo: int, hi: int) -> np.ndarray: ...

    def embed(self, tokens: Sequence[int]) -> np.ndarray: ...

    def cache_end(self) -> int: ...


class HeadDrafter:
    """Drafts with a trained head over the target's features. Its cache holds the pairs (f_i, x_{i+1}) of the
    committed sequence; a proposal feeds the pairs it lacks in one pass (the first guess comes out of its last
    row), one pass per further token, then drops its guesses again."""

    name = "head"
    costs_per_token = True

    def __init__(self, target: FeatureModel, head: HeadModel, vocab: np.ndarray, scale: float,
                 min_path_probability: float = MIN_PATH_PROBABILITY, identity: str = "") -> None:
        self.target, self.head = target, head
        self.vocab = vocab  # the head's output row j is the target's token vocab[j]
        self.scale = np.float32(scale)
        self.min_path_probability = min_path_probability
        self.identity = identity  # which head this is (a digest of its export's description): learned state is its own
        target.keep_features()
        self._on: list[int] = []  # the tokens x_0..x_h its cache of h pairs was computed on
        self._sayable = dict(zip(vocab.tolist(), target.embed(vocab.tolist()), strict=True))
        self._embeddings: dict[int, np.ndarray] = {}  # other tokens', bounded
        self._rows = np.zeros((2 * MAX_GUESSES, 2 * head.manifest["hidden_size"]), np.float32)  # a step's pairs

    def begin(self, context: Sequence[int]) -> None:
        """Feed the prompt's pairs now: in the prefill's time, not charged to the first proposal (the γ controller
        takes a proposal's time for what a draft token costs). The pairs kept from an earlier request are those of
        the prefix it shares with this one."""
        self._catch_up(context, common_prefix(self._on, context))

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        if max_tokens <= 0:
            return Draft([])
        # Within a request the context only grows: the last token the head read, still in place, vouches for the
        # rest (one comparison a step, not one per token of context).
        n = len(self._on)
        logits = self._catch_up(context, n if n and n <= len(context) and self._on[-1] == context[n - 1]
                                else common_prefix(self._on, context))
        if logits is None:  # the target's features do not reach the last committed token (see _catch_up)
            return Draft([])
        known = self.head.cache_end()
        tokens: list[int] = []
        path, passes, key = 1.0, 1, 0
        while True:
            best = int(logits.argmax())
            path *= _top_probability(logits, best)
            if not tokens:  # the first guess's confidence keys the proposal
                key = 1 + bisect.bisect(CONFIDENCE_EDGES, path)
            if tokens and path < self.min_path_probability:  # the first guess's pass is paid: it is always offered
                break
            tokens.append(int(self.vocab[best]))
            if len(tokens) == max_tokens:
                break
            # The head's own prediction of the next feature (in the scaled units it reads) and its guess, as the
            # next pair.
            f = self.head.features(self.head.cache_end() - 1, self.head.cache_end())
            logits = self.head.decode(self._pairs(f, tokens[-1:], np.float32(1)), self.head.cache_end(), 1)[0]
            passes += 1
        self.head.truncate(known)  # its guesses go: the target decides what follows
        return Draft(tokens, passes=passes if passes > len(tokens) else None, key=key)

    def _catch_up(self, context: Sequence[int], shared: int) -> np.ndarray | None:
        """Feed the head the pairs of ``context`` it lacks (``shared``: how many of its first tokens the head's pairs
        were computed on); the logits of its guess for the token after the target's last cached one, or None when
        that is not the token after ``context`` (the target has not yet computed the features of all but the last
        committed token) or there is nothing to feed."""
        end = min(self.target.cache_end(), len(context) - 1)
        if end <= 0 or end + MAX_GUESSES >= self.head.n_ctx:  # no pair yet, or the head's context is full
            return None
        # The pairs still right (pair i needs x_0..x_{i+1} unchanged); the last is fed again if need be, for its guess.
        keep = max(min(shared - 1, end - 1), 0)
        self.head.truncate(keep)
        rows = self._pairs(self.target.features(keep, end), context[keep + 1:end + 1], self.scale)
        logits = self.head.decode(rows, keep, 1)[0]
        del self._on[min(keep + 1, shared):]  # only tokens the context shares
        self._on.extend(context[len(self._on):end + 1])
        return logits if end == len(context) - 1 else None

    def _pairs(self, features: np.ndarray, tokens: Sequence[int], scale: np.float32) -> np.ndarray:
        """The head's input rows [f_i / ``scale``, embedding(x_{i+1})], written into rows kept for it: a step's few
        rows cost no allocation (each numpy call counts here: it runs right after the target's pass, cold)."""
        sayable, kept = self._sayable, self._embeddings
        others = [t for t in dict.fromkeys(tokens) if t not in sayable]
        new = [t for t in others if t not in kept]
        if new and len(kept) + len(new) > EMBEDDINGS_KEPT:  # start afresh with this call's tokens, all of them
            kept.clear()
            new = others
        if new:
            kept.update(zip(new, self.target.embed(new), strict=True))
        n, width = features.shape
        rows = self._rows[:n] if n <= len(self._rows) else np.empty((n, 2 * width), np.float32)
        np.divide(features, scale, out=rows[:, :width])
        for row, token in zip(rows, tokens, strict=True):
            embedding = sayable.get(token)
            row[width:] = kept[token] if embedding is None else embedding
        return rows


def _top_probability(logits: np.ndarray, best: int) -> float:
    """The softmax probability of the ``best`` row."""
    return float(1.0 / np.exp(logits - logits[best]).sum())
