"""ONNX Runtime backend: a model exported as per-layer graphs, run over edgespec's own KV memory.

An exported directory (docs/onnx-format.md, written by ``edgespec export onnx``) holds ``embed.onnx``, one
``layer_NN.onnx`` per decoder layer and ``head.onnx``. One ``OnnxModel`` opens a session for the embedding,
the head and each *segment* of layers (consecutive layers merged into one graph at load time, capped in size:
edgespec/backends/onnx/segments.py), and allocates the whole KV cache once: a single buffer (layers × K/V × kv_heads ×
context × head_dim) of the export's ``kv_dtype`` (half under edgespec's attention, else float32). Each layer's
``past_key``/``present_key`` (and value) is bound through IO binding to the SAME slice of that buffer, so the
attention writes the new positions in place: nothing is concatenated or reallocated per token, and rolling back
is moving the committed boundary.

Because each layer's weights live in exactly one session, a layer-skip draft (``LayerSkipView``) is the
same sessions chained without the skipped segments, writing into the same buffer: one copy of the weights
and of the KV memory serves target and draft (see ``KVArena`` for how the draft's entries are kept apart).
The segments split at the skip set only once the draft first runs: a target that never self-drafts (the
n-gram default) runs fewer, bigger sessions.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...cpu import physical_cores
from ...drafters.head import HeadDrafter
from ...engine.arena import CacheState
from ...errors import EdgespecError, InvalidParameterError, ModelLoadError
from ...extras import require
from ...identity import key_digest
from ...kernels import library as custom_ops
from ..base import ModelOptions, check_options, split_batches
from ..vocab import check_same_vocab
from . import segments
from .head import HeadModel
from .layerskip import LayerSkipView, check_skip, default_skip
from .manifest import MANIFEST, head_folder, is_draft_head, kv_dtype_of, read_manifest
from .session import can_fuse, open_session, providers_for, session_options
from .tokenizer import HFTokenizer


def open_model(model: str | os.PathLike[str], options: ModelOptions) -> OnnxModel:
    # Exact numerics are built into the exported graphs (docs/onnx-format.md): nothing to switch here.
    return OnnxModel(model, OnnxOptions(n_ctx=options.n_ctx, n_threads=options.n_threads, device=options.device,
                                        layer_skip=options.layer_skip))


def is_onnx_model(path: str | os.PathLike[str]) -> bool:
    """Whether a path is for the ONNX backend: a directory (GGUF models are files), a .onnx file or a manifest."""
    p = Path(path).expanduser()
    return p.is_dir() or p.suffix == ".onnx" or p.name == MANIFEST


claims = is_onnx_model


@dataclass(frozen=True)
class OnnxOptions:
    """How the sessions are created. The defaults make logits batch-invariant (docs/layer-skip.md)."""

    n_ctx: int = 4096
    n_batch: int = 256
    n_threads: int | None = None  # None: physical cores
    device: str = "cpu"
    layer_skip: Sequence[int] | None = None  # layers the self-draft skips; None: the manifest's calibrated set
    # Run the layers between skipped ones as one session each (edgespec/backends/onnx/segments.py); False: one session
    # per layer, so that any layer subset can run (skip-set calibration).
    fuse_layers: bool = True
    # A file prefix: onnxruntime's profiler on, every session writing its events to <prefix>_<time>.json, handed
    # over by ``end_profiling`` (benchmarks/pass_profile.py). Costs time per node: for measurement only.
    profile: str | None = None
    # Another build of edgespec's ops than this machine's, e.g. of another revision's sources, to compare kernels in
    # the whole model (benchmarks/kernels_in_model.py). None: this machine's build of the installed sources.
    kernels: Path | None = None

    def __post_init__(self) -> None:
        check_options(self.device, self.n_ctx, self.n_batch, self.n_threads)
        if self.kernels is not None and not Path(self.kernels).is_file():
            raise InvalidParameterError(f"kernels must be a built library of edgespec's ops, got {self.kernels}")














def open_head(folder: Path, n_ctx: int, n_threads: int, manifest: dict | None = None) -> HeadModel:
    """A draft head's export, run as one session on the CPU (edgespec/backends/onnx/head.py); ``manifest``: its manifest
    where the caller has read and checked it already (``OnnxModel.draft_head``)."""
    require("onnx", "onnx", "a draft head")  # to join its graphs
    if manifest is None:
        manifest = read_manifest(folder)
        if not is_draft_head(manifest):
            raise ModelLoadError(f"{folder} is not a draft head (no features input)")
    custom_ops.require_for(manifest, folder, "cpu")
    so, _ = session_options(n_threads)

    def session(file: Path) -> tuple[Any, int]:
        return open_session(str(file), so, ["CPUExecutionProvider"], folder)

    return HeadModel(folder, manifest, n_ctx, session)




class _Buffer:
    """One preallocated array the sessions read and write through raw pointers.

    On the CPU (and CoreML, which works on host memory) it is a numpy array; with CUDA it lives on the GPU
    as an OrtValue, and only the logits come back to the host.
    """

    def __init__(self, shape: tuple[int, ...], device_type: str, dtype: np.dtype) -> None:
        self.shape, self.device_type, self.dtype = shape, device_type, dtype
        if device_type == "cpu":
            self.array: np.ndarray | None = np.zeros(shape, dtype=dtype)
            self.ptr = self.array.ctypes.data
        else:  # pragma: no cover - needs a GPU
            import onnxruntime as ort

            self.array = None
            self._value = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype.type, device_type, 0)
            self.ptr = self._value.data_ptr()


@dataclass
class _Stage:
    """One session in the chain: a layer graph, or a segment of consecutive layers fused at load time."""

    layers: tuple[int, ...]
    session: Any

    def name(self, name: str, layer: int) -> str:
        return segments.io_name(name, layer, len(self.layers) > 1)


@dataclass
class _PassIO:
    """The IO bindings of a pass of one number of rows through one plan of stages, everything bound: the token ids'
    buffer, the KV slices, the step's scalars, the hidden states' ping-pong buffers. Made once per shape and reused:
    binding costs a call into onnxruntime per value, run cold after the last pass (or a draft) evicted its code and
    data from the caches. Binding the hidden states and ids every call, the Python around a SmolLM2 INT8 pass in the
    decode loop took 233-359 µs (medians, 6.2-8.4 ms passes, 2-core AMD EPYC), with them bound once 71-103 µs."""

    embed: Any
    stages: list[Any]
    out: _Buffer  # what the last stage writes: the head reads it




class OnnxModel:
    """An exported model: sessions for embed, layer segments and head, one KV buffer, a tokenizer. Satisfies the
    arena's ``Cache``."""

    def __init__(self, path: str | os.PathLike[str], options: OnnxOptions | None = None) -> None:
        require("onnxruntime", "onnx", "an ONNX model")
        self.path = Path(path).expanduser()
        self.options = options or OnnxOptions()
        if not self.path.is_dir() and (self.path.suffix == ".onnx" or self.path.name == MANIFEST):
            if self.path.name == MANIFEST or (self.path.parent / MANIFEST).is_file():
                self.path = self.path.parent
            else:
                raise ModelLoadError(_lone_onnx_message(self.path))
        if not self.path.is_dir():
            raise ModelLoadError(f"ONNX model directory not found: {self.path}")
        self.manifest = m = read_manifest(self.path)
        self.n_layer: int = m["num_layers"]
        self.n_vocab: int = m["vocab_size"]
        self._hidden: int = m["hidden_size"]
        kv_heads, head_dim, context = m["num_kv_heads"], m["head_dim"], m["context_length"]
        # The graphs run a lone token as a pair (batch-invariant numerics, docs/onnx-format.md), whose second
        # row writes one scratch slot past the last position: the buffer is one row longer than the context.
        kv_length = m.get("kv_length", context + 1)
        self.n_ctx = min(self.options.n_ctx, context)
        self.n_batch = min(self.options.n_batch, self.n_ctx)
        self.n_threads = self.options.n_threads or physical_cores()
        if is_draft_head(m):  # run by the drafter (edgespec/backends/onnx/head.py), beside the model it drafts for
            raise ModelLoadError(f"{self.path} is a draft head, not a model: load the export it drafts for "
                                 f"({m.get('draft_head', {}).get('target', 'the folder beside it')})")
        self.tokenizer = HFTokenizer(self.path)
        providers = providers_for(self.options.device)
        self.device_type = "cuda" if providers[0] == "CUDAExecutionProvider" else "cpu"
        custom_ops.require_for(m, self.path, self.device_type)

        so, self.n_threads = session_options(self.n_threads, kernels=self.options.kernels)
        if self.options.profile:
            so.enable_profiling, so.profile_file_prefix = True, self.options.profile

        self.huge_page_bytes = 0  # of the sessions' memory, collapsed into 2 MB pages (huge_pages.py)

        def session(name: str, where: Path) -> Any:
            created, collapsed = open_session(name, so, providers, where)
            self.huge_page_bytes += collapsed
            return created

        files = [self.path / name for name in [m["embed"], *m["layers"], m["head"]]]
        for file in files:
            if not file.is_file():
                raise ModelLoadError(f"{self.path}: {file.name} is missing")
        self._embed = session(str(files[0]), files[0])
        self._head = session(str(files[-1]), files[-1])
        skip = self.options.layer_skip
        if skip is None:
            skip = (m.get("layer_skip") or {}).get("skip", default_skip(self.n_layer))
        self.skip = check_skip(skip, self.n_layer)
        # The KV arena, allocated once at the length the graphs declare.
        kv_shape = (self.n_layer, 2, 1, kv_heads, kv_length, head_dim)
        self.kv = _Buffer(kv_shape, self.device_type, kv_dtype_of(m))
        self._kv_bytes = int(np.prod(kv_shape[2:], dtype=np.int64)) * self.kv.dtype.itemsize
        self._pos = np.zeros(1, dtype=np.int32)  # seqlens_k: total length after the call − 1
        self._total = np.zeros((), dtype=np.int32)  # total_sequence_length
        self._no_tree = np.zeros(0, dtype=np.int32)  # tree_parents of a chain
        self._tree: int | None = None  # where the tree fed by decode_tree starts, until keep_tree_path
        self.exact_trees = False  # the engine verifies trees only where the self-check found them exact
        self.pass_rows = 0  # its passes are exact at any size: never padded
        self.reuse_probe_exact = True  # a kept prompt prefix is reused unless the self-check's reuse probe differs
        self._layer_files = files[1:-1]
        self._session: Callable[[str, Path], Any] = session
        # Segments split at the skip set only when the layer-skip draft is first readied (``ready_segments``): the
        # target's logits are the same bit for bit under any split (tests/model/test_onnx_backend.py), and each session
        # call
        # costs beyond its compute (SmolLM2 INT8, 2 threads, 100 tokens of context, three alternating runs:
        # 13 sessions 15.1–15.7 ms per token, 4 sessions 14.1–14.3 ms; docs/layer-skip.md).
        self._split_at: list[int] = []
        self._open_stages()
        self._all_layers = tuple(range(self.n_layer))  # plans are keyed by tuples: no new one per token
        self._ping = [_Buffer((1, self.n_batch, self._hidden), self.device_type, np.dtype(np.float32))
                      for _ in range(2)]
        self._logits = np.zeros((0, self.n_vocab), dtype=np.float32)
        self._ids = np.zeros((1, self.n_batch), dtype=np.int64)  # a pass's token ids, where its embed graph reads
        self._head_ios: dict[tuple[int, int, int], Any] = {}  # by (rows' buffer, rows, logit rows)
        self._end = 0
        # Once ``keep_features`` is called: the last hidden state (before the final norm) of every cell, kept like
        # the cell's KV (written by full passes, moved with a tree's path, saved and restored with the cache), so
        # rows [0, cache_end()) are always those of the cached tokens. A draft head reads them.
        self._features: np.ndarray | None = None

    def _open_stages(self) -> None:
        """One session per segment of layers (edgespec/backends/onnx/segments.py), each bound to its slices of the KV;
        the segments end where the run of layers skipped by ``_split_at`` starts or ends."""
        self.close()  # the old sessions go first: their weights are freed before the new load
        layer_files, session = self._layer_files, self._session
        fuse = self.options.fuse_layers and can_fuse()
        stages = []
        with tempfile.TemporaryDirectory(prefix="edgespec-segments-") as scratch:
            for layers in segments.plan(self.n_layer, self._split_at, [f.stat().st_size for f in layer_files], fuse):
                if len(layers) == 1:
                    sess = session(str(layer_files[layers[0]]), layer_files[layers[0]])
                else:
                    merged = Path(scratch) / f"layers_{layers[0]}_{layers[-1]}.onnx"
                    try:
                        segments.fuse([layer_files[i] for i in layers], layers, merged)
                    except ValueError as e:
                        raise ModelLoadError(str(e)) from e
                    where = f"{layer_files[layers[0]].name}..{layer_files[layers[-1]].name}"
                    sess = session(str(merged), self.path / where)
                stage = _Stage(tuple(layers), sess)
                _check_stage(stage, layer_files, self.kv.shape[2:], self.kv.dtype)
                stages.append(stage)
        self._stages = stages
        self._tree_input = all(self._has_tree_input(stage) for stage in stages)
        self._stage_of = {stage.layers[0]: stage for stage in stages}

    def _pass_io(self, plan: tuple[int, ...], stages: list[_Stage], n: int) -> _PassIO:
        """The bindings of a pass of ``n`` rows through ``stages`` (the plan running the layers ``plan``), made on
        first use: at most one set per plan and number of rows up to ``n_batch``."""
        key = (plan, n)
        bound = self._passes.get(key)
        if bound is None:
            dev, h = self.device_type, self._hidden
            src, dst = self._ping
            embed = self._embed.io_binding()
            embed.bind_input("input_ids", "cpu", 0, np.int64, [1, n], self._ids.ctypes.data)
            embed.bind_output("hidden", dev, 0, np.float32, [1, n, h], src.ptr)
            ios = []
            for stage in stages:
                io = self._stage_io(stage)
                io.bind_input("hidden", dev, 0, np.float32, [1, n, h], src.ptr)
                io.bind_output("hidden_out", dev, 0, np.float32, [1, n, h], dst.ptr)
                ios.append(io)
                src, dst = dst, src
            bound = self._passes[key] = _PassIO(embed, ios, src)
        return bound

    def _stage_io(self, stage: _Stage) -> Any:
        """A new IO binding of ``stage`` with its KV slices and the step's scalars bound (a chain: no tree)."""
        io = stage.session.io_binding()
        shape, dtype = list(self.kv.shape[2:]), self.kv.dtype.type
        for layer in stage.layers:
            for j, (past, present) in enumerate((("past_key", "present_key"), ("past_value", "present_value"))):
                ptr = self.kv.ptr + (2 * layer + j) * self._kv_bytes
                io.bind_input(stage.name(past, layer), self.device_type, 0, dtype, shape, ptr)
                # The same memory: the attention writes the new positions in place.
                io.bind_output(stage.name(present, layer), self.device_type, 0, dtype, shape, ptr)
        io.bind_input("seqlens_k", "cpu", 0, np.int32, [1], self._pos.ctypes.data)
        io.bind_input("total_sequence_length", "cpu", 0, np.int32, [], self._total.ctypes.data)
        if self._has_tree_input(stage):
            self._bind_parents(io, self._no_tree)
        return io

    @staticmethod
    def _has_tree_input(stage: _Stage) -> bool:
        inputs = [*stage.session.get_inputs(), *stage.session.get_overridable_initializers()]
        return any(i.name == segments.TREE_INPUT for i in inputs)

    @staticmethod
    def _bind_parents(io: Any, parents: np.ndarray) -> None:
        io.bind_input(segments.TREE_INPUT, "cpu", 0, np.int32, [len(parents)], parents.ctypes.data)

    def ready_segments(self, layers: Sequence[int]) -> list[_Stage]:
        """The sessions that run exactly ``layers``. A set the loaded segments cannot run splits them at the
        skip set, once (a second load of the layer graphs, ~1.5 s for SmolLM2): then the layer-skip draft's set
        runs; any other set must not split a segment."""
        key = tuple(layers)
        stages = self._plans.get(key)
        if stages is None:
            stages = self._stages_running(key)
            if stages is None and not self._split_at:
                self._split_at = self.skip
                self._open_stages()
                stages = self._stages_running(key)
            if stages is None:
                raise EdgespecError(f"internal: layers {list(key)} split a fused segment; load the model with "
                                    "fuse_layers=False to run arbitrary layer subsets")
            self._plans[key] = stages
        return stages

    def _stages_running(self, layers: tuple[int, ...]) -> list[_Stage] | None:
        stages = [self._stage_of[i] for i in layers if i in self._stage_of]
        return stages if [i for stage in stages for i in stage.layers] == list(layers) else None

    # -- lifetime / metadata ----------------------------------------------------------------------------
    def end_profiling(self) -> list[Path]:
        """Stop the profiler (``OnnxOptions.profile``) and return the files of the sessions in use."""
        sessions = [self._embed, *(stage.session for stage in self._stages), self._head]
        return [Path(session.end_profiling()) for session in sessions]

    def close(self) -> None:
        """Release the sessions (the view shares them, so it is closed too)."""
        self._stages, self._plans, self._stage_of = [], {}, {}
        self._passes: dict[tuple[tuple[int, ...], int], _PassIO] = {}  # by (plan, rows): ``_pass_io``

    @property
    def segments(self) -> list[tuple[int, ...]]:
        """The layers each session runs, in order (several: a segment fused at load time)."""
        return [stage.layers for stage in self._stages]

    @property
    def description(self) -> str:
        m = self.manifest
        return f"{m.get('architecture', '?')} {self.n_layer} layers, {m.get('quant', '?')} (ONNX)"

    @property
    def providers(self) -> list[str]:
        """The execution providers the sessions run on, best first."""
        return list(self._embed.get_providers())

    @property
    def chat_template(self) -> str | None:
        return self.manifest.get("chat_template") or self.tokenizer.config.get("chat_template")

    @property
    def bos(self) -> int:
        bos = self.manifest.get("bos_token_id")
        return int(bos) if bos is not None else -1

    @property
    def eos(self) -> int:
        return int(self.manifest.get("eos_token_ids", [-1])[0])

    def is_eog(self, token: int) -> bool:
        return token in self.manifest.get("eos_token_ids", ())

    def token_text(self, token: int) -> bytes:
        return self.tokenizer.token_text(token)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.tokenize(text, add_special, parse_special)

    def piece(self, token: int) -> bytes:
        return self.tokenizer.piece(token)

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def check_same_vocab(self, other: object) -> None:
        check_same_vocab(self, other)  # type: ignore[arg-type]

    # -- the forward pass --------------------------------------------------------------------------------
    def forward(self, layers: Sequence[int], tokens: Sequence[int] | np.ndarray, start: int, n_logits: int,
                clock: np.ndarray | None = None, hidden: dict[int, list[np.ndarray]] | None = None) -> np.ndarray:
        """Run ``tokens`` at positions start.. through embed → ``layers`` → head, writing the KV of those
        positions for those layers in place; return the logits of the last ``n_logits`` positions.

        Both measurement hooks need ``fuse_layers=False`` (a session per layer). ``clock`` (calibration): seconds
        spent in each layer's session are added to ``clock[layer]``. ``hidden`` (CPU; what a draft head could
        read, benchmarks/head_feature_probe.py): a copy of each keyed layer's output rows is appended to
        ``hidden[layer]``, one array [rows, width] per chunk of the pass.
        """
        if start + len(tokens) > self.n_ctx:
            raise EdgespecError(f"internal: positions up to {start + len(tokens)} exceed n_ctx={self.n_ctx}")
        n_logits = min(n_logits, len(tokens))
        if n_logits > self.n_batch:
            raise EdgespecError(f"internal: {n_logits} logit rows asked for, more than n_batch={self.n_batch}")
        plan = tuple(layers)
        stages = self.ready_segments(plan)
        if (clock is not None or hidden is not None) and any(len(stage.layers) > 1 for stage in stages):
            raise EdgespecError("internal: per-layer clocks or states need a model loaded with fuse_layers=False")
        out, last = self._ping[0], 0
        # Only a pass through every layer ends in the last hidden state (a layer-skip draft's rows are not it);
        # ``ready_segments`` ran exactly ``layers``, distinct, so all of them is a matter of their count.
        keep = self._features is not None and len(layers) == self.n_layer
        try:
            for lo, hi in split_batches(len(tokens), self.n_batch):  # the last chunk holds every requested row
                out = self._run_chunk(plan, stages, tokens[lo:hi], start + lo, clock, hidden)
                last = hi - lo
                if keep and out.array is not None:
                    self._features[start + lo:start + hi] = out.array[0, :last]  # type: ignore[index]
            return self._logits[:0] if n_logits == 0 else self._run_head(out, last, n_logits)
        except RuntimeError as e:  # a graph off its ops' contracts (a corrupt export, or one for another edgespec)
            raise ModelLoadError(f"onnxruntime cannot run {self.path}: {e}") from e

    def _run_chunk(self, plan: tuple[int, ...], stages: list[_Stage], tokens: Sequence[int] | np.ndarray,
                   start: int, clock: np.ndarray | None, hidden: dict[int, list[np.ndarray]] | None) -> _Buffer:
        n = len(tokens)
        bound = self._pass_io(plan, stages, n)
        self._ids[0, :n] = tokens
        self._embed.run_with_iobinding(bound.embed)
        self._pos[0] = start + n - 1
        self._total[()] = start + n
        for i, (stage, io) in enumerate(zip(stages, bound.stages, strict=True)):
            if clock is None:
                stage.session.run_with_iobinding(io)
            else:
                t = time.perf_counter()
                stage.session.run_with_iobinding(io)
                clock[stage.layers[0]] += time.perf_counter() - t
            if hidden is not None and stage.layers[0] in hidden:
                wrote = self._ping[(i + 1) % 2].array  # the stages take turns writing the two buffers (``_pass_io``)
                if wrote is not None:
                    hidden[stage.layers[0]].append(wrote[0, :n].copy())
        return bound.out

    def _run_head(self, hidden: _Buffer, n: int, n_logits: int) -> np.ndarray:
        if self._logits.shape[0] < n_logits:  # grows a few times at most (to the largest verify batch)
            self._logits = np.zeros((max(n_logits, 2 * self._logits.shape[0], 8), self.n_vocab), dtype=np.float32)
            self._head_ios.clear()  # bound to the old buffer
        key = (hidden.ptr, n, n_logits)
        io = self._head_ios.get(key)
        if io is None:
            io = self._head_ios[key] = self._head.io_binding()
            ptr = hidden.ptr + (n - n_logits) * self._hidden * 4
            io.bind_input("hidden", self.device_type, 0, np.float32, [1, n_logits, self._hidden], ptr)
            io.bind_output("logits", "cpu", 0, np.float32, [1, n_logits, self.n_vocab], self._logits.ctypes.data)
        self._head.run_with_iobinding(io)
        return self._logits[:n_logits]

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """The input embedding of each token [n, hidden] (the embed graph alone)."""
        return self._embed.run(None, {"input_ids": np.asarray(tokens, dtype=np.int64)[None]})[0][0]

    def keep_features(self) -> None:
        """Keep each cell's last hidden state from now on (``features``). The cache is emptied: the cells it held
        have none."""
        if self._features is None:
            self._features = np.zeros((self.n_ctx, self._hidden), dtype=np.float32)
            self._end = 0

    def features(self, lo: int, hi: int) -> np.ndarray:
        """The last hidden states (before the final norm) of cached positions lo..hi−1 (a view, valid until the
        next pass); ``keep_features`` must have been called."""
        if self._features is None or not 0 <= lo <= hi <= self._end:
            raise EdgespecError(f"internal: features {lo}..{hi} of a cache holding {self._end} positions")
        return self._features[lo:hi]

    # -- the Cache protocol (the arena's view of the target) ---------------------------------------------
    def decode(self, tokens: Sequence[int] | np.ndarray, start: int, n_logits: int) -> np.ndarray:
        if start != self._end:
            raise EdgespecError(f"internal: decode at {start}, but the cache ends at {self._end}")
        logits = self.forward(self._all_layers, tokens, start, n_logits)
        self._end = start + len(tokens)
        return logits

    def truncate(self, keep: int) -> None:
        self._end = min(self._end, keep)

    @property
    def tree_passes(self) -> bool:
        """Whether a token tree can be fed in one pass: under edgespec's attention, whose ``tree_parents`` input
        masks each row to its path and sums its keys in the order a chain would, so each row should be the bits of
        a one-token pass over its path (tests/kernels/test_exact_attention.py, tests/model/test_onnx_trees.py); exports
        of graphs
        revision 10 on. Whether they are is the self-check's verdict (``exact_trees``, set by exactness.check)."""
        return self.device_type == "cpu" and self._tree_input

    def max_tree_rows(self, start: int) -> int:
        """Nodes a tree at ``start`` may have: one pass, within the context."""
        return min(self.n_batch, self.n_ctx - start)

    def decode_tree(self, tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        """One pass over a token tree (``KVArena.extend_tree``): node i in cell start + i, at position start + its
        depth, attending to the cached positions and its own ancestors only. One row of logits per node.
        ``keep_tree_path`` must follow before any other call on the cache."""
        n = len(tokens)
        if start != self._end:
            raise EdgespecError(f"internal: a tree at {start}, but the cache ends at {self._end}")
        if not 0 < n <= self.n_batch or not self.tree_passes:
            raise EdgespecError(f"internal: a tree of {n} nodes (n_batch {self.n_batch}, trees: {self.tree_passes})")
        tree = np.asarray(parents, dtype=np.int32)
        ios = self._pass_io(self._all_layers, self.ready_segments(self._all_layers), n).stages  # the pass's (one chunk)
        for io in ios:
            self._bind_parents(io, tree)
        try:
            logits = self.forward(self._all_layers, tokens, start, n)
        finally:
            for io in ios:
                self._bind_parents(io, self._no_tree)
        self._tree, self._end = start, start + n
        return logits

    def keep_tree_path(self, nodes: list[int]) -> None:
        """After ``decode_tree``: the K/V of ``nodes`` (a root path, root first) move to the cells of their positions
        (the keys were rotated by position, so they are what a chain's would be); the other nodes' are dropped."""
        start, self._tree = self._tree, None
        if start is None:
            raise EdgespecError("internal: keep_tree_path without a tree")
        kv = self.kv.array
        assert kv is not None  # trees run on the CPU only (``exact_trees``)
        for depth, node in enumerate(nodes):  # node ≥ depth: each cell is read before anything overwrites it
            if node != depth:
                kv[..., start + depth, :] = kv[..., start + node, :]
                if self._features is not None:
                    self._features[start + depth] = self._features[start + node]
        self._end = start + len(nodes)

    def cache_end(self) -> int:
        return self._end

    def max_pass_rows(self, start: int) -> int:
        """Any pass is exact here: the graphs are batch-invariant by construction (docs/onnx-format.md); where a
        product kernel is not, the export pads its rows itself."""
        return self.n_ctx - start

    @property
    def exact_reuse(self) -> bool:
        """Whether a kept cache prefix plus a decoded tail gives a fresh prefill's logits bit for bit: the
        graphs are batch-invariant (docs/onnx-format.md), measured on the CPU (tests/model/test_prompt_cache.py) and
        probed
        by the self-check (``reuse_probe_exact``)."""
        return self.device_type == "cpu" and self.reuse_probe_exact

    def save_state(self) -> CacheState | None:
        """A copy of the KV of the held positions; None on a GPU (copying it to the host is not cheap)."""
        if self.kv.array is None:
            return None
        data = self.kv.array[..., :self._end, :].copy()
        features = None if self._features is None else self._features[:self._end].copy()
        return CacheState(self._end, data.nbytes + (0 if features is None else features.nbytes), (data, features))

    def load_state(self, state: CacheState) -> None:
        data, features = state.data  # type: ignore[misc]
        assert isinstance(data, np.ndarray) and self.kv.array is not None
        self.kv.array[..., :state.n_tokens, :] = data
        self._end = state.n_tokens
        if self._features is not None:  # a state saved before the features were kept has none: nothing is cached
            if features is None:
                self._end = 0
            else:
                self._features[:state.n_tokens] = features

    def draft_head(self) -> HeadDrafter | None:
        """The draft head exported for this model (``edgespec export head`` writes it to ``<export>.head``), run on
        the CPU beside it; None where there is none (or on a GPU, where the hidden states stay on the device)."""
        folder = head_folder(self.path)
        if self.device_type != "cpu" or not (folder / MANIFEST).is_file():
            return None
        manifest = read_manifest(folder)
        info = manifest.get("draft_head") or {}
        try:
            vocab = np.load(folder / str(info.get("vocab", "vocab.npy")))
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{folder}: cannot read the head's vocabulary: {e}") from e
        why = self._head_mismatch(manifest, info, vocab)
        if why:
            raise ModelLoadError(f"{folder} is not a draft head for {self.path.name}: {why}; write one for it with "
                                 f"`edgespec export head {self.path} --weights HEAD.npz` (docs/draft-head.md)")
        head = open_head(folder, n_ctx=self.n_ctx, n_threads=self.n_threads, manifest=manifest)
        return HeadDrafter(self, head, vocab.astype(np.int64), float(info["scale"]), identity=key_digest(info))

    def _head_mismatch(self, manifest: dict, info: dict, vocab: np.ndarray) -> str | None:
        """Why the head export with this manifest cannot draft for this model, or None."""
        if not is_draft_head(manifest):
            return "it is not a draft head (no features input)"
        if manifest["hidden_size"] != self._hidden:
            return f"its width is {manifest['hidden_size']}, the model's {self._hidden}"
        if info.get("target_vocab_size") != self.n_vocab:
            return (f"it was trained for a vocabulary of {info.get('target_vocab_size')} tokens, the model has "
                    f"{self.n_vocab}")
        if vocab.shape != (manifest["vocab_size"],) or not ((vocab >= 0) & (vocab < self.n_vocab)).all():
            return "its vocabulary file does not match its output rows"
        if not isinstance(info.get("scale"), (int, float)):
            return "it has no feature scale"
        return None

    def self_draft(self) -> LayerSkipView:
        """The layer-skip draft: this model without the layers in ``skip``, over the same sessions and KV."""
        return LayerSkipView(self, self.skip)

    @property
    def kv_array(self) -> np.ndarray | None:
        """The KV arena as a numpy array (CPU), for inspection."""
        return self.kv.array








def _check_stage(stage: _Stage, files: Sequence[Path], kv_shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Refuse layer graphs whose inputs do not match the contract, naming the file and what is wrong."""
    inputs = {i.name: i for i in stage.session.get_inputs()}
    outputs = {o.name: o for o in stage.session.get_outputs()}
    for layer in stage.layers:
        file = files[layer]

        def arg(name: str, layer: int = layer) -> object:
            return inputs.get(stage.name(name, layer)) or outputs.get(stage.name(name, layer))

        why = segments.contract_error(file, [n for n in segments.LAYER_INPUTS if arg(n)],
                                      [n for n in segments.LAYER_OUTPUTS if arg(n)])
        if why:
            raise ModelLoadError(why)
        for name in segments.KV_NAMES:
            value = arg(name)
            expected = "tensor(float)" if dtype == np.float32 else f"tensor({dtype.name})"
            if value.type != expected:  # type: ignore[attr-defined]
                raise ModelLoadError(f"{file}: {name} is {value.type}, but the manifest's KV is {dtype.name}")  # type: ignore[attr-defined]
            shape = list(value.shape)  # type: ignore[attr-defined]
            if len(shape) != len(kv_shape) or any(isinstance(d, int) and d != k for d, k in zip(shape, kv_shape,
                                                                                                   strict=False)):
                raise ModelLoadError(f"{file}: {name} has shape {shape}, but the manifest gives {list(kv_shape)}")


def _lone_onnx_message(path: Path) -> str:
    if not path.is_file():
        return f"ONNX model not found: {path}"
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        names = [i.name for i in model.graph.input]
    except Exception:  # any unreadable file gets the generic message below
        names = []
    kv = any("past" in n or "cache" in n for n in names)
    why = ("it has KV inputs but is a single graph" if kv else "it has no KV cache inputs (past_key/past_value)")
    return (f"{path} is a lone ONNX file; {why}. edgespec runs models exported as a directory by "
            f"`edgespec export onnx` (embed.onnx, layer_NN.onnx with past_key/past_value, head.onnx, {MANIFEST})")
