"""edgespec's attention kernel (edgespec/kernels/exact_attention.cc) as onnxruntime runs it: built on this machine
by `make setup`, every row of a call bit-identical to the same row computed alone, and the attention itself right
(a float64 NumPy reference) for SmolLM2's shape, Gemma's (head_dim 256, sliding window, q/k/v apart), Gemma 2's
soft-capping and Phi-3's head_dim 96; over a float32 KV buffer and over a float16 one (keys and values rounded
to half as NumPy rounds them, every build alike)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from edgespec.backends.onnx.session import session_options
from edgespec.errors import ModelLoadError
from edgespec.kernels import library as custom_ops

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper, F, I32 = onnx.helper, onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
KV_TYPES = {np.float32: F, np.float16: onnx.TensorProto.FLOAT16}


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    dim: int
    packed: bool = True
    window: int = -1
    softcap: float = 0.0


SHAPES = {"smollm2": Shape(9, 3, 64), "gemma3": Shape(4, 1, 256, packed=False, window=16),
          "softcap": Shape(4, 2, 128, softcap=20.0),
          # one query head per KV head and a window past the kernel's 64-key tiles: a row's keys are split into
          # other groups in a call than alone (head_dim 96: the 64- and 32-wide value sums)
          "window": Shape(2, 2, 96, window=70)}
POSITIONS = 90
LENGTH = POSITIONS + 1


def _rope(dim: int) -> tuple[np.ndarray, np.ndarray]:
    freqs = np.arange(LENGTH)[:, None] / (10000.0 ** (np.arange(0, dim, 2) / dim))[None]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


class _Op:
    """The op alone in a session, over one KV buffer updated in place (as the exported layers bind it)."""

    def __init__(self, s: Shape, kv_dtype: type = np.float32, library: Path | None = None, tree: bool = False) -> None:
        self.s, self.kv_dtype, self.tree = s, kv_dtype, tree
        kv = [1, s.kv_heads, LENGTH, s.dim]
        names = ["q", "k", "v"] if not s.packed else ["q", "", ""]
        node = helper.make_node(custom_ops.ATTENTION_OP,
                                [*names, "past_key", "past_value", "seqlens_k", "total", "cos", "sin",
                                 *(["tree_parents"] if tree else [])],
                                ["out", "present_key", "present_value"], domain=custom_ops.DOMAIN, num_heads=s.heads,
                                kv_num_heads=s.kv_heads, scale=s.dim ** -0.5, local_window_size=s.window,
                                softcap=s.softcap)
        width = (s.heads + 2 * s.kv_heads) * s.dim if s.packed else s.heads * s.dim
        inputs = [helper.make_tensor_value_info("q", F, [1, "S", width])]
        if not s.packed:
            inputs += [helper.make_tensor_value_info(n, F, [1, "S", s.kv_heads * s.dim]) for n in "kv"]
        inputs += [helper.make_tensor_value_info(n, KV_TYPES[kv_dtype], kv) for n in ("past_key", "past_value")]
        inputs += [helper.make_tensor_value_info("seqlens_k", I32, [1]),
                   helper.make_tensor_value_info("total", I32, [])]
        if tree:
            inputs.append(helper.make_tensor_value_info("tree_parents", I32, ["T"]))
        outputs = [helper.make_tensor_value_info("out", F, [1, "S", s.heads * s.dim])]
        outputs += [helper.make_tensor_value_info(n, KV_TYPES[kv_dtype], kv) for n in ("present_key", "present_value")]
        cos, sin = _rope(s.dim)
        constants = [onnx.numpy_helper.from_array(cos, "cos"), onnx.numpy_helper.from_array(sin, "sin")]
        graph = helper.make_graph([node], "attention", inputs, outputs, constants)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                        helper.make_opsetid(custom_ops.DOMAIN, 1)])
        model.ir_version = 10
        so, _ = session_options(1, make_shared=False, kernels=library)
        self.session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.kv = [np.zeros(kv, kv_dtype) for _ in range(2)]

    def run(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, parents: list[int] | None = None
            ) -> np.ndarray:
        """Rows q/k/v from cell ``start`` on: a chain, or the tree ``parents`` (each row's parent row, -1: a root)."""
        total = start + len(q)
        io = self.session.io_binding()
        if self.s.packed:
            io.bind_cpu_input("q", np.ascontiguousarray(np.concatenate([q, k, v], axis=1)[None]))
        else:
            for name, x in (("q", q), ("k", k), ("v", v)):
                io.bind_cpu_input(name, np.ascontiguousarray(x[None]))
        io.bind_cpu_input("seqlens_k", np.array([total - 1], np.int32))
        io.bind_cpu_input("total", np.array(total, np.int32))
        if self.tree:
            io.bind_cpu_input("tree_parents", np.array(parents or [], np.int32))
        io.bind_output("out")
        for name, buffer in zip(("key", "value"), self.kv, strict=True):
            past, present = f"past_{name}", f"present_{name}"
            io.bind_input(past, "cpu", 0, self.kv_dtype, list(buffer.shape), buffer.ctypes.data)
            io.bind_output(present, "cpu", 0, self.kv_dtype, list(buffer.shape), buffer.ctypes.data)
        self.session.run_with_iobinding(io)
        return io.get_outputs()[0].numpy()[0]


def _stored(s: Shape, k: np.ndarray, v: np.ndarray, kv_dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """The KV buffer's contents after the kernel wrote positions 0 … n − 1 ([KV, n, D] each): the keys rotated in
    float32 as the kernel rotates them (the same products and sums, each rounded), then both rounded to the KV
    type by NumPy."""
    cos, sin = _rope(s.dim)
    n, half = len(k), s.dim // 2
    x, c, si = k.reshape(n, s.kv_heads, s.dim), cos[:n, None], sin[:n, None]
    rotated = np.concatenate([x[..., :half] * c - x[..., half:] * si, x[..., half:] * c + x[..., :half] * si], -1)
    return tuple(a.astype(kv_dtype).transpose(1, 0, 2) for a in (rotated, v.reshape(n, s.kv_heads, s.dim)))


def _reference(s: Shape, q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_dtype: type) -> np.ndarray:
    """Rotary embedding, causal (and windowed) softmax attention in float64 over the stored keys and values, every
    position."""
    cos, sin = (x.astype(np.float64) for x in _rope(s.dim))
    n, half = len(q), s.dim // 2
    x = q.reshape(n, s.heads, s.dim).astype(np.float64)
    c, si = cos[:n, None], sin[:n, None]
    qr = np.concatenate([x[..., :half] * c - x[..., half:] * si, x[..., half:] * c + x[..., :half] * si], -1)
    kr, vv = (a.astype(np.float64) for a in _stored(s, k, v, kv_dtype))
    out = np.zeros((n, s.heads, s.dim))
    for h in range(s.heads):
        kv = h // (s.heads // s.kv_heads)
        scores = qr[:, h] @ kr[kv].T * s.dim ** -0.5
        if s.softcap:
            scores = s.softcap * np.tanh(scores / s.softcap)
        p, j = np.arange(n)[:, None], np.arange(n)[None]
        seen = (j <= p) & ((j > p - s.window) if s.window > 0 else True)
        scores = np.where(seen, scores, -np.inf)
        weights = np.exp(scores - scores.max(1, keepdims=True))
        out[:, h] = (weights / weights.sum(1, keepdims=True)) @ vv[kv]
    return out.reshape(n, -1)


def _inputs(s: Shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    q = (2 * rng.standard_normal((POSITIONS, s.heads * s.dim))).astype(np.float32)
    k = (2 * rng.standard_normal((POSITIONS, s.kv_heads * s.dim))).astype(np.float32)
    v = rng.standard_normal((POSITIONS, s.kv_heads * s.dim)).astype(np.float32)
    return q, k, v


def _check_right(op: _Op, s: Shape, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Every position alone, in order: the KV buffer as NumPy would store it, the outputs as the reference's;
    returns the outputs."""
    alone = np.stack([op.run(q[p:p + 1], k[p:p + 1], v[p:p + 1], p)[0] for p in range(POSITIONS)])
    for buffer, expected in zip(op.kv, _stored(s, k, v, op.kv_dtype), strict=True):
        np.testing.assert_array_equal(buffer[0, :, :POSITIONS].view(np.uint8), expected.view(np.uint8))
    np.testing.assert_allclose(alone, _reference(s, q, k, v, op.kv_dtype), rtol=0, atol=2e-5 * np.abs(v).max())
    return alone


def test_the_kernel_is_built_here() -> None:
    assert custom_ops.library() is not None, "`make setup` builds it (edgespec build-kernel)"


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", list(SHAPES))
def test_rows_are_bit_identical_in_any_call_and_right(name: str, kv_dtype: type) -> None:
    s = SHAPES[name]
    q, k, v = _inputs(s)
    op = _Op(s, kv_dtype)
    alone = _check_right(op, s, q, k, v)
    for rows in (2, 3, 5, 9, 17, 64):
        for start in (0, 7, POSITIONS - rows):
            got = op.run(q[start:start + rows], k[start:start + rows], v[start:start + rows], start)
            bad = [start + r for r in range(rows) if not np.array_equal(got[r], alone[start + r])]
            assert not bad, f"{rows} rows from {start}: positions {bad} differ from the same rows alone"


# Two roots, a branch at the first, a best path that is not the first branch; depths up to 3.
TREE = [-1, 0, 0, 1, 3, 2, -1, 6]


def _path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", list(SHAPES))
def test_tree_rows_are_their_paths_chain_rows_bit_for_bit(name: str, kv_dtype: type) -> None:
    """A token tree after 75 cached positions (past a 64-key tile and the windows): each row's output and stored
    K/V are the bits a chain of its own path gives at the same positions (so one-token decoding's, by the test
    above); the rows of other branches are masked out exactly."""
    s = SHAPES[name]
    q, k, v = _inputs(s)
    start, n = 75, len(TREE)
    tree, chain = _Op(s, kv_dtype, tree=True), _Op(s, kv_dtype)
    for op in (tree, chain):
        op.run(q[:start], k[:start], v[:start], 0)
    got = tree.run(q[start:start + n], k[start:start + n], v[start:start + n], start, TREE)
    assert np.array_equal(tree.run(q[:1], k[:1], v[:1], start, []), chain.run(q[:1], k[:1], v[:1], start)), \
        "an empty tree_parents is a chain"
    tree.run(q[start:start + n], k[start:start + n], v[start:start + n], start, TREE)
    for node in range(n):
        path = [start + i for i in _path(TREE, node)]
        want = chain.run(q[path], k[path], v[path], start)[-1]
        assert np.array_equal(got[node], want), f"tree row {node} (path {path}) differs from its chain's last row"
        cell, position = start + node, start + len(path) - 1
        for stored, expected in zip(tree.kv, chain.kv, strict=True):
            assert np.array_equal(stored[0, :, cell].view(np.uint8), expected[0, :, position].view(np.uint8))


@pytest.mark.parametrize("parents", [[0, -1], [-1, 1], [-1, -2], [-1]])
def test_a_malformed_tree_is_a_clear_error(parents: list[int]) -> None:
    """A parent after its child, itself, below -1, or a count that is not the rows': refused with the reason."""
    s = SHAPES["smollm2"]
    q, k, v = (x[:2] for x in _inputs(s))
    with pytest.raises(Exception, match="ExactAttention: tree_parents"):
        _Op(s, tree=True).run(q, k, v, 0, parents)


# Values at half precision's edges, each rounded to nearest even as NumPy rounds them: the largest half and the
# ties on either side of it and of infinity, infinities and a NaN, ties between subnormals and at the smallest
# subnormal's half, float32 subnormals, a tie between two normals.
EDGES = np.array([65504, 65519.99, 65520, 1e9, np.inf, -np.inf, np.nan, 2 ** -24, 2 ** -25, 3 * 2 ** -25,
                  1.5 * 2 ** -25, 2 ** -26, 5 * 2 ** -25, 6.1e-5, 2 ** -14 - 2 ** -25, 1e-40, -1e-45, 1 + 2 ** -11,
                  1 + 3 * 2 ** -11, -0.0, -(2 ** -24) * 1.5], np.float32)


@pytest.mark.parametrize("march", [None, "x86-64"])
def test_half_kv_is_rounded_as_numpy_rounds_in_every_build(tmp_path: Path, march: str | None) -> None:
    """This CPU's build (F16C where the CPU has it) and the portable one (no F16C: the kernel's own conversions):
    values at half's edges stored as NumPy's astype(float16), and attention over a half KV right."""
    if march and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the {march} build runs on x86 only")
    library = None
    if march:
        library = tmp_path / f"{march}.so"
        custom_ops.compile_library(library, [f"-march={march}"])
    s = SHAPES["smollm2"]
    edges = np.resize(EDGES, (1, s.kv_heads * s.dim))
    op = _Op(s, np.float16, library)
    op.run(np.zeros((1, s.heads * s.dim), np.float32), edges, edges, 0)
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(op.kv[1][0, :, 0].view(np.uint16), edges.astype(np.float16).reshape(
            s.kv_heads, s.dim).view(np.uint16))
    _check_right(_Op(s, np.float16, library), s, *_inputs(s))


def test_a_graph_off_the_contract_is_a_clear_error() -> None:
    """8 query heads over 3 KV heads: refused by the kernel with the reason, nothing read out of bounds."""
    s = Shape(8, 3, 64)
    q = np.zeros((1, s.heads * s.dim), np.float32)
    kv = np.zeros((1, s.kv_heads * s.dim), np.float32)
    with pytest.raises(Exception, match="ExactAttention: num_heads must be a multiple of kv_num_heads"):
        _Op(s).run(q, kv, kv, 0)


def test_an_export_needing_the_kernels_says_how_to_get_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gqa = "com.microsoft.GroupQueryAttention"
    attention = {"quant_options": {"attention": custom_ops.ATTENTION}}
    products = {"quant_options": {"attention": gqa, "weights": "edgespec.BlockInt8MatMul (MatMulNBits' 8-bit blocks)"}}
    for manifest in (attention, products):
        with pytest.raises(ModelLoadError, match="run on the CPU only"):
            custom_ops.require_for(manifest, tmp_path, "cuda")
    # an environment where they were never built and cannot be (no compiler)
    monkeypatch.setattr(custom_ops, "kernels_dir", lambda: tmp_path)
    monkeypatch.setattr(custom_ops, "_unbuildable", None)
    monkeypatch.setattr(custom_ops, "compile_library", _no_compiler)
    for manifest in (attention, products):
        with pytest.raises(ModelLoadError, match="make setup"):
            custom_ops.require_for(manifest, tmp_path, "cpu")
    custom_ops.require_for({"quant_options": {"attention": gqa, "weights": "MatMulNBits"}}, tmp_path, "cpu")


def _no_compiler(out: Path, cpu_flags: list[str] | None = None, say: object = None, sources: object = None) -> None:
    raise custom_ops.KernelBuildError("no C++ compiler found (set CXX)")


def test_a_missing_build_is_compiled_on_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A source changed since the last build (a `git pull` without `make setup`): the first export or load that
    wants the ops builds them, instead of falling back to the slower GroupQueryAttention/MatMulNBits exports."""
    headers = custom_ops.kernels_dir() / "include"
    monkeypatch.setattr(custom_ops, "kernels_dir", lambda: tmp_path)
    monkeypatch.setattr(custom_ops, "_unbuildable", None)
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(headers))  # the headers this environment fetched (no download)
    assert custom_ops.library() is None
    said: list[str] = []
    assert custom_ops.ensure(said.append) == custom_ops.library_path() == custom_ops.library()
    assert custom_ops.default_attention() == "exact" and said[0].startswith("building")
