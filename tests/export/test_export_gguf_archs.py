"""GGUF → ONNX for the edge architectures without torch (export/onnx/gguf_source.py): a tiny random GGUF of each
(tests/tiny_gguf.py) — F32, and with its matrices in each block type the export carries (Q8_0, Q4_0, Q4_1) — goes
through `edgespec export onnx FILE.gguf` in a process where torch and transformers cannot be imported. Each
export's logits match llama.cpp's on the same file, and greedy n-gram speculation on the export equals its
target-only decoding. A file holding what the graphs cannot compute is refused with its name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from edgespec.export.onnx.reference import OnnxReference

import edgespec
from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel
from edgespec.cli.main import main
from tests.conftest import SpecBench
from tests.tiny_gguf import ARCHITECTURES, HEAD_DIM, SLIDING_WINDOW, tiny_gguf

pytest.importorskip("onnxruntime")
pytest.importorskip("gguf")

CONTEXT = 512
QUANTS = {"F32": "fp32", "Q8_0": "gguf", "Q4_0": "gguf", "Q4_1": "gguf"}  # the file's matrices → --quant
CASES = [(arch, quant) for arch in sorted(ARCHITECTURES) for quant in QUANTS]
TEXT = "The quick brown fox jumps over the lazy dog. " * 12

# Every export of the module in one process that cannot import torch or transformers.
_EXPORT = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} is blocked: this path must not import it")
sys.meta_path.insert(0, Block())
from edgespec.cli.main import main
context, jobs = sys.argv[1], sys.argv[2:]
for src, quant, out in zip(jobs[::3], jobs[1::3], jobs[2::3]):
    code = main(["export", "onnx", src, "--quant", quant, "--out", out, "--context-length", context,
                 "--threads", "1", "--no-quality"])
    assert code == 0, (src, quant)
assert not {"torch", "transformers"} & set(sys.modules), "torch or transformers was imported"
"""


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Path, Path]]:
    """(architecture, the file's matrix type) → (tiny GGUF, its ONNX export)."""
    folder = tmp_path_factory.mktemp("gguf-archs")
    cases, jobs = {}, []
    for arch, quant in CASES:
        gguf = tiny_gguf(folder / f"{arch}-{quant}.gguf", arch, smollm2_vocabulary=False, quant=quant)
        cases[arch, quant] = gguf, folder / f"{arch}-{quant}-onnx"
        jobs += [str(gguf), QUANTS[quant], str(folder / f"{arch}-{quant}-onnx")]
    result = subprocess.run([sys.executable, "-c", _EXPORT, str(CONTEXT), *jobs], capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    return cases


def _llama_logits(path: Path) -> tuple[list[int], np.ndarray]:
    llama = LlamaModel(path, ContextOptions(n_ctx=CONTEXT, n_batch=CONTEXT, n_threads=1))
    try:
        ids = llama.tokenize(TEXT, add_special=False, parse_special=False)[:100]
        return ids, llama.decode(ids, 0, len(ids)).copy()
    finally:
        llama.close()


@pytest.mark.parametrize("arch, quant", CASES)
def test_export_matches_llama_cpp(exports: dict[tuple[str, str], tuple[Path, Path]], arch: str, quant: str) -> None:
    """Every position of 100 tokens (past Gemma's 16-token window). F32 (`--quant fp32`): within 1e-4 of the
    logits' range (measured: ≤ 4e-7; Gemma ~7e-5, llama.cpp's GELU reads a half-precision table), every top-1
    equal. Carried blocks (`--quant gguf`): the bound of tests/export/test_export_gguf_onnx.py, mean difference
    under 0.04 of the logits' spread (measured ≤ 0.004: llama.cpp and MatMulNBits round the activations to int8
    blocks their own ways) and ≥ 97% of top-1 equal (measured: all)."""
    gguf, folder = exports[arch, quant]
    ids, expected = _llama_logits(gguf)
    got = OnnxReference(folder).logits(ids)
    agree = (got.argmax(-1) == expected.argmax(-1)).mean()
    if quant == "F32":
        assert np.abs(got - expected).max() < 1e-4 * np.abs(expected).max(), (arch, np.abs(got - expected).max())
        assert agree == 1.0
    else:
        assert np.abs(got - expected).mean() < 0.04 * float(expected.std()), (arch, quant)
        assert agree >= 0.97, (arch, quant, agree)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_greedy_ngram_speculation_on_the_export_equals_target_only(
        exports: dict[tuple[str, str], tuple[Path, Path]], arch: str) -> None:
    """On the export of the Q4_0 file (its blocks carried), at a prompt longer than Gemma's window."""
    engine = edgespec.load(exports[arch, "Q4_0"][1], n_ctx=CONTEXT, n_threads=1, mode="ngram", tuning=False)
    try:
        prompt = engine.tokenize("List the days of the week: Monday, Tuesday, Wednesday, Monday, Tuesday, " * 3)
        assert len(prompt) > SLIDING_WINDOW
        plain = engine.generate(prompt, max_tokens=48, mode="none")
        drafted = 0
        for gamma in (3, "auto"):
            out = engine.generate(prompt, max_tokens=48, mode="ngram", gamma=gamma)
            assert out.tokens == plain.tokens, (arch, gamma)
            drafted += out.stats.drafted
        assert drafted > 0, "nothing was drafted: the check would prove nothing"
    finally:
        engine.close()


REFUSED = {  # (architecture, what the tiny file gets) → what the refusal names
    "llama LongRoPE": ("llama", {"rope_factors_long.weight": np.ones(HEAD_DIM // 2, np.float32),
                                 "rope_factors_short.weight": np.ones(HEAD_DIM // 2, np.float32)}, "LongRoPE"),
    "llama o_proj bias": ("llama", {"blk.0.attn_output.bias": np.zeros(64, np.float32)}, "attn_output.bias (a bias)"),
    "qwen2 rope_freqs": ("qwen2", {"rope_freqs.weight": np.ones(HEAD_DIM // 2, np.float32)}, "rope_freqs.weight"),
    "llama partial rotary": ("llama", {"{arch}.rope.dimension_count": HEAD_DIM // 2}, "partial rotary"),
    "llama YaRN RoPE": ("llama", {"{arch}.rope.scaling.type": "yarn", "{arch}.rope.scaling.factor": 4.0},
                        "RoPE scaling 'yarn'"),
    "gemma3 final softcap": ("gemma3", {"{arch}.final_logit_softcapping": 30.0}, "final logit soft-capping"),
    "llama experts": ("llama", {"{arch}.expert_count": 8}, "mixture of experts"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_the_graphs_cannot_compute_is_refused_by_name(case: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from edgespec.catalog import info as model_info

    arch, extra, named = REFUSED[case]
    gguf = tiny_gguf(tmp_path / f"{arch}.gguf", arch, smollm2_vocabulary=False, extra=extra)
    assert main(["export", "onnx", str(gguf), "--out", str(tmp_path / "onnx"), "--no-quality"]) == 2
    err = capsys.readouterr().err
    assert named in err and "not supported" in err and "Traceback" not in err, err
    assert not (tmp_path / "onnx").exists()
    if any(isinstance(v, np.ndarray) for v in extra.values()):  # `edgespec models` reads the tensor names too
        assert not model_info.describe(gguf).onnx


TOKENIZER_TEXTS = ("the thin one on the table", " in  a\n\nnaïve café 東京", "<|im_start|>user\nthe<|im_end|>",
                   "", " ", "  ", "tabs\tthe\n", "an<|im_end|> after a special")


def _same_tokens_as_llama_cpp(gguf: Path, folder: Path, texts: tuple[str, ...]) -> None:
    from edgespec.backends.onnx.tokenizer import HFTokenizer

    mine = HFTokenizer(folder)
    llama = LlamaModel(gguf, ContextOptions(n_ctx=64, n_threads=1))
    try:
        for text in texts:
            for add_special in (False, True):
                for parse_special in (False, True):
                    assert (mine.tokenize(text, add_special, parse_special)
                            == llama.tokenize(text, add_special, parse_special)), (text, add_special, parse_special)
    finally:
        llama.close()


@pytest.mark.parametrize("space_prefix", [False, True])  # Gemma's files: none; Phi-3's, Mistral's, Llama 2's: one
def test_a_sentencepiece_vocabulary_is_written_without_transformers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, space_prefix: bool) -> None:
    """Gemma's, Phi-3's and Mistral's GGUFs hold SentencePiece vocabularies: edgespec's own writer turns them into
    a tokenizer.json that tokenizes as llama.cpp does, with or without special tokens parsed and a space prefix."""
    gguf = tiny_gguf(tmp_path / "gemma3.gguf", "gemma3", smollm2_vocabulary=False, sentencepiece=True, quant="Q4_0",
                     extra={"tokenizer.ggml.add_space_prefix": space_prefix})
    args = ["export", "onnx", str(gguf), "--out", str(tmp_path / "onnx"), "--no-quality", "--threads", "1"]
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "transformers", None)  # as if it were not installed
        assert main(args) == 0
    _same_tokens_as_llama_cpp(gguf, tmp_path / "onnx", TOKENIZER_TEXTS)


def test_a_vocabulary_array_of_another_length_is_a_clear_error(tmp_path: Path) -> None:
    """A damaged file whose scores do not match its tokens: the tokenizer writer says which array, no stray index."""
    import gguf as gguf_package
    from edgespec.export.gguf.ggufio import reader
    from edgespec.export.gguf.tokenizer import write_tokenizer

    from edgespec.errors import ModelLoadError

    path = tmp_path / "damaged.gguf"
    writer = gguf_package.GGUFWriter(path, "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "▁", "a", "▁a"])
    writer.add_token_scores([0.0, -1.0, -2.0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"tokenizer\.ggml\.scores holds 3 values for 4 tokens"):
        write_tokenizer(reader(path), tmp_path)


@pytest.mark.slow
def test_gemma3_vocabulary_tokenizes_as_llama_cpp(tmp_path: Path, spec_bench: SpecBench) -> None:
    """The shipped Gemma 3 270M's 262 144 pieces (user-defined runs of spaces and newlines, byte tokens, controls):
    Spec-Bench's questions and harder strings tokenize as llama.cpp tokenizes them."""
    from edgespec.export.gguf.ggufio import reader
    from edgespec.export.gguf.tokenizer import write_tokenizer

    from edgespec.catalog.models import families

    gguf = families()["gemma3-270m"].prepare()
    write_tokenizer(reader(gguf), tmp_path)
    categories = ["coding", "math_reasoning", "qa", "rag", "summarization", "translation", "writing"]
    questions = tuple(q["turns"][0] for q in spec_bench(categories, per_category=4))
    _same_tokens_as_llama_cpp(gguf, tmp_path, TOKENIZER_TEXTS + questions + (
        "emoji 🙂, 汉字, ß", "a   b    c", "\n\n\n", "<start_of_turn>user\nhi<end_of_turn>", "x" * 60))


def test_vocabulary_matrices_read_in_chunks_change_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedding and the output projection are read a chunk of rows at a time, the output quantized to 8-bit
    blocks as it is read (peak memory: a float32 copy of either can outweigh the file): the logits are those of the
    same export from whole tensors quantized by onnxruntime's quantizer, bit for bit."""
    from edgespec.export.onnx import gguf_source
    from edgespec.export.onnx.export import export_onnx

    gguf = tiny_gguf(tmp_path / "tiny.gguf", "llama3", smollm2_vocabulary=False)  # F32: nothing carried
    logits = {}
    for chunked in (True, False):
        with monkeypatch.context() as m:
            if chunked:
                m.setattr(gguf_source, "ROWS_AT_A_TIME", 100)  # 268 rows: three chunks
            else:
                m.setattr(gguf_source.GgufWeights, "table", lambda self, name, dtype: self(name).astype(dtype))
                m.setattr(gguf_source.GgufWeights, "blocks_8bit", lambda self, name: self(name))
            export_onnx(gguf, tmp_path / str(chunked), "gguf", context_length=256, progress=False, products="nbits")
        logits[chunked] = OnnxReference(tmp_path / str(chunked)).logits(list(range(3, 120)))
    assert np.array_equal(logits[True], logits[False])
