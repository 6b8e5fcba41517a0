"""ONNX Runtime backend: a model exported as per-layer graphs, run over edgespec's own KV memory.

An exported directory (docs/onnx-format.md, written by ``edgespec export onnx``) holds ``embed.onnx``, one
``layer_NN.onnx`` per decoder layer and ``head.onnx``. One ``OnnxModel`` opens a session for the embedding,
the head and each *segment* of layers (consecutive layers merged into one graph at load time, capped in size:
edgespec/onnx_segments.py), and allocates the whole KV cache once: a single buffer (layers × K/V × kv_heads ×
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

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import custom_ops
from . import onnx_segments as segments
from .arena import CacheState
from .backend import GPU_DEVICES, ModelOptions, check_options, split_batches
from .cpu import physical_cores
from .drafters.head import HeadDrafter
from .errors import EdgespecError, InvalidParameterError, ModelLoadError
from .extras import install_command, require
from .head_model import HeadModel
from .hf_tokenizer import HFTokenizer
from .huge_pages import new_memory_on_huge_pages
from .tuning import key_digest
from .vocab import check_same_vocab

MANIFEST = "edgespec-onnx.json"
FORMAT = "edgespec-onnx/1"
KV_DTYPES = ("float32", "float16")  # the manifest's kv_dtype: what the layer graphs' past/present tensors hold
# Execution providers tried for each device, best first; the CPU provider always comes last.
_PROVIDERS = {"cpu": (), "cuda": ("CUDAExecutionProvider",), "metal": ("CoreMLExecutionProvider",),
              "auto": ("CUDAExecutionProvider", "CoreMLExecutionProvider")}


def head_folder(export: Path) -> Path:
    """Where ``edgespec export head`` writes the draft head of an export: beside it (a re-export replaces the export's
    directory, not the head, which took long to train)."""
    return export.with_name(export.name + ".head")


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
    # Run the layers between skipped ones as one session each (edgespec/onnx_segments.py); False: one session
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


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelLoadError(f"{folder} is not an edgespec ONNX model directory (no {MANIFEST}); "
                             "make one with `edgespec export onnx`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e
    if not isinstance(manifest, dict):
        raise ModelLoadError(f"{path}: a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        raise ModelLoadError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}")
    missing = [k for k in ("num_layers", "num_kv_heads", "head_dim", "hidden_size", "vocab_size", "context_length",
                           "embed", "layers", "head") if k not in manifest]
    if missing:
        raise ModelLoadError(f"{path}: missing {', '.join(missing)}")
    if manifest.get("kv_dtype", "float32") not in KV_DTYPES:
        raise ModelLoadError(f"{path}: kv_dtype {manifest['kv_dtype']!r} is not supported ({' or '.join(KV_DTYPES)})")
    layers = manifest["layers"]
    if not isinstance(layers, list) or len(layers) != manifest["num_layers"]:
        raise ModelLoadError(f"{path}: layers {str(layers)[:60]} for num_layers={manifest['num_layers']}")
    return manifest


def is_draft_head(manifest: dict) -> bool:
    """A draft head's export (``edgespec export head``) reads rows of features, not token ids: its "embed" graph
    maps [the target's hidden state, a token's embedding] to its width, and it has no vocabulary of its own."""
    return manifest.get("input") == "features"


def kv_dtype_of(manifest: dict) -> np.dtype:
    """The element type of an export's KV buffer (``read_manifest`` checked it)."""
    return np.dtype(manifest.get("kv_dtype", "float32"))


# onnxruntime's process-wide thread pool: its intra-op thread count once edgespec made it, -1 when another
# library made it first, None while there is none.
_shared_pool_threads: int | None = None


def session_options(n_threads: int, make_shared: bool = True, kernels: Path | None = None) -> tuple[object, int]:
    """Session options for edgespec's sessions, and the intra-op thread count they will really run with.

    A forward pass chains 30+ sessions. Each with its own pool, the pools must not spin between calls (an idle
    spinning pool steals the cores the running one needs), and every parallel op then waits for sleeping
    threads to wake: SmolLM2 INT8, 2 threads, 600 tokens of context, 20.0 ms per token without spinning,
    17.4 ms spinning within a call only, 15.5 ms with all sessions on ONE process-wide spinning pool. That
    pool is the default. onnxruntime allows only one per process, of a fixed size, and once it exists every
    session in the process must use it: a later model asking for another thread count runs on it too (the
    count returned says so), and so must other onnxruntime sessions in the process (``use_per_session_threads
    = False``; this function's options do). ``EDGESPEC_ORT_SHARED_POOL=0`` keeps per-session pools instead,
    and so does ``make_shared=False`` while there is no shared pool yet (the exporter's checks). ``kernels``: the
    library of edgespec's ops to register (default: this machine's build).
    """
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state

    global _shared_pool_threads
    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    # Without: each of the 32+ sessions keeps its own memory arena at its peak size (SmolLM2 INT8 after a
    # 400-token prompt and a few verify passes: peak RSS 794 MB with arenas, 580 MB without, same speed).
    so.enable_cpu_mem_arena = False
    if _shared_pool_threads is None and make_shared and os.environ.get("EDGESPEC_ORT_SHARED_POOL", "1") != "0":
        try:
            _pybind_state.set_global_thread_pool_sizes(n_threads, 1)
            _shared_pool_threads = n_threads
        except Exception:  # someone else made the process-wide pool first: its size is unknown
            _shared_pool_threads = -1
    custom_ops.register(so, kernels)  # edgespec's ops, for the exports that use them
    if _shared_pool_threads is not None:
        so.use_per_session_threads = False
        return so, n_threads if _shared_pool_threads < 0 else _shared_pool_threads
    so.intra_op_num_threads, so.inter_op_num_threads = n_threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")  # spin within a call, sleep between calls
    return so, n_threads


def open_session(file: str, so: object, providers: list[str], where: Path) -> tuple[Any, int]:
    """An onnxruntime session of the graph ``file`` (``where``: what to call it in an error), and how many bytes
    of its memory were collapsed into 2 MB pages (its weights: read once per pass)."""
    import onnxruntime as ort

    try:
        with new_memory_on_huge_pages() as collapsed:
            created = ort.InferenceSession(file, so, providers=providers)
    except Exception as e:  # onnxruntime raises its own exception types for invalid graphs
        raise ModelLoadError(f"onnxruntime cannot load {where}: {e}") from e
    return created, collapsed.bytes


def open_head(folder: Path, n_ctx: int, n_threads: int, manifest: dict | None = None) -> HeadModel:
    """A draft head's export, run as one session on the CPU (edgespec/head_model.py); ``manifest``: its manifest
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


def _providers(device: str) -> list[str]:
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    wanted = [p for p in _PROVIDERS[device] if p in available]
    if device in GPU_DEVICES and not wanted:
        package = f"onnxruntime-gpu ({install_command('cuda')})" if device == "cuda" else "an onnxruntime with CoreML"
        raise InvalidParameterError(f"device={device!r}, but this onnxruntime has no {_PROVIDERS[device][0]}; "
                                    f"install {package}")
    return [*wanted, "CPUExecutionProvider"]


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


def _can_fuse() -> bool:
    """Fusing merges graphs with the ``onnx`` package (in the ``onnx`` extra); without it, per-layer sessions."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        return False
    return True


class OnnxModel:
    """An exported model: sessions for embed, layer segments and head, one KV buffer, a tokenizer. Satisfies the
    arena's ``Cache``."""

    def __init__(self, path: str | os.PathLike[str], options: OnnxOptions | None = None) -> None:
        require("onnxruntime", "onnx", "an ONNX model")
        self.path = Path(path).expanduser()
        self.options = options or OnnxOptions()
        if self.path.suffix == ".onnx" or self.path.name == MANIFEST:
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
        if is_draft_head(m):  # run by the drafter (edgespec/head_model.py), beside the model it drafts for
            raise ModelLoadError(f"{self.path} is a draft head, not a model: load the export it drafts for "
                                 f"({m.get('draft_head', {}).get('target', 'the folder beside it')})")
        self.tokenizer = HFTokenizer(self.path)
        providers = _providers(self.options.device)
        self.device_type = "cuda" if providers[0] == "CUDAExecutionProvider" else "cpu"
        custom_ops.require_for(m, self.path, self.device_type)

        so, self.n_threads = session_options(self.n_threads, kernels=self.options.kernels)
        if self.options.profile:
            so.enable_profiling, so.profile_file_prefix = True, self.options.profile

        self.huge_page_bytes = 0  # of the sessions' memory, collapsed into 2 MB pages (edgespec/huge_pages.py)

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
        self.reuse_probe_exact = True  # a kept prompt prefix is reused unless the self-check's reuse probe differs
        self._layer_files = files[1:-1]
        self._session: Callable[[str, Path], Any] = session
        # Segments split at the skip set only when the layer-skip draft is first readied (``_plan``): the target's
        # logits are the same bit for bit under any split (tests/test_onnx_backend.py), and each session call
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
        """One session per segment of layers (edgespec/onnx_segments.py), each bound to its slices of the KV;
        the segments end where the run of layers skipped by ``_split_at`` starts or ends."""
        self.close()  # the old sessions go first: their weights are freed before the new load
        layer_files, session = self._layer_files, self._session
        fuse = self.options.fuse_layers and _can_fuse()
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

    def _plan(self, layers: Sequence[int]) -> list[_Stage]:
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
        stages = self._plan(plan)
        if (clock is not None or hidden is not None) and any(len(stage.layers) > 1 for stage in stages):
            raise EdgespecError("internal: per-layer clocks or states need a model loaded with fuse_layers=False")
        out, last = self._ping[0], 0
        # Only a pass through every layer ends in the last hidden state (a layer-skip draft's rows are not it);
        # ``_plan`` ran exactly ``layers``, distinct, so all of them is a matter of their count.
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
        a one-token pass over its path (tests/test_exact_attention.py, tests/test_onnx_trees.py); exports of graphs
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
        ios = self._pass_io(self._all_layers, self._plan(self._all_layers), n).stages  # the pass's (one chunk)
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
        graphs are batch-invariant (docs/onnx-format.md), measured on the CPU (tests/test_prompt_cache.py) and probed
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


class LayerSkipView:
    """The target minus some layers, sharing its sessions and its KV buffer (a ``SharedCache`` for the arena).

    It writes the KV of the layers it runs at the positions it decodes; the arena makes it adopt the
    target's committed entries instead of recomputing them, and the target's verify pass overwrites
    the positions the view wrote speculatively.
    """

    def __init__(self, model: OnnxModel, skip: Sequence[int]) -> None:
        self.model = model
        self.skip = check_skip(skip, model.n_layer)
        self.layers = tuple(i for i in range(model.n_layer) if i not in set(self.skip))
        self.n_ctx = model.n_ctx
        self._end = 0
        # What `edgespec calibrate-skip` measured for this very set: (top-1 agreement with the target, draft
        # pass / target pass). The γ controller starts from it instead of from an optimistic guess.
        entry = model.manifest.get("layer_skip") or {}
        self.calibrated: tuple[float, float] | None = (
            (float(entry["agreement"]), float(entry["cost_ratio"]))
            if entry.get("skip") == self.skip and "agreement" in entry and "cost_ratio" in entry else None)

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        if start != self._end:
            raise EdgespecError(f"internal: draft decode at {start}, but its cache ends at {self._end}")
        logits = self.model.forward(self.layers, tokens, start, n_logits)
        self._end = start + len(tokens)
        return logits

    def truncate(self, keep: int) -> None:
        self._end = min(self._end, keep)

    def adopt(self, end: int) -> None:
        """Take the owner's first ``end`` positions as this view's own (they are in the shared memory)."""
        self._end = end

    def prepare(self) -> None:
        """Split the owner's fused segments at the skip set if they are not yet (once, ~1.5 s)."""
        self.model._plan(self.layers)

    def cache_end(self) -> int:
        return self._end


def default_skip(n_layer: int) -> list[int]:
    """Without a calibrated set: every other layer of the middle third (measured on SmolLM2 to agree on
    ~60% of greedy tokens for 6 of 30 layers; `edgespec calibrate-skip` finds a better set)."""
    lo, hi = n_layer // 3, 2 * n_layer // 3
    return list(range(lo + 1, hi, 2))


def check_skip(skip: Sequence[int], n_layer: int) -> list[int]:
    try:
        layers = sorted({int(i) for i in skip})
    except (TypeError, ValueError) as e:
        raise InvalidParameterError(f"layer_skip must be a list of layer indices, got {skip!r}") from e
    bad = [i for i in layers if not 0 <= i < n_layer]
    if bad:
        raise InvalidParameterError(f"layer_skip has layer {bad[0]}, outside 0..{n_layer - 1}")
    if len(layers) >= n_layer:
        raise InvalidParameterError(f"layer_skip skips all {n_layer} layers: the draft would be the embedding alone")
    return layers


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
