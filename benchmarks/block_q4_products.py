"""Current: a tool the manual uses.
edgespec.BlockQ4MatMul against MatMulNBits (4-bit, block 32, accuracy level 4) on the same GGUF blocks: time per
product at 1–16 rows, and what each extra row costs.

    PYTHONPATH=. python benchmarks/block_q4_products.py [--kind Q4_0] [--shapes 2048x3072,...] [--rows 1,2,4,8,16]
                                                      [--threads 2] [--copies 4] [--rounds 15] [--out DIR]

Per shape (K × N; default Llama-3.2-1B's products as the export packs them: q|k|v 2048×3072, o 2048×2048,
gate|up 2048×16384, down 8192×2048), random blocks of ``--kind`` (Q4_0 or Q4_1; MatMulNBits is timed for Q4_0,
which it carries as codes with zero point 8) in ``--copies`` copies, one graph per op that runs every copy in turn, so
each product reads its weights from memory as a decode pass does. The ops and row counts take turns within each
round, on onnxruntime's shared pool with ``--threads`` threads; the best of the rounds, divided by the copies, is the
time per product (on a shared machine the median carries other jobs' time slices: the JSON has it too); inputs and
outputs are bound to buffers made once. Also checks
that the op's first row has the same bits in every call. Prints a table (µs, and each op's time at k rows over its
own time at one row) and writes block_q4_products.json under ``--out`` (default benchmarks/results, git-ignored).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from edgespec.export.onnx import block_q4, block_weights
from onnx import helper, numpy_helper

from edgespec.backends.onnx.session import session_options
from edgespec.identity import cpu_identity
from edgespec.kernels import library as custom_ops

LLAMA_1B = "2048x3072,2048x2048,2048x16384,8192x2048"
NBITS = "MatMulNBits"


def random_weight(kind: str, n: int, k: int, rng: np.random.Generator) -> block_weights.BlockWeight:
    """GGUF blocks of ``kind`` with random codes and fp16 scales (and minima) of a trained model's size."""
    blocks = n * k // 32
    head = [rng.uniform(0.001, 0.01, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2)]
    if kind == "Q4_1":
        head.append(rng.uniform(-0.08, 0.0, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2))
    codes = rng.integers(0, 256, (blocks, 16), dtype=np.uint8)
    return block_weights.from_ggml(kind, np.concatenate([*head, codes], axis=1).reshape(n, -1), n, k)


def products_model(weights: list[block_weights.BlockWeight], op: str) -> onnx.ModelProto:
    """One graph: x [1, M, K] through each weight in turn (``op``: the edgespec op or MatMulNBits), y_i out."""
    n, k = weights[0].shape
    nodes, tensors = [], []
    for i, w in enumerate(weights):
        if op == NBITS:
            tensors += [numpy_helper.from_array(w.codes, f"b{i}"), numpy_helper.from_array(w.scales.ravel(), f"s{i}"),
                        numpy_helper.from_array(w.packed_zero_points(), f"z{i}")]
            nodes.append(helper.make_node(NBITS, ["x", f"b{i}", f"s{i}", f"z{i}"], [f"y{i}"], domain="com.microsoft",
                                          K=k, N=n, bits=4, block_size=32, accuracy_level=4))
        else:
            codes, scales = block_q4.pack(w)
            tensors += [numpy_helper.from_array(codes, f"b{i}"), numpy_helper.from_array(scales, f"s{i}")]
            nodes.append(helper.make_node(op, ["x", f"b{i}", f"s{i}"], [f"y{i}"], domain=custom_ops.DOMAIN))
    graph = helper.make_graph(nodes, "products", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                                [1, None, k])],
                              [helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, None)
                               for i in range(len(weights))], tensors)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
              helper.make_opsetid(custom_ops.DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def bind(session: ort.InferenceSession, x: np.ndarray, n: int, copies: int) -> ort.IOBinding:
    """x and the outputs bound to buffers allocated once: a run then times the products, not the allocation of
    fresh outputs and their copies into NumPy (at 16 rows of gate|up 4 MB a run, more than the products' time)."""
    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    for i in range(copies):
        out = ort.OrtValue.ortvalue_from_shape_and_type([1, x.shape[1], n], np.float32)
        binding.bind_ortvalue_output(f"y{i}", out)
    return binding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("Q4_0", "Q4_1"), default="Q4_0")
    parser.add_argument("--shapes", default=LLAMA_1B, help="K×N, comma-separated")
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--copies", type=int, default=4, help="copies of each weight taken in turn (past the caches)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    if custom_ops.ensure() is None:
        raise SystemExit(f"edgespec's kernels cannot be built here: {custom_ops.build_failure()}")
    rows = [int(r) for r in args.rows.split(",")]
    ops = [block_q4.OP, *([NBITS] if args.kind == "Q4_0" else [])]
    options, threads = session_options(args.threads)
    rng = np.random.default_rng(0)
    results: dict[str, dict] = {}
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.lower().split("x"))
        weights = [random_weight(args.kind, n, k, rng) for _ in range(args.copies)]
        sessions = {op: ort.InferenceSession(products_model(weights, op).SerializeToString(), options,
                                             providers=["CPUExecutionProvider"]) for op in ops}
        del weights
        feeds = {m: {"x": rng.standard_normal((1, m, k), dtype=np.float32)} for m in rows}
        bound = {(op, m): bind(sessions[op], feeds[m]["x"], n, args.copies) for op in ops for m in rows}
        first = {m: sessions[block_q4.OP].run(None, {"x": feeds[m]["x"][:, :1]})[0] for m in rows}
        same = all(np.array_equal(sessions[block_q4.OP].run(None, feeds[m])[0][:, :1], first[m]) for m in rows)
        times: dict[tuple[str, int], list[float]] = {(op, m): [] for op in ops for m in rows}
        for _ in range(args.rounds):
            for m in rows:
                for op in ops:
                    start = time.perf_counter()
                    sessions[op].run_with_iobinding(bound[op, m])
                    times[op, m].append((time.perf_counter() - start) / args.copies)
        results[f"{k}x{n}"] = {"same_bits": same,
                               **{op: {m: round(min(times[op, m]) * 1e6, 1) for m in rows} for op in ops},
                               "median": {op: {m: round(float(np.median(times[op, m])) * 1e6, 1) for m in rows}
                                          for op in ops}}
    layer = {op: {m: sum(r[op][m] for r in results.values()) for m in rows} for op in ops}

    print(f"{args.kind}, µs per product (best of {args.rounds} rounds × {args.copies} copies from memory), "
          f"{threads} threads, {cpu_identity()[:60]}")
    print(f"{'K×N':<12}{'rows':>5}" + "".join(f"{op:>16}{'×1 row':>8}" for op in ops)
          + ("" if len(ops) == 1 else f"{'nbits/op':>10}"))
    for shape, r in [*results.items(), ("layer", layer)]:
        for m in rows:
            line = f"{shape:<12}{m:>5}" + "".join(f"{r[op][m]:>16.1f}{r[op][m] / r[op][rows[0]]:>8.2f}" for op in ops)
            print(line + ("" if len(ops) == 1 else f"{r[NBITS][m] / r[block_q4.OP][m]:>10.2f}"))
    print("the op's rows bit-identical alone and in every call: "
          + ("yes" if all(r["same_bits"] for r in results.values()) else "NO"))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "block_q4_products.json"
    out.write_text(json.dumps({"cpu": cpu_identity(), "kind": args.kind, "threads": threads, "copies": args.copies,
                               "rounds": args.rounds, "us_per_product": results, "layer_us": layer}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
