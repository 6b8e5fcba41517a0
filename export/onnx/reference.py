"""A minimal reference runner for an edgespec ONNX directory: chains embed → layers → head over plain numpy
KV buffers. For the exporter's own checks (logits vs transformers, batch invariance, quality); the runtime
with the preallocated arena and IO binding is edgespec's ONNX backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgespec.backends.onnx.manifest import kv_dtype_of, read_manifest
from edgespec.errors import ModelLoadError

from .. import require


def session_options(threads: int = 1, optimization: str = "all"):
    """The runtime's session settings (edgespec.backends.onnx.model.session_options: the process-wide thread pool
    when the runtime made one, else per-session pools) at a chosen graph optimization level."""
    ort = require("onnxruntime", "onnx")
    from edgespec.backends.onnx.session import session_options as runtime_options

    so, _ = runtime_options(threads, make_shared=False)
    so.graph_optimization_level = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[optimization]
    return so


class OnnxReference:
    """Token ids in, logits out; ``forward`` appends to the KV buffers, ``truncate`` rolls back."""

    def __init__(self, folder: str | Path, threads: int = 1, **options) -> None:
        ort = require("onnxruntime", "onnx")
        self.folder = Path(folder)
        self.manifest = m = read_manifest(self.folder)
        so = session_options(threads, **options)
        providers = ["CPUExecutionProvider"]
        try:
            self.embed = ort.InferenceSession(str(self.folder / m["embed"]), so, providers=providers)
            self.layers = [ort.InferenceSession(str(self.folder / name), so, providers=providers)
                           for name in m["layers"]]
            self.head = ort.InferenceSession(str(self.folder / m["head"]), so, providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types for corrupt files
            raise ModelLoadError(f"{self.folder}: onnxruntime cannot load the graphs: {e}") from e
        # The KV buffers are bound as both past_* and present_* (the contract's in-place update).
        shape = (1, m["num_kv_heads"], m["kv_length"], m["head_dim"])
        self.kv = [(ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, kv_dtype_of(m))),
                    ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, kv_dtype_of(m)))) for _ in m["layers"]]
        self.length = 0

    def forward(self, ids: list[int], skip: frozenset[int] = frozenset()) -> np.ndarray:
        """Logits [len(ids), vocab] for ``ids`` appended after the current length."""
        return self.head.run(None, {"hidden": self.hidden(ids, skip)})[0][0]

    def hidden(self, ids: list[int], skip: frozenset[int] = frozenset()) -> np.ndarray:
        """The last layer's output [1, len(ids), hidden size] (the head's input) for ``ids`` appended after the
        current length."""
        total = self.length + len(ids)
        if not ids or total > self.manifest["context_length"]:
            raise ModelLoadError(f"{total} positions: empty call or beyond the export's context length "
                                 f"{self.manifest['context_length']}")
        hidden = self.embed.run(None, {"input_ids": np.array([ids], np.int64)})[0]
        seqlens, total_len = np.array([total - 1], np.int32), np.array(total, np.int32)
        for i, layer in enumerate(self.layers):
            if i in skip:
                continue
            k, v = self.kv[i]
            binding = layer.io_binding()
            binding.bind_cpu_input("hidden", hidden)
            binding.bind_cpu_input("seqlens_k", seqlens)
            binding.bind_cpu_input("total_sequence_length", total_len)
            binding.bind_ortvalue_input("past_key", k)
            binding.bind_ortvalue_input("past_value", v)
            binding.bind_output("hidden_out")
            binding.bind_ortvalue_output("present_key", k)
            binding.bind_ortvalue_output("present_value", v)
            layer.run_with_iobinding(binding)
            hidden = binding.get_outputs()[0].numpy()
        self.length = total
        return hidden

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def logits(self, ids: list[int]) -> np.ndarray:
        """Full prefill of ``ids`` from an empty cache."""
        self.length = 0
        return self.forward(ids)
