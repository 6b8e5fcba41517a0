"""``edgespec row-cost``: what each onnxruntime kernel of an ONNX export charges for one more row.

A verify pass over k tokens is one call over k rows, and how much dearer it is than one row (the verify-cost
curve the γ controller plans with) is set by the kernels. This times, at the shapes and weights of one layer
of an export: the layer graph as exported (single-row padding included), each of its weight products alone
(MatMulNBits; MatMul in fp32 exports), the same products as MatMulInteger (uint8 activations × int8 weights:
integer accumulation is exact for any number of rows, so it would need no padding, and MLAS has AMX kernels
for it), and its attention op alone (GroupQueryAttention, or edgespec's ExactAttention) at a given context.
Prints a table, writes JSON and a PNG.

Measured here (Xeon with AMX, 2 threads, SmolLM2 INT8; docs/kernels.md) MatMulNBits' cost grows about
linearly with the rows (4–8× one row's for 17: its int8 kernel is compute-bound per row), while
MatMulInteger's hardly moves: that is where ONNX Runtime's verify curve comes from, and what a format with
integer GEMMs would change.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import numpy as np

from ..backends.onnx.manifest import kv_dtype_of, read_manifest
from ..errors import InvalidParameterError

DEFAULT_ROWS = (1, 2, 3, 4, 5, 8, 12, 17)
ATTENTION_OPS = ("GroupQueryAttention", "ExactAttention")


def _median_us(run: Callable[[], None], repeats: int) -> float:
    for _ in range(max(3, repeats // 10)):  # warm-up: first calls allocate and pack
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def _session(model: object, threads: int) -> object:
    """A session on the runtime's own options (the process-wide pool, whose threads keep spinning between calls
    as while a forward pass chains its sessions: with pools that sleep between calls, every multi-threaded kernel
    would pay a wake-up (~20 µs here) that a single-threaded one does not, and small kernels would look dearer at
    2 rows). Once that pool exists no session of the process may have threads of its own."""
    import onnxruntime as ort

    from ..backends.onnx.session import session_options

    so, _ = session_options(threads)
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")  # type: ignore[attr-defined]
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]


def _one_op_model(model: object, node: object, inputs: Sequence[tuple[str, int, list]],
                  output_types: dict[str, int] | None = None) -> object:
    """A model running just ``node`` of ``model``, with the initializers it reads and ``inputs`` as
    (name, onnx element type, shape) for everything else it reads; its outputs float32 but for ``output_types``."""
    from onnx import TensorProto, helper

    names = set(node.input)  # type: ignore[attr-defined]
    initializers = [t for t in model.graph.initializer if t.name in names]  # type: ignore[attr-defined]
    types = output_types or {}
    outputs = [helper.make_tensor_value_info(o, types.get(o, TensorProto.FLOAT), None) for o in node.output if o]  # type: ignore[attr-defined]
    value_infos = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    return helper.make_model(helper.make_graph([node], "one_op", value_infos, outputs, initializers),
                             opset_imports=model.opset_import, ir_version=model.ir_version)  # type: ignore[attr-defined]


def _weight_products(graph: object) -> list[tuple[object, int, int]]:
    """(node, K, N) of every product of activations with a weight: MatMulNBits or edgespec.BlockInt8MatMul
    (quantized exports) or MatMul with a constant right-hand side (fp32)."""
    weights = {t.name: list(t.dims) for t in graph.initializer}  # type: ignore[attr-defined]
    found = []
    for node in graph.node:  # type: ignore[attr-defined]
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            found.append((node, int(attrs["K"]), int(attrs["N"])))
        elif node.op_type == "BlockInt8MatMul":  # B packed [N/C, K/4, 4·C]: C columns × 4 k per row of B
            groups, k_quads, step = weights[node.input[1]]
            found.append((node, int(k_quads) * 4, int(groups) * int(step) // 4))
        elif node.op_type == "MatMul" and len(weights.get(node.input[1], [])) == 2:
            k_in, n_out = weights[node.input[1]]
            found.append((node, int(k_in), int(n_out)))
    return found


class _KV:
    """One layer's KV buffers, bound as both past and present (in place, as the runtime binds them)."""

    def __init__(self, kv_heads: int, length: int, head_dim: int, dtype: np.dtype) -> None:
        self.shape = [1, kv_heads, length, head_dim]
        self.key = np.zeros(self.shape, dtype)
        self.value = np.zeros(self.shape, dtype)
        self.pos = np.zeros(1, np.int32)
        self.total = np.zeros((), np.int32)

    def bind(self, io: object, past: tuple[str, str], present: tuple[str, str], seqlens: str, total: str) -> None:
        for p, q, a in ((past[0], present[0], self.key), (past[1], present[1], self.value)):
            io.bind_input(p, "cpu", 0, a.dtype.type, self.shape, a.ctypes.data)  # type: ignore[attr-defined]
            io.bind_output(q, "cpu", 0, a.dtype.type, self.shape, a.ctypes.data)  # type: ignore[attr-defined]
        io.bind_input(seqlens, "cpu", 0, np.int32, [1], self.pos.ctypes.data)  # type: ignore[attr-defined]
        io.bind_input(total, "cpu", 0, np.int32, [], self.total.ctypes.data)  # type: ignore[attr-defined]

    def at(self, context: int, rows: int) -> None:
        """A call of ``rows`` rows after ``context`` committed positions."""
        self.pos[0] = context + rows - 1
        self.total[()] = context + rows


def measure(folder: Path, rows: Sequence[int] = DEFAULT_ROWS, context: int = 200, threads: int = 2,
            repeats: int = 100, layer: int = 0) -> dict:
    """Median µs per call for each kernel of ``layer`` at each row count (see the module docstring)."""
    import onnx
    import onnxruntime as ort

    m = read_manifest(folder)
    layer_file = folder / m["layers"][layer]
    graph_model = onnx.load(str(layer_file))
    graph = graph_model.graph
    kv_length, heads, kv_heads, head_dim = (m.get("kv_length", m["context_length"] + 1), m["num_attention_heads"],
                                            m["num_kv_heads"], m["head_dim"])
    if context + max(rows) + 1 > kv_length:
        raise InvalidParameterError(f"context {context} + {max(rows)} rows does not fit the export's {kv_length} "
                                    "KV positions")
    hidden = m["hidden_size"]
    rng = np.random.default_rng(0)
    kv = _KV(kv_heads, kv_length, head_dim, kv_dtype_of(m))
    results: dict[str, dict[int, float]] = {}

    # The layer as exported.
    layer_session = _session(graph_model, threads)
    io = layer_session.io_binding()  # type: ignore[attr-defined]
    kv.bind(io, ("past_key", "past_value"), ("present_key", "present_value"), "seqlens_k", "total_sequence_length")
    results["layer graph"] = {}
    for k in rows:
        x, y = rng.standard_normal((1, k, hidden)).astype(np.float32), np.zeros((1, k, hidden), np.float32)
        io.bind_input("hidden", "cpu", 0, np.float32, [1, k, hidden], x.ctypes.data)
        io.bind_output("hidden_out", "cpu", 0, np.float32, [1, k, hidden], y.ctypes.data)
        kv.at(context, k)
        results["layer graph"][k] = _median_us(partial(layer_session.run_with_iobinding, io), repeats)  # type: ignore[attr-defined]

    # Each weight product with its own weights, and the same product as MatMulInteger.
    elem = onnx.TensorProto
    for node, k_in, n_out in _weight_products(graph):
        label = f"{node.op_type} {k_in}×{n_out}"
        own = _session(_one_op_model(graph_model, node, [(node.input[0], elem.FLOAT, ["rows", k_in])]), threads)
        integer = _session(onnx.helper.make_model(onnx.helper.make_graph(
            [onnx.helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "matmul_integer",
            [onnx.helper.make_tensor_value_info("a", elem.UINT8, ["rows", k_in])],
            [onnx.helper.make_tensor_value_info("y", elem.INT32, ["rows", n_out])],
            [onnx.numpy_helper.from_array(rng.integers(-127, 128, (k_in, n_out), dtype=np.int8), "w")]),
            opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=8), threads)
        results[label], results[f"MatMulInteger {k_in}×{n_out}"] = {}, {}
        for k in rows:
            a = rng.standard_normal((k, k_in)).astype(np.float32)
            a8 = rng.integers(0, 256, (k, k_in), dtype=np.uint8)
            results[label][k] = _median_us(partial(own.run, None, {node.input[0]: a}), repeats)  # type: ignore[attr-defined]
            results[f"MatMulInteger {k_in}×{n_out}"][k] = _median_us(partial(integer.run, None, {"a": a8}), repeats)  # type: ignore[attr-defined]

    # The attention op alone (GroupQueryAttention or edgespec's ExactAttention; packed q/k/v, shared KV
    # buffers), without any padding the layer adds around it.
    op = next(n for n in graph.node if n.op_type in ATTENTION_OPS)
    packed = (heads + 2 * kv_heads) * head_dim
    kv_elem = onnx.helper.np_dtype_to_tensor_dtype(kv_dtype_of(m))
    inputs = [(op.input[0], elem.FLOAT, [1, "rows", packed]), (op.input[3], kv_elem, kv.shape),
              (op.input[4], kv_elem, kv.shape), (op.input[5], elem.INT32, [1]), (op.input[6], elem.INT32, [])]
    attention = _session(_one_op_model(graph_model, op, inputs, {op.output[1]: kv_elem, op.output[2]: kv_elem}),
                         threads)
    io = attention.io_binding()  # type: ignore[attr-defined]
    kv.bind(io, (op.input[3], op.input[4]), (op.output[1], op.output[2]), op.input[5], op.input[6])
    results[op.op_type] = {}
    for k in rows:
        q, out = rng.standard_normal((1, k, packed)).astype(np.float32), np.zeros((1, k, heads * head_dim), np.float32)
        io.bind_input(op.input[0], "cpu", 0, np.float32, [1, k, packed], q.ctypes.data)
        io.bind_output(op.output[0], "cpu", 0, np.float32, [1, k, heads * head_dim], out.ctypes.data)
        kv.at(context, k)
        results[op.op_type][k] = _median_us(partial(attention.run_with_iobinding, io), repeats)  # type: ignore[attr-defined]

    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "model": str(folder),
            "layer": layer_file.name, "quant_options": m.get("quant_options"), "context": context,
            "threads": threads, "repeats": repeats, "rows": list(rows),
            "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                        "onnxruntime": ort.__version__},
            "us": {name: {str(k): round(v, 1) for k, v in per.items()} for name, per in results.items()}}


def table(result: dict) -> str:
    rows = result["rows"]
    lines = [f"µs per call (median of {result['repeats']}), {result['layer']} of {result['model']}, context "
             f"{result['context']}, {result['threads']} threads, onnxruntime {result['machine']['onnxruntime']}; "
             "in brackets: the cost relative to one row",
             f"{'kernel':<28}" + "".join(f"{k:>16}" for k in rows)]
    for name, per in result["us"].items():
        one = per[str(rows[0])]
        lines.append(f"{name:<28}" + "".join(f"{per[str(k)]:>8.0f} ({per[str(k)] / one:4.2f})" for k in rows))
    return "\n".join(lines)


def plot(result: dict, path: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    rows = result["rows"]
    for name, per in result["us"].items():
        ax.plot(rows, [per[str(k)] / per[str(rows[0])] for k in rows], marker="o", label=name)
    ax.plot(rows, [k / rows[0] for k in rows], color="grey", linestyle=":", label="k rows = k calls")
    ax.set_xlabel("rows in the call (verify batch size)")
    ax.set_ylabel(f"cost relative to {rows[0]} row")
    ax.set_title(f"{result['layer']}, context {result['context']}, {result['threads']} threads")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def run(folder: str, rows: Sequence[int], context: int, threads: int, repeats: int, out: str,
        plots: bool) -> int:
    result = measure(Path(folder).expanduser(), rows, context, threads, repeats)
    print(table(result))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"row_cost-{datetime.now().strftime('%Y%m%dT%H%M%S')}"
    result["plot"] = plot(result, stem.with_suffix(".png")) if plots else None
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(f"wrote {stem.with_suffix('.json')}" + (f", {result['plot']}" if result["plot"] else ""))
    return 0
