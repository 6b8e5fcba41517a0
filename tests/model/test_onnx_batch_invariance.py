"""Batch invariance of one exported decoder layer with Gemma 3's attention shape (head_dim 256), built by the
real graph writer from random weights: no model download or full export needed; with GroupQueryAttention and
with edgespec's exact attention kernel, and INT8 products as MatMulNBits and as edgespec.BlockInt8MatMul.

MLAS reduces GroupQueryAttention's Q·Kᵀ over head_dim in one pass while a call has ≤ 64 keys and in passes
of 128 beyond, so before the fix a row at a position < 64 came out differently alone than inside a verify
batch reaching past 64 (Gemma 3 INT8 logits up to 0.58 apart on a Spec-Bench translation prompt).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from edgespec.export.onnx import block_int8
from edgespec.export.onnx.export import DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, _quantized, pads_every_product
from edgespec.export.onnx.graphs import ATTENTIONS, ModelSpec, attention_min_total, kv_dtype, kv_length, layer_graph

from edgespec.backends.onnx.session import session_options

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

HIDDEN, INTERMEDIATE, HEADS, HEAD_DIM = 64, 128, 4, 256
CONTEXT = 128
POSITIONS = 80  # past the 64-key boundary
SPEC = ModelSpec("gemma3", 1, HIDDEN, HEADS, 1, HEAD_DIM, 256, 1e-6, ("sliding_attention",),
                 {"sliding_attention": 10000.0, "full_attention": 1e6}, 512, 256 ** -0.5, 2, (1,))


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN), "self_attn.k_proj": (HEAD_DIM, HIDDEN),
              "self_attn.v_proj": (HEAD_DIM, HIDDEN), "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
              "mlp.gate_proj": (INTERMEDIATE, HIDDEN), "mlp.up_proj": (INTERMEDIATE, HIDDEN),
              "mlp.down_proj": (HIDDEN, INTERMEDIATE)}
    w = {f"model.layers.0.{k}.weight": (rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32)
         for k, s in shapes.items()}
    for norm, size in (("input_layernorm", HIDDEN), ("post_attention_layernorm", HIDDEN),
                       ("pre_feedforward_layernorm", HIDDEN), ("post_feedforward_layernorm", HIDDEN),
                       ("self_attn.q_norm", HEAD_DIM), ("self_attn.k_norm", HEAD_DIM)):
        w[f"model.layers.0.{norm}.weight"] = (0.1 * rng.standard_normal(size)).astype(np.float32)
    return w


class _Layer:
    """One layer session over one in-place KV buffer (past_* and present_* bound to the same memory)."""

    def __init__(self, path: Path, kv: str) -> None:
        so, _ = session_options(1, make_shared=False)  # the runtime's settings (and its shared pool, if made)
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        shape = (1, 1, kv_length(CONTEXT), HEAD_DIM)
        self.kv = [ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, kv)) for _ in range(2)]

    def run(self, rows: np.ndarray, start: int) -> np.ndarray:
        """Hidden rows at positions start.. → the layer's output rows (positions ≥ start are rewritten)."""
        total = start + len(rows)
        io = self.session.io_binding()
        io.bind_cpu_input("hidden", np.ascontiguousarray(rows[None]))
        io.bind_cpu_input("seqlens_k", np.array([total - 1], np.int32))
        io.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        io.bind_output("hidden_out")  # first: get_outputs() follows the binding order
        for name, value in zip(("key", "value"), self.kv, strict=True):
            io.bind_ortvalue_input(f"past_{name}", value)
            io.bind_ortvalue_output(f"present_{name}", value)
        self.session.run_with_iobinding(io)
        return io.get_outputs()[0].numpy()[0]


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("quant", ["fp32", "int8", "int8 BlockInt8MatMul", "int4"])
def test_gemma_shaped_layer_rows_do_not_depend_on_the_call(tmp_path: Path, quant: str, attention: str) -> None:
    path = tmp_path / "layer.onnx"
    bits = {"int4": 4, "fp32": None}.get(quant, 8)
    pad = pads_every_product(bits, quant == "int4", DEFAULT_ACCURACY_LEVEL)  # as the export decides
    kv = kv_dtype(attention, quant.split()[0])  # as the export decides: half under the exact attention, but fp32
    graph = layer_graph(SPEC, _weights().__getitem__, 0, CONTEXT, pad_matmuls=pad, attention=attention, kv=kv)
    if bits:  # the export's defaults: symmetric MatMulNBits, block 32, accuracy_level 4
        graph = _quantized(graph, bits, DEFAULT_BLOCK_SIZE, DEFAULT_ACCURACY_LEVEL, True)
    if quant.endswith(block_int8.OP):
        assert block_int8.rewrite(graph) == 4  # q|k|v, o, gate|up, down
    onnx.save_model(graph, str(path))
    layer = _Layer(path, kv)
    # Gemma-like residual stream: large magnitudes and a few outlier channels
    rng = np.random.default_rng(1)
    hidden = (30 * rng.standard_normal((POSITIONS, HIDDEN))).astype(np.float32)
    hidden[:, [3, 17]] *= 100
    singles = np.stack([layer.run(hidden[p:p + 1], p)[0] for p in range(POSITIONS)])
    bad = [p for p, row in enumerate(layer.run(hidden, 0)) if not np.array_equal(row, singles[p])]
    assert not bad, f"one call of {POSITIONS} positions: positions {bad} differ from single-token calls"
    for k in (2, 3, 5, 8):
        for start in range(64 - k, 66):  # every window that crosses (or touches) 64 keys
            got = layer.run(hidden[start:start + k], start)
            bad = [start + j for j in range(k) if not np.array_equal(got[j], singles[start + j])]
            assert not bad, f"k={k} from {start}: positions {bad} differ from single-token calls"


def test_padding_target() -> None:
    assert attention_min_total(SPEC, CONTEXT) == 65
    assert attention_min_total(SPEC, 40) == kv_length(40)  # never past the buffer
    llama = ModelSpec("llama", 1, HIDDEN, 9, 3, 64, 256, 1e-5, ("full_attention",), {"full_attention": 1e4},
                      None, 0.125, 1, (2,))
    assert attention_min_total(llama, CONTEXT) == 0  # head_dim ≤ 128: one pass at every key count
