"""Layer-skip drafts on the real models: exactly the requested layers, the same logits written two ways,
Gemma 3's sliding-window layers kept as they were, lossless speculation, and the layer search."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from edgespec.export.draft.layers import format_layers, parse_layers, write_draft, write_draft_reference
from edgespec.export.draft.search import search
from edgespec.export.gguf import ggufio

import edgespec
from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel
from edgespec.catalog.models import families, quantize
from edgespec.cli.main import main
from edgespec.export import quality

SMOL_KEEP = "0-11,20-29"
GEMMA_KEEP = [0, 1, 2, 5, 6, 7, 11, 12, 16, 17]  # breaks gemma3's 5-local-1-global period on purpose


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return families()["smollm2-135m"].prepare("q4_0")


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _logits(path: Path, text: str) -> np.ndarray:
    model = LlamaModel(path, ContextOptions(n_ctx=256, n_threads=1))
    try:
        tokens = model.tokenize(text)
        return model.decode(tokens, 0, len(tokens)).copy()
    finally:
        model.close()


def test_layer_specs() -> None:
    assert parse_layers(SMOL_KEEP, 30) == [*range(12), *range(20, 30)]
    assert parse_layers("3, 1-2,2", 4) == [1, 2, 3]
    assert format_layers([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_draft_keeps_requested_layers_and_matches_reference(smollm2: Path, tmp_path: Path) -> None:
    keep = parse_layers(SMOL_KEEP, 30)
    ours, ref = tmp_path / "llama.gguf", tmp_path / "ref.gguf"
    write_draft(smollm2, ours, keep)
    write_draft_reference(smollm2, ref, keep)
    for path in (ours, ref):
        assert ggufio.kept_layers(path, smollm2) == keep  # read back from the tensors' bytes
        assert ggufio.info(path).n_layers == len(keep)
    text = "The quick brown fox jumps over the lazy dog. Once upon a time"
    a, b = _logits(ours, text), _logits(ref, text)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, _logits(smollm2, text))  # 8 layers fewer is another model


def test_draft_loads_in_the_runtime_and_is_lossless(smollm2: Path, tmp_path: Path) -> None:
    draft = tmp_path / "draft.gguf"
    write_draft(smollm2, draft, parse_layers("0-23,27-29", 30))
    engine = edgespec.load(smollm2, draft=draft, n_ctx=1024, n_threads=1, gamma=4)
    try:
        for text in quality.prompts(2):
            prompt = engine.chat_tokens([{"role": "user", "content": text}])
            spec = engine.generate(prompt, max_tokens=32)
            assert spec.tokens == engine.generate(prompt, max_tokens=32, mode="none").tokens
            assert spec.stats.mode == "draft" and spec.stats.drafted > 0
    finally:
        engine.close()


def test_search_ci_sized(smollm2: Path) -> None:
    calls: list[tuple[int, int]] = []
    result = search(smollm2, 30, budget=0.94, n_prompts=1, n_tokens=12, candidates=2, n_threads=1,
                    progress=lambda done, total, _: calls.append((done, total)))
    assert len(result.keep) == 29 and result.evaluated == 2 and calls[-1] == (2, 2)
    removed = result.history[0]["removed"]
    assert removed not in (0, 29) and removed not in result.keep
    assert result.full_agreement == 1.0  # the target agrees with its own greedy tokens (exact numerics)
    assert 0.0 <= result.agreement <= 1.0 and result.history[0]["agreement"] == round(result.agreement, 4)


def test_cli_search_records_set_agreement_and_cost(smollm2: Path, home: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "searched.gguf"
    assert main(["export", "draft", str(smollm2), "--search", "--budget", "0.94", "--candidates", "1",
                 "--search-prompts", "1", "--search-tokens", "8", "--prompts", "1", "--tokens", "8",
                 "--threads", "1", "--out", str(out), "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)
    made, q = entry["made"], entry["quality"]
    assert made["kept_layers"] == ggufio.kept_layers(out, smollm2) == made["search"]["keep"]
    assert len(made["kept_layers"]) == 29 and made["kept_fraction"] == round(29 / 30, 4)
    assert q["cost_ratio"] > 0 and q["lossless"] is True and 0 <= q["acceptance"] <= 1


@pytest.mark.slow
def test_gemma3_draft_keeps_sliding_window_types(tmp_path: Path) -> None:
    gemma = families()["gemma3-270m"].prepare()
    flags = ggufio.sliding_window_layers(ggufio.reader(gemma))
    assert flags == [il % 6 < 5 for il in range(18)]  # llama.cpp's rule for this file: 5 local, 1 global
    ours, ref = tmp_path / "llama.gguf", tmp_path / "ref.gguf"
    write_draft(gemma, ours, GEMMA_KEEP)
    write_draft_reference(gemma, ref, GEMMA_KEEP)
    for path in (ours, ref):
        assert ggufio.kept_layers(path, gemma) == GEMMA_KEEP
        assert ggufio.sliding_window_layers(ggufio.reader(path)) == [flags[il] for il in GEMMA_KEEP]
    text = "The quick brown fox jumps over the lazy dog. Once upon a time"
    draft_logits = _logits(ours, text)
    assert np.array_equal(draft_logits, _logits(ref, text))
    # Without the rewritten flags llama.cpp would give renumbered layers the types of their new index
    # (another attention window and RoPE base): a different, silently broken model.
    unpatched = tmp_path / "unpatched.gguf"
    quantize(gemma, unpatched, None, [il for il in range(18) if il not in GEMMA_KEEP])
    assert not np.array_equal(draft_logits, _logits(unpatched, text))
    # Keeping every layer through the same path reproduces the source exactly.
    full = tmp_path / "full.gguf"
    write_draft(gemma, full, list(range(18)))
    assert np.array_equal(_logits(full, text), _logits(gemma, text))
