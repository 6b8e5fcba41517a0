"""GGUF → ONNX without torch: a tiny llama GGUF written here (random weights, 2 layers, a small BPE vocabulary)
exported with its own Q4_0 / Q4_1 / Q8_0 blocks, against llama.cpp on the same file; block round trips; the
tokenizer written from the SmolLM2 GGUF's metadata against llama.cpp's; the shipped SmolLM2 Q4_1 exported and
speculated losslessly; no torch or transformers imported on the way."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel
from edgespec.backends.onnx.session import session_options
from edgespec.backends.onnx.tokenizer import HFTokenizer
from edgespec.kernels import library as custom_ops

gguf = pytest.importorskip("gguf")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from edgespec.export.gguf.ggufio import reader  # noqa: E402
from edgespec.export.gguf.tokenizer import write_tokenizer  # noqa: E402
from edgespec.export.onnx.block_weights import from_ggml  # noqa: E402
from edgespec.export.onnx.export import export_onnx  # noqa: E402
from edgespec.export.onnx.graphs import GraphBuilder, block_linear  # noqa: E402
from edgespec.export.onnx.reference import OnnxReference  # noqa: E402

from tests.conftest import SpecBench  # noqa: E402
from tests.export.llama_checks import assert_batch_invariant, llama_logits  # noqa: E402
from tests.tiny_gguf import TEMPLATE, add_small_tokenizer, llama_writer, small_vocabulary  # noqa: E402

QT = gguf.GGMLQuantizationType
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 2
HEAD_DIM = HIDDEN // HEADS
TEXT = "the thin one on the table, in 2024: naïve café 東京 {x: [1, 22]} the end"


def write_tiny_gguf(path: Path, qtype: int, seed: int = 0, pre: str = "gpt-2") -> Path:
    """A 2-layer llama GGUF whose every matrix is quantized to ``qtype`` by gguf.quants (tied embeddings)."""
    rng = np.random.default_rng(seed)
    w = llama_writer(path, LAYERS, HIDDEN, FFN, HEADS, KV_HEADS)
    n_vocab = add_small_tokenizer(w, pre)

    def matrix(name: str, rows: int, cols: int, scale: float = 1.0) -> None:
        values = (scale * rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))

    matrix("token_embd.weight", n_vocab, HIDDEN, scale=8.0)
    norm("output_norm.weight")
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN, 4.0)
        matrix(f"blk.{i}.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN, 4.0)
        matrix(f"blk.{i}.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


CARRIED = {"Q4_0": QT.Q4_0, "Q4_1": QT.Q4_1, "Q8_0": QT.Q8_0}


@pytest.mark.parametrize("kind", CARRIED)
def test_blocks_round_trip_exactly(kind: str) -> None:
    """Carried blocks dequantize to gguf's own dequantization bit for bit, and MatMulNBits reads them so: one-hot
    rows through the graph's block_linear give back every weight (within int8 activation rounding: 1e-6)."""
    rng = np.random.default_rng(3)
    n, k = 48, 96
    values = (rng.standard_normal((n, k)) + rng.uniform(-2, 2, (n, 1))).astype(np.float32)
    data = gguf.quants.quantize(values, CARRIED[kind])
    expected = gguf.quants.dequantize(data, CARRIED[kind])
    weight = from_ggml(kind, data, n, k)
    assert np.array_equal(weight.dequantize(), expected)
    order = np.random.default_rng(4).permutation(n)
    assert np.array_equal(weight.rows(order).dequantize(), expected[order])  # whole rows move

    g = GraphBuilder("one")
    g.one("Identity", [block_linear(g, "x", weight, "w")], "y")
    f32 = onnx.TensorProto.FLOAT
    model = g.model([onnx.helper.make_tensor_value_info("x", f32, [1, "S", k])],
                    [onnx.helper.make_tensor_value_info("y", f32, [1, "S", n])])
    session = ort.InferenceSession(model.SerializeToString(), session_options(1)[0],  # the process's thread pool
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": np.eye(k, dtype=np.float32)[None]})[0][0]  # row j: weight column j
    np.testing.assert_allclose(got, expected.T, rtol=1e-6, atol=1e-6 * np.abs(expected).max())


@pytest.fixture(scope="module", params=list(CARRIED))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    path = write_tiny_gguf(folder / "tiny.gguf", CARRIED[request.param])
    export_onnx(path, folder / "onnx", context_length=256, progress=False)
    return request.param, path, folder / "onnx"


def test_tiny_gguf_logits_match_llama_cpp(tiny: tuple[str, Path, Path], tmp_path: Path) -> None:
    """Every position's logits against llama.cpp on the same file. Not bit-identical by design: llama.cpp rounds
    the activations to Q8 blocks for each quantized product and onnxruntime's MatMulNBits (accuracy level 4) to
    its own int8 blocks, and the sums run in other orders; on this random model (sharp attention, no training)
    that moves logits by ~2% of their spread on average. The carried blocks follow llama.cpp more closely than
    the same weights dequantized to float32 do (measured: mean difference about half), which a wrong block
    layout, rotary permutation or minimum would not."""
    kind, path, folder = tiny
    ids, expected = llama_logits(path, TEXT * 3)
    manifest = json.loads((folder / "edgespec-onnx.json").read_text())
    assert manifest["quant"] == "gguf" and manifest["source"]["gguf_types"][kind] == 1 + 7 * LAYERS
    got = OnnxReference(folder).logits(ids)
    export_onnx(path, tmp_path / "fp32", "fp32", context_length=256, progress=False)
    dense = OnnxReference(tmp_path / "fp32").logits(ids)
    spread = float(expected.std())
    assert np.abs(got - expected).mean() < 0.04 * spread, (kind, np.abs(got - expected).mean(), spread)
    assert np.abs(got - expected).mean() < np.abs(dense - expected).mean()
    assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.97


def test_tiny_tokenizer_and_template_come_from_the_gguf(tiny: tuple[str, Path, Path]) -> None:
    _, path, folder = tiny
    mine = HFTokenizer(folder)
    llama = LlamaModel(path, ContextOptions(n_ctx=64, n_threads=1))
    try:
        for text in (TEXT, "<|im_start|>user\nthe<|im_end|>"):
            for parse_special in (False, True):
                assert mine.tokenize(text, False, parse_special) == llama.tokenize(text, False, parse_special)
    finally:
        llama.close()
    assert json.loads((folder / "edgespec-onnx.json").read_text())["chat_template"] == TEMPLATE


SAMPLE = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\tand\n\nnew lines \n",
    "naïve café, Ünïcödé, 東京タワー, русский текст, emoji 🙂🚀, ﬁ ligature",
    "def f(x: int) -> list[int]:\n    return [i ** 2 for i in range(x)]  # 1234567890\n",
    "3.14159 + 2,718 = 5.86 · 10^3 · 1e-9 · 0x1F",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi <|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|> and <repo_name> markup inside text",
    "'s 't 're 've 'm 'll 'd — quotes “like this” and ‘this’",
]


PRE_TOKENIZERS = ["gpt-2", "smollm", "llama-bpe", "qwen2"]  # GPT-2, SmolLM2, Llama 3.x, Qwen2/2.5/3
DIGITS = "1234567 12 123, 0.1234 the table"


@pytest.mark.parametrize("pre", PRE_TOKENIZERS)
def test_pre_tokenizers_equal_llama_cpp(pre: str, tmp_path: Path) -> None:
    """The tokenizer written for each pre-tokenizer name the writer knows, on the small vocabulary (merges across
    digits, which the expressions split in runs of any length, of three or one by one; a word no merge reaches,
    which Llama 3's takes whole), tokenizes as llama.cpp does."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", QT.Q8_0, pre=pre)
    write_tokenizer(reader(path), tmp_path)
    mine = HFTokenizer(tmp_path)
    llama = LlamaModel(path, ContextOptions(n_ctx=256, n_threads=1))
    try:
        for text in [*SAMPLE, DIGITS, TEXT]:
            for add_special in (False, True):
                for parse_special in (False, True):
                    assert mine.tokenize(text, add_special, parse_special) == \
                        llama.tokenize(text, add_special, parse_special), (pre, text, add_special, parse_special)
    finally:
        llama.close()


def test_the_pre_tokenizers_differ_on_thesmall_vocabulary(tmp_path: Path) -> None:
    """So that the test above tells Llama 3's and Qwen2's apart from GPT-2's and from each other (SmolLM2's splits
    digits as Qwen2's does)."""
    got = {}
    for pre in ("gpt-2", "llama-bpe", "qwen2"):
        write_tokenizer(reader(write_tiny_gguf(tmp_path / f"{pre}.gguf", QT.Q8_0, pre=pre)), tmp_path)
        got[pre] = HFTokenizer(tmp_path).tokenize(DIGITS, False, False)
    assert len({tuple(ids) for ids in got.values()}) == len(got)
    assert got["llama-bpe"][-1] == small_vocabulary().index("Ġtable")  # whole, though no merge makes it


@pytest.fixture(scope="module")
def smol_q4_1() -> Path:
    from edgespec.catalog.models import families

    return families()["smollm2-135m"].prepare("q4_1")


def test_smollm2_tokenizer_equals_llama_cpp(smol_q4_1: Path, tmp_path: Path) -> None:
    write_tokenizer(reader(smol_q4_1), tmp_path)
    mine = HFTokenizer(tmp_path)
    llama = LlamaModel(smol_q4_1, ContextOptions(n_ctx=64, n_threads=1))
    try:
        for text in SAMPLE:
            for add_special in (False, True):
                for parse_special in (False, True):
                    assert mine.tokenize(text, add_special, parse_special) == \
                        llama.tokenize(text, add_special, parse_special), (text, add_special, parse_special)
        ids = llama.tokenize(" ".join(SAMPLE), False, True)
        assert b"".join(mine.piece(t) for t in ids) == b"".join(llama.piece(t) for t in ids)
    finally:
        llama.close()


_BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} is blocked: this path must not import it")
sys.meta_path.insert(0, Block())
from edgespec.cli.main import main
code = main(sys.argv[1:])
assert not {"torch", "transformers"} & set(sys.modules), "torch or transformers was imported"
sys.exit(code)
"""


def test_export_imports_no_torch_and_no_transformers(tmp_path: Path) -> None:
    """The whole command — export, quality report against llama.cpp, gate — with torch and transformers
    blocked from importing."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", QT.Q4_1)
    out = tmp_path / "o"
    result = subprocess.run([sys.executable, "-c", _BLOCKER, "export", "onnx", str(path), "--out", str(out),
                             "--context-length", "1024", "--threads", "1", "--force"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "top-1" in result.stdout and (out / "tokenizer.json").is_file()


@pytest.fixture(scope="module")
def smol_carried(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """The shipped SmolLM2 Q4_1 exported by the command as a user runs it (its blocks carried, quality gate)."""
    from edgespec.cli.main import main

    out = tmp_path_factory.mktemp("smol") / "onnx"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["export", "onnx", "smollm2-135m", "--out", str(out), "--threads", "1"]) == 0
    return out, json.loads((out / "edgespec-onnx.json").read_text()), printed.getvalue()


def test_smollm2_q4_1_carried_passes_the_gate(smol_carried: tuple[Path, dict, str]) -> None:
    """The gate's top-1 counts the source's own near-ties as agreeing (``quality.source_ties``): both numbers are
    recorded, the gate decides on the second, and the carried export passes it."""
    _, manifest, printed = smol_carried
    q = manifest["quality"]
    assert manifest["quant"] == "gguf" and manifest["source"]["gguf_types"].get("Q4_1", 0) > 0
    assert q["top1_decided"] >= q["top1_agreement"] and q["source_tie"] >= 0
    assert q["top1_decided"] >= 0.99 and q["kl"] <= 0.01 and q["against"].startswith("llama.cpp")
    assert manifest["kv_dtype"] == ("float16" if custom_ops.uses_exact_attention(manifest) else "float32")
    assert "quality gate passed" in printed and "beyond the source's own ties" in printed


@pytest.mark.parametrize("mode", ["ngram", "layerskip"])
def test_smollm2_carried_speculates_losslessly(smol_carried: tuple[Path, dict, str], mode: str,
                                               spec_bench: SpecBench) -> None:
    import edgespec

    folder = smol_carried[0]
    engine = edgespec.load(folder, n_ctx=2048, n_threads=1, mode=mode, layer_skip=[12, 14, 16, 18],
                           tuning=False)
    try:
        drafted = 0
        for q in spec_bench(["summarization", "coding", "math_reasoning"]):
            prompt = engine.chat_tokens([{"role": "user", "content": q["turns"][0]}])
            plain = engine.generate(prompt, max_tokens=32, mode="none")
            spec = engine.generate(prompt, max_tokens=32, gamma=3)
            assert spec.tokens == plain.tokens, (mode, q["category"])
            drafted += spec.stats.drafted
        assert drafted > 0, "nothing was drafted: the check would prove nothing"
    finally:
        engine.close()


def test_the_gate_refuses_a_bad_requantization(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Q4_0 re-quantized from the shipped Q4_1 (top-1 ≈ 0.84): refused, nothing left behind; --force keeps it."""
    from edgespec.cli.main import main

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    out = tmp_path / "q4_0.gguf"
    args = ["export", "gguf", "smollm2-135m", "--quant", "q4_0", "--out", str(out), "--threads", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "refused by the quality gate" in err and "top-1 agreement" in err and "Traceback" not in err
    assert not out.exists()
    assert main([*args, "--force"]) == 0
    assert out.exists() and "quality gate FAILED" in capsys.readouterr().out


def test_gate_thresholds() -> None:
    from edgespec.export.gate import QualityGateError, check

    from edgespec.catalog.models import MAX_KL, MIN_TOP1, below_quality_bar

    assert below_quality_bar(MIN_TOP1, MAX_KL) is None
    assert "top-1" in (below_quality_bar(0.98, 0.0) or "") and "KL" in (below_quality_bar(1.0, 0.02) or "")
    with pytest.raises(QualityGateError, match="refused"):
        check("x", 0.5, 1.0, force=False)
    assert "FAILED" in check("x", 0.5, 1.0, force=True)


def test_a_flip_between_the_source_s_own_near_ties_is_not_a_disagreement() -> None:
    from edgespec.export.quality import agreement

    source = np.log(np.array([[0.50, 0.49, 0.01], [0.90, 0.05, 0.05]]))
    artefact = np.log(np.array([[0.49, 0.50, 0.01], [0.05, 0.90, 0.05]]))  # both rows pick another token
    a = agreement([(source, artefact)], tie=0.05)
    assert a.top1 == 0.0 and a.top1_decided == 0.5  # row 0: ln(0.50/0.49) = 0.02 nats apart, a tie; row 1: 2.9
    assert agreement([(source, artefact)]).top1_decided == 0.0  # no ties measured: the raw top-1


def test_runtime_imports_pull_no_torch() -> None:
    code = ("import sys, edgespec, edgespec.cli.main, edgespec.backends.onnx.model, edgespec.server.app\n"
            "import edgespec.export.onnx.export\n"
            "assert not {'torch', 'transformers'} & set(sys.modules), sorted(sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_tiny_carried_graphs_are_batch_invariant(tiny: tuple[str, Path, Path]) -> None:
    assert_batch_invariant(tiny[2], list(range(3, 200)))


def test_tiny_graphs_with_groupqueryattention_are_batch_invariant(tmp_path: Path) -> None:
    """The export without edgespec's kernel (``--attention gqa``: single-token calls padded) is exact too."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", CARRIED["Q8_0"])
    manifest = export_onnx(path, tmp_path / "onnx", context_length=256, progress=False, attention="gqa")
    assert manifest["quant_options"]["attention"] == "com.microsoft.GroupQueryAttention"
    assert_batch_invariant(tmp_path / "onnx", list(range(3, 200)))


def test_smollm2_carried_is_batch_invariant(smol_carried: tuple[Path, dict, str]) -> None:
    assert_batch_invariant(smol_carried[0], list(range(1000, 1100)))


def test_a_vocabulary_it_cannot_write_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgespec.cli.main import main

    path = write_tiny_gguf(tmp_path / "odd.gguf", QT.Q8_0, pre="deepseek-llm")
    assert main(["export", "onnx", str(path), "--out", str(tmp_path / "o"), "--no-quality"]) == 2
    err = capsys.readouterr().err
    assert "pre-tokenizer 'deepseek-llm'" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob("o.tmp*"))
