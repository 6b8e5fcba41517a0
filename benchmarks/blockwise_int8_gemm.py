"""A blockwise-INT8 product built for verify batches against onnxruntime's MatMulNBits, side by side.

    python benchmarks/blockwise_int8_gemm.py [--rounds 3] [--threads 2] [--out DIR]

What a verify pass over k tokens costs on a CPU is mostly its matrix products (README, "ONNX export", row costs).
``blockwise_int8/outer_product_gemm.cc`` computes MatMulNBits' 8-bit, accuracy_level 4 arithmetic in an outer-product
form (weights packed 8 columns × 4 k, activations broadcast) so that up to 4 rows share each weight load; this
script compiles it (g++ -O3 -march=native -fopenmp) and times it against MatMulNBits on the shapes of the default
model (SmolLM2-135M: q|k|v 576×960, o 576×576, gate|up 576×3072, down 1536×576), random weights, with enough
copies of each product (≥ 64 MB) that the weights come from memory as in a model's pass, 1 … 9 rows, rounds
alternating between the two. The kernel checks that each row of a 9-row call equals the row computed alone.
Prints a table (medians over rounds, µs and × one row), writes blockwise_int8_gemm.json and .png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgespec.bench.plots import line_chart
from edgespec.tuning import cpu_identity

SOURCE = Path(__file__).with_name("blockwise_int8") / "outer_product_gemm.cc"
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))  # (K, N)
ROWS = (1, 2, 3, 4, 5, 7, 9)
FOOTPRINT = 64 << 20  # bytes of weights per timing: past the last-level cache


def copies(k: int, n: int) -> int:
    return -(-FOOTPRINT // (k * n))


def build(folder: Path) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        raise SystemExit("needs g++ (apt install g++)")
    binary = folder / "outer_product_gemm"
    subprocess.run([compiler, "-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-std=gnu++17",
                    str(SOURCE), "-o", str(binary)], check=True)
    return binary


def time_kernel(binary: Path, k: int, n: int, threads: int) -> tuple[dict[int, float], int]:
    """Median µs per product by row count, and rows of the 9-row call that differed from the row alone."""
    out = subprocess.run([str(binary), str(k), str(n), str(threads), str(copies(k, n)), *map(str, ROWS)],
                         check=True, capture_output=True, text=True).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    return {d["rows"]: d["median_us"] for d in lines}, max(d["rows_differing_from_alone"] for d in lines)


def matmulnbits_session(k: int, n: int, threads: int) -> ort.InferenceSession:
    """``copies`` independent MatMulNBits nodes (8 bits, blocks of 32, accuracy_level 4) reading one input."""
    rng = np.random.default_rng(0)
    nodes, weights, outputs = [], [], []
    for c in range(copies(k, n)):
        q = rng.integers(0, 256, size=(n, k // 32, 32), dtype=np.uint8)
        scales = (0.01 * (1 + 0.1 * rng.standard_normal(n * k // 32))).astype(np.float32)
        weights += [numpy_helper.from_array(q, f"w{c}"), numpy_helper.from_array(scales, f"s{c}")]
        nodes.append(helper.make_node("MatMulNBits", ["x", f"w{c}", f"s{c}"], [f"y{c}"], domain="com.microsoft",
                                      K=k, N=n, bits=8, block_size=32, accuracy_level=4))
        outputs.append(helper.make_tensor_value_info(f"y{c}", TensorProto.FLOAT, [None, n]))
    graph = helper.make_graph(nodes, "products", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                              outputs, weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def time_matmulnbits(session: ort.InferenceSession, k: int, n: int) -> dict[int, float]:
    rng = np.random.default_rng(1)
    result = {}
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        us = []
        for _ in range(max(20, 600 // copies(k, n))):
            start = time.perf_counter()
            session.run(None, {"x": x})
            us.append((time.perf_counter() - start) * 1e6 / copies(k, n))
        result[m] = float(np.median(us))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    runs: dict[str, dict[str, list[dict[int, float]]]] = {}
    differing = 0
    with tempfile.TemporaryDirectory() as folder:
        binary = build(Path(folder))
        for k, n in SHAPES:
            shape = f"{k}×{n}"
            session = matmulnbits_session(k, n, args.threads)
            runs[shape] = {"outer-product kernel": [], "MatMulNBits": []}
            for _ in range(args.rounds):
                timing, bad = time_kernel(binary, k, n, args.threads)
                runs[shape]["outer-product kernel"].append(timing)
                differing = max(differing, bad)
                runs[shape]["MatMulNBits"].append(time_matmulnbits(session, k, n))
            del session
    medians = {shape: {op: {m: float(np.median([r[m] for r in rounds])) for m in ROWS} for op, rounds in ops.items()}
               for shape, ops in runs.items()}

    print(f"{cpu_identity()[:60]}, {args.threads} threads, onnxruntime {ort.__version__}; weights from memory "
          f"({FOOTPRINT >> 20} MB per timing), medians of {args.rounds} rounds; rows of a 9-row call differing from "
          f"the row alone: {differing}")
    print(f"{'shape K×N':<11}{'op':<22}" + "".join(f"{'k=' + str(m):>14}" for m in ROWS))
    for shape, ops in medians.items():
        for op, us in ops.items():
            print(f"{shape:<11}{op:<22}" + "".join(f"{us[m]:>7.1f} {us[m] / us[1]:>4.2f}×" for m in ROWS))
    ops = ("outer-product kernel", "MatMulNBits")
    total = {op: {m: sum(medians[s][op][m] for s in medians) for m in ROWS} for op in ops}
    print("one layer's products (sum of the four shapes):")
    for op, us in total.items():
        print(f"{'':<11}{op:<22}" + "".join(f"{us[m]:>7.1f} {us[m] / us[1]:>4.2f}×" for m in ROWS))

    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "blockwise_int8_gemm.json"
    out.write_text(json.dumps({"cpu": cpu_identity(), "threads": args.threads, "onnxruntime": ort.__version__,
                               "footprint_bytes": FOOTPRINT, "rows_differing_from_alone": differing,
                               "median_us": medians, "layer_us": total, "rounds": runs}, indent=1))
    lines = [(f"{op}, one layer's products", [total[op][m] / total[op][1] for m in ROWS], color, "-")
             for op, color in (("outer-product kernel", "tab:blue"), ("MatMulNBits", "tab:gray"))]
    line_chart(args.out / "blockwise_int8_gemm.png", list(ROWS), lines, "rows in the call",
               "cost relative to one row", "Blockwise INT8 products, weights from memory")
    print(f"wrote {out} and blockwise_int8_gemm.png")


if __name__ == "__main__":
    main()
