"""GGUF → ONNX for the edge architectures: a tiny random GGUF of each (tests/tiny_gguf.py) goes through
`edgespec export onnx FILE.gguf --quant fp32` (transformers' GGUF loader, which undoes llama.cpp's q/k
permutation, then edgespec's writer), and the export's logits match llama.cpp's on the same file."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
from edgespec.export.gguf.hf import FROM_GGUF
from edgespec.export.onnx.reference import OnnxReference

import edgespec
from edgespec.cli.main import main
from tests.tiny_gguf import tiny_gguf

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

CONTEXT = 512


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3"])
def test_gguf_export_matches_llama_cpp(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))  # the GGUF's HF conversion is cached there
    gguf = tiny_gguf(tmp_path / f"{arch}.gguf", arch, smollm2_vocabulary=False)
    assert arch in FROM_GGUF  # so `edgespec models` calls it exportable
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["export", "onnx", str(gguf), "--quant", "fp32", "--out", str(tmp_path / "onnx"),
                     "--context-length", str(CONTEXT), "--no-quality"]) == 0
    engine = edgespec.load(gguf, mode="none", n_ctx=CONTEXT, n_threads=1)
    try:
        ids = engine.tokenize("The quick brown fox jumps over the lazy dog. " * 12)[:100]
        reference = engine.target.decode(ids, 0, len(ids)).copy()
    finally:
        engine.close()
    got = OnnxReference(tmp_path / "onnx").logits(ids)
    assert np.abs(reference - got).max() < 1e-4 * np.abs(reference).max()
    assert (reference.argmax(-1) == got.argmax(-1)).all()


def test_llama3_gguf_rope_factors_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' GGUF loader drops rope_freqs: the export would compute another model, so it is refused."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    gguf = tiny_gguf(tmp_path / "llama3.gguf", "llama3", smollm2_vocabulary=False)
    assert main(["export", "onnx", str(gguf), "--quant", "fp32", "--out", str(tmp_path / "onnx"),
                 "--no-quality"]) == 2
    assert "rope_freqs" in capsys.readouterr().err and not (tmp_path / "onnx").exists()
