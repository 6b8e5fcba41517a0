"""A batch-invariant attention without GroupQueryAttention's single-row padding: a probe for the ONNX backend.

    python benchmarks/attention_invariance.py [--keys 40,700,2000] [--threads 2] [--out DIR]

Why: the ONNX graphs pad every single-token call to two rows (docs/onnx-format.md), because onnxruntime's
GroupQueryAttention rounds one query row differently from the same row among others (its P·V product takes MLAS's
GEMV path when M = 1); at 2000 tokens of context that padding costs ~10 ms of a ~35 ms step (README, #14).

What this measures, on one layer's attention with SmolLM2's shapes (3 KV heads, 3 query heads each, head size 64),
built from plain MatMuls: the query heads of a KV head are stacked as the GEMM's rows, so M = 3 · rows is never 1;
causal masking adds −inf; the softmax sum is a MatMul against a ones matrix (8 columns: a one-column product
rounds differently), not ReduceSum. For every call of 2..17 rows it compares each row's output with the same row
computed alone at its own position (fewer keys, nothing masked): the largest difference, 0.0 = bit-identical. And
the time per call for 1, 2 and 5 rows. Not measured here: where the new rows' K/V come from without copying the
cache (the open part of the design: see the issue notes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

KV_HEADS, GROUP, HEAD_DIM, SUM_COLUMNS = 3, 3, 64, 8


def attention_session(threads: int) -> ort.InferenceSession:
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("FusedMatMul", ["q", "k"], ["scores"], domain="com.microsoft", transB=1,
                         alpha=HEAD_DIM ** -0.5),  # [KV, GROUP·rows, keys]
        helper.make_node("Add", ["scores", "mask"], ["masked"]),
        helper.make_node("ReduceMax", ["masked"], ["peak"], axes=[-1], keepdims=1),
        helper.make_node("Sub", ["masked", "peak"], ["shifted"]),
        helper.make_node("Exp", ["shifted"], ["weights"]),
        helper.make_node("MatMul", ["weights", "ones"], ["sums"]),
        helper.make_node("Slice", ["sums", "zero", "one", "last"], ["total"]),
        helper.make_node("MatMul", ["weights", "v"], ["weighted"]),
        helper.make_node("Div", ["weighted", "total"], ["out"]),
    ]
    inputs = [helper.make_tensor_value_info("q", f, [KV_HEADS, "m", HEAD_DIM]),
              helper.make_tensor_value_info("k", f, [KV_HEADS, "keys", HEAD_DIM]),
              helper.make_tensor_value_info("v", f, [KV_HEADS, "keys", HEAD_DIM]),
              helper.make_tensor_value_info("mask", f, ["m", "keys"]),
              helper.make_tensor_value_info("ones", f, ["keys", SUM_COLUMNS])]
    constants = [numpy_helper.from_array(np.array([value], np.int64), name)
                 for name, value in (("zero", 0), ("one", 1), ("last", -1))]
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("out", f, [KV_HEADS, "m", HEAD_DIM])], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def attend(session: ort.InferenceSession, q: np.ndarray, start: int, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rows at positions start.. (q: [KV, GROUP, rows, dim]) over keys 0..their own position: [KV, GROUP, rows, dim]."""
    rows = q.shape[2]
    keys = start + rows
    mask = np.zeros((GROUP, rows, keys), np.float32)
    for i in range(rows):
        mask[:, i, start + i + 1:] = -np.inf
    out = session.run(None, {"q": np.ascontiguousarray(q.reshape(KV_HEADS, GROUP * rows, HEAD_DIM)),
                             "k": k[:, :keys], "v": v[:, :keys], "mask": mask.reshape(GROUP * rows, keys),
                             "ones": np.ones((keys, SUM_COLUMNS), np.float32)})[0]
    return out.reshape(KV_HEADS, GROUP, rows, HEAD_DIM)


def measure(session: ort.InferenceSession, keys: int, repeats: int = 100) -> dict[str, object]:
    rng = np.random.default_rng(keys)
    k, v = (rng.standard_normal((KV_HEADS, keys + 17, HEAD_DIM)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((KV_HEADS, GROUP, 17, HEAD_DIM)).astype(np.float32)
    worst = 0.0
    for rows in (2, 3, 5, 9, 16, 17):
        together = attend(session, q[:, :, :rows], keys, k, v)
        for i in range(rows):
            alone = attend(session, q[:, :, i:i + 1], keys + i, k, v)
            worst = max(worst, float(np.abs(together[:, :, i] - alone[:, :, 0]).max()))
    micros = {}
    for rows in (1, 2, 5):
        for _ in range(10):
            attend(session, q[:, :, :rows], keys, k, v)
        start = time.perf_counter()
        for _ in range(repeats):
            attend(session, q[:, :, :rows], keys, k, v)
        micros[rows] = (time.perf_counter() - start) / repeats * 1e6
    return {"keys": keys, "max_difference": worst, "us_per_call": micros}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="40,700,2000", help="context lengths (comma-separated)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for attention_invariance.json")
    args = parser.parse_args()
    session = attention_session(args.threads)
    results = [measure(session, int(n)) for n in args.keys.split(",")]
    print(f"{'keys':>6} {'max |row in call − row alone|':>30} {'µs 1 row':>9} {'2 rows':>7} {'5 rows':>7}")
    for r in results:
        us = r["us_per_call"]
        print(f"{r['keys']:>6} {r['max_difference']:>30.1e} {us[1]:>9.0f} {us[2]:>7.0f} {us[5]:>7.0f}")
    out = args.out / "attention_invariance.json"
    out.write_text(json.dumps({"onnxruntime": ort.__version__, "threads": args.threads, "results": results}, indent=1))
    print(f"wrote {out} (times include building the mask in Python)")


if __name__ == "__main__":
    main()
