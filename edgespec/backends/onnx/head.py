"""A draft head's export run as ONE onnxruntime session, its inputs and outputs bound once.

The head (``edgespec export head``, docs/draft-head.md) is written as an export like a model's: an "embed" graph
that reads rows of features, its layer graph, its output graph. Run as a model is, a one-row pass takes three
session calls and a dozen bindings; right after a target pass, which evicts the head's weights and onnxruntime's
and Python's working state from the caches, each of those costs several times its warm time. So the three graphs
are joined into one when the head loads (``segments.whole_pass``: the same kernels on the same rows, so the
same logits and states), the KV, the step's scalars and fixed buffers are bound once, and a pass copies its rows
in, runs, and copies its last hidden states out. On the CPU only: a head drafts beside an export on the CPU.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import EdgespecError, ModelLoadError
from ..base import split_batches
from . import segments

N_BATCH = 256  # rows per session call at most (a long prompt's pairs are fed in runs, as a model's tokens are)


class HeadModel:
    """The head's cache of pairs and their last hidden states (``features``: its predictions of the target's next
    feature), and its passes over new pairs."""

    def __init__(self, folder: Path, manifest: dict, n_ctx: int, session: Callable[[Path], tuple[Any, int]]) -> None:
        """``manifest``: the head export's, checked (``manifest.read_manifest``); ``session``: opens a graph
        file as an onnxruntime session on the CPU, returning it and the bytes it put on huge pages
        (``model.open_head`` passes both)."""
        self.path = folder
        self.manifest = m = manifest
        self.n_vocab: int = m["vocab_size"]
        self.n_ctx = min(n_ctx, m["context_length"])
        width = m["hidden_size"]
        files = [folder / name for name in [m["embed"], *m["layers"], m["head"]]]
        for file in files:
            if not file.is_file():
                raise ModelLoadError(f"{folder}: {file.name} is missing")
        with tempfile.TemporaryDirectory(prefix="edgespec-head-") as scratch:
            joined = Path(scratch) / "pass.onnx"
            try:
                segments.whole_pass(files[0], files[1:-1], files[-1], joined)
            except ValueError as e:
                raise ModelLoadError(str(e)) from e
            # Mostly 0: the session takes heap memory the joining freed, not new mappings (huge_pages.py).
            # Collapsing all that the joining mapped put 31 MB on huge pages, RSS +10-20 MB, the head's passes in
            # the decode loop as fast within noise (ad hoc, 2 x 2 runs): not done.
            self._session, self.huge_page_bytes = session(joined)
        n_layer = m["num_layers"]
        kv_length = m.get("kv_length", m["context_length"] + 1)
        kv_dtype = np.dtype(m.get("kv_dtype", "float32"))
        self._kv = np.zeros((n_layer, 2, 1, m["num_kv_heads"], kv_length, m["head_dim"]), kv_dtype)
        self._pos = np.zeros(1, dtype=np.int32)  # seqlens_k: total length after the call − 1
        self._total = np.zeros((), dtype=np.int32)  # total_sequence_length
        self._logit_start = np.zeros(1, dtype=np.int64)  # −n: the logits of the last n rows
        self._rows = np.zeros((N_BATCH, 2 * width), dtype=np.float32)
        self._hidden = np.zeros((N_BATCH, width), dtype=np.float32)
        self._logits = np.zeros((N_BATCH, self.n_vocab), dtype=np.float32)
        self._features = np.zeros((self.n_ctx, width), dtype=np.float32)
        self._bound = (0, 0)  # the rows and logit rows the binding's shapes are for
        self._end = 0
        self._io = io = self._session.io_binding()
        shape, dtype = list(self._kv.shape[2:]), self._kv.dtype.type
        for layer in range(n_layer):
            for j, (past, present) in enumerate((("past_key", "present_key"), ("past_value", "present_value"))):
                ptr = self._kv[layer, j].ctypes.data
                io.bind_input(segments.io_name(past, layer, True), "cpu", 0, dtype, shape, ptr)
                io.bind_output(segments.io_name(present, layer, True), "cpu", 0, dtype, shape, ptr)  # in place
        io.bind_input("seqlens_k", "cpu", 0, np.int32, [1], self._pos.ctypes.data)
        io.bind_input("total_sequence_length", "cpu", 0, np.int32, [], self._total.ctypes.data)
        io.bind_input(segments.LOGIT_INPUT, "cpu", 0, np.int64, [1], self._logit_start.ctypes.data)

    def decode(self, rows: np.ndarray, start: int, n_logits: int) -> np.ndarray:
        """Feed ``rows`` (pairs [n, 2 × width]) at positions start..; the logits of the last ``n_logits`` (1..n) of
        them (a view, valid until the next pass)."""
        n = len(rows)
        if start != self._end or start + n > self.n_ctx or not 1 <= n_logits <= min(n, N_BATCH):
            raise EdgespecError(f"internal: a head pass of {n} rows at {start} ({n_logits} logits) on a cache of "
                                f"{self._end} positions (context {self.n_ctx})")
        for lo, hi in split_batches(n, N_BATCH):  # the last run holds every row whose logits are wanted
            self._run(rows[lo:hi], start + lo, n_logits if hi == n else 1)
        self._end = start + n
        return self._logits[:n_logits]

    def _run(self, rows: np.ndarray, start: int, n_logits: int) -> None:
        n, io = len(rows), self._io
        if self._bound != (n, n_logits):  # most passes are one row with one logit row: bound already
            width = self._hidden.shape[1]
            io.bind_input("features", "cpu", 0, np.float32, [1, n, 2 * width], self._rows.ctypes.data)
            io.bind_output("hidden_out", "cpu", 0, np.float32, [1, n, width], self._hidden.ctypes.data)
            io.bind_output("logits", "cpu", 0, np.float32, [1, n_logits, self.n_vocab], self._logits.ctypes.data)
            self._logit_start[0] = -n_logits
            self._bound = (n, n_logits)
        self._rows[:n] = rows
        self._pos[0] = start + n - 1
        self._total[()] = start + n
        try:
            self._session.run_with_iobinding(io)
        except RuntimeError as e:  # a graph off its ops' contracts (a corrupt export, or one for another edgespec)
            raise ModelLoadError(f"onnxruntime cannot run {self.path}: {e}") from e
        self._features[start:start + n] = self._hidden[:n]

    def features(self, lo: int, hi: int) -> np.ndarray:
        """The last hidden states of cached positions lo..hi−1 (a view, valid until the next pass)."""
        if not 0 <= lo <= hi <= self._end:
            raise EdgespecError(f"internal: features {lo}..{hi} of a head cache holding {self._end} positions")
        return self._features[lo:hi]

    def truncate(self, keep: int) -> None:
        self._end = min(self._end, keep)

    def cache_end(self) -> int:
        return self._end
