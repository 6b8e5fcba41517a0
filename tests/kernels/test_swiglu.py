"""edgespec.SwiGlu (edgespec/kernels/swiglu.cc) as onnxruntime runs it: silu(gate) · up within float rounding of a
float64 reference and of onnxruntime's own Split, Sigmoid and Mul, extreme inputs finite and right, every element the
same bits alone, in any row count and with a tail shorter than a vector, the portable build giving the same bits as
this machine's, and an odd width refused with a clear error."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from edgespec.backends.onnx.session import session_options
from edgespec.kernels import library as custom_ops

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper, F = onnx.helper, onnx.TensorProto.FLOAT
pytestmark = pytest.mark.skipif(custom_ops.library() is None, reason="the kernel library is not built here")


def _session(width: int, ours: bool = True, kernels: Path | None = None) -> object:
    """x [1, S, 2·width] → y [1, S, width]: the op, or onnxruntime's Split, x · Sigmoid(x) and Mul."""
    if ours:
        nodes = [helper.make_node(custom_ops.SWIGLU_OP, ["x"], ["y"], domain=custom_ops.DOMAIN)]
    else:
        split = onnx.numpy_helper.from_array(np.array([width, width], np.int64), "split")
        nodes = [helper.make_node("Split", ["x", "split"], ["gate", "up"], axis=-1),
                 helper.make_node("Sigmoid", ["gate"], ["s"]), helper.make_node("Mul", ["gate", "s"], ["act"]),
                 helper.make_node("Mul", ["act", "up"], ["y"])]
    graph = helper.make_graph(nodes, "swiglu", [helper.make_tensor_value_info("x", F, [1, "S", "W"])],
                              [helper.make_tensor_value_info("y", F, None)], [] if ours else [split])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("edgespec", 1)])
    model.ir_version = 10
    so, _ = session_options(2, make_shared=False, kernels=kernels)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _reference(x: np.ndarray) -> np.ndarray:
    gate, up = np.split(x.astype(np.float64), 2, axis=-1)
    with np.errstate(over="ignore"):  # e^1e30 is inf: gate / inf is the 0 that silu is there
        return gate / (1 + np.exp(-gate)) * up


@pytest.mark.parametrize("width", [1536, 44])  # SmolLM2's MLP, and a width with a 4-element tail
def test_matches_the_reference_and_onnxruntime(width: int) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((1, 9, 2 * width)) * 4).astype(np.float32)
    ours = _session(width).run(None, {"x": x})[0]
    assert ours.shape == (1, 9, width) and ours.dtype == np.float32
    scale = np.abs(_reference(x)) + 1e-30
    assert (np.abs(ours - _reference(x)) / scale).max() < 1e-6
    theirs = _session(width, ours=False).run(None, {"x": x})[0]  # its sigmoid is less precise far below 0
    assert np.abs(ours - theirs).max() < 1e-6 * np.abs(theirs).max()


def test_extreme_inputs() -> None:
    gate = np.array([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 88.0, -88.0, 100.0, -100.0, 1e30, -1e30], np.float32)
    x = np.concatenate([gate, np.full_like(gate, 2.0)])[None, None]
    y = _session(len(gate)).run(None, {"x": x})[0][0, 0]
    assert np.isfinite(y).all()
    expected = _reference(x.astype(np.float64))[0, 0]
    assert np.allclose(y, expected, rtol=1e-6, atol=1e-35)  # e^x below −87 is taken as 0
    assert y[8] == 200.0 and y[9] == 0.0 and y[10] == 2e30  # silu(x) = x far above 0, 0 far below


@pytest.mark.parametrize("rows", [11, 40])  # 40: a prefill chunk's rows, shared between the threads
def test_an_element_has_the_same_bits_in_any_call(rows: int) -> None:
    rng = np.random.default_rng(rows)
    width = 44
    session = _session(width)
    x = (rng.standard_normal((1, rows, 2 * width)) * 3).astype(np.float32)
    together = session.run(None, {"x": x})[0]
    for r in range(rows):
        assert np.array_equal(session.run(None, {"x": x[:, r:r + 1]})[0][0, 0], together[0, r])
    assert np.array_equal(session.run(None, {"x": x[:, 3:30]})[0][0], together[0, 3:30])


def test_the_portable_build_gives_the_same_bits(tmp_path: Path) -> None:
    """A baseline x86-64 build (no AVX2, no FMA, the vectors as SSE pairs) against this machine's."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the x86-64 build runs on x86 only")
    other = tmp_path / "x86-64.so"
    custom_ops.compile_library(other, ["-march=x86-64"])
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((1, 5, 2 * 44)) * 6).astype(np.float32)
    assert np.array_equal(_session(44).run(None, {"x": x})[0], _session(44, kernels=other).run(None, {"x": x})[0])


def test_an_odd_width_is_refused() -> None:
    with pytest.raises(Exception, match="last dimension must be even"):
        _session(3).run(None, {"x": np.zeros((1, 2, 7), np.float32)})
