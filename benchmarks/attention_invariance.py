"""Historical: a one-off probe, kept to reproduce a past finding.
Kept for: the design study behind edgespec.ExactAttention (edgespec/kernels/exact_attention.cc), the
attention op the exports use.
Batch-invariant attention without GroupQueryAttention's single-row padding: three designs beside it.

    python benchmarks/attention_invariance.py [--keys 40,700,2000] [--threads 2] [--out DIR]

Why: with GroupQueryAttention the ONNX graphs pad every single-token call to two rows (docs/onnx-format.md),
because it rounds one query row differently from the same row among others (its P·V product takes MLAS's GEMV
path when M = 1); at 2000 tokens of context that padding cost ~10 ms of a ~35 ms step (docs/kernels.md).

One layer's attention, SmolLM2's shapes (3 KV heads, 3 query heads each, head size 64). Two designs from plain
MatMuls, a KV head's query heads stacked as the GEMM's rows (M = 3 · rows is never 1), causal masking by −inf,
the softmax sum as a product against ones columns (a one-column product rounds differently):

- ``grouped``: the keys are inputs of the call's full length (the cache would be copied each call to make them).
- ``blocked``: the cache itself, in blocks of 64 positions — K transposed [blocks, kv, dim, 64] and V with 8 ones
  columns [blocks, kv, 64, dim + 8] — passed without a copy and written in place by the graph (ScatterND whose
  output is bound to its input's memory); scores over every block of the call at once, masked, P·V per block and
  summed over the blocks (each block's product reduces over 64 keys: one MLAS pass whatever the row count).

and the two ops the exports use, over a shared past/present buffer written in place:

- ``kernel``: edgespec.ExactAttention (edgespec/kernels/exact_attention.cc, built by ``make setup``): every row in
  an order fixed by its own position; the exports' op where it is built.
- ``gqa``: GroupQueryAttention (timing only; the graphs pad a lone token to its 2 rows).

For every call of 2..17 rows (verify batches) and of 64 (a prefill chunk) it compares each row's output with the
same row computed alone at its own position (fewer keys, nothing masked): the largest difference, 0.0 =
bit-identical. And onnxruntime's time per call (inputs bound beforehand) for 1, 2 and 5 rows. Prints a table,
writes attention_invariance.json and .png.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgespec.bench.plots import line_chart
from edgespec.kernels import library as custom_ops

KV_HEADS, GROUP, HEAD_DIM, SUM_COLUMNS, BLOCK = 3, 3, 64, 8, 64
HEADS = KV_HEADS * GROUP
F, I64 = TensorProto.FLOAT, TensorProto.INT64
# verify batches (2–17 rows) and a prefill chunk (64 rows); 17 and 64 rows cross a 64-position block at 700 keys
ROWS_CHECKED, ROWS_TIMED = (2, 3, 5, 9, 16, 17, 64), (1, 2, 5)


def _session(nodes: list, inputs: list, outputs: list, constants: dict[str, np.ndarray],
             threads: int) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "attention", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_cpu_mem_arena = False  # as edgespec's sessions
    custom_ops.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _value(name: str, elem: int, shape: list) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


def _run_time(session: ort.InferenceSession, io: ort.IOBinding, repeats: int = 200) -> float:
    """Median µs of one run with everything bound."""
    for _ in range(10):
        session.run_with_iobinding(io)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run_with_iobinding(io)
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e6)


@dataclass
class Call:
    """A call bound by pointer: ``io`` reads ``arrays`` and writes ``out``, which must outlive it."""

    io: ort.IOBinding
    out: np.ndarray
    arrays: list[np.ndarray]


def _bind(session: ort.InferenceSession, feeds: dict[str, np.ndarray], out_shape: tuple[int, ...]) -> Call:
    io = session.io_binding()
    arrays = [np.ascontiguousarray(a) for a in feeds.values()]
    for name, array in zip(feeds, arrays, strict=True):
        io.bind_input(name, "cpu", 0, array.dtype.type, list(array.shape), array.ctypes.data)
    out = np.empty(out_shape, np.float32)
    io.bind_output("out", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
    return Call(io, out, arrays)


class Grouped:
    """Keys and values of the call's full length as inputs; rows at positions start.. attend to 0..their own."""

    def __init__(self, threads: int) -> None:
        n = helper.make_node
        nodes = [n("FusedMatMul", ["q", "k"], ["scores"], domain="com.microsoft", transB=1, alpha=HEAD_DIM ** -0.5),
                 n("Add", ["scores", "mask"], ["masked"]),
                 n("ReduceMax", ["masked", "last"], ["peak"], keepdims=1),
                 n("Sub", ["masked", "peak"], ["shifted"]), n("Exp", ["shifted"], ["weights"]),
                 n("MatMul", ["weights", "ones"], ["sums"]),
                 n("Slice", ["sums", "zero", "one", "last"], ["total"]),
                 n("MatMul", ["weights", "v"], ["weighted"]), n("Div", ["weighted", "total"], ["out"])]
        inputs = [_value("q", F, [KV_HEADS, "m", HEAD_DIM]), _value("k", F, [KV_HEADS, "keys", HEAD_DIM]),
                  _value("v", F, [KV_HEADS, "keys", HEAD_DIM]), _value("mask", F, ["m", "keys"]),
                  _value("ones", F, ["keys", SUM_COLUMNS])]
        self.session = _session(nodes, inputs, [_value("out", F, [KV_HEADS, "m", HEAD_DIM])],
                                {"zero": _ints(0), "one": _ints(1), "last": _ints(-1)}, threads)

    def binding(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> Call:
        """q, k, v: [positions, ·] of the whole sequence so far; the call's rows are q[start:]."""
        rows, keys = len(q) - start, len(q)
        mask = np.zeros((GROUP, rows, keys), np.float32)
        for i in range(rows):
            mask[:, i, start + i + 1:] = -np.inf
        feeds = {"q": q[start:].reshape(rows, KV_HEADS, GROUP, HEAD_DIM).transpose(1, 2, 0, 3),
                 "k": k.reshape(keys, KV_HEADS, HEAD_DIM).transpose(1, 0, 2),
                 "v": v.reshape(keys, KV_HEADS, HEAD_DIM).transpose(1, 0, 2),
                 "mask": mask.reshape(GROUP * rows, keys), "ones": np.ones((keys, SUM_COLUMNS), np.float32)}
        feeds["q"] = feeds["q"].reshape(KV_HEADS, GROUP * rows, HEAD_DIM)
        return _bind(self.session, feeds, (KV_HEADS, GROUP * rows, HEAD_DIM))

    def rows(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
        call = self.binding(q, k, v, start)
        self.session.run_with_iobinding(call.io)
        return call.out.reshape(KV_HEADS, GROUP, -1, HEAD_DIM).transpose(2, 0, 1, 3).reshape(-1, HEADS * HEAD_DIM)


class Blocked:
    """The cache in blocks, read without a copy and written in place; rows attend over every block of the call."""

    def __init__(self, threads: int, max_positions: int) -> None:
        n = helper.make_node
        nodes = [
            n("Reshape", ["k", "by_head"], ["k3"]), n("Transpose", ["k3"], ["k_new"], perm=[1, 2, 0]),
            n("ScatterND", ["past_key", "key_index", "k_new"], ["present_key"]),
            n("Reshape", ["v", "by_head"], ["v3"]), n("Transpose", ["v3"], ["v_new"], perm=[1, 0, 2]),
            n("ScatterND", ["past_value", "value_index", "v_new"], ["present_value"]),
            n("Reshape", ["q", "by_group"], ["q4"]), n("Transpose", ["q4"], ["q_t"], perm=[1, 0, 2, 3]),
            n("Reshape", ["q_t", "stacked"], ["q_rows"]),  # [1, kv, rows · group, dim]
            n("FusedMatMul", ["q_rows", "present_key"], ["scores"], domain="com.microsoft", alpha=HEAD_DIM ** -0.5),
            n("Add", ["scores", "mask"], ["masked"]),  # [blocks, kv, rows · group, BLOCK]
            n("ReduceMax", ["masked", "blocks_and_keys"], ["peak"], keepdims=1),
            n("Sub", ["masked", "peak"], ["shifted"]), n("Exp", ["shifted"], ["weights"]),
            n("MatMul", ["weights", "present_value"], ["per_block"]),  # [blocks, kv, rows · group, dim + 8]
            n("ReduceSum", ["per_block", "blocks"], ["summed"], keepdims=1),
            n("Split", ["summed", "weighted_sum_rest"], ["weighted", "total", "rest"], axis=3),
            n("Div", ["weighted", "total"], ["out"])]
        inputs = [_value("q", F, ["S", HEADS * HEAD_DIM]), _value("k", F, ["S", KV_HEADS * HEAD_DIM]),
                  _value("v", F, ["S", KV_HEADS * HEAD_DIM]),
                  _value("past_key", F, ["nb", KV_HEADS, HEAD_DIM, BLOCK]),
                  _value("past_value", F, ["nb", KV_HEADS, BLOCK, HEAD_DIM + SUM_COLUMNS]),
                  _value("key_index", I64, [KV_HEADS, HEAD_DIM, "S", 4]),
                  _value("value_index", I64, [KV_HEADS, "S", HEAD_DIM, 4]), _value("mask", F, ["nb", 1, "m", BLOCK])]
        outputs = [_value("out", F, [1, KV_HEADS, "m", HEAD_DIM]),
                   _value("present_key", F, ["nb", KV_HEADS, HEAD_DIM, BLOCK]),
                   _value("present_value", F, ["nb", KV_HEADS, BLOCK, HEAD_DIM + SUM_COLUMNS])]
        constants = {"by_head": _ints(-1, KV_HEADS, HEAD_DIM), "by_group": _ints(-1, KV_HEADS, GROUP, HEAD_DIM),
                     "stacked": _ints(1, KV_HEADS, -1, HEAD_DIM), "blocks_and_keys": _ints(0, 3),
                     "blocks": _ints(0), "weighted_sum_rest": _ints(HEAD_DIM, 1, SUM_COLUMNS - 1)}
        self.session = _session(nodes, inputs, outputs, constants, threads)
        blocks = max_positions // BLOCK + 1
        self.key = np.zeros((blocks, KV_HEADS, HEAD_DIM, BLOCK), np.float32)
        self.value = np.zeros((blocks, KV_HEADS, BLOCK, HEAD_DIM + SUM_COLUMNS), np.float32)
        self.value[..., HEAD_DIM:] = 1.0

    def binding(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> Call:
        """q, k, v: the call's rows, at positions start..; writes their K/V into the cache."""
        rows = len(q)
        positions = np.arange(start, start + rows)
        block, slot = positions // BLOCK, positions % BLOCK
        n_blocks = int(block[-1]) + 1
        key_index = np.empty((KV_HEADS, HEAD_DIM, rows, 4), np.int64)
        key_index[..., 0], key_index[..., 3] = block, slot
        key_index[..., 1] = np.arange(KV_HEADS)[:, None, None]
        key_index[..., 2] = np.arange(HEAD_DIM)[None, :, None]
        value_index = np.empty((KV_HEADS, rows, HEAD_DIM, 4), np.int64)
        value_index[..., 0], value_index[..., 2] = block[:, None], slot[:, None]
        value_index[..., 1] = np.arange(KV_HEADS)[:, None, None]
        value_index[..., 3] = np.arange(HEAD_DIM)
        key_position = np.arange(n_blocks * BLOCK).reshape(n_blocks, 1, 1, BLOCK)
        row_position = np.repeat(positions, GROUP).reshape(1, 1, GROUP * rows, 1)
        mask = np.where(key_position > row_position, -np.inf, 0).astype(np.float32)
        call = _bind(self.session, {"q": q, "k": k, "v": v, "key_index": key_index, "value_index": value_index,
                                       "mask": mask}, (1, KV_HEADS, rows * GROUP, HEAD_DIM))
        for past, present, cache in (("past_key", "present_key", self.key[:n_blocks]),
                                     ("past_value", "present_value", self.value[:n_blocks])):
            call.io.bind_input(past, "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)
            call.io.bind_output(present, "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)  # in place
        return call

    def rows(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
        call = self.binding(q, k, v, start)
        self.session.run_with_iobinding(call.io)
        return call.out.reshape(KV_HEADS, -1, GROUP, HEAD_DIM).transpose(1, 0, 2, 3).reshape(-1, HEADS * HEAD_DIM)



def fill(cached: Blocked | Kernel, q: np.ndarray, k: np.ndarray, v: np.ndarray, end: int) -> None:
    """Positions 0..end−1 into a design's cache, in calls of up to 256 rows (as a prefill)."""
    for lo in range(0, end, 256):
        cached.rows(q[lo:min(end, lo + 256)], k[lo:min(end, lo + 256)], v[lo:min(end, lo + 256)], lo)


def cache_session(threads: int, max_positions: int, op: str) -> ort.InferenceSession:
    """GroupQueryAttention ("gqa") or edgespec's kernel ("kernel") over a shared past/present buffer, as the
    exported layers run them (rotary as the identity: cos 1, sin 0)."""
    kv = [1, KV_HEADS, max_positions, HEAD_DIM]
    cos = np.ones((max_positions, HEAD_DIM // 2), np.float32)
    sin = np.zeros((max_positions, HEAD_DIM // 2), np.float32)
    names = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total", "cos", "sin"]
    attrs = {"num_heads": HEADS, "kv_num_heads": KV_HEADS, "scale": HEAD_DIM ** -0.5}
    if op == "gqa":
        node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                                domain="com.microsoft", do_rotary=1, **attrs)
    else:
        node = helper.make_node(custom_ops.ATTENTION_OP, names, ["out", "present_key", "present_value"],
                                domain=custom_ops.DOMAIN, local_window_size=-1, softcap=0.0, **attrs)
    inputs = [_value("qkv", F, [1, "S", (HEADS + 2 * KV_HEADS) * HEAD_DIM]), _value("past_key", F, kv),
              _value("past_value", F, kv), _value("seqlens_k", TensorProto.INT32, [1]),
              _value("total", TensorProto.INT32, [])]
    outputs = [_value("out", F, [1, "S", HEADS * HEAD_DIM]), _value("present_key", F, kv),
               _value("present_value", F, kv)]
    return _session([node], inputs, outputs, {"cos": cos, "sin": sin}, threads)


def cache_call(session: ort.InferenceSession, cache: np.ndarray, qkv: np.ndarray, start: int) -> Call:
    """The call writing rows start.. of ``qkv`` [rows, (H + 2·KV)·D] into ``cache`` [2, 1, KV, L, D] in place."""
    rows = len(qkv)
    call = _bind(session, {"qkv": qkv[None], "seqlens_k": np.array([start + rows - 1], np.int32),
                           "total": np.array(start + rows, np.int32)}, (1, rows, HEADS * HEAD_DIM))
    for past, present, buffer in (("past_key", "present_key", cache[0]), ("past_value", "present_value", cache[1])):
        call.io.bind_input(past, "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
        call.io.bind_output(present, "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
    return call


class Kernel:
    """edgespec.ExactAttention, the op the exports use where it is built: rows written into the cache in place."""

    def __init__(self, threads: int, max_positions: int) -> None:
        self.session = cache_session(threads, max_positions, "kernel")
        self.cache = np.zeros((2, 1, KV_HEADS, max_positions, HEAD_DIM), np.float32)

    def rows(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
        call = cache_call(self.session, self.cache, np.concatenate([q, k, v], axis=1), start)
        self.session.run_with_iobinding(call.io)
        return call.out[0]



def cache_time(session: ort.InferenceSession, cache: np.ndarray, keys: int, rows: int) -> float:
    qkv = np.random.default_rng(rows).standard_normal((rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM)).astype(np.float32)
    call = cache_call(session, cache, qkv, keys)  # kept: the binding points into its arrays
    return _run_time(session, call.io)


def measure(keys: int, threads: int) -> dict[str, object]:
    rng = np.random.default_rng(keys)
    n = keys + max(ROWS_CHECKED)
    q = (rng.standard_normal((n, HEADS * HEAD_DIM)) * 2).astype(np.float32)
    k = (rng.standard_normal((n, KV_HEADS * HEAD_DIM)) * 2).astype(np.float32)
    v = rng.standard_normal((n, KV_HEADS * HEAD_DIM)).astype(np.float32)
    grouped, blocked, kernel = Grouped(threads), Blocked(threads, n), Kernel(threads, n + 1)
    fill(blocked, q, k, v, keys)
    fill(kernel, q, k, v, keys)
    prefix = {"blocked": (blocked.key.copy(), blocked.value.copy()), "kernel": kernel.cache.copy()}
    alone = {"grouped": np.stack([grouped.rows(q[:p + 1], k[:p + 1], v[:p + 1], p)[0] for p in range(keys, n)])}
    for design, cached in (("blocked", blocked), ("kernel", kernel)):
        alone[design] = np.stack([cached.rows(q[p:p + 1], k[p:p + 1], v[p:p + 1], p)[0] for p in range(keys, n)])
    worst = dict.fromkeys(alone, 0.0)
    for rows in ROWS_CHECKED:
        end = keys + rows
        together = {"grouped": grouped.rows(q[:end], k[:end], v[:end], keys)}
        blocked.key[:], blocked.value[:] = prefix["blocked"]
        kernel.cache[:] = prefix["kernel"]
        for design, cached in (("blocked", blocked), ("kernel", kernel)):
            together[design] = cached.rows(q[keys:end], k[keys:end], v[keys:end], keys)
        for design, out in together.items():
            worst[design] = max(worst[design], float(np.abs(out - alone[design][:rows]).max()))
    micros: dict[str, dict[int, float]] = {"grouped": {}, "blocked": {}, "kernel": {}, "gqa": {}}
    gqa = cache_session(threads, n + 1, "gqa")
    gqa_cache = rng.standard_normal((2, 1, KV_HEADS, n + 1, HEAD_DIM)).astype(np.float32)
    for rows in ROWS_TIMED:
        end = keys + rows
        call = grouped.binding(q[:end], k[:end], v[:end], keys)
        micros["grouped"][rows] = _run_time(grouped.session, call.io)
        call = blocked.binding(q[keys:end], k[keys:end], v[keys:end], keys)
        micros["blocked"][rows] = _run_time(blocked.session, call.io)
        micros["kernel"][rows] = cache_time(kernel.session, gqa_cache, keys, rows)
        micros["gqa"][rows] = cache_time(gqa, gqa_cache, keys, rows)
    return {"keys": keys, "max_difference": worst, "us_per_call": micros}


def plot(results: list[dict], path: Path) -> None:
    keys = [r["keys"] for r in results]
    lines = [(f"{design}, {rows} row{'s' if rows > 1 else ''}", [r["us_per_call"][design][rows] for r in results],
              color, style)
             for design, color in (("gqa", "tab:gray"), ("grouped", "tab:blue"), ("blocked", "tab:orange"),
                                   ("kernel", "tab:green"))
             for rows, style in ((1, "-"), (2, ":"), (5, "--"))]
    line_chart(path, keys, lines, "keys (context length)", "µs per call, one layer",
               "attention per call (inputs bound beforehand)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="40,700,2000", help="context lengths (comma-separated)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"),
                        help="folder for attention_invariance.json/.png (default benchmarks/results, git-ignored)")
    args = parser.parse_args()
    results = [measure(int(n), args.threads) for n in args.keys.split(",")]
    header = f"{'keys':>6} {'design':>8} {'max |row in call − row alone|':>30}"
    print(f"{header} {'µs 1 row':>9} {'2 rows':>7} {'5 rows':>7}")
    for r in results:
        for design, us in r["us_per_call"].items():
            diff = f"{r['max_difference'][design]:.1e}" if design in r["max_difference"] else "-"
            print(f"{r['keys']:>6} {design:>8} {diff:>30} {us[1]:>9.0f} {us[2]:>7.0f} {us[5]:>7.0f}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "attention_invariance.json"
    out.write_text(json.dumps({"onnxruntime": ort.__version__, "threads": args.threads, "block": BLOCK,
                               "results": results}, indent=1))
    plot(results, args.out / "attention_invariance.png")
    print(f"wrote {out} and attention_invariance.png")


if __name__ == "__main__":
    main()
