"""8-bit MatMulNBits (blocks of 32, accuracy level 4) → ``edgespec.BlockInt8MatMul``, where it is faster here.

The op (``edgespec/kernels/block_int8_matmul.cc``) computes MatMulNBits' arithmetic at those settings — int8
weights and per-block int8 activations, exact integer block sums, a float sum over blocks — with the weights packed
so that the rows of a verify batch share each weight load; a row has the same bits alone or in any batch, so it
needs no padding either. It differs from MatMulNBits only in the order of the float sum (≈1e-6 on SmolLM2's
products). Which one is faster depends on the CPU: onnxruntime's kernels use VNNI or AMX where the CPU has them,
the op AVX2 or VNNI (on an EPYC with AVX-512 VNNI, one layer's products at 1 / 4 rows: 69 / 101 µs against
MatMulNBits' 75 / 148 since the op's 16-column packing; within 3% of each other before). So the export times both
on one layer's products, on this machine, and rewrites the graphs only where the op wins (``choose``).
"""

from __future__ import annotations

import time

import numpy as np

from edgespec.backends.onnx.session import session_options
from edgespec.cpu import physical_cores
from edgespec.kernels import library as custom_ops

from .. import require

OP = custom_ops.PRODUCTS_OP
PRODUCTS = ("auto", "edgespec", "nbits")  # export_onnx's choices: time both here, the op, MatMulNBits
BLOCK, COLUMNS, DEPTH = 32, 16, 4  # the op's blocks along K, and its packing: 16 columns × 4 k per 64 bytes
TIMED_ROWS = (1, 4)  # a decoded token, and a verify batch
ROUNDS = 30


def _attributes(node: object) -> dict:
    return {a.name: a.i for a in node.attribute}  # type: ignore[attr-defined]


def _zero_point(node: object, initializers: dict) -> int | None:
    """The one 8-bit zero point of every block (128 when the input is absent), or None if they differ."""
    if len(node.input) < 4 or not node.input[3]:  # type: ignore[attr-defined]
        return 128
    points = initializers.get(node.input[3])  # type: ignore[attr-defined]
    if points is None or points.dtype != np.uint8 or not (points == points.flat[0]).all():
        return None
    return int(points.flat[0])


def eligible(node: object, initializers: dict) -> bool:
    """A MatMulNBits the op computes alike: 8 bits, blocks of 32, level 4, constant weights, one zero point that
    leaves every weight in int8's range, no bias or group index, N a multiple of 16."""
    if node.op_type != "MatMulNBits" or len(node.input) > 4:  # type: ignore[attr-defined]
        return False
    a = _attributes(node)
    if not (a.get("bits") == 8 and a.get("block_size") == BLOCK and a.get("accuracy_level") == 4
            and a["N"] % COLUMNS == 0 and a["K"] % BLOCK == 0
            and node.input[1] in initializers and node.input[2] in initializers):  # type: ignore[attr-defined]
        return False
    zero_point, codes = _zero_point(node, initializers), initializers[node.input[1]]  # type: ignore[attr-defined]
    return zero_point is not None and int(codes.min()) - zero_point >= -128 and int(codes.max()) - zero_point <= 127


def pack(codes: np.ndarray, scales: np.ndarray, zero_point: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' B (uint8 [N, K/32, 32]) and scales ([N·K/32]) → the op's B (int8 [N/16, K/4, 64]: columns
    n..n+15 × k..k+3 per 64 bytes, k fastest) and scales (float32 [K/32, N]). Nothing is rounded."""
    # code − zero point in uint8 arithmetic, read as int8: exact for every code ``eligible`` lets through (its
    # result lies in int8's range), with no wider copy of a vocabulary-sized matrix
    w = (codes.reshape(n, k) - np.uint8(zero_point)).view(np.int8)
    packed = w.reshape(n // COLUMNS, COLUMNS, k // DEPTH, DEPTH).transpose(0, 2, 1, 3)
    return (np.ascontiguousarray(packed.reshape(n // COLUMNS, k // DEPTH, COLUMNS * DEPTH)),
            np.ascontiguousarray(scales.reshape(n, k // BLOCK).T.astype(np.float32)))


def rewrite(model: object) -> int:
    """Replace every eligible MatMulNBits of ``model`` by the op, in place; the number replaced."""
    numpy_helper, helper = require("onnx.numpy_helper", "onnx"), require("onnx.helper", "onnx")
    graph = model.graph  # type: ignore[attr-defined]
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    replaced, unused = 0, set()
    for position, node in enumerate(list(graph.node)):
        if not eligible(node, initializers):
            continue
        a = _attributes(node)
        codes, scales = node.input[1], node.input[2]
        packed, block_scales = pack(initializers[codes], initializers[scales], _zero_point(node, initializers),
                                    a["N"], a["K"])
        name = node.name or node.output[0]
        graph.initializer.extend([numpy_helper.from_array(packed, f"{name}_int8"),
                                  numpy_helper.from_array(block_scales, f"{name}_block_scales")])
        unused.update(node.input[1:])
        graph.node.remove(node)
        graph.node.insert(position, helper.make_node(OP, [node.input[0], f"{name}_int8", f"{name}_block_scales"],
                                                     list(node.output), name=name, domain=custom_ops.DOMAIN))
        replaced += 1
    still_read = {i for n in graph.node for i in n.input}
    for t in [t for t in graph.initializer if t.name in unused - still_read]:
        graph.initializer.remove(t)
    if replaced and all(o.domain != custom_ops.DOMAIN for o in model.opset_import):  # type: ignore[attr-defined]
        model.opset_import.append(helper.make_opsetid(custom_ops.DOMAIN, 1))  # type: ignore[attr-defined]
    return replaced


def _products_only(model: object) -> object:
    """A model of ``model``'s eligible products alone, each fed from an input of its own."""
    numpy_helper, helper, onnx = (require("onnx.numpy_helper", "onnx"), require("onnx.helper", "onnx"),
                                  require("onnx"))
    graph = model.graph  # type: ignore[attr-defined]
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    nodes, inputs, outputs, reads = [], [], [], set()
    for i, node in enumerate(n for n in graph.node if eligible(n, initializers)):
        k = _attributes(node)["K"]
        copy = helper.make_node(node.op_type, [f"x{i}", *node.input[1:]], [f"y{i}"], domain=node.domain,
                                name=f"p{i}", **_attributes(node))
        nodes.append(copy)
        reads.update(node.input[1:])
        inputs.append(helper.make_tensor_value_info(f"x{i}", onnx.TensorProto.FLOAT, [1, None, k]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, None))
    kept = [t for t in graph.initializer if t.name in reads]
    return helper.make_model(helper.make_graph(nodes, "products", inputs, outputs, kept),
                             opset_imports=model.opset_import, ir_version=model.ir_version)  # type: ignore[attr-defined]


def choose(layer: object) -> dict:
    """Time ``layer``'s eligible products as MatMulNBits and as the op, alternating, at 1 and 4 rows, with the
    threads and options edgespec's sessions use here. Returns the medians in µs and ``"op"``: the op's name when
    its total is lower, else "MatMulNBits"."""
    ort = require("onnxruntime")
    nbits = _products_only(layer)
    if not nbits.graph.node:  # type: ignore[attr-defined]
        return {"op": "MatMulNBits", "why": "no 8-bit, block-32, level-4 products"}
    ours = type(nbits)()
    ours.CopyFrom(nbits)
    rewrite(ours)
    options, _ = session_options(physical_cores(), make_shared=False)  # the op registered; the process's pool
    sessions = {name: ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
                for name, m in (("MatMulNBits", nbits), (OP, ours))}
    rng = np.random.default_rng(0)
    feeds = {rows: {i.name: rng.standard_normal((1, rows, i.type.tensor_type.shape.dim[2].dim_value),
                                                dtype=np.float32)
                    for i in nbits.graph.input}  # type: ignore[attr-defined]
             for rows in TIMED_ROWS}
    times: dict[tuple[str, int], list[float]] = {(name, rows): [] for name in sessions for rows in TIMED_ROWS}
    for _ in range(ROUNDS):
        for rows, feed in feeds.items():
            for name, session in sessions.items():
                start = time.perf_counter()
                session.run(None, feed)
                times[name, rows].append(time.perf_counter() - start)
    medians = {f"{name} {rows} rows": round(float(np.median(t)) * 1e6, 1) for (name, rows), t in times.items()}
    total = {name: sum(float(np.median(times[name, rows])) for rows in TIMED_ROWS) for name in sessions}
    return {"op": OP if total[OP] < total["MatMulNBits"] else "MatMulNBits", "median_us": medians}
