"""benchmarks/synthetic_gguf.py: its random models of real shapes load in llama.cpp (through
edgespec's backend and engine) and in the GGUF → ONNX exporter. Cut to one or two layers (and a small vocabulary
for the big shapes) to stay quick; the tool runs as its command line, without edgespec."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel

TOOL = Path(__file__).resolve().parents[2] / "benchmarks" / "synthetic_gguf.py"
TEXT = "the thin one on the table: 12 apples"
STREAMS = TOOL.parents[0] / "reference" / "replay_streams-smollm2-q4_0-128tok.jsonl"
# Running the tool's main in a fresh interpreter, then checking it imported nothing of edgespec (the lead runs it
# on machines where only numpy, gguf and llama-cpp-python are installed).
STANDALONE = ("import runpy, sys; sys.argv = [{tool!r}, *sys.argv[1:]]\n"
              "try:\n    runpy.run_path({tool!r}, run_name='__main__')\n"
              "except SystemExit as e:\n    assert not e.code, e.code\n"
              "assert not [m for m in sys.modules if m.startswith('edgespec')], 'imported edgespec'\n")


def synthesize(out: Path, *args: str) -> Path:
    done = subprocess.run([sys.executable, "-c", STANDALONE.format(tool=str(TOOL)), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M's shape, two layers, Q8_0 (a type the ONNX exporter carries as it is)."""
    return synthesize(tmp_path_factory.mktemp("synthetic") / "smol.gguf",
                      "--shape", "smollm2-135m", "--quant", "q8_0", "--layers", "2")


@pytest.fixture(scope="module")
def llama1b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama-3.2-1B's shape as users have the file (rope_freqs, llama-bpe), one layer, a small vocabulary,
    Q4_K_M."""
    return synthesize(tmp_path_factory.mktemp("synthetic") / "llama1b.gguf", "--shape", "llama-3.2-1b", "--quant",
                      "q4_k_m", "--layers", "1", "--vocab", "1024", "--threads", "2")


def greedy(path: Path, steps: int) -> tuple[list[int], np.ndarray]:
    """The prompt's ids and the logits of ``steps`` greedy one-token decoding steps after it, in llama.cpp."""
    model = LlamaModel(path, ContextOptions(n_ctx=128, n_threads=2))
    try:
        ids = model.tokenize(TEXT, add_special=False)
        rows = [model.decode(ids, 0, 1)[-1].copy()]
        for i in range(steps - 1):
            rows.append(model.decode([int(rows[-1].argmax())], len(ids) + i, 1)[-1].copy())
        return ids, np.array(rows)
    finally:
        model.close()


def test_real_vocabulary_and_layers(smol: Path) -> None:
    model = LlamaModel(smol, ContextOptions(n_ctx=64, n_threads=1))
    try:
        assert (model.n_vocab, model.n_layer) == (49152, 2)
        assert model.tokenize(TEXT, add_special=False)  # the synthetic byte-level tokenizer works
        assert model.chat_template is not None
    finally:
        model.close()


@pytest.mark.parametrize(("shape", "quant"), [("llama-3.2-1b", "q4_k_m"), ("qwen2.5-7b", "q4_0")])
def test_big_shapes_cut_to_one_layer_decode(tmp_path: Path, shape: str, quant: str) -> None:
    """The real hidden sizes, heads and FFN widths (Llama 3.x's RoPE factors, Qwen2's q/k/v biases) load and
    decode to finite logits that vary with the input; one layer and 1024 tokens keep it to seconds."""
    path = synthesize(tmp_path / f"{shape}.gguf", "--shape", shape, "--quant", quant, "--layers", "1",
                      "--vocab", "1024", "--threads", "2")
    _, logits = greedy(path, 4)
    assert logits.shape == (4, 1024) and np.isfinite(logits).all()
    assert len({row.tobytes() for row in logits}) == 4


def test_llama3_rope_factors_go_back_into_the_hf_config(llama1b: Path, tmp_path: Path) -> None:
    """The Hugging Face folder of a Llama 3.x GGUF (onnxruntime-genai's builder, the quality report read it) gets
    the llama3 RoPE scaling its rope_freqs came from: transformers' frequencies are then the file's; factors no
    llama3 scaling gives are refused."""
    transformers = pytest.importorskip("transformers")
    from edgespec.export.gguf.ggufio import reader
    from edgespec.export.gguf.hf import llama3_rope
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from edgespec.export import UnsupportedArchitectureError
    from tests.tiny_gguf import tiny_gguf

    config = transformers.AutoConfig.from_pretrained(llama1b.parent, gguf_file=llama1b.name)
    config.rope_parameters = llama3_rope(llama1b, config)
    assert config.rope_parameters["factor"] == 32.0
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
    [factors] = [t.data for t in reader(llama1b).tensors if t.name == "rope_freqs.weight"]
    plain = 500000.0 ** -(np.arange(0, 64, 2) / 64)
    assert np.allclose(inv_freq.numpy(), plain / factors, rtol=1e-6)
    other = tiny_gguf(tmp_path / "llama3.gguf", "llama3", smollm2_vocabulary=False)  # factors 1 to 8, evenly
    with pytest.raises(UnsupportedArchitectureError, match="are not Llama 3"):
        llama3_rope(other, transformers.AutoConfig.from_pretrained(other.parent, gguf_file=other.name))


def test_engine_decodes_it(smol: Path) -> None:
    engine = edgespec.load(str(smol), mode="none", n_ctx=128, n_threads=2, tuning=False)
    try:
        result = engine.chat([{"role": "user", "content": TEXT}], max_tokens=8)  # the file's ChatML template
        assert len(result.tokens) == 8 or engine.target.is_eog(result.tokens[-1])
    finally:
        engine.close()


def test_onnx_export_follows_llama_cpp(smol: Path, tmp_path: Path) -> None:
    """The GGUF → ONNX exporter reads the file (its Q8_0 blocks carried, its tokenizer written) and computes the
    same model: llama.cpp's greedy token at most positions (not bit-identical: each rounds activations its own
    way, see test_export_gguf_onnx)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    pytest.importorskip("tokenizers")
    from edgespec.export.onnx.export import export_onnx
    from edgespec.export.onnx.reference import OnnxReference

    export_onnx(smol, tmp_path / "onnx", context_length=128, progress=False)
    ids, expected = greedy(smol, 6)
    tokens = [*ids, *(int(row.argmax()) for row in expected[:-1])]
    got = OnnxReference(tmp_path / "onnx").logits(tokens)[len(ids) - 1:]
    assert got.shape == expected.shape and np.isfinite(got).all()
    assert np.abs(got - expected).mean() < 0.03 * expected.std()  # measured: 1%
    assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.8  # measured: 6 of 6


def test_verify_curve_benchmark_runs_on_it(smol: Path, tmp_path: Path) -> None:
    """benchmarks/verify_curve_sizes.py end to end, cut short: every row count timed at each context, decode and
    prefill speeds, memory, and its files written (timings are not checked: a shared machine)."""
    import runpy

    bench = runpy.run_path(str(TOOL.with_name("verify_curve_sizes.py")))
    assert bench["main"]([str(smol), "--rounds", "2", "--contexts", "16", "40", "--decode-tokens", "4",
                          "--prefill-tokens", "32", "--threads", "1", "--label", "test", "--out",
                          str(tmp_path)]) == 0
    [written] = tmp_path.glob("verify_curve_sizes-*-cpu-test.json")
    [model] = json.loads(written.read_text())["models"]
    assert set(model["curves"]) == {"16", "40"}
    for curve in model["curves"].values():
        assert [int(k) for k in curve] == list(bench["ROWS"])
        assert all(len(row["samples_ms"]) == 2 and row["ms"] > 0 for row in curve.values())
        assert curve["1"]["relative"] == 1.0
    assert model["decode"]["tok_s"] > 0 and model["prefill"]["tok_s"] > 0 and model["n_layer"] == 2
    assert model["rss_after_load_mib"] > 0


def test_builds_side_by_side_runs_on_two_copies(smol: Path, tmp_path: Path) -> None:
    """benchmarks/builds_side_by_side.py end to end, cut short, on two copies of one file: every rate measured per
    round, drafted output equal to plain decoding's, a peak RSS per build from its own process (timings are not
    checked: a shared machine)."""
    import runpy
    import shutil

    copy = shutil.copy(smol, tmp_path / "copy.gguf")
    bench = runpy.run_path(str(TOOL.with_name("builds_side_by_side.py")))
    assert bench["main"]([str(smol), str(copy), "--rounds", "2", "--max-tokens", "6", "--threads", "1", "--ctx",
                          "4096", "--label", "test", "--out", str(tmp_path)]) == 0  # its tokenizer: few merges
    [written] = tmp_path.glob("builds_side_by_side-*-1t-test.json")
    models = json.loads(written.read_text())["models"]
    assert list(models) == [str(smol), str(copy)]
    for m in models.values():
        assert len(m["rounds"]["prefill"]) == len(m["rounds"]["plain"]) == len(m["rounds"]["lookup"]) == 2
        assert m["prefill"] > 0 and m["plain"] > 0 and m["lookup"] > 0 and m["head"] is None
        assert m["rounds"]["identical"] == ["3/3", "3/3"]
        assert m["peak_rss_mib"] > 0


def test_replay_takes_acceptance_from_real_outputs_and_costs_from_the_benchmark(tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture[str]
                                                                                ) -> None:
    """`edgespec replay --curve-file`: the real SmolLM2's recorded outputs decide acceptance, a verify_curve_sizes
    result's curves (one model, two contexts) the cost; each curve named MODEL@CONTEXT is replayed."""
    from edgespec.cli.main import main

    result = {"models": [{"path": "/data/llama-3.2-1b-q4_0.gguf", "curves": {
        "128": {"1": {"relative": 1.0}, "2": {"relative": 1.1}, "4": {"relative": 1.3}, "8": {"relative": 2.0}},
        "1024": {"1": {"relative": 1.0}, "2": {"relative": 1.5}, "4": {"relative": 2.5}, "8": {"relative": 5.0}}}}]}
    (tmp_path / "curves.json").write_text(json.dumps(result))
    assert main(["replay", str(STREAMS), "--curve-file", str(tmp_path / "curves.json"), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert set(replayed) == {"llama-3.2-1b-q4_0@128", "llama-3.2-1b-q4_0@1024"}
    cheap, dear = (replayed[f"llama-3.2-1b-q4_0@{c}"]["overall"] for c in ("128", "1024"))
    assert cheap["speedup"] > dear["speedup"]


def test_compare_exports_a_kquant_file_and_times_both_backends(tmp_path: Path) -> None:
    """benchmarks/verify_curve_sizes.py --compare end to end, cut short: Llama-3.2-1B's shape (one layer, a small
    vocabulary, without rope_freqs and naming GPT-2's pre-tokenizer, as the exporter reads today) quantized to
    Q4_K_M by llama.cpp, exported with its K-quant blocks carried, then timed on both backends taking turns, peak
    memory probed per backend; the engine's curve then takes the export directory (timings are not checked)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    pytest.importorskip("tokenizers")
    import runpy

    from edgespec.kernels import library as custom_ops

    if custom_ops.ensure() is None:
        pytest.skip("the kernel library cannot be built here")
    path = synthesize(tmp_path / "llama1b.gguf", "--shape", "llama-3.2-1b", "--quant", "q4_k_m", "--layers", "1",
                      "--vocab", "1024", "--threads", "2", "--no-rope-freqs", "--pre", "gpt-2")
    bench = runpy.run_path(str(TOOL.with_name("verify_curve_sizes.py")))
    out = tmp_path / "results"
    assert bench["main"](["--compare", str(path), "--context", "24", "--rows", "1,2,4", "--rounds", "2", "--runs",
                          "1", "--decode-tokens", "3", "--prefill-tokens", "16", "--label", "test", "--out",
                          str(out)]) == 0
    [written] = out.glob("verify_curve_compare-*-2t-llama1b-test.json")
    result = json.loads(written.read_text())
    assert {"Q4_K", "Q6_K"} <= set(result["gguf"]["types"]) and not result["gguf"]["rope_freqs"]
    assert result["export"]["made"] and result["export"]["path"] == str(tmp_path / "llama1b-onnx")
    assert "BlockKQuantMatMul" in result["export"]["quant_options"]["weights"]
    assert set(result["backends"]) == {"onnx", "llamacpp"}
    for backend in result["backends"].values():
        assert [int(k) for k in backend["verify"]] == [1, 2, 4] and backend["verify"]["1"]["relative"] == 1.0
        assert all(len(row["samples_ms"]) == 2 and row["ms"] > 0 for row in backend["verify"].values())
        assert backend["decode"]["tok_s"] > 0 and backend["prefill"]["tok_s"] > 0
        assert backend["decode"]["step_ms_median"] > 0
        assert backend["memory"]["rss_peak_mib"] >= backend["memory"]["rss_after_load_mib"] > 0
        assert backend["exactness"]["exact"]
    assert result["agreement"]["llamacpp"]["max_abs_diff"] < 0.5 * result["agreement"]["llamacpp"]["logit_std"]

    assert bench["main"]([result["export"]["path"], "--rounds", "1", "--contexts", "8", "--decode-tokens", "3",
                          "--prefill-tokens", "8", "--threads", "2", "--label", "onnx", "--out", str(out)]) == 0
    [written] = out.glob("verify_curve_sizes-*-cpu-onnx.json")
    [model] = json.loads(written.read_text())["models"]
    assert model["backend"] == "onnx" and model["n_layer"] == 1 and model["decode"]["tok_s"] > 0


@pytest.mark.slow
def test_compare_builds_and_times_the_genai_peer(llama1b: Path, tmp_path: Path) -> None:
    """--compare with onnxruntime-genai as a plain-decoding peer beside llama.cpp on the same (Llama 3.x) file:
    its INT4 model built once through the file's Hugging Face folder (its build recorded beside it, then reused),
    timed in the same turns, its peak memory probed, its logits the file's model's (timings are not checked)."""
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    import runpy

    bench = runpy.run_path(str(TOOL.with_name("verify_curve_sizes.py")))
    out, folder = tmp_path / "results", tmp_path / "genai"
    common = ["--compare", str(llama1b), "--genai-to", str(folder), "--context", "24", "--rows", "1,2", "--rounds",
              "2", "--runs", "1", "--decode-tokens", "3", "--prefill-tokens", "16", "--out", str(out)]
    assert bench["main"]([*common, "--backends", "llamacpp,genai", "--label", "built"]) == 0
    [written] = out.glob("verify_curve_compare-*-built.json")
    result = json.loads(written.read_text())
    genai, build = result["genai"], result["genai"]["build"]
    assert genai["made"] and genai["path"] == str(folder) and result["export"] is None
    assert (genai["quant"], genai["block_size"], genai["accuracy_level"]) == ("int4", 32, 4)
    assert build["source"]["gguf"] == str(llama1b.resolve()) and build["seconds"] > 0 and build["peak_rss_mib"] > 0
    peer = result["backends"]["genai"]
    assert peer["backend"] == "onnxruntime-genai" and peer["exactness"] is None
    assert [int(k) for k in peer["verify"]] == [1, 2] and all(len(r["samples_ms"]) == 2 for r in
                                                               peer["verify"].values())
    assert peer["decode"]["tok_s"] > 0 and peer["prefill"]["tok_s"] > 0
    assert peer["memory"]["rss_peak_mib"] >= peer["memory"]["rss_after_load_mib"] > 0
    assert result["agreement"]["genai"]["correlation"] > 0.8  # re-quantized to INT4: measured 0.94-0.95

    assert bench["main"]([*common, "--backends", "genai", "--no-memory", "--label", "reused"]) == 0
    [written] = out.glob("verify_curve_compare-*-reused.json")
    again = json.loads(written.read_text())["genai"]
    assert not again["made"] and again["build"] == build


@pytest.mark.slow
def test_bench_runs_llama_cpp_and_the_genai_peer_on_a_users_file(llama1b: Path, tmp_path: Path,
                                                                 spec_bench_file: Path) -> None:
    """`edgespec bench --model FILE.gguf` on a file of one's own (here with a 1024-token vocabulary): llama.cpp's
    plain decoding and onnxruntime-genai's on its INT4 build of the file answer every turn."""
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    from edgespec.cli.main import main

    genai = tmp_path / "genai"
    assert main(["export", "onnx", str(llama1b), "--format", "genai", "--quant", "int4", "--out", str(genai)]) == 0
    assert main(["bench", "--model", str(llama1b), "--configs", "lcpp-plain,ortg-plain", "--ort-genai-model",
                 str(genai), "--questions", str(spec_bench_file), "--limit", "1", "--max-tokens", "4", "--threads",
                 "2", "--no-plots", "--out", str(tmp_path)]) == 0
    [written] = tmp_path.glob("spec_bench-*.json")
    result = json.loads(written.read_text())
    assert [c["name"] for c in result["configs"]] == ["target", "lcpp-plain", "ortg-plain"]
    records = result["records"]
    for name in ("lcpp-plain", "ortg-plain"):
        mine = [r for r in records if r["config"] == name]
        assert mine and len(mine) == len([r for r in records if r["config"] == "target"])
        assert all(r["n_tokens"] > 0 for r in mine)
