"""llama.cpp through llama-cpp-python's low-level ctypes API.

One ``LlamaModel`` is one GGUF file with one context (its own KV cache, sequence 0). It knows how to
tokenize, how to decode a run of tokens at given positions and hand back the logits of the positions
asked for, and how to drop cache entries from a position on. It keeps no notion of "committed": that
belongs to ``KVArena``, the only caller of ``truncate``.

Why not ``llama_cpp.Llama``: its generate/draft path forces ``logits_all`` and copies n_ctx × vocab
float matrices, and defaults to one thread here.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...catalog.gguf_header import check_gguf
from ...catalog.models import resolve
from ...cpu import physical_cores
from ...engine.arena import MAX_TREE_LEAVES, CacheState
from ...errors import EdgespecError, InvalidParameterError, MissingExtraError, ModelLoadError
from ..base import GPU_DEVICES, ModelOptions, check_options, padded_pass_limit, split_batches
from ..vocab import check_same_vocab

try:
    import llama_cpp as lc
except ModuleNotFoundError as e:  # a dependency, so a broken install: one line that says what runs without it
    raise MissingExtraError(
        "llama.cpp models (GGUF files, model names) need 'llama_cpp', which is not installed: `make setup` builds it "
        "(llama-cpp-python at the version pyproject.toml pins, without llamafile's kernels: docs/exact-numerics.md); "
        "ONNX exports run without it") from e

log = logging.getLogger("edgespec.llama")

# llama.cpp attends over the first n_kv cells of the cache, n_kv rounded up to a multiple of this
# (llama_kv_cache::get_n_kv). Where a kernel's sums depend on n_kv (CUDA's softmax and products without flash
# attention), a row computed in a pass whose cells end past a multiple of it differs from the same row computed
# in a pass that ends before: see ``max_pass_rows``.
KV_STEP = 256

_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}  # ggml_log_level


_last_level = [logging.DEBUG]


@lc.llama_log_callback
def _route_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # llama.cpp prints hundreds of lines per load; route them into Python logging (debug/info by default).
    if level != 5:  # GGML_LOG_LEVEL_CONT continues the previous line at its level
        _last_level[0] = _LEVELS.get(level, logging.DEBUG)
    log.log(_last_level[0], text.decode("utf-8", "replace").rstrip())


lc.llama_log_set(_route_llama_log, ctypes.c_void_p(0))
lc.llama_backend_init()


@dataclass(frozen=True)
class ContextOptions:
    """How a context is created. The defaults make logits batch-invariant (docs/exact-numerics.md)."""

    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None  # None: physical cores
    device: str = "cpu"
    exact_numerics: bool = True  # lossless verification: on a CPU an F32 KV cache, flash attention off (set_numerics)

    def __post_init__(self) -> None:
        check_options(self.device, self.n_ctx, self.n_batch, self.n_threads)


def _gpu_layers(device: str) -> int:
    gpu = bool(lc.llama_supports_gpu_offload())
    if device in GPU_DEVICES and not gpu:
        raise InvalidParameterError(
            f"device={device!r}, but this llama-cpp-python was built for the CPU only; reinstall it with "
            f"CMAKE_ARGS=\"-DGGML_{device.upper()}=on\" pip install --force-reinstall --no-cache-dir llama-cpp-python"
        )
    return -1 if device != "cpu" and gpu else 0


def set_numerics(cparams: lc.llama_context_params, exact: bool, on_gpu: bool) -> None:
    """The KV cache type and attention kernel of a context: llama.cpp's defaults (F16 KV cache, flash attention
    where the device has it) unless ``exact`` on a CPU.

    Greedy losslessness needs a position verified inside a batch to get bit-identical logits to the same position
    decoded alone. On a CPU an F32 KV cache with flash attention off gives that (docs/exact-numerics.md). On a GPU
    neither those settings nor the defaults do (passes of 4+ rows take other kernels: H100, H200); there fixed-shape
    passes make it exact (``set_pass_rows``, chosen by the self-check), and with them the defaults were exact too
    and cost less a pass (H200: padded target-only 0.98x llama-cpp-python's unpadded decoding, 0.90x with F32 and
    no flash attention; docs/gpu.md). So exact numerics keep the defaults on a GPU."""
    if exact and not on_gpu:
        cparams.type_k = cparams.type_v = lc.GGML_TYPE_F32
        cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED


class LlamaModel:
    """A GGUF model with one context; decode() returns logits as numpy views valid until the next decode."""

    def __init__(self, path: str | Path, options: ContextOptions | None = None) -> None:
        self.path = Path(path)
        self.options = options or ContextOptions()
        check_gguf(self.path)
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = _gpu_layers(self.options.device)
        # No repacked/AMX weight layouts: measured here, they make a position's logits depend on the batch
        # it is computed in (max diff ~0.8 even with an F32 KV cache) for ~10% speed, and the AMX kernels
        # crashed on this Xeon. Plain layouts are exact (docs/exact-numerics.md).
        mparams.use_extra_bufts = False
        self._model = lc.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: the file is corrupt, truncated or of an "
                                 "unsupported architecture (run with --verbose for llama.cpp's log)")
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = lc.llama_vocab_n_tokens(self._vocab)
        self.n_threads = self.options.n_threads or physical_cores()

        cparams = lc.llama_context_default_params()
        cparams.n_ctx = self.options.n_ctx
        cparams.n_batch = cparams.n_ubatch = self.options.n_batch
        # Sequence 0 holds the committed tokens; a draft tree's root-to-leaf paths take sequences 1..MAX_TREE_LEAVES
        # for one pass (decode_tree). One unified cache: every sequence's cells come out of the same n_ctx. llama.cpp
        # reserves an output row per sequence and aborts where that exceeds the batch (a context of 16 tokens).
        cparams.n_seq_max = min(MAX_TREE_LEAVES + 1, self.options.n_batch, self.options.n_ctx)
        self._max_leaves = cparams.n_seq_max - 1
        cparams.kv_unified = True
        cparams.n_threads = cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        self.on_gpu = mparams.n_gpu_layers != 0
        set_numerics(cparams, self.options.exact_numerics, self.on_gpu)
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lc.llama_model_free(self._model)
            self._model = None
            raise ModelLoadError(f"llama.cpp could not create a context of {self.options.n_ctx} tokens for "
                                 f"{self.path} (out of memory?)")
        self.n_ctx = lc.llama_n_ctx(self._ctx)  # llama.cpp may round the requested size up
        self.n_batch = lc.llama_n_batch(self._ctx)  # and clamp the batch to the context
        self._memory = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self._tree_batch: lc.llama_batch | None = None  # made by the first decode_tree: room for many seq ids a row
        self._tree: tuple[int, list[list[int]]] = (0, [])  # the last decode_tree's start, and each node's seq ids
        self._piece = ctypes.create_string_buffer(256)
        self._n_cells = self.n_ctx
        # 0: each pass decodes just its tokens. B > 0: every pass of up to B tokens is padded to B rows (see
        # ``set_pass_rows``), chosen by the exactness self-check where unpadded passes are not batch-invariant.
        self.pass_rows = 0
        self.row_cap = 0  # verify passes held to this many tokens (0: none), where only smaller ones are exact
        # Whether every tree row equals one-token decoding of its path, bit for bit, at this pass shape: what the
        # exactness self-check measured (edgespec/backends/selfcheck.py); until then, no (the engine verifies chains).
        # Measured on a CPU: not with the exact numerics (a row's sums depend on which cells its ancestors sit in),
        # yes with the fast ones padded to 4 rows (flash attention walks a row's visible cells in order).
        self.exact_trees = False
        # Whether a kept prompt prefix plus the rest gives a whole prefill's logits: what the self-check's reuse
        # probe measured (exactness.probe_reuse); until then, yes where ``exact_reuse`` says so.
        self.reuse_probe_exact = True
        self.tree_passes = True  # one sequence per root-to-leaf path (``decode_tree``)

    # -- lifetime -------------------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_ctx", None):
            lc.llama_batch_free(self._batch)
            if self._tree_batch is not None:
                lc.llama_batch_free(self._tree_batch)
            lc.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            lc.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()

    # -- metadata -------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    @property
    def chat_template(self) -> str | None:
        raw = lc.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode()

    @property
    def n_layer(self) -> int:
        return lc.llama_model_n_layer(self._model)

    @property
    def size_bytes(self) -> int:
        return lc.llama_model_size(self._model)

    # -- vocabulary -----------------------------------------------------------------------------------
    @property
    def bos(self) -> int:
        return lc.llama_vocab_bos(self._vocab)

    @property
    def eos(self) -> int:
        return lc.llama_vocab_eos(self._vocab)

    @property
    def adds_bos(self) -> bool:
        return bool(lc.llama_vocab_get_add_bos(self._vocab))

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> bytes:
        return lc.llama_vocab_get_text(self._vocab, token) or b""

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (lc.llama_token * capacity)()
        n = lc.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:  # cannot happen with one token per byte plus specials, but llama.cpp says how many it needs
            capacity = -n
            buf = (lc.llama_token * capacity)()
            n = lc.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token as text (control tokens render as nothing)."""
        n = lc.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            return buf.raw[:n]
        return self._piece.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def check_same_vocab(self, other: LlamaModel) -> None:
        """Raise unless both models map every token id to the same text (speculation exchanges token ids)."""
        check_same_vocab(self, other)

    # -- fixed-shape passes ---------------------------------------------------------------------------
    def set_pass_rows(self, rows: int) -> None:
        """Pad every pass of up to ``rows`` tokens to exactly ``rows`` rows (0: no padding).

        On a device whose kernels are not batch-invariant (CUDA: a pass of 4+ tokens takes other kernels than
        a one-token pass) a token's logits depend on how many rows its pass has. Padding a one-token decode and a
        k-token verify alike to B rows (the real tokens, then filler tokens at the following positions, every
        row's logits asked for, the filler's cache entries removed after the pass) gives each real row the same
        kernels and shapes. The filler cannot change a real row: it sits at later positions, which the causal
        mask hides. The last ``rows - 1`` cells are kept free for the filler, so the context shrinks by that
        much. Fixed shapes also let llama.cpp reuse its graph (and CUDA graphs) from pass to pass.
        """
        if rows < 0 or rows == 1 or rows > self.n_batch:
            raise InvalidParameterError(f"pass rows must be 0 (unpadded) or 2..{self.n_batch}, got {rows}")
        self.pass_rows = rows
        self.n_ctx = self._n_cells - max(0, rows - 1)

    def set_row_cap(self, rows: int) -> None:
        """Hold verify passes to ``rows`` tokens (0: no cap), the largest size the self-check found exact where
        larger ones are not: on a CPU llama.cpp's K-quant products take another kernel from 8 rows on."""
        if rows < 0 or rows == 1:
            raise InvalidParameterError(f"a row cap must be 0 (none) or 2 or more, got {rows}")
        self.row_cap = rows

    def max_pass_rows(self, start: int) -> int:
        """How many tokens a pass starting at ``start`` may carry and still give each the logits it gets when
        decoded alone (padded alike): unpadded, all of them up to the self-check's cap; padded, those that see the
        same n_kv as they would alone (``padded_pass_limit``)."""
        return padded_pass_limit(start, self.pass_rows, KV_STEP) if self.pass_rows else self.row_cap or self.n_batch

    def max_tree_rows(self, start: int) -> int:
        """How many nodes (the committed tokens the cache lacks included) a tree pass from ``start`` may carry:
        unpadded, up to the self-check's cap; padded, as a pass (``max_pass_rows``) whose filler makes it a
        multiple of ``pass_rows``."""
        if not self.pass_rows:
            return self.row_cap or self.n_batch
        return padded_pass_limit(start, self.pass_rows, KV_STEP, self.n_batch - self.pass_rows + 1)

    # -- the KV cache (only KVArena calls these) ------------------------------------------------------
    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        """Append ``tokens`` at positions start.. to the cache; return logits of the last ``n_logits`` of them.

        Long runs are split into n_batch chunks; a pass of up to ``pass_rows`` tokens is padded (see
        ``set_pass_rows``). The returned array is a view into llama.cpp's output buffer (n_logits × n_vocab,
        float32), valid until the next decode.
        """
        if not tokens:
            raise EdgespecError("internal: decode() needs at least one token")
        n_logits = min(n_logits, len(tokens))
        if 0 < len(tokens) <= self.pass_rows:
            return self._decode_padded(tokens, start, n_logits)
        step = self.n_batch
        if n_logits > step:
            raise EdgespecError(f"internal: {n_logits} logit rows asked for, more than n_batch={step}")
        chunks = split_batches(len(tokens), step)
        tail = chunks[-1][0]
        first_logit = len(tokens) - n_logits
        batch = self._batch
        for lo, hi in chunks:
            batch.n_tokens = hi - lo
            for i, j in enumerate(range(lo, hi)):
                batch.token[i] = tokens[j]
                batch.pos[i] = start + j
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = j >= first_logit
            rc = lc.llama_decode(self._ctx, batch)
            if rc != 0:
                raise EdgespecError(f"llama_decode failed with code {rc} at position {start + lo} "
                                    f"(context {self.n_ctx} tokens)")
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = lc.llama_get_logits_ith(self._ctx, first_logit - tail)
        return np.ctypeslib.as_array(ptr, shape=(n_logits, self.n_vocab))

    def _decode_padded(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        """One pass of exactly ``pass_rows`` rows: ``tokens``, then the last of them repeated as filler."""
        rows, n = self.pass_rows, len(tokens)
        batch = self._batch
        batch.n_tokens = rows
        for i in range(rows):
            batch.token[i] = tokens[min(i, n - 1)]
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True  # every row: asking for fewer outputs changes the output kernel's shape
        rc = lc.llama_decode(self._ctx, batch)
        self.truncate(start + n)  # the filler's entries go at once: the cache holds exactly the real tokens
        if rc != 0:
            raise EdgespecError(f"llama_decode failed with code {rc} at position {start} (context {self.n_ctx} tokens)")
        ptr = lc.llama_get_logits_ith(self._ctx, n - n_logits)
        return np.ctypeslib.as_array(ptr, shape=(n_logits, self.n_vocab))

    def decode_tree(self, tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        """One pass over a token tree (``KVArena.extend_tree``): node i at position start + depth - 1, attending to
        the committed tokens and its own ancestors only. Each root-to-leaf path is a sequence of its own (1, 2, ..;
        the committed prefix is copied to each first, which in a unified cache only tags its cells) and every node
        carries the sequences of the leaves below it: llama.cpp's mask lets a token see the cells of its (first)
        sequence at positions up to its own, which are exactly its ancestors. Where passes are padded
        (``set_pass_rows``), the tree is padded the same way to a multiple of that many rows: filler in sequence 0
        after the committed tokens, which no tree row sees, every row's logits asked for, the filler's cells removed
        at once. Returns one row of logits per node (a copy). ``keep_tree_path`` must follow before any other call
        on the cache."""
        n = len(tokens)
        rows = -(-n // self.pass_rows) * self.pass_rows if self.pass_rows else n
        if not 0 < rows <= self.n_batch:
            raise EdgespecError(f"internal: a tree of {n} nodes (n_batch {self.n_batch})")
        is_parent = set(parents)
        leaves = [i for i in range(n) if i not in is_parent]
        if len(leaves) > self._max_leaves:
            raise EdgespecError(f"internal: a tree of {len(leaves)} leaves, more than {self._max_leaves}")
        seqs: list[list[int]] = [[] for _ in range(n)]
        for seq, leaf in enumerate(leaves, 1):
            node = leaf
            while node >= 0:
                seqs[node].append(seq)
                node = parents[node]
        for seq in range(1, len(leaves) + 1):
            lc.llama_memory_seq_cp(self._memory, 0, seq, -1, -1)
        if self._tree_batch is None:
            self._tree_batch = lc.llama_batch_init(self.n_batch, 0, MAX_TREE_LEAVES)
        batch = self._tree_batch
        batch.n_tokens = rows
        depth = [0] * n
        for i, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
            depth[i] = 0 if parent < 0 else depth[parent] + 1
            batch.token[i] = token
            batch.pos[i] = start + depth[i]
            batch.n_seq_id[i] = len(seqs[i])
            for j, seq in enumerate(seqs[i]):
                batch.seq_id[i][j] = seq
            batch.logits[i] = True
        for i in range(n, rows):
            batch.token[i] = tokens[-1]
            batch.pos[i] = start + i - n
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        self._tree = (start, seqs)
        rc = lc.llama_decode(self._ctx, batch)
        self.truncate(start)  # the filler's cells (sequence 0 holds nothing else from start on)
        if rc != 0:
            self._drop_tree_sequences(len(leaves))
            raise EdgespecError(f"llama_decode failed with code {rc} on a tree of {n} nodes at position {start}")
        return np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(self._ctx, i), shape=(self.n_vocab,))
                         for i in range(n)])

    def keep_tree_path(self, nodes: list[int]) -> None:
        """After ``decode_tree``: sequence 0 takes the cells of ``nodes`` (a root path), the tree's sequences go.

        Node i sits in the cell after node i - 1, so a path other than the tree's first sits in cells with gaps
        between them, which the next passes' tokens would fill: a later token in a cell before its ancestors'. The
        flash-attention kernel adds a row's visible cells in cell order (and the others' sums depend on cells
        too), so those rows would differ from sequential decoding's (benchmarks/tree_rows.py). Such a path's
        cells are therefore moved: copied out (llama.cpp's state format: raw K and V) and back into the free cells
        right after the committed tokens, where sequential decoding puts them."""
        start, seqs = self._tree
        n_seqs = max((max(s) for s in seqs), default=0)
        if nodes and nodes != list(range(len(nodes))):
            path = seqs[nodes[-1]][0]  # the sequence of a leaf below the last node: exactly the path's cells
            for seq in range(1, n_seqs + 1):
                if seq != path:
                    lc.llama_memory_seq_rm(self._memory, seq, -1, -1)
            lc.llama_memory_seq_rm(self._memory, path, -1, start)  # the committed prefix stays tagged 0
            lc.llama_memory_seq_rm(self._memory, path, start + len(nodes), -1)
            size = lc.llama_state_seq_get_size(self._ctx, path)
            data = (ctypes.c_uint8 * size)()
            copied = lc.llama_state_seq_get_data(self._ctx, data, size, path) == size
            lc.llama_memory_seq_rm(self._memory, path, -1, -1)  # every cell from start on is free now
            if not copied or lc.llama_state_seq_set_data(self._ctx, data, size, path) != size:
                lc.llama_memory_seq_rm(self._memory, path, -1, -1)
                raise EdgespecError(f"llama.cpp could not move the accepted path's cache entries of {self.path.name}")
            lc.llama_memory_seq_cp(self._memory, path, 0, -1, -1)
        elif nodes:
            lc.llama_memory_seq_cp(self._memory, seqs[nodes[-1]][0], 0, start, start + len(nodes))
        self._drop_tree_sequences(n_seqs)
        if self.cache_end() != start + len(nodes):
            raise EdgespecError(f"internal: after a tree step the cache ends at {self.cache_end()}, "
                                f"not {start + len(nodes)}")

    def _drop_tree_sequences(self, n_leaves: int) -> None:
        for seq in range(1, n_leaves + 1):
            lc.llama_memory_seq_rm(self._memory, seq, -1, -1)

    def truncate(self, keep: int) -> None:
        """Drop every cache entry at position >= keep."""
        if not lc.llama_memory_seq_rm(self._memory, 0, keep, -1):
            raise EdgespecError(f"llama.cpp refused to roll the cache of {self.path.name} back to {keep}")

    def cache_end(self) -> int:
        """One past the highest position in the cache (0 when empty), as llama.cpp itself reports it."""
        return lc.llama_memory_seq_pos_max(self._memory, 0) + 1

    @property
    def exact_reuse(self) -> bool:
        """Whether a kept cache prefix plus a decoded tail gives a fresh prefill's logits bit for bit: with
        exact numerics on a CPU, measured (tests/model/test_prompt_cache.py) and probed by the self-check; with the fast
        ones, or where passes must be padded to be exact, a position's KV depends on the batch it was prefilled in
        (a GPU: not measured)."""
        return self.options.exact_numerics and not self.pass_rows and not self.on_gpu and self.reuse_probe_exact

    def save_state(self) -> CacheState | None:
        """A copy of sequence 0's cache entries (llama.cpp's own state format); None for sliding-window models
        (Gemma 2/3): their cache rolled back to a restored state's prefix came back empty
        (tests/export/test_arch_support.py,
        a tiny Gemma 2), so their conversations are not kept."""
        if lc.llama_model_n_swa(self._model) > 0:
            return None
        size = lc.llama_state_seq_get_size(self._ctx, 0)
        data = (ctypes.c_uint8 * size)()
        if lc.llama_state_seq_get_data(self._ctx, data, size, 0) != size:
            raise EdgespecError(f"llama.cpp could not copy the cache of {self.path.name} out")
        return CacheState(self.cache_end(), size, data)

    def load_state(self, state: CacheState) -> None:
        self.truncate(0)
        data = state.data
        assert isinstance(data, ctypes.Array)
        if lc.llama_state_seq_set_data(self._ctx, data, len(data), 0) == 0 or self.cache_end() != state.n_tokens:
            self.truncate(0)
            raise EdgespecError(f"llama.cpp could not restore a saved cache of {self.path.name}")

    def self_draft(self) -> None:
        """No layer-skip self-draft: llama.cpp offers no way to run a subset of a model's layers."""
        return None

    def draft_head(self) -> None:
        """No draft head: it reads the target's last hidden states, which edgespec's llama.cpp calls do not keep."""
        return None


def claims(model: str | os.PathLike[str]) -> bool:
    """GGUF files; llama.cpp is also the default backend, for model names (``smollm2-135m:q8_0``)."""
    return Path(model).suffix == ".gguf"


def open_model(model: str | os.PathLike[str], options: ModelOptions) -> LlamaModel:
    if options.layer_skip is not None:
        raise InvalidParameterError("layer_skip needs an ONNX model: llama.cpp cannot skip layers")
    return LlamaModel(resolve(model), ContextOptions(n_ctx=options.n_ctx, n_threads=options.n_threads,
                                                    device=options.device, exact_numerics=options.exact_numerics))
