"""The default model: fixed with tuning off (as in every other test), measured and cached with tuning on."""

from __future__ import annotations

from pathlib import Path

import pytest

import edgespec
from edgespec.bench import choose
from edgespec.bench.choose import Budget, choose_default, table
from edgespec.default_model import choice_key
from edgespec.models import DEFAULT_MAX_KL, DEFAULT_MIN_TOP1, families
from edgespec.tuning import default_choice_path


def test_with_tuning_off_the_default_is_the_shipped_weights_with_ngram_auto() -> None:
    family = families()["smollm2-135m"]
    assert family.default_quant == "q4_1" == family.source_quant
    engine = edgespec.load(n_ctx=512, n_threads=1)
    try:
        assert engine.target.path == family.source_path()
        assert engine.mode == "ngram" and engine.gamma == "auto"
    finally:
        engine.close()


def test_only_variants_that_pass_the_quality_bar_are_candidates() -> None:
    family = families()["smollm2-135m"]
    candidates = family.default_candidates()
    assert candidates[0] == "q4_1" and "q4_0" not in candidates and "q4_k_m" not in candidates
    for quant in candidates[1:]:
        top1, kl = family.quality[quant]
        assert top1 >= DEFAULT_MIN_TOP1 and kl <= DEFAULT_MAX_KL


def test_the_choice_is_measured_once_stored_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))  # variants, verdicts and the choice land here
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    key = choice_key(1, "cpu")
    assert key is not None
    said: list[str] = []
    # The ONNX candidate is asked for (onnxruntime is installed) but not exported here: test_onnx_export does that.
    monkeypatch.setattr(choose, "onnx_candidate", lambda *_: (None, "not exported in this test"))
    choice = choose_default(families()["smollm2-135m"], key, 1, "cpu", Budget(prompts=2, max_tokens=12),
                            say=said.append)
    assert choice.skipped.pop("onnx int8") == "not exported in this test"
    raced = {r["target"] for r in choice.candidates}
    assert raced | set(choice.skipped) == {f"smollm2-135m:{q}" for q in key["candidates"]}  # each raced or skipped
    assert {(r["mode"], r["gamma"]) for r in choice.candidates} == {("none", 0), ("ngram", "auto")}
    best = min((r for r in choice.candidates), key=lambda r: r["reply_s"])
    assert (choice.target, choice.mode) == (best["target"], best["mode"])  # every row here is lossless
    for r in choice.candidates:  # the first text is the document: prefill is part of what a user waits for
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0
        expected = choose.reply_seconds(r, r["prompt_tokens"], 2, 12)
        assert r["reply_s"] == pytest.approx(expected, abs=0.01)
    assert all(r["identical"] == "2/2" for r in choice.candidates)
    assert default_choice_path(key).is_file() and any("edgespec: default = " in line for line in said)
    assert table(choice)[-1] == said[-2]

    def measure_again(*_: object, **__: object) -> None:
        raise AssertionError("the stored choice should have been used")

    monkeypatch.setattr(choose, "choose_default", measure_again)
    engine = edgespec.load(n_threads=1, n_ctx=512)
    try:
        assert engine.target.path == families()["smollm2-135m"].prepare(choice.target.partition(":")[2])
        assert engine.mode == choice.mode
        # Its γ-auto race run calibrated the verify-cost curve: the first reply after the race starts from it.
        monkeypatch.setattr(engine, "calibrate", lambda *a, **k: pytest.fail("calibrated again after the race"))
        assert engine.generate("Hello", max_tokens=2, mode="ngram", gamma="auto").tokens
    finally:
        engine.close()
