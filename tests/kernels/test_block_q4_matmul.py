"""edgespec.BlockQ4MatMul and edgespec.BlockKQuantMatMul (edgespec/kernels/block_q4_matmul.cc) as onnxruntime runs
them on random GGUF Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K blocks packed by export/onnx/block_q4.py and
block_kquant.py: the exact
arithmetic against a float64 reference, every row bit-identical alone and in calls of 1–64 rows and with any thread
count, the portable, AVX2, AVX-VNNI and AVX-512 builds giving the same bits as this machine's, and a graph off the
contract refused with a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from edgespec.export.onnx import block_kquant, block_q4, block_weights

from edgespec.backends.onnx.session import session_options
from edgespec.kernels import library as custom_ops
from tests.conftest import cpu_has

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper, numpy_helper, F = onnx.helper, onnx.numpy_helper, onnx.TensorProto.FLOAT
pytestmark = pytest.mark.skipif(custom_ops.library() is None, reason="the kernel library is not built here")

K, N = 128, 48  # 4 blocks along K, 3 packed column groups
KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
DEPTH = {kind: 512 if kind.endswith("_K") else K for kind in KINDS}  # K per kind: K-quants in super-blocks of 256
Weight = block_weights.BlockWeight | block_kquant.KQuantWeight


def _kernel_blocks(kind: str, rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Random blocks of a type only the kernels carry (K-quants, Q5_0, Q5_1: every scale, minimum and code possible,
    the largest included); raw bytes."""
    blocks = n * k // block_kquant.SPAN[kind]
    raw = rng.integers(0, 256, (blocks, block_kquant.BYTES[kind]), dtype=np.uint8)
    super_block = kind.endswith("_K")
    d = rng.uniform(0.0005, 0.004, blocks) if super_block else rng.uniform(0.001, 0.05, blocks)
    if kind in ("Q3_K", "Q6_K", "Q5_0"):  # no minimum: d of either sign
        d *= np.where(rng.random(blocks) < 0.3, -1, 1)
    second = rng.uniform(0.0005, 0.01, blocks) if super_block else rng.uniform(-0.4, 0.1, blocks)  # dmin, Q5_1's m
    for at, value in zip(block_kquant.HALVES[kind], (d, second), strict=False):
        raw[:, at:at + 2] = value.astype(np.float16).view(np.uint8).reshape(blocks, 2)
    if kind == "Q6_K":
        raw[::7, :192] = 0  # every code −32 …
        raw[::7, 192:208] = 0x80  # … times scale −128
    elif kind == "Q3_K":
        raw[::7, :108] = 0  # every code −4 times scale −32
    elif kind == "Q2_K":
        raw[::7, :80] = 0xFF  # every sc and m 15, every code 3
    elif kind == "Q5_0":
        raw[::7, 2:] = 0  # every code −16
    else:
        raw[::7, 2 * len(block_kquant.HALVES[kind]):] = 0xFF  # every sc and m 63, every code 15 or 31
    return raw.reshape(n, -1)


def _ggml(kind: str, rng: np.random.Generator, n: int = N, k: int = K) -> np.ndarray:
    """Random GGUF blocks of ``kind``: fp16 d (and m), random nibbles; the raw bytes [N, bytes per row]."""
    if kind in block_kquant.KINDS:
        return _kernel_blocks(kind, rng, n, k)
    blocks = n * k // 32
    d = rng.uniform(0.001, 0.05, blocks).astype(np.float16)
    head = [d.view(np.uint8).reshape(blocks, 2)]
    if kind == "Q4_1":
        head.append(rng.uniform(-0.4, 0.1, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2))
    codes = rng.integers(0, 256, (blocks, 16), dtype=np.uint8)
    codes[::7] = 0xFF  # every code 15 (the largest products)
    return np.concatenate([*head, codes], axis=1).reshape(n, -1)


def _weight(kind: str, rng: np.random.Generator, n: int = N, k: int | None = None) -> Weight:
    k = k or DEPTH[kind]
    if kind in block_kquant.KINDS:
        return block_kquant.from_ggml(kind, _ggml(kind, rng, n, k), n, k)
    return block_weights.from_ggml(kind, _ggml(kind, rng, n, k), n, k)


def _pack(weight: Weight) -> tuple[str, np.ndarray, np.ndarray]:
    if isinstance(weight, block_kquant.KQuantWeight):
        return (block_kquant.OPS[weight.kind], *block_kquant.pack(weight))
    return (block_q4.OP, *block_q4.pack(weight))


def _model(packed: tuple[str, np.ndarray, np.ndarray], k: int) -> object:
    op, codes, scales = packed
    node = helper.make_node(op, ["x", "b", "s"], ["y"], domain=custom_ops.DOMAIN)
    graph = helper.make_graph([node], "products", [helper.make_tensor_value_info("x", F, [1, "S", k])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(codes, "b"), numpy_helper.from_array(scales, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(custom_ops.DOMAIN, 1)])
    model.ir_version = 10
    return model


def _session(model: object, threads: int = 2, kernels: Path | None = None) -> object:
    so, _ = session_options(threads, make_shared=False, kernels=kernels)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _exact_parts(weight: Weight) -> tuple[np.ndarray, np.ndarray, int]:
    """The weights in float64, exactly, as the op's two float steps split them ([N, K] each: the codes' part, the
    minima's), and the span of a float step along K."""
    n, k = weight.shape
    if isinstance(weight, block_kquant.KQuantWeight):
        codes, scales, minima = weight.gathered()  # the scales exact products, the minima's too
        w = (scales.astype(np.float64) * codes).reshape(n, k)
        span = codes.shape[2]
        return w, np.zeros_like(w) if minima is None else np.repeat(minima.reshape(n, -1), span, axis=1), span
    w = (weight.unpacked_codes().astype(np.float64) - weight.zero_point) * weight.scales[..., None]
    minima = np.zeros_like(w) if weight.minima is None else np.broadcast_to(weight.minima[..., None], w.shape)
    return w.reshape(n, k), minima.reshape(n, k).astype(np.float64), 32


def _reference(x: np.ndarray, weight: Weight) -> tuple[np.ndarray, np.ndarray, int]:
    """The op's arithmetic in float64 ([M, K] → [M, N]): each row's blocks quantized to int8 by max|x| / 127 (in
    float32, as the kernel), times the dequantized weights; the sum of the float steps' magnitudes (a rounding
    bound); and the number of float steps a column takes."""
    m, blocks = x.shape[0], x.shape[1] // 32
    xb = x.reshape(m, blocks, 32)
    step = (np.abs(xb).max(-1) / np.float32(127)).astype(np.float32)
    inverse = np.where(step > 0, np.float32(1) / np.where(step > 0, step, 1), 0).astype(np.float32)
    q = (np.rint((xb * inverse[..., None]).astype(np.float32)).astype(np.float64) * step[..., None]).reshape(m, -1)
    w, minima, span = _exact_parts(weight)
    sub = x.shape[1] // span
    terms = [np.einsum("mbk,nbk->mnb", q.reshape(m, sub, span), part.reshape(-1, sub, span)) for part in (w, minima)]
    steps = sub * (2 if np.any(minima) else 1)
    return terms[0].sum(-1) + terms[1].sum(-1), (np.abs(terms[0]) + np.abs(terms[1])).sum(-1), steps


@pytest.mark.parametrize("kind", KINDS)
def test_matches_the_dequantized_weights_within_float_rounding(kind: str) -> None:
    rng = np.random.default_rng(0)
    weight = _weight(kind, rng)
    k = weight.shape[1]
    x = rng.standard_normal((9, k)).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: scale 0
    x[1, 32:64] *= 100.0  # a block far larger than the rest
    y_ref, magnitude, steps = _reference(x, weight)
    y = _session(_model(_pack(weight), k)).run(None, {"x": x[None]})[0][0]
    # float32 products of the scales and one fused step per sub-block (and minimum): a few units of 2⁻²⁴ of the
    # terms' magnitudes
    assert np.all(np.abs(y - y_ref) <= (steps + 2) * 2.0**-23 * magnitude)
    # the activations' int8 rounding: largest on the row whose block is 100× the rest, and on Q2_K's weights (2-bit
    # codes under a minimum: nearly alike within a sub-block, so the rounding errors add up; 0.026 of max|y| here)
    bound = 0.04 if kind == "Q2_K" else 0.02
    assert np.abs(y - x @ weight.dequantize().T).max() < bound * np.abs(y).max()


@pytest.mark.parametrize("kind", KINDS)
def test_rows_are_bit_identical_alone_and_in_calls_of_1_to_64_rows(kind: str) -> None:
    rng = np.random.default_rng(1)
    weight = _weight(kind, rng)
    session = _session(_model(_pack(weight), weight.shape[1]))
    x = rng.standard_normal((1, 64, weight.shape[1])).astype(np.float32)
    alone = np.concatenate([session.run(None, {"x": x[:, i:i + 1]})[0] for i in range(64)], axis=1)
    for rows in range(2, 65):  # every tile split, and the rows quantized by the pool from 16 on
        start = (rows * 7) % (65 - rows)
        together = session.run(None, {"x": x[:, start:start + rows]})[0]
        assert np.array_equal(together, alone[:, start:start + rows]), f"{rows} rows"


@pytest.mark.parametrize("kind", KINDS)
def test_thread_counts_give_the_same_bits(kind: str) -> None:
    rng = np.random.default_rng(2)
    k = 256 if kind.endswith("_K") else 96
    model = _model(_pack(_weight(kind, rng, n=160, k=k)), k)  # 10 column tasks
    x = rng.standard_normal((1, 13, k)).astype(np.float32)
    one, *others = (_session(model, threads).run(None, {"x": x})[0] for threads in (1, 2, 3, 4))
    assert all(np.array_equal(one, other) for other in others)


# Each build's loop against this machine's (-march=native): the portable one (baseline x86-64: no AVX2, F16C or
# FMA), AVX2's vpmaddubsw on pairs of 8-column vectors (x86-64-v3), the same with AVX-VNNI's 256-bit vpdpbusd, and
# AVX-512 without VNNI (x86-64-v4: pairs, tiles of 4 rows).
@pytest.mark.parametrize(("flags", "needs"), [(("-march=x86-64",), "avx2"), (("-march=x86-64-v3",), "avx2"),
                                              (("-march=x86-64-v3", "-mavxvnni"), "avx_vnni"),
                                              (("-march=x86-64-v4",), "avx512vl")])
def test_every_path_gives_the_same_bits(tmp_path: Path, flags: tuple[str, ...], needs: str) -> None:
    if not cpu_has(needs):
        pytest.skip(f"the {' '.join(flags)} build needs an x86 CPU with {needs} to run beside this one's")
    other = tmp_path / "other.so"
    custom_ops.compile_library(other, list(flags))
    rng = np.random.default_rng(3)
    for kind in KINDS:
        k = DEPTH[kind]
        model = _model(_pack(_weight(kind, rng)), k)
        native, built = _session(model), _session(model, kernels=other)
        for rows in (1, 3, 8, 17):
            x = rng.standard_normal((1, rows, k)).astype(np.float32)
            assert np.array_equal(native.run(None, {"x": x})[0], built.run(None, {"x": x})[0]), f"{kind} {rows}"
        # activations that quantize to ties (each block's largest is 127: k + 0.5 rounds to the even neighbour)
        ties = rng.integers(-127, 127, (1, 3, k)).astype(np.float32) + 0.5
        ties[..., ::32] = 127.0
        assert np.array_equal(native.run(None, {"x": ties})[0], built.run(None, {"x": ties})[0]), f"{kind} ties"


def test_pack_carries_every_code_scale_and_minimum() -> None:
    rng = np.random.default_rng(4)
    for kind in ("Q4_0", "Q4_1"):
        weight = _weight(kind, rng, n=32, k=64)
        codes, scales = block_q4.pack(weight)
        q = weight.unpacked_codes().reshape(32, 64)
        assert codes.shape == (2, 8, 64) and scales.shape == (2, 2, 16 if kind == "Q4_0" else 32)
        for n, k in [(0, 0), (3, 5), (9, 63), (15, 36), (20, 7), (31, 62)]:
            byte = codes[n // 16, k // 8, (n % 16) * 4 + k % 4]
            assert (byte >> 4 if k % 8 >= 4 else byte & 0x0F) == q[n, k]
            assert scales[n // 16, k // 32, n % 16] == weight.scales[n, k // 32]
        if kind == "Q4_1":  # the file's m, back from block_weights' m + 8d
            raw = _ggml(kind, np.random.default_rng(5), 32, 64).reshape(32, 2, 20)[..., 2:4].copy().view(np.float16)
            again = block_q4.pack(_weight(kind, np.random.default_rng(5), n=32, k=64))[1]
            assert np.array_equal(again[..., 16:], raw[..., 0].reshape(2, 16, 2).transpose(0, 2, 1))
    codes, scales = block_q4.pack(_weight("Q4_1", rng, n=40, k=64))  # N not a multiple of 16: zero columns after
    assert codes.shape == (3, 8, 64) and not codes[2, :, 32:].any() and not scales[2, :, 8:16].any()
    with pytest.raises(ValueError, match="not a GGUF Q4_0/Q4_1 weight"):
        block_q4.pack(block_weights.from_ggml("Q8_0", rng.integers(0, 256, (N, K // 32 * 34), dtype=np.uint8), N, K))


def _code(codes: np.ndarray, group: int, j: int, at: int) -> int:
    """Column j's code of k = at from a packed B of 4-bit ([G, K/8, 64]) or 5-bit ([G, K/32, 320]) codes."""
    five = codes.shape[2] == 320
    lines = codes[group].reshape(-1, 64)  # 5-bit: per block of 32 its four chunks of nibbles, then its fifth bits
    byte = lines[at // 8 + (at // 32 if five else 0), 4 * j + at % 4]
    low = byte >> 4 if at % 8 >= 4 else byte & 0x0F
    if not five:
        return int(low)
    fifth = lines[at // 32 * 5 + 4, 4 * j + at % 4] >> (2 * (at % 32 // 8) + at % 8 // 4) & 1
    return int(low | fifth << 4)


@pytest.mark.parametrize("kind", ("Q5_0", "Q5_1"))
def test_five_bit_pack_carries_every_code_scale_and_minimum(kind: str) -> None:
    """Q5_0 / Q5_1 read as gguf's own dequantization reads them, and every weight's code, d and m where
    BlockQ4MatMul's layout puts them."""
    gguf = pytest.importorskip("gguf")
    n, k = 40, 64  # N not a multiple of 16: zero columns after
    raw = _ggml(kind, np.random.default_rng(8), n, k)
    weight = block_kquant.from_ggml(kind, raw, n, k)
    expected = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).reshape(n, k)
    assert np.array_equal(weight.dequantize(), expected)
    codes, scales = block_kquant.pack(weight)
    d, m, q = weight.q5()
    assert codes.shape == (3, 2, 320) and scales.shape == (3, 2, 16 if kind == "Q5_0" else 32)
    assert not codes[2].reshape(-1, 64)[:, 32:].any() and not scales[2, :, 8:16].any()
    for col, at in [(0, 0), (3, 5), (9, 63), (15, 36), (20, 7), (31, 62), (39, 12), (17, 28)]:
        assert _code(codes, col // 16, col % 16, at) == q.reshape(n, k)[col, at]
        assert scales[col // 16, at // 32, col % 16] == d[col, at // 32]
        if m is not None:
            assert scales[col // 16, at // 32, 16 + col % 16] == m[col, at // 32]


@pytest.mark.parametrize("kind", ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
def test_kquant_pack_carries_every_code_scale_and_minimum(kind: str) -> None:
    """Every weight's code and its sub-block's numbers where the layout puts them, the file's fp16 bytes as they
    are, and the super-blocks read as gguf's own dequantization reads them."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(7)
    n, k = 40, 512  # N not a multiple of 16: zero columns after
    raw = _ggml(kind, rng, n, k)
    weight = block_kquant.from_ggml(kind, raw, n, k)
    expected = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).reshape(n, k)
    assert np.array_equal(weight.dequantize(), expected)
    assert np.array_equal(weight.rows(np.arange(n)[::-1]).dequantize(), expected[::-1])
    codes, scales = block_kquant.pack(weight)
    gathered, _, _ = weight.gathered()
    signed = kind in block_kquant.ZERO  # Q3_K, Q6_K: a signed scale per sub-block, no minimum
    q = gathered.reshape(n, k).astype(np.int16) + block_kquant.ZERO.get(kind, 0)  # Q6_K's, Q3_K's unsigned codes
    assert scales.shape == (3, 2, 288 if signed else 576 if kind == "Q2_K" else 320)
    assert not codes[2].reshape(-1, 64)[:, 32:].any()
    fp16 = 1 if signed else 2  # d (and dmin) of the 16 columns, then a byte per column and sub-block
    halves, small = scales[2, :, :32 * fp16].reshape(2, fp16, 16, 2), scales[2, :, 32 * fp16:].reshape(2, -1, 16)
    assert not halves[:, :, 8:].any() and not small[:, :, 8:].any() and small[:, :, :8].any()
    super_blocks = raw.reshape(n, 2, -1)
    at_d = block_kquant.HALVES[kind][0]
    d_bytes = super_blocks[..., at_d:at_d + 2]  # the file's fp16 d
    for col, at in [(0, 0), (3, 5), (9, 63), (15, 36), (20, 7), (31, 300), (39, 511), (17, 255)]:
        g, j, s = col // 16, col % 16, at // 256
        if not signed:
            if kind == "Q2_K":  # byte 4j + i % 4 of the 16 k's 64 bytes, bits 2·(i // 4)
                i = at % 16
                assert codes[g, at // 16, 4 * j + i % 4] >> (2 * (i // 4)) & 3 == q[col, at]
            else:
                assert _code(codes, g, j, at) == q[col, at]
            d, dmin, sc, m, _ = weight.minima_form()
            assert scales[g, s, 2 * j:2 * j + 2].tobytes() == d_bytes[col, s].tobytes() == d[col, s].tobytes()
            assert scales[g, s, 32 + 2 * j:34 + 2 * j].tobytes() == dmin[col, s].tobytes()
            sub = at % 256 // (16 if kind == "Q2_K" else 32)
            assert scales[g, s, 64 + 32 * sub + j] == sc[col, s, sub]
            assert scales[g, s, 64 + 32 * sub + 16 + j] == m[col, s, sub]
        else:
            unit = codes[g, at // 16]
            i = at % 16
            byte = unit[i // 8 * 64 + 4 * j + i % 4]
            low = byte >> 4 if i % 8 >= 4 else byte & 0x0F
            high = unit[128 + 4 * j + i % 4] >> (2 * (i // 4)) & 3 if kind == "Q6_K" else 0  # Q3_K: 128 bytes
            assert len(unit) == (192 if kind == "Q6_K" else 128) and low | high << 4 == q[col, at]
            d, sub_scales, _ = weight.signed_form()
            assert scales[g, s, 2 * j:2 * j + 2].tobytes() == d_bytes[col, s].tobytes() == d[col, s].tobytes()
            assert scales[g, s, 32 + 16 * (at % 256 // 16) + j].view(np.int8) == sub_scales[col, s, at % 256 // 16]
    with pytest.raises(ValueError, match=r"whole \(super-\)blocks"):
        block_kquant.from_ggml(kind, raw[:, :10], n, 128)


def test_a_graph_off_the_contract_is_a_clear_error() -> None:
    op, codes, scales = _pack(_weight("Q4_0", np.random.default_rng(6)))
    session = _session(_model((op, codes, scales[:, :-1]), K))
    with pytest.raises(Exception, match="BlockQ4MatMul: K must be a multiple of 32"):
        session.run(None, {"x": np.zeros((1, 2, K), np.float32)})
    session = _session(_model((op, codes, np.concatenate([scales, scales[..., :8]], axis=2)), K))
    with pytest.raises(Exception, match=r"scales \[N/16, K/32, 16\] \(Q4_0, Q5_0\)"):
        session.run(None, {"x": np.zeros((1, 2, K), np.float32)})
    op, codes, scales = _pack(_weight("Q6_K", np.random.default_rng(6)))
    session = _session(_model((op, codes, scales[..., :-16]), 512))  # Q4_K's 320 bytes would be right for Q4_K
    with pytest.raises(Exception, match=r"BlockKQuantMatMul: .*\(Q6_K\) or .*\(Q3_K\) and scales \[N/16, K/256, 288\]"):
        session.run(None, {"x": np.zeros((1, 2, 512), np.float32)})
    session = _session(_model((op, codes[:, :-1], scales), 512))
    with pytest.raises(Exception, match="BlockKQuantMatMul: K must be a multiple of 256"):
        session.run(None, {"x": np.zeros((1, 2, 512), np.float32)})
