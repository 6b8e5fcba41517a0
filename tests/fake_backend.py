"""A scripted, model-free backend: the engine, the γ controller, the arena and the drafters in milliseconds.

``FakeModel`` implements the backend contract (edgespec/backends/base.py) over a byte vocabulary (token 0 is BOS,
1 is EOS, 2 + b is byte b). Its logits are a pure function of the context held in its KV memory, so a run is
deterministic and its target-only output is known; a ``FakeClock`` advances by a configurable cost per
forward pass (instead of sleeping), so the γ controller sees a chosen verify-cost curve exactly.

The KV memory records which cache wrote each position. A target position whose entry a self-draft view
wrote (what the arena must prevent) shifts the target's argmax: a view misused by the arena shows up as a
greedy output that differs from target-only, as it would with a real layer-skip draft.

``shape_dependent`` makes it a device that is not batch-invariant, as llama.cpp on a GPU: a target row's logits
are shifted by an amount that depends on its pass's shape (rows in the pass, and the attended length rounded up
to a multiple of ``KV_STEP``), so a token verified in a batch can get another argmax than decoded alone — unless
every pass is padded to the same number of rows (``set_pass_rows``), as the real backend does.
``prefill_dependent`` makes verify passes exact but a prompt's KV depend on how it was prefilled (whole, or a kept
prefix and then the rest): what only the self-check's reuse probe can find out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.backends.base import padded_pass_limit
from edgespec.backends.vocab import check_same_vocab
from edgespec.engine.arena import CacheState
from edgespec.errors import EdgespecError

BOS, EOS = 0, 1
N_VOCAB = 258  # BOS, EOS and the 256 bytes
PEAK = 10.0  # a scripted token's logit above every other one
KV_STEP = 16  # a shape-dependent fake's attended-length step (llama.cpp's is 256: small here to meet it often)
PREFILL_ROWS = 8  # passes longer than this are prefills: a prefill-dependent fake's entries remember their length

Logits = Callable[[Sequence[int]], np.ndarray]  # context (tokens held up to a position) → next-token logits


def encode(text: str) -> list[int]:
    """The fake vocabulary's tokens for ``text`` (no BOS)."""
    return [2 + b for b in text.encode("utf-8")]


def decode_text(tokens: Sequence[int]) -> str:
    return bytes(t - 2 for t in tokens if t >= 2).decode("utf-8", "replace")


def scripted(sequence: Sequence[int]) -> Logits:
    """The model that continues ``sequence``: after a context of length n it predicts sequence[n] (EOS past
    its end), whatever the context holds. A prompt that is a prefix of ``sequence`` is continued by the rest."""
    seq = list(sequence)

    def logits(context: Sequence[int]) -> np.ndarray:
        row = np.zeros(N_VOCAB, dtype=np.float32)
        row[seq[len(context)] if len(context) < len(seq) else EOS] = PEAK
        return row

    return logits


def bigram(seed: int, support: Sequence[int], scale: float = 1.5) -> Logits:
    """Logits from a table indexed by the last token: random over ``support``, -inf elsewhere (a distribution
    whose every probability is known, for the statistical tests)."""
    rng = np.random.default_rng(seed)
    table = np.full((N_VOCAB, N_VOCAB), -np.inf, dtype=np.float32)
    table[:, list(support)] = rng.normal(0.0, scale, (N_VOCAB, len(support)))
    return lambda context: table[context[-1]]


class FakeClock:
    """Stands in for ``time.perf_counter``: it moves only when a fake model charges a forward pass."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _Entry:
    token: int
    writer: str  # "target" or "draft"
    prefill: int = 0  # the length of the pass that wrote it, when longer than PREFILL_ROWS (a prefill)


class _Pass:
    """One cache's end over the shared memory: the target's, or its self-draft view's."""

    def __init__(self, memory: FakeModel, logits: Logits, writer: str, cost_ratio: float) -> None:
        self.memory, self.logits, self.writer, self.cost_ratio = memory, logits, writer, cost_ratio
        self.n_ctx = memory.n_ctx
        self.end = 0

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        if start != self.end:
            raise EdgespecError(f"fake: {self.writer} decode at {start}, but its cache ends at {self.end}")
        self.end = self.memory.write(tokens, start, self.writer, self.cost_ratio)
        return self.memory.rows(self.logits, self.end, n_logits, corrupt=self.writer == "target")

    def truncate(self, keep: int) -> None:
        self.end = min(self.end, keep)

    def cache_end(self) -> int:
        return self.end


class FakeModel:
    """A scripted model with one KV memory (see the module docstring)."""

    def __init__(self, logits: Logits, n_ctx: int = 256, pass_cost: Callable[[int], float] = lambda n: 0.01,
                 clock: FakeClock | None = None, self_draft: Logits | None = None, draft_cost_ratio: float = 0.3,
                 calibrated: tuple[float, float] | None = None, name: str = "fake.gguf",
                 chat_template: str | None = None, shape_dependent: bool = False,
                 prefill_dependent: bool = False) -> None:
        """``pass_cost(n)``: seconds one forward pass over n tokens charges ``clock``. ``self_draft``: the logits
        of a layer-skip view over this model's memory, whose passes cost ``draft_cost_ratio`` of the target's."""
        self.path = Path(name)
        self.n_ctx = n_ctx
        self.n_vocab = N_VOCAB
        self.n_threads = 1
        self.bos, self.eos = BOS, EOS
        self.chat_template = chat_template
        self.description = "scripted fake model"
        self.logits, self.pass_cost, self.clock = logits, pass_cost, clock
        self.kv: list[_Entry | None] = [None] * n_ctx
        self._target = _Pass(self, logits, "target", 1.0)
        self._draft = None if self_draft is None else FakeSkipView(self, self_draft, draft_cost_ratio, calibrated)
        self.passes: list[int] = []  # tokens fed per forward pass, in order
        self._tree: tuple[int, list[int], list[int]] = (0, [], [])  # the last decode_tree's start, tokens, parents
        self.closed = False
        self.shape_dependent = shape_dependent
        self.prefill_dependent = prefill_dependent
        self.reuse_probe_exact = True  # the self-check's reuse verdict (exactness.probe_reuse)
        self.pass_rows = 0  # 0: passes of their own size; B: padded to B rows (set_pass_rows)
        self._shape = 0  # the last target pass's shape, which shifts its rows when shape_dependent

    # -- vocabulary -----------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        tokens = [BOS] if add_special else []
        for part in re.split(r"(<s>|</s>)", text) if parse_special else [text]:
            tokens += {"<s>": [BOS], "</s>": [EOS]}.get(part, encode(part))
        return tokens

    def piece(self, token: int) -> bytes:
        return bytes([token - 2]) if token >= 2 else b""  # control tokens render as nothing

    def token_text(self, token: int) -> bytes:
        return {BOS: b"<s>", EOS: b"</s>"}.get(token, self.piece(token))

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def check_same_vocab(self, other: object) -> None:
        check_same_vocab(self, other)  # type: ignore[arg-type]

    # -- the cache ------------------------------------------------------------------------------------
    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        return self._target.decode(tokens, start, n_logits)

    def truncate(self, keep: int) -> None:
        self._target.truncate(keep)

    tree_passes = True
    exact_trees = True  # a node's row is a function of its own path's tokens only (and shape_dependent: its shape)

    def decode_tree(self, tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        """One pass over a token tree: node i's row from the context held before ``start`` plus its own path. Padded
        (``set_pass_rows``) to a multiple of the pass rows, as the real backend pads it; when shape_dependent, its
        rows are shifted by that shape, so a tree of more rows than a one-token pass's drifts."""
        if start != self._target.end:
            raise EdgespecError(f"fake: tree decode at {start}, but the cache ends at {self._target.end}")
        if start + len(tokens) > self.n_ctx:
            raise EdgespecError(f"fake: cannot hold a tree of {len(tokens)} nodes at {start} (n_ctx {self.n_ctx})")
        padded = -(-len(tokens) // self.pass_rows) * self.pass_rows if self.pass_rows else len(tokens)
        self.passes.append(len(tokens))
        if self.clock is not None:
            self.clock.now += self.pass_cost(padded)
        held = self.kv[:start]
        corrupt = any(e.writer != "target" for e in held)  # type: ignore[union-attr]
        paths: list[list[int]] = []
        rows = []
        for token, parent in zip(tokens, parents, strict=True):
            paths.append((paths[parent] if parent >= 0 else []) + [token])
            row = self.logits([e.token for e in held] + paths[-1])  # type: ignore[union-attr]
            if self.shape_dependent:
                row = np.roll(row, (padded + 3 * -(-(start + padded) // KV_STEP)) % 5)
            rows.append(np.roll(row, 1) if corrupt else row)
        self._tree = (start, tokens, parents)
        return np.array(rows, dtype=np.float32).reshape(len(rows), N_VOCAB)

    def keep_tree_path(self, nodes: list[int]) -> None:
        start, tokens, parents = self._tree
        if any(parents[b] != a for a, b in zip([-1, *nodes], nodes, strict=False)):
            raise EdgespecError(f"fake: nodes {nodes} are not a root path of the tree")
        for i, node in enumerate(nodes):
            self.kv[start + i] = _Entry(tokens[node], "target")
        self._target.end = start + len(nodes)

    def cache_end(self) -> int:
        return self._target.cache_end()

    def set_pass_rows(self, rows: int) -> None:
        self.pass_rows = rows

    def max_pass_rows(self, start: int) -> int:
        return padded_pass_limit(start, self.pass_rows, KV_STEP) if self.pass_rows else self.n_ctx

    def max_tree_rows(self, start: int) -> int:
        return padded_pass_limit(start, self.pass_rows, KV_STEP, self.n_ctx) if self.pass_rows else self.n_ctx

    @property
    def exact_reuse(self) -> bool:
        """A position's entry depends on its token and context alone; a row's logits also on its pass's shape
        when shape_dependent (a prefill's last chunk is another shape than a whole prompt's). prefill_dependent
        entries are not told apart here: only the self-check's reuse probe finds them out."""
        return not self.shape_dependent and self.reuse_probe_exact

    def save_state(self) -> CacheState:
        end = self.cache_end()
        return CacheState(end, end, list(self.kv[:end]))

    def load_state(self, state: CacheState) -> None:
        assert isinstance(state.data, list)
        self.kv[:state.n_tokens] = state.data
        self._target.end = state.n_tokens

    def self_draft(self) -> FakeSkipView | None:
        return self._draft

    def draft_head(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    # -- shared by the target and its view ------------------------------------------------------------
    def write(self, tokens: Sequence[int], start: int, writer: str, cost_ratio: float) -> int:
        if not tokens or start + len(tokens) > self.n_ctx:
            raise EdgespecError(f"fake: cannot write {len(tokens)} tokens at {start} (n_ctx {self.n_ctx})")
        for i, token in enumerate(tokens):
            self.kv[start + i] = _Entry(token, writer, len(tokens) if len(tokens) > PREFILL_ROWS else 0)
        rows = self.pass_rows if len(tokens) <= self.pass_rows else len(tokens)
        self.passes.append(len(tokens))
        self._shape = rows + 3 * -(-(start + rows) // KV_STEP)
        if self.clock is not None:
            self.clock.now += cost_ratio * self.pass_cost(rows)
        return start + len(tokens)

    def rows(self, logits: Logits, end: int, n_logits: int, corrupt: bool) -> np.ndarray:
        """Logits for the last ``n_logits`` of positions ..end, each from the context held up to it."""
        out = []
        for pos in range(end - min(n_logits, end), end):
            held = self.kv[:pos + 1]
            row = logits([e.token for e in held])  # type: ignore[union-attr]
            if corrupt and any(e.writer != "target" for e in held):  # type: ignore[union-attr]
                row = np.roll(row, 1)  # a target reading draft-written KV computes something else
            if corrupt and self.shape_dependent:
                row = np.roll(row, self._shape % 5)  # another pass shape, other kernels: other logits
            if corrupt and self.prefill_dependent:  # a prompt prefilled in two passes: other kernels for its KV
                row = np.roll(row, len({e.prefill for e in held if e.prefill}) % 5)  # type: ignore[union-attr]
            out.append(row)
        return np.array(out, dtype=np.float32).reshape(len(out), N_VOCAB)


class FakeSkipView(_Pass):
    """A layer-skip self-draft over the owner's memory: other logits, a share of the cost (a ``SelfDraft``)."""

    def __init__(self, owner: FakeModel, logits: Logits, cost_ratio: float,
                 calibrated: tuple[float, float] | None) -> None:
        super().__init__(owner, logits, "draft", cost_ratio)
        self.calibrated = calibrated

    def adopt(self, end: int) -> None:
        self.end = end

    def prepare(self) -> None:
        """Nothing to load: the fake view runs over the owner's memory as it is."""
