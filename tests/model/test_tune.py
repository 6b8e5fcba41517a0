"""`edgespec tune --quick` on the default model writes a tuning file that edgespec.load then uses."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec.cli.main import main
from edgespec.controller.cost import MAX_GAMMA
from edgespec.identity import file_identity
from edgespec.tuning.store import tuning_dir
from tests.conftest import onnx_export_dir


def test_tune_writes_what_the_engine_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))  # its own cache: the model is prepared there too
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    assert main(["tune", "--quick", "--threads", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (path,) = tuning_dir().glob("*.json")
    assert report["path"] == str(path) and path.is_relative_to(tmp_path)
    assert report["mode"] in ("none", "ngram") and report["expected_speedup"] > 0
    candidates = report["details"]["candidates"]
    assert {(c["mode"], c["gamma"]) for c in candidates} >= {("none", 0), ("ngram", "auto")}
    assert all(c["identical"] == c["generations"] for c in candidates)  # greedy: every candidate is lossless
    assert report["details"]["calibration_set"].endswith("(built-in, not from Spec-Bench)")

    engine = edgespec.load("smollm2-135m", n_threads=1)  # named: without a model, load() measures the default
    try:
        tuned = engine.tuning
        assert tuned is not None and tuned.key == report["key"]
        assert engine.mode == tuned.mode and engine.gamma == tuned.gamma  # the defaults it chose
        calibrations = []
        calibrate = engine.calibrate
        engine.calibrate = lambda *a, **k: calibrations.append(1) or calibrate(*a, **k)  # type: ignore[method-assign]
        controller = engine._get_controller()
        assert np.array_equal(controller.curve.shape, np.array(tuned.curve_shape))
        assert controller.curve.scale == tuned.curve_scale
        assert controller.acceptance("ngram", 3)[0] == pytest.approx(tuned.acceptance["ngram"][0])
        prompt = engine.chat_tokens([{"role": "user", "content": "Repeat twice: the quick brown fox jumps."}])
        out = engine.generate(prompt, max_tokens=24, mode="ngram", gamma="auto")
        assert calibrations == []  # the tuning replaced the start-up calibration
        assert out.tokens == engine.generate(prompt, max_tokens=24, mode="none").tokens
    finally:
        engine.close()

    assert main(["tune", "--show", "--threads", "1"]) == 0
    assert f"mode {tuned.mode}, γ {tuned.gamma}" in capsys.readouterr().out
    other = edgespec.load("smollm2-135m", n_threads=2, mode="none")  # another thread count: another tuning (none here)
    assert other.tuning is None
    other.close()
    monkeypatch.setenv("EDGESPEC_TUNING", "off")
    assert main(["tune", "--show", "--threads", "1"]) == 2
    assert "EDGESPEC_TUNING is off" in capsys.readouterr().err


def test_an_untuned_engine_keeps_its_calibration_for_the_next_process(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a tuning, the first γ-auto request calibrates the verify-cost curve (~3 s of its reply) and keeps it;
    the next engine on the same file, threads and device starts from it. Tunings off: each measures its own."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    prompt = "Repeat twice: the quick brown fox jumps."
    first = edgespec.load("smollm2-135m", n_threads=1, n_ctx=512)
    try:
        assert first.tuning is None and first.stored_curve is not None
        first.generate(prompt, max_tokens=4)
    finally:
        first.close()
    stored = first.stored_curve.read()
    assert stored is not None and stored.scale > 0 and len(stored.shape) == MAX_GAMMA + 2

    second = edgespec.load("smollm2-135m", n_threads=1, n_ctx=512)
    try:
        monkeypatch.setattr(second, "calibrate", lambda *a, **k: pytest.fail("the stored curve was not used"))
        curve = second._get_controller().curve
        assert np.array_equal(curve.shape, stored.shape) and curve.scale == stored.scale
        out = second.generate(prompt, max_tokens=12)
        assert out.tokens == second.generate(prompt, max_tokens=12, mode="none").tokens
    finally:
        second.close()
    monkeypatch.setenv("EDGESPEC_TUNING", "off")
    untuned = edgespec.load("smollm2-135m", n_threads=1, n_ctx=512)
    assert untuned.stored_curve is None
    untuned.close()


def test_a_stored_curve_that_cannot_serve_is_measured_again(tmp_path: Path) -> None:
    """Corrupt, another format, another γ range, a zero scale: read() gives None and the engine calibrates."""
    from edgespec.controller.cost import CostCurve
    from edgespec.tuning.store import StoredCurve

    stored = StoredCurve(tmp_path / "curve.json")
    assert stored.read() is None  # none yet
    curve = CostCurve(shape=np.array([np.nan, *np.linspace(1.0, 5.0, MAX_GAMMA + 1)]), scale=0.01)
    stored.write(curve)
    back = stored.read()
    assert back is not None and np.array_equal(back.shape[1:], curve.shape[1:]) and back.scale == curve.scale
    good = json.loads(stored.path.read_text())
    for bad in ("{not json", json.dumps([1, 2]), json.dumps({**good, "format": 0}),
                json.dumps({**good, "shape": good["shape"][:5]}), json.dumps({**good, "scale": 0.0})):
        stored.path.write_text(bad)
        assert stored.read() is None, bad


def test_a_model_directory_is_identified_by_its_files(tmp_path: Path) -> None:
    """An ONNX export is a directory: rewriting one graph or the manifest inside it makes its tuning stale."""
    (tmp_path / "layer_00.onnx").write_bytes(b"x" * 10)
    (tmp_path / "edgespec-onnx.json").write_text("{}")
    before = file_identity(tmp_path)
    assert before["size"] == 12
    time.sleep(0.01)
    (tmp_path / "layer_00.onnx").write_bytes(b"y" * 10)  # same size, same directory entries: only the time moves
    assert file_identity(tmp_path) != before


def test_tune_an_onnx_model_races_the_self_draft_modes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """On an ONNX export, tune measures the layer-skip draft too and races layer-skip and hybrid."""
    model_dir = onnx_export_dir()  # before EDGESPEC_HOME moves: the export lives in the usual cache
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    assert main(["tune", str(model_dir), "--quick", "--threads", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["acceptance"]) == {"ngram", "layerskip"} and report["draft_cost_s"]["layerskip"] > 0
    candidates = report["details"]["candidates"]
    assert {(c["mode"], c["gamma"]) for c in candidates} >= {("none", 0), ("ngram", "auto"), ("layerskip", "auto"),
                                                              ("hybrid", "auto")}
    assert all(c["identical"] == c["generations"] for c in candidates)
    engine = edgespec.load(model_dir, n_threads=1, n_ctx=1024)
    try:
        assert engine.tuning is not None and engine.tuning.key == report["key"] and engine.mode == report["mode"]
    finally:
        engine.close()
