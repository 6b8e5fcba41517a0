"""Q2_K-, Q3_K_M-, Q4_K_M- and Q5_K_M-shaped GGUFs → ONNX with their K-quant super-blocks (Q2_K … Q6_K) carried into
edgespec.BlockKQuantMatMul (nothing re-quantized): a tiny random llama written here (hidden size 256, the K-quants'
super-block; q, k, o, gate and up Q4_K, v, one layer's down and the tied embedding Q6_K, as llama.cpp's Q4_K_M mixes
them), and the same model in float32 quantized to Q2_K, Q3_K_M and Q5_K_M by llama.cpp's own quantizer; Q5_0 and
Q5_1 blocks (edgespec.BlockQ4MatMul) beside the other types. Each against llama.cpp on the same file; every
position's logits the same alone, in a verify batch and in a prefill; greedy speculation equal to target-only
decoding."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from edgespec.kernels import library as custom_ops

gguf = pytest.importorskip("gguf")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from edgespec.export.onnx.reference import OnnxReference  # noqa: E402

from tests.export.llama_checks import assert_batch_invariant, llama_logits  # noqa: E402
from tests.tiny_gguf import KQ_LAYERS, KQ_TYPES, llama_quantize, write_kquant_gguf  # noqa: E402

pytestmark = pytest.mark.skipif(custom_ops.ensure() is None, reason="the kernel library cannot be built here")

TEXT = "the thin one on the table, in 2024: naïve café 東京 {x: [1, 22]} the end"
# K-quants beside the types carried otherwise (Q4_0 / Q4_1, Q5_0 / Q5_1: BlockQ4MatMul; Q8_0: MatMulNBits or
# BlockInt8MatMul), within q|k|v and gate|up
MIXED = [{"attn_q": "Q4_K", "attn_k": "Q8_0", "attn_v": "Q5_0", "attn_output": "Q4_0", "ffn_gate": "Q4_1",
          "ffn_up": "Q4_K", "ffn_down": "Q6_K"}, KQ_TYPES | {"attn_output": "Q5_1", "ffn_gate": "Q5_1"}]
# per file: the GGUF's types, and the edgespec products in each layer graph (runs of a type in q|k|v and gate|up)
FILES = {"q4_k_m": ({"Q4_K": 10, "Q6_K": 5, "F32": 5}, [5, 6]),
         # llama.cpp's Q5_K_M here: Q5_K, with Q6_K for layer 1's v and down and the tied embedding
         "q5_k_m": ({"Q5_K": 12, "Q6_K": 3, "F32": 5}, [4, 5]),
         # llama.cpp's Q3_K_M here: Q3_K q, k, gate and up, Q4_K o and down, Q5_K v, the tied embedding Q6_K
         "q3_k_m": ({"Q3_K": 8, "Q4_K": 4, "Q5_K": 2, "Q6_K": 1, "F32": 5}, [5, 5]),
         # llama.cpp's Q2_K here: Q2_K q, k, gate and up, Q3_K v, o and down, the tied embedding Q6_K
         "q2_k": ({"Q2_K": 8, "Q3_K": 6, "Q6_K": 1, "F32": 5}, [5, 5])}


@pytest.fixture(scope="module", params=list(FILES))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """The file (FILES) and its export as a user makes it (``export onnx --quant gguf``: quality report against
    llama.cpp and its gate)."""
    from edgespec.cli.main import main

    folder = tmp_path_factory.mktemp(request.param)
    path = folder / f"{request.param}.gguf"  # the file's stem names its FILES entry
    if request.param == "q4_k_m":
        write_kquant_gguf(path)
    else:
        dense = [dict.fromkeys(KQ_TYPES, "F32")] * KQ_LAYERS
        llama_quantize(write_kquant_gguf(folder / "f32.gguf", layer_types=dense, embedding="F32"), path,
                       request.param.upper())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["export", "onnx", str(path), "--quant", "gguf", "--out", str(folder / "onnx"),
                     "--context-length", "1024", "--threads", "1"]) == 0
    assert "quality gate passed" in printed.getvalue()
    return path, folder / "onnx", json.loads((folder / "onnx" / "edgespec-onnx.json").read_text())


def test_every_k_quant_is_carried_into_the_op(tiny: tuple[Path, Path, dict]) -> None:
    """No product is dequantized or re-quantized: q|k|v and gate|up of mixed types are one op per run of a type."""
    path, folder, manifest = tiny
    types, per_layer = FILES[path.stem]
    assert manifest["quant"] == "gguf" and manifest["source"]["gguf_types"] == types
    options = manifest["quant_options"]
    assert options["kquant_products"] == custom_ops.KQUANT_PRODUCTS and "four_bit_products" not in options
    assert options["single_row_padding"] == "none" and custom_ops.needs_library(manifest)
    assert {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"} <= set(options["carried"])
    ops = {name: [n.op_type for n in onnx.load(str(folder / name)).graph.node]
           for name in ("embed.onnx", "layer_00.onnx", "layer_01.onnx", "head.onnx")}
    assert not any(op in ("MatMul", "MatMulNBits") for nodes in ops.values() for op in nodes), ops
    # Q4_K_M: q|k (Q4_K) and v (Q6_K); o; gate|up (layer 1: Q6_K gate, Q4_K up); down; the tied Q6_K head.
    # Q5_K_M: q|k|v; o; gate|up; down (layer 1: q|k and v, down Q6_K). Q3_K_M and Q2_K: q|k and v; o; gate|up; down.
    assert [ops[f"layer_0{i}.onnx"].count(custom_ops.KQUANT_PRODUCTS_OP) for i in range(2)] == per_layer
    assert ops["head.onnx"].count(custom_ops.KQUANT_PRODUCTS_OP) == 1 and "Gather" in ops["embed.onnx"]


def test_logits_follow_llama_cpp(tiny: tuple[Path, Path, dict], tmp_path: Path) -> None:
    """Every position's logits against llama.cpp on the same file. Not bit-identical by design: llama.cpp rounds the
    activations of a K-quant product to Q8_K (one scale per 256), the op to int8 per 32, and sums in another order;
    float32 activations on the same weights (the fp32 export) differ from llama.cpp about as much (measured on this
    model: a mean 5.6% of the logits' spread for the op, 5.0% for fp32, top-1 the same everywhere). A wrong layout
    is far off: Q4_K's minima left out, Q6_K's sub-block scales shifted by one or its high bits swapped measured
    45–104%."""
    from edgespec.export.onnx.export import export_onnx

    path, folder, _ = tiny
    ids, expected = llama_logits(path, TEXT * 3)
    got = OnnxReference(folder).logits(ids)
    export_onnx(path, tmp_path / "fp32", "fp32", context_length=256, progress=False)
    dense = OnnxReference(tmp_path / "fp32").logits(ids)
    spread = float(expected.std())
    assert np.abs(got - expected).mean() < 0.08 * spread, (np.abs(got - expected).mean(), spread)
    assert np.abs(got - expected).mean() < 1.5 * np.abs(dense - expected).mean()
    assert np.abs(got - dense).mean() < 0.05 * spread  # the same weights: only the activations' int8 rounding
    assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.97


def test_a_position_has_the_same_logits_alone_in_a_verify_batch_and_in_a_prefill(tiny: tuple[Path, Path, dict]) -> None:
    assert_batch_invariant(tiny[1], list(range(3, 200)))


def test_k_quants_beside_other_types(tmp_path: Path) -> None:
    """Q4_K and Q6_K in one packed product with Q8_0 and Q5_0 (q|k|v), with Q4_1 (gate|up), beside Q4_0; Q5_1 (o, and
    gate beside a Q4_K up), a Q8_0 embedding: each run of a type keeps its own op, all within the bounds above of
    llama.cpp, exact for any row count. (The Q5_0 / Q5_1 blocks are gguf's port of llama.cpp's reference quantizer.)"""
    from edgespec.export.onnx.export import export_onnx

    path = write_kquant_gguf(tmp_path / "mixed.gguf", layer_types=MIXED, embedding="Q8_0")
    manifest = export_onnx(path, tmp_path / "onnx", context_length=256, progress=False)
    options = manifest["quant_options"]
    assert options["four_bit_products"] == custom_ops.Q4_PRODUCTS
    assert options["kquant_products"] == custom_ops.KQUANT_PRODUCTS and options["single_row_padding"] == "none"
    ops = [n.op_type for n in onnx.load(str(tmp_path / "onnx" / "layer_00.onnx")).graph.node]
    # q (Q4_K), k (Q8_0), v (Q5_0): three products; o (Q4_0); gate (Q4_1) and up (Q4_K); down (Q6_K). The 8-bit
    # one is MatMulNBits or BlockInt8MatMul, whichever the export timed faster here.
    eight_bit = ops.count("MatMulNBits") + ops.count(custom_ops.PRODUCTS_OP)
    assert (ops.count(custom_ops.KQUANT_PRODUCTS_OP), ops.count(custom_ops.Q4_PRODUCTS_OP), eight_bit,
            ops.count("Concat")) == (3, 3, 1, 2), ops
    ops = [n.op_type for n in onnx.load(str(tmp_path / "onnx" / "layer_01.onnx")).graph.node]
    # q|k (Q4_K), v (Q6_K); o (Q5_1); gate (Q5_1) and up (Q4_K); down (Q4_K)
    assert (ops.count(custom_ops.KQUANT_PRODUCTS_OP), ops.count(custom_ops.Q4_PRODUCTS_OP), ops.count("MatMulNBits"),
            ops.count(custom_ops.PRODUCTS_OP)) == (4, 2, 0, 0), ops
    ids, expected = llama_logits(path, TEXT * 3)
    got = OnnxReference(tmp_path / "onnx").logits(ids)
    assert np.abs(got - expected).mean() < 0.08 * float(expected.std())
    assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.97
    assert_batch_invariant(tmp_path / "onnx", list(range(3, 200)))


@pytest.mark.parametrize("mode", ["ngram", "layerskip"])
def test_greedy_speculation_equals_target_only_decoding(tiny: tuple[Path, Path, dict], mode: str) -> None:
    import edgespec

    engine = edgespec.load(tiny[1], n_ctx=512, n_threads=1, mode=mode, layer_skip=[1], tuning=False, require_exact=True)
    try:
        drafted = 0
        for text in (TEXT * 2, "the the the on the table the", "{x: [1, 22]} {x: [1, 22]} {x:"):
            prompt = engine.tokenize(text)
            plain = engine.generate(prompt, max_tokens=48, mode="none")
            spec = engine.generate(prompt, max_tokens=48, gamma=3)
            assert spec.tokens == plain.tokens, (mode, text)
            drafted += spec.stats.drafted
        assert drafted > 0, "nothing was drafted: the check would prove nothing"
    finally:
        engine.close()
