"""`edgespec export gguf` and `export pair` on the real SmolLM2: round trips, manifests, the registry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from edgespec.export.gguf import ggufio

import edgespec
from edgespec.catalog.models import families
from edgespec.cli.main import main
from edgespec.export import manifest, quality


@pytest.fixture(scope="module")
def smollm2() -> dict[str, Path]:
    fam = families()["smollm2-135m"]
    return {q: fam.prepare(q) for q in ("q4_1", "q4_0", "f16")}


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private EDGESPEC_HOME for the export registry (source models are resolved before it applies)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _greedy(path: Path, texts: list[str], n: int = 32) -> list[list[int]]:
    engine = edgespec.load(path, n_ctx=1024, n_threads=1)
    try:
        return [engine.chat([{"role": "user", "content": t}], max_tokens=n, mode="none", gamma=0).tokens
                for t in texts]
    finally:
        engine.close()


def test_f16_export_greedy_equals_source(smollm2: dict[str, Path], home: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "smollm2-f16.gguf"
    rc = main(["export", "gguf", str(smollm2["f16"]), "--quant", "f16", "--out", str(out), "--json",
               "--prompts", "1", "--tokens", "8", "--threads", "1"])
    assert rc == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["artefact"] == str(out.resolve()) and entry["made"]["quant"] == "f16"
    assert entry["quality"]["top1_agreement"] == 1.0 and entry["quality"]["kl_mean"] == 0.0
    texts = quality.prompts(2)
    assert _greedy(out, texts, 16) == _greedy(smollm2["f16"], texts, 16)
    # The manifest beside the file and the registry entry agree, and `edgespec models` lists the artefact.
    assert manifest.load(manifest.manifest_path(out))["artefact"] == entry["artefact"]
    assert [m["artefact"] for m in manifest.exported()] == [entry["artefact"]]
    assert main(["models"]) == 0
    assert str(out.resolve()) in capsys.readouterr().out


def test_requantized_weights_are_the_source_weights(smollm2: dict[str, Path], home: Path, tmp_path: Path) -> None:
    """Q4_1 → F16 changes the storage, not the numbers: every weight is the dequantized source weight,
    rounded to F16. (Greedy output of the two can still differ: llama.cpp's Q4/Q8 kernels quantize the
    activations to 8 bits, its F16 kernels do not — docs/export.md.)"""
    out = tmp_path / "q41-f16.gguf"
    assert main(["export", "gguf", str(smollm2["q4_1"]), "--quant", "f16", "--out", str(out), "--no-quality"]) == 0
    gguf = pytest.importorskip("gguf")
    src = {t.name: t for t in ggufio.reader(smollm2["q4_1"]).tensors}
    checked = 0
    for t in ggufio.reader(out).tensors:
        if t.name.startswith("blk.3.") or t.name == "token_embd.weight":
            expected = gguf.quants.dequantize(src[t.name].data, src[t.name].tensor_type)
            if len(t.shape) > 1:  # weight matrices become F16; norms stay F32
                assert t.tensor_type == gguf.GGMLQuantizationType.F16
                expected = expected.astype(np.float16)
            assert np.array_equal(gguf.quants.dequantize(t.data, t.tensor_type), expected.astype(np.float32))
            checked += 1
    assert checked == 10


def test_q8_0_export_agrees_with_source(smollm2: dict[str, Path], home: Path, tmp_path: Path) -> None:
    from edgespec.export.common import resolve_source
    from edgespec.export.gguf.command import export_gguf

    entry = export_gguf(resolve_source("smollm2-135m:q4_1"), "q8_0", tmp_path / "q8.gguf", 2, 16, threads=1)
    q = entry["quality"]
    assert entry["source"]["name"] == "smollm2-135m:q4_1" and entry["source"]["n_layers"] == 30
    assert q["positions"] == 32 and q["top1_agreement"] >= 0.9 and q["decode_tokens_per_s"] > 0
    assert q["file_bytes"] == (tmp_path / "q8.gguf").stat().st_size


def test_pair_builds_target_and_draft_that_run(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pair"
    assert main(["export", "pair", "smollm2-135m", "--out", str(out), "--prompts", "1", "--tokens", "8",
                 "--threads", "1"]) == 0
    text = capsys.readouterr().out
    pair = json.loads((out / "pair.json").read_text())
    assert pair["mode"] == "draft" and pair["command"] in text and 0 <= pair["acceptance"] <= 1
    target, draft = manifest.load(Path(pair["target"])), manifest.load(Path(pair["draft"]))
    assert target["made"]["quant"] == "q8_0" and draft["made"]["quant"] == "q4_0"
    assert draft["quality"]["lossless"] is True and draft["quality"]["cost_ratio"] > 0
    engine = edgespec.load(target["artefact"], draft=draft["artefact"], n_ctx=1024, n_threads=1, gamma=4)
    try:
        prompt = engine.chat_tokens([{"role": "user", "content": quality.prompts(1)[0]}])
        spec = engine.generate(prompt, max_tokens=24)
        assert spec.tokens == engine.generate(prompt, max_tokens=24, mode="none").tokens
        assert spec.stats.accepted > 0
    finally:
        engine.close()


@pytest.mark.slow
def test_gemma3_pair_end_to_end(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma 3 (sliding window, 262k vocabulary): Q8_0 target + Q4_K_M draft from the shipped weights."""
    out = tmp_path / "gemma-pair"
    assert main(["export", "pair", "gemma3-270m", "--out", str(out), "--prompts", "1", "--tokens", "8",
                 "--threads", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    target, draft = result["target"], result["draft"]
    assert target["architecture"] == draft["architecture"] == "gemma3" and target["n_layers"] == 18
    assert target["source"]["name"] == "gemma3-270m:q4_k_m" and target["quality"]["top1_agreement"] >= 0.75
    assert draft["quality"]["lossless"] is True and draft["quality"]["acceptance"] > 0
