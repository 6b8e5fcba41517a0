"""Prompt lookup: if the last n tokens occurred earlier in prompt + output, propose what followed them; failing
that, look them up in the model's own earlier answers."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from ..arena import common_prefix
from ..errors import InvalidParameterError
from ..sampling import SamplingParams
from .base import Draft

# The earlier answers kept for lookup, in tokens: about 100 answers. At most ~0.55 KB of index per token (one entry
# per n-gram length; tracemalloc, all n-grams distinct), so at most ~9 MB. The oldest answers go first.
HISTORY_TOKENS = 16384


class NgramDrafter:
    """Longest-suffix n-gram lookup over the committed sequence, with an incremental index, and over the
    answers this drafter saw finish before it.

    For each n in [n_min, n_max] a dict maps every n-gram seen so far to the position right after its
    most recent occurrence. Each committed token adds n_max - n_min + 1 entries; a lookup is at most
    that many dict probes. Nothing is rescanned.

    A new sequence (``begin``) keeps what the index learned from the prefix it shares with the previous
    one (a chat's next turn re-sends the whole conversation): an undo log per position restores each
    entry a later position overwrote, so only the tokens after the shared prefix are indexed.

    Why earlier answers: a model repeats its own phrasing across requests ("Here are some", "\\n\\n2. **",
    "In conclusion,"), text the current prompt may not contain. They are consulted only for a match longer
    than the sequence's own, and their drafts carry their own keys (negative: -n for an n-token match), so the
    γ controller learns separately how often such a draft is right. Lookup is free and the target verifies
    every draft, so greedy output is unchanged whatever they propose. Sampled requests do not use them: a
    sample depends on its drafts, and a seed (with a fixed γ) must give the same sample whatever came before.
    """

    name = "ngram"
    costs_per_token = False

    def __init__(self, n_max: int = 5, n_min: int = 1, max_draft: int = 16, history: int = HISTORY_TOKENS) -> None:
        if not 1 <= n_min <= n_max:
            raise InvalidParameterError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        if history < 0:
            raise InvalidParameterError(f"history must be >= 0 tokens, got {history}")
        self.n_min, self.n_max, self.max_draft, self.history = n_min, n_max, max_draft, history
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}
        self._seen: list[int] = []  # the tokens indexed so far
        self._prompt_end = 0  # where the current sequence's prompt ended in _seen: the answer follows
        # Per position j >= 1 (entry j - 1): what its entries replaced, (n, n-gram, previous position or None).
        self._undo: list[list[tuple[int, tuple[int, ...], int | None]]] = []
        self._answers: deque[list[int]] = deque()  # earlier answers, oldest first
        self._answer_tokens: list[int] = []  # those answers end to end, each followed by -1
        self._answer_index: dict[tuple[int, ...], int] = {}  # n-gram (any n) -> position after it, most recent

    def begin(self, context: Sequence[int]) -> None:
        """Start a sequence: the entries of positions inside the prefix shared with the last one are kept, and
        the last one's answer joins the earlier answers."""
        self._remember(self._seen[self._prompt_end:])
        shared = common_prefix(self._seen, context)
        # Position j's entries read tokens before j only: those of j <= shared stay valid, except one
        # pointing at the new sequence's end (its continuation does not exist yet).
        while len(self._undo) > max(0, min(shared, len(context) - 1)):
            for n, gram, previous in reversed(self._undo.pop()):
                if previous is None:
                    del self._index[n][gram]
                else:
                    self._index[n][gram] = previous
        del self._seen[shared:]
        self._update(context)
        self._prompt_end = len(context)

    def _update(self, context: Sequence[int]) -> None:
        # The n-gram ending just before position j maps to j; the n-gram ending at the last token is only
        # added once its continuation exists, so a lookup never finds the suffix itself.
        seen = self._seen
        for j in range(len(self._undo) + 1, len(context)):
            log = []
            for n in range(self.n_min, min(self.n_max, j) + 1):
                gram = tuple(context[j - n:j])
                log.append((n, gram, self._index[n].get(gram)))
                self._index[n][gram] = j
            self._undo.append(log)
        seen.extend(context[len(seen):])

    def _remember(self, answer: list[int]) -> None:
        """Keep an answer for lookup; past ``history`` tokens the oldest answers are dropped (a rebuild)."""
        if not answer or self.history == 0:
            return
        answer = answer[-self.history:]
        self._answers.append(answer)
        total = len(self._answer_tokens) + len(answer) + 1  # every answer with its separator
        if total <= self.history:
            self._index_answer(answer)
            return
        while total > self.history // 2 and len(self._answers) > 1:
            total -= len(self._answers.popleft()) + 1
        self._answer_tokens, self._answer_index = [], {}
        for kept in self._answers:
            self._index_answer(kept)

    def _index_answer(self, answer: list[int]) -> None:
        start = len(self._answer_tokens)
        tokens = self._answer_tokens
        tokens.extend(answer)
        tokens.append(-1)  # no n-gram spans two answers, no draft runs from one into the next
        for j in range(start + 1, len(tokens) - 1):  # j: the continuation's position, a token of this answer
            for n in range(self.n_min, min(self.n_max, j - start) + 1):
                self._answer_index[tuple(tokens[j - n:j])] = j

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self._update(context)
        limit = min(max_tokens, self.max_draft)
        if limit <= 0:
            return Draft([])
        # Greedy output does not depend on the drafts; a sample does (which draft tokens get accepted, with its
        # random numbers): earlier answers would make a seeded request's sample depend on earlier requests.
        answers = self._answer_index if params.greedy else {}
        for n in range(min(self.n_max, len(context)), self.n_min - 1, -1):  # the longest match first
            gram = tuple(context[-n:])
            start = self._index[n].get(gram)
            if start is not None:  # the sequence's own match wins one as long in the earlier answers
                return Draft(list(context[start:start + limit]), key=n)
            at = answers.get(gram)
            if at is not None:
                tokens = self._answer_tokens[at:at + limit]
                return Draft(tokens[:tokens.index(-1)] if -1 in tokens else tokens, key=-n)
        return Draft([])
