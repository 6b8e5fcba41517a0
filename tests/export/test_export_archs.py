"""The edge architectures in the ONNX writer: a tiny random transformers model of each (2 layers, hidden size 64,
SmolLM2's tokenizer) exports to edgespec ONNX (`edgespec export onnx FOLDER --quant fp32`), its logits match
transformers', and greedy speculation (n-gram, layer-skip, hybrid) on the export equals target-only decoding.
docs/models.md's support table cites these."""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from edgespec.export.onnx.export import TOKENIZER_FILES
from edgespec.export.onnx.reference import OnnxReference

import edgespec
from edgespec.cli.main import main
from edgespec.engine.engine import Engine
from tests.conftest import SpecBench, hf_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

CONTEXT = 1024
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=CONTEXT, rms_norm_eps=1e-6)


def _qwen2() -> object:
    config = transformers.Qwen2Config(**SMALL, tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():  # transformers initializes biases to zero: make them count
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def _qwen3() -> object:
    config = transformers.Qwen3Config(**SMALL, head_dim=32, tie_word_embeddings=True)  # ≠ hidden / heads, as in Qwen3
    model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():  # transformers initializes the q/k norms to ones: make them count
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.normal_(1, 0.3)
    return model


def _llama3() -> object:
    # Llama 3's scaling with an original context of 64 positions: every band (kept, interpolated, slowed) occurs
    # at head_dim 16, and the test's 300–600 positions run far past it.
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, rope_parameters=rope))


def _llama_linear() -> object:  # linear RoPE scaling: positions divided by 4
    rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, rope_parameters=rope))


def _phi3() -> object:  # fused qkv and gate_up projections, every layer windowed (64 of the test's 300–600)
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(**SMALL, sliding_window=64, pad_token_id=0))


def _mistral() -> object:  # Llama with every layer windowed
    return transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, sliding_window=64))


def _gemma2() -> object:
    # Soft-capping strong enough to matter: attention scores capped at ±2, logits at ±200 (these reach ~30);
    # alternating sliding (64) and global layers.
    config = transformers.Gemma2Config(**SMALL, head_dim=16, query_pre_attn_scalar=16, sliding_window=64,
                                       attn_logit_softcapping=2.0, final_logit_softcapping=200.0)
    model = transformers.Gemma2ForCausalLM(config)
    with torch.no_grad():  # transformers initializes Gemma's norms to zero (scale 1 + w): make them count
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.3)
    return model


BUILDERS = {"qwen2": _qwen2, "qwen3": _qwen3, "llama3": _llama3, "llama-linear": _llama_linear, "phi3": _phi3,
            "mistral": _mistral, "gemma2": _gemma2}


@pytest.fixture(scope="module")
def tokenizer_folder() -> Path:
    return hf_checkpoint("smollm2-135m")  # converted once from the shipped GGUF, cached in the edgespec cache


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         tokenizer_folder: Path) -> Iterator[tuple[object, Path]]:
    """(transformers model, its fp32 edgespec ONNX export)."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp(request.param)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder)
    model = BUILDERS[request.param]()
    model.config.vocab_size = len(tokenizer)
    model.resize_token_embeddings(len(tokenizer))
    with torch.no_grad():  # far wider logits than the default init: confident argmaxes, so the layer-skip
        model.get_output_embeddings().weight.mul_(100)  # draft (which stops below 0.5) drafts
    model.config.bos_token_id, model.config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    model.eval()
    model.save_pretrained(folder / "hf")
    for name in TOKENIZER_FILES:
        if (tokenizer_folder / name).is_file():
            shutil.copy(tokenizer_folder / name, folder / "hf" / name)
    with contextlib.redirect_stdout(io.StringIO()):  # the command a user runs on such a folder
        assert main(["export", "onnx", str(folder / "hf"), "--quant", "fp32", "--out", str(folder / "onnx"),
                     "--context-length", str(CONTEXT), "--no-quality"]) == 0
    yield model, folder / "onnx"


def _ids(n: int, spec_bench: SpecBench) -> list[int]:
    from tokenizers import Tokenizer

    article = spec_bench(["summarization"])[0]["turns"][0]
    return Tokenizer.from_file(str(hf_checkpoint("smollm2-135m") / "tokenizer.json")).encode(article).ids[:n]


def test_fp32_logits_match_transformers(tiny: tuple[object, Path], spec_bench: SpecBench) -> None:
    model, onnx_dir = tiny
    ids = _ids(300, spec_bench)
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].numpy()  # type: ignore[operator]
    got = OnnxReference(onnx_dir).logits(ids)
    assert np.abs(reference - got).max() < 1e-5 * np.abs(reference).max()  # relative: these logits reach ~100
    assert (reference.argmax(-1) == got.argmax(-1)).all()


@pytest.fixture(scope="module")
def engine(tiny: tuple[object, Path]) -> Iterator[Engine]:
    e = edgespec.load(tiny[1], n_ctx=CONTEXT, n_threads=1, layer_skip=[1])
    yield e
    e.close()


@pytest.mark.parametrize("mode", ["ngram", "layerskip", "hybrid"])
def test_greedy_speculation_equals_target_only(engine: Engine, mode: str, spec_bench: SpecBench) -> None:
    drafted = 0
    for prompt in (engine.tokenize("Monday, Tuesday, Wednesday, Monday, Tuesday,"), _ids(600, spec_bench)):
        expected = engine.generate(prompt, max_tokens=32, mode="none").tokens
        for gamma in (3, "auto"):
            out = engine.generate(prompt, max_tokens=32, mode=mode, gamma=gamma)
            assert out.tokens == expected, f"{mode} γ={gamma}, prompt of {len(prompt)} tokens"
            drafted += out.stats.drafted if gamma == 3 else 0
    if mode != "ngram":
        assert drafted > 0, "nothing was verified speculatively: the test would prove nothing"
