"""edgespec.BlockInt8MatMul (edgespec/kernels/block_int8_matmul.cc) as onnxruntime runs it, and the export's
rewrite of MatMulNBits into it (export/onnx/block_int8.py): MatMulNBits' 8-bit products within float rounding, the
exact arithmetic against a NumPy reference (weights of −128 included), every row bit-identical alone or in any
call, the portable, AVX2 and VNNI loops giving the same bits, and a graph off the contract refused with a
clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from edgespec.export.onnx import block_int8

from edgespec.backends.onnx.session import session_options
from edgespec.kernels import library as custom_ops
from tests.conftest import cpu_has

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper, numpy_helper, F = onnx.helper, onnx.numpy_helper, onnx.TensorProto.FLOAT
pytestmark = pytest.mark.skipif(custom_ops.library() is None, reason="the kernel library is not built here")

K, N = 96, 48  # 3 blocks along K, 3 packed column groups


def _session(model: object, kernels: Path | None = None) -> object:
    so, _ = session_options(2, make_shared=False, kernels=kernels)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _model(nodes: list, initializers: list, k: int = K, opsets: tuple[str, ...] = ("com.microsoft",)) -> object:
    graph = helper.make_graph(nodes, "products", [helper.make_tensor_value_info("x", F, [1, "S", k])],
                              [helper.make_tensor_value_info("y", F, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    *(helper.make_opsetid(d, 1) for d in opsets)])
    model.ir_version = 10
    return model


def _nbits(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None) -> object:
    """One 8-bit MatMulNBits at block 32, level 4: codes uint8 [N, K/32, 32], scales [N, K/32]."""
    n, blocks, _ = codes.shape
    inputs = [numpy_helper.from_array(codes, "b"), numpy_helper.from_array(scales.ravel(), "scales")]
    if zero_points is not None:
        inputs.append(numpy_helper.from_array(zero_points, "zero_points"))
    node = helper.make_node("MatMulNBits", ["x", *(t.name for t in inputs)], ["y"], domain="com.microsoft",
                            K=blocks * 32, N=n, bits=8, block_size=32, accuracy_level=4)
    return _model([node], inputs, blocks * 32)


def _weights(rng: np.random.Generator, n: int = N, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    codes = rng.integers(0, 256, (n, k // 32, 32), dtype=np.uint8)  # code 0: weight −128
    codes[:, :, 0] = 0
    return codes, rng.uniform(0.001, 0.02, (n, k // 32)).astype(np.float32)


def _reference(x: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The op's arithmetic in float64: each row's blocks quantized to int8 by max|x| / 127, exact integer block
    sums, scaled by both scales."""
    m, blocks = x.shape[0], codes.shape[1]
    xb = x.reshape(m, blocks, 32).astype(np.float64)
    step = (np.abs(x.reshape(m, blocks, 32)).max(-1) / np.float32(127)).astype(np.float32)
    inverse = np.where(step > 0, np.float32(1) / np.where(step > 0, step, 1), 0).astype(np.float32)
    q = np.rint((xb * inverse[..., None]).astype(np.float32)).astype(np.int64)
    w = codes.astype(np.int64) - 128
    sums = np.einsum("mbk,nbk->mnb", q, w)
    return (sums * (step[:, None, :].astype(np.float64) * scales[None].astype(np.float64))).sum(-1)


def test_matches_matmulnbits_and_the_exact_arithmetic() -> None:
    rng = np.random.default_rng(0)
    codes, scales = _weights(rng)
    nbits = _nbits(codes, scales)
    ours = _nbits(codes, scales)
    assert block_int8.rewrite(ours) == 1
    assert [n.op_type for n in ours.graph.node] == [block_int8.OP]
    assert {t.name for t in ours.graph.initializer} == {"y_int8", "y_block_scales"}  # MatMulNBits' inputs gone
    assert any(o.domain == custom_ops.DOMAIN for o in ours.opset_import)
    x = rng.standard_normal((1, 7, K)).astype(np.float32)
    x[0, 0, :32] = -np.abs(x[0, 0, :32])  # negative activations against weights of −128
    y_nbits, y_ours = _session(nbits).run(None, {"x": x})[0], _session(ours).run(None, {"x": x})[0]
    scale = np.abs(y_nbits).max()
    assert np.abs(y_ours - y_nbits).max() <= 1e-6 * scale
    assert np.abs(y_ours[0] - _reference(x[0], codes, scales)).max() <= 1e-6 * scale


@pytest.mark.parametrize("rows", [2, 5, 9, 40])  # 40: rows quantized by the thread pool
def test_rows_are_bit_identical_alone_and_in_any_call(rows: int) -> None:
    rng = np.random.default_rng(rows)
    model = _nbits(*_weights(rng))
    block_int8.rewrite(model)
    session = _session(model)
    x = rng.standard_normal((1, rows, K)).astype(np.float32)
    together = session.run(None, {"x": x})[0]
    alone = np.concatenate([session.run(None, {"x": x[:, i:i + 1]})[0] for i in range(rows)], axis=1)
    assert np.array_equal(alone, together)
    assert np.array_equal(session.run(None, {"x": x[:, 1:4]})[0], together[:, 1:4])


# Each build's integer loop against this machine's build (-march=native: the VNNI loop where the CPU has a dot
# product instruction, 16 columns wide with AVX512-VNNI, else the AVX2 one): a baseline x86-64 (no AVX2, no FMA:
# what every CPU without AVX2 runs), x86-64-v3 (AVX2 + FMA, no VNNI: pairs of 8-column vectors, tiles of 2 rows)
# and x86-64-v4 (AVX-512 without VNNI: the same loop in tiles of 4 rows).
@pytest.mark.parametrize(("march", "needs"), [("x86-64", "avx2"), ("x86-64-v3", "avx2"), ("x86-64-v4", "avx512vl")])
def test_every_path_gives_the_same_bits(tmp_path: Path, march: str, needs: str) -> None:
    if not cpu_has(needs):
        pytest.skip(f"the {march} build needs an x86 CPU with {needs} to run beside this one's")
    other = tmp_path / f"{march}.so"
    custom_ops.compile_library(other, [f"-march={march}"])
    rng = np.random.default_rng(3)
    model = _nbits(*_weights(rng))
    block_int8.rewrite(model)
    native, built = _session(model), _session(model, kernels=other)
    for rows in (1, 4, 7, 40):
        x = rng.standard_normal((1, rows, K)).astype(np.float32)
        assert np.array_equal(native.run(None, {"x": x})[0], built.run(None, {"x": x})[0]), f"{rows} rows"
    # Activations that quantize to ties (each block's largest is 127, so a code is the value itself: k + 0.5 rounds
    # to the even neighbour in every path, the AVX-512 one's vector conversion included).
    ties = rng.integers(-127, 127, (1, 3, K)).astype(np.float32) + 0.5
    ties[..., ::32] = 127.0
    assert np.array_equal(native.run(None, {"x": ties})[0], built.run(None, {"x": ties})[0]), "ties"


def test_rewrite_carries_a_zero_point_and_leaves_other_products() -> None:
    rng = np.random.default_rng(1)
    codes, scales = _weights(rng)
    model = _nbits(codes, scales, np.full(N * 3, 128, np.uint8))  # a Q8_0 weight carried from a GGUF
    assert block_int8.rewrite(model) == 1
    low = np.minimum(codes, 247)  # with zero point 120, weights −120 … 127
    nbits, ours = _nbits(low, scales, np.full(N * 3, 120, np.uint8)), _nbits(low, scales, np.full(N * 3, 120, np.uint8))
    assert block_int8.rewrite(ours) == 1
    x = rng.standard_normal((1, 3, K)).astype(np.float32)
    expected = _session(nbits).run(None, {"x": x})[0]
    assert np.abs(_session(ours).run(None, {"x": x})[0] - expected).max() <= 1e-6 * np.abs(expected).max()
    assert block_int8.rewrite(_nbits(codes, scales, np.full(N * 3, 120, np.uint8))) == 0  # 255 − 120 leaves int8
    four_bit = _nbits(codes, scales)
    next(a for a in four_bit.graph.node[0].attribute if a.name == "bits").i = 4
    other_level = _nbits(codes, scales)
    next(a for a in other_level.graph.node[0].attribute if a.name == "accuracy_level").i = 1
    mixed = _nbits(codes, scales, rng.integers(120, 136, N * 3, dtype=np.uint8))
    assert [block_int8.rewrite(m) for m in (four_bit, other_level, mixed)] == [0, 0, 0]


def test_pack_puts_four_k_of_sixteen_columns_in_each_64_bytes() -> None:
    codes = np.arange(32 * 64, dtype=np.int64).reshape(32, 2, 32) % 251
    packed, block_scales = block_int8.pack(codes.astype(np.uint8), np.ones((32, 2), np.float32), 0, 32, 64)
    w = codes.reshape(32, 64)
    assert packed.shape == (2, 16, 64) and block_scales.shape == (2, 32)
    for n, k in [(0, 0), (3, 5), (9, 63), (15, 33), (20, 7), (31, 62)]:
        assert packed[n // 16, k // 4, (n % 16) * 4 + k % 4] == np.int8(np.uint8(w[n, k]))


def test_a_graph_off_the_contract_is_a_clear_error() -> None:
    rng = np.random.default_rng(2)
    wrong = numpy_helper.from_array(rng.integers(-127, 128, (N // 16, K // 4, 64), dtype=np.int8), "b")
    scales = numpy_helper.from_array(np.ones((K // 32 + 1, N), np.float32), "s")
    node = helper.make_node(block_int8.OP, ["x", "b", "s"], ["y"], domain=custom_ops.DOMAIN)
    session = _session(_model([node], [wrong, scales], opsets=(custom_ops.DOMAIN,)))
    with pytest.raises(Exception, match="BlockInt8MatMul: K must be a multiple of 32"):
        session.run(None, {"x": np.zeros((1, 2, K), np.float32)})
    # weights packed 8 columns wide, as exports before graphs revision 8 wrote them
    old = numpy_helper.from_array(rng.integers(-127, 128, (N // 8, K // 4, 32), dtype=np.int8), "b")
    scales = numpy_helper.from_array(np.ones((K // 32, N), np.float32), "s")
    session = _session(_model([node], [old, scales], opsets=(custom_ops.DOMAIN,)))
    with pytest.raises(Exception, match=r"B \[N/16, K/4, 64\].*export it again"):
        session.run(None, {"x": np.zeros((1, 2, K), np.float32)})
