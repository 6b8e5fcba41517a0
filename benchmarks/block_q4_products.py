"""Current: a tool the manual uses.
edgespec.BlockQ4MatMul (Q4_0, Q4_1, Q5_0, Q5_1) and edgespec.BlockKQuantMatMul (Q2_K … Q6_K) against
MatMulNBits (4-bit, block 32, accuracy level 4) on the same GGUF blocks: time per product at 1–16 rows, and what
each extra row costs.

    PYTHONPATH=. python benchmarks/block_q4_products.py [--kind Q4_0,Q4_K,Q6_K] [--shapes 2048x3072,...]
                        [--rows 1,2,4,8,16] [--threads 2] [--copies 4] [--rounds 15] [--out DIR]

Per shape (K × N; default Llama-3.2-1B's products as the export packs them: q|k|v 2048×3072, o 2048×2048,
gate|up 2048×16384, down 8192×2048), random blocks of each ``--kind`` (any of KINDS, comma-separated;
MatMulNBits is timed for Q4_0, which it carries as codes with zero point 8) in ``--copies`` copies, one graph per op
and kind that runs every copy in turn, so each product reads its weights from memory as a decode pass does. The ops,
kinds and row counts take turns within each round, on onnxruntime's shared pool with ``--threads`` threads; the best
of the rounds, divided by the copies, is the time per product (on a shared machine the median carries other jobs'
time slices: the JSON has it too); inputs and outputs are bound to buffers made once. Also checks that each op's
first row has the same bits in every call. Prints a table (µs, and each op's time at k rows over its own time at one
row) and writes block_q4_products.json under ``--out`` (default benchmarks/results, git-ignored).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from edgespec.export.onnx import block_kquant, block_q4, block_weights
from onnx import helper, numpy_helper

from edgespec.backends.onnx.session import session_options
from edgespec.identity import cpu_identity
from edgespec.kernels import library as custom_ops

LLAMA_1B = "2048x3072,2048x2048,2048x16384,8192x2048"
NBITS = "MatMulNBits"
KINDS = ("Q4_0", "Q4_1", *block_kquant.KINDS)
Weight = block_weights.BlockWeight | block_kquant.KQuantWeight


def random_weight(kind: str, n: int, k: int, rng: np.random.Generator) -> Weight:
    """GGUF blocks of ``kind`` with random codes and fp16 scales (and minima) of a trained model's size."""
    if kind in block_kquant.KINDS:  # random codes and sub-block numbers, fp16 d (and dmin or m) set
        blocks = n * k // block_kquant.SPAN[kind]
        raw = rng.integers(0, 256, (blocks, block_kquant.BYTES[kind]), dtype=np.uint8)
        for at in block_kquant.HALVES[kind]:
            raw[:, at:at + 2] = rng.uniform(0.0001, 0.0005, (blocks, 1)).astype(np.float16).view(np.uint8)
        return block_kquant.from_ggml(kind, raw.reshape(n, -1), n, k)
    blocks = n * k // 32
    head = [rng.uniform(0.001, 0.01, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2)]
    if kind == "Q4_1":
        head.append(rng.uniform(-0.08, 0.0, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2))
    codes = rng.integers(0, 256, (blocks, 16), dtype=np.uint8)
    return block_weights.from_ggml(kind, np.concatenate([*head, codes], axis=1).reshape(n, -1), n, k)


def products_model(weights: list[Weight], op: str) -> onnx.ModelProto:
    """One graph: x [1, M, K] through each weight in turn (``op``: MatMulNBits, else the weights' edgespec op),
    y_i out."""
    n, k = weights[0].shape
    nodes, tensors = [], []
    for i, w in enumerate(weights):
        if op == NBITS:
            assert isinstance(w, block_weights.BlockWeight)
            tensors += [numpy_helper.from_array(w.codes, f"b{i}"), numpy_helper.from_array(w.scales.ravel(), f"s{i}"),
                        numpy_helper.from_array(w.packed_zero_points(), f"z{i}")]
            nodes.append(helper.make_node(NBITS, ["x", f"b{i}", f"s{i}", f"z{i}"], [f"y{i}"], domain="com.microsoft",
                                          K=k, N=n, bits=4, block_size=32, accuracy_level=4))
        else:
            kquant = isinstance(w, block_kquant.KQuantWeight)
            codes, scales = block_kquant.pack(w) if kquant else block_q4.pack(w)  # type: ignore[arg-type]
            tensors += [numpy_helper.from_array(codes, f"b{i}"), numpy_helper.from_array(scales, f"s{i}")]
            nodes.append(helper.make_node(block_kquant.OPS[w.kind] if kquant else block_q4.OP, ["x", f"b{i}", f"s{i}"],
                                          [f"y{i}"], domain=custom_ops.DOMAIN))
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
    parser.add_argument("--kind", default="Q4_0", help=f"GGUF types, comma-separated: {', '.join(KINDS)}")
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
    kinds = args.kind.split(",")
    if not set(kinds) <= set(KINDS):
        raise SystemExit(f"--kind: choose from {', '.join(KINDS)}")
    # "Q4_K": the edgespec op on Q4_K blocks; "MatMulNBits": MatMulNBits on the Q4_0 ones
    ops = [*kinds, *([NBITS] if "Q4_0" in kinds else [])]
    options, threads = session_options(args.threads)
    rng = np.random.default_rng(0)
    results: dict[str, dict] = {}
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.lower().split("x"))
        weights = {kind: [random_weight(kind, n, k, rng) for _ in range(args.copies)] for kind in kinds}
        sessions = {op: ort.InferenceSession(products_model(weights["Q4_0" if op == NBITS else op], op)
                                             .SerializeToString(), options, providers=["CPUExecutionProvider"])
                    for op in ops}
        del weights
        feeds = {m: {"x": rng.standard_normal((1, m, k), dtype=np.float32)} for m in rows}
        bound = {(op, m): bind(sessions[op], feeds[m]["x"], n, args.copies) for op in ops for m in rows}
        same = True
        for kind in kinds:
            first = {m: sessions[kind].run(None, {"x": feeds[m]["x"][:, :1]})[0] for m in rows}
            same &= all(np.array_equal(sessions[kind].run(None, feeds[m])[0][:, :1], first[m]) for m in rows)
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

    print(f"µs per product (best of {args.rounds} rounds × {args.copies} copies from memory; Q4_0 / Q4_1 / Q5_0 / "
          f"Q5_1: {block_q4.OP}, Q4_K / Q5_K / Q6_K: {custom_ops.KQUANT_PRODUCTS_OP}), {threads} threads, "
          f"{cpu_identity()[:60]}")
    nbits = NBITS in ops
    print(f"{'K×N':<12}{'rows':>5}" + "".join(f"{op:>12}{'×1 row':>8}" for op in ops)
          + (f"{'nbits/Q4_0':>11}" if nbits else ""))
    for shape, r in [*results.items(), ("layer", layer)]:
        for m in rows:
            line = f"{shape:<12}{m:>5}" + "".join(f"{r[op][m]:>12.1f}{r[op][m] / r[op][rows[0]]:>8.2f}" for op in ops)
            print(line + (f"{r[NBITS][m] / r['Q4_0'][m]:>11.2f}" if nbits else ""))
    print("the op's rows bit-identical alone and in every call: "
          + ("yes" if all(r["same_bits"] for r in results.values()) else "NO"))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "block_q4_products.json"
    out.write_text(json.dumps({"cpu": cpu_identity(), "kinds": kinds, "threads": threads, "copies": args.copies,
                               "rounds": args.rounds, "us_per_product": results, "layer_us": layer}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
