"""Hugging Face folder → GGUF with edgespec's own writer, checked by a round trip through transformers:
GGUF (F16) → HF folder (export/gguf/hf.py) → GGUF (F16) must give the source's tensors and greedy output."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from edgespec.export.gguf import ggufio
from edgespec.export.gguf.hf import SOURCE_RECORD, drop_stale, gguf_to_hf

import edgespec
from edgespec.catalog.models import families
from edgespec.cli.main import main
from edgespec.export import quality
from edgespec.identity import file_identity


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """The source F16 GGUF, its HF folder, and a private EDGESPEC_HOME (the folder's GGUF is cached there
    once for the module)."""
    source = families()["smollm2-135m"].prepare("f16")
    work = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGESPEC_HOME", str(work / "home"))
        yield source, gguf_to_hf(source, work / "smollm2-hf", "float16"), work


def test_hf_folder_to_gguf_round_trip(round_trip: tuple[Path, Path, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    source, folder, _ = round_trip
    out = tmp_path / "back.gguf"
    assert main(["export", "gguf", str(folder), "--quant", "f16", "--out", str(out), "--no-quality", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["architecture"] == "llama" and entry["n_layers"] == 30
    # Every tensor comes back bit for bit (Q/K rows permuted back into llama.cpp's RoPE layout).
    back = {t.name: t for t in ggufio.reader(out).tensors}
    for t in ggufio.reader(source).tensors:
        assert back[t.name].tensor_type == t.tensor_type and np.array_equal(back[t.name].data, t.data), t.name
    src_engine = edgespec.load(source, n_ctx=1024, n_threads=1)
    back_engine = edgespec.load(out, n_ctx=1024, n_threads=1)
    try:
        assert back_engine.chat_template is not None
        for text in quality.prompts(2):  # no digits in these two: see docs/export.md on SmolLM2's digit splitting
            messages = [{"role": "user", "content": text}]
            prompt = src_engine.chat_tokens(messages)
            assert back_engine.chat_tokens(messages) == prompt
            assert (back_engine.generate(prompt, max_tokens=24, mode="none").tokens
                    == src_engine.generate(prompt, max_tokens=24, mode="none").tokens)
    finally:
        src_engine.close()
        back_engine.close()


def test_hf_folder_to_q8_0(round_trip: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, folder, _ = round_trip
    out = tmp_path / "q8.gguf"
    assert main(["export", "gguf", str(folder), "--quant", "q8_0", "--out", str(out), "--no-quality"]) == 0
    engine = edgespec.load(out, n_ctx=512, n_threads=1)
    try:
        assert engine.generate("The capital of France is", max_tokens=8, mode="none").tokens
    finally:
        engine.close()


def test_hf_folder_errors(round_trip: tuple[Path, Path, Path], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    _, folder, _ = round_trip
    bad = tmp_path / "bert"
    bad.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    assert main(["export", "gguf", str(bad), "--quant", "f16", "--out", str(tmp_path / "o.gguf")]) == 2
    assert "architecture 'bert' is not supported" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["export", "gguf", str(tmp_path / "empty"), "--quant", "f16", "--out", str(tmp_path / "o.gguf")]) == 2
    assert "no config.json" in capsys.readouterr().err


@pytest.mark.slow
def test_gemma3_hf_folder_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = families()["gemma3-270m"].prepare("f16")
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    folder = gguf_to_hf(source, tmp_path / "gemma-hf", "float32")
    out = tmp_path / "back.gguf"
    assert main(["export", "gguf", str(folder), "--quant", "f16", "--out", str(out), "--no-quality"]) == 0
    back_reader = ggufio.reader(out)
    back = {t.name: t for t in back_reader.tensors}
    for t in ggufio.reader(source).tensors:
        got = back[t.name]
        assert got.tensor_type == t.tensor_type, t.name
        if t.name.endswith("norm.weight"):  # stored as 1 + w; transformers subtracted the 1, we add it back
            np.testing.assert_allclose(got.data, t.data, rtol=1e-6, atol=0)
        else:
            assert np.array_equal(got.data, t.data), t.name
    # The sliding-window layers are written explicitly and match llama.cpp's rule for the source.
    assert ggufio.sliding_window_layers(back_reader) == ggufio.sliding_window_layers(ggufio.reader(source))
    src_engine = edgespec.load(source, n_ctx=1024, n_threads=1)
    back_engine = edgespec.load(out, n_ctx=1024, n_threads=1)
    try:
        for text in [*quality.prompts(3), "Hello world!\n\n  Numbers 12345, code: def f(x): return x**2"]:
            prompt = src_engine.tokenize(text)
            assert back_engine.tokenize(text) == prompt
        for text in quality.prompts(2):
            prompt = src_engine.tokenize(text)
            assert (back_engine.generate(prompt, max_tokens=16, mode="none").tokens
                    == src_engine.generate(prompt, max_tokens=16, mode="none").tokens)
    finally:
        src_engine.close()
        back_engine.close()


def test_conversions_of_replaced_or_removed_ggufs_are_dropped(round_trip: tuple[Path, Path, Path],
                                                              tmp_path: Path) -> None:
    """The cache of conversions (hf_folder) drops those whose GGUF was replaced under its path or removed, each as
    large as the model in float32 or 16 bits, and keeps current ones and folders it did not write."""
    source, folder, _ = round_trip
    assert json.loads((folder / SOURCE_RECORD).read_text()) == file_identity(source)
    cache, ggufs = tmp_path / "hf", tmp_path / "ggufs"
    ggufs.mkdir()
    for name in ("kept", "replaced", "removed", "unrecorded"):
        gguf = ggufs / f"{name}.gguf"
        shutil.copyfile(source, gguf)
        (cache / name).mkdir(parents=True)
        shutil.copyfile(folder / "config.json", cache / name / "config.json")
        if name != "unrecorded":
            (cache / name / SOURCE_RECORD).write_text(json.dumps(file_identity(gguf)))
    with (ggufs / "replaced.gguf").open("ab") as f:  # a new download under the same name
        f.write(b"\0" * 32)
    (ggufs / "removed.gguf").unlink()
    drop_stale(cache)
    assert sorted(p.name for p in cache.iterdir()) == ["kept", "unrecorded"]

