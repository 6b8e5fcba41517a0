"""Skip-set calibration and the command line on the real SmolLM2 ONNX export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec.backends.onnx.manifest import MANIFEST
from edgespec.backends.onnx.model import OnnxModel, OnnxOptions
from edgespec.cli.main import main
from edgespec.engine.engine import Engine
from edgespec.errors import EdgespecError
from edgespec.tuning.skip_search import SkipSearchResult, expected_speedup, save_to_manifest, search_skip_set
from tests.conftest import onnx_export_dir


def test_expected_speedup_model() -> None:
    verify = np.linspace(1.0, 2.0, 10)
    assert expected_speedup(0.0, 0.5, verify) == (1.0, 0)  # a draft that is never right never pays
    speedup, gamma = expected_speedup(0.9, 0.1, verify)
    assert speedup > 2.0 and gamma >= 3
    assert expected_speedup(0.8, 0.8, verify)[0] < expected_speedup(0.8, 0.4, verify)[0]  # dearer draft, less gain


def test_calibration_finds_and_stores_a_skip_set(onnx_engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(EdgespecError, match="fuse_layers=False"):  # fused segments cannot run any subset
        search_skip_set(onnx_engine.target, n_tokens=1)  # type: ignore[arg-type]
    model = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, n_ctx=512, fuse_layers=False))
    prompt = model.tokenize("The three primary colours are")
    result = search_skip_set(model, prompts=[prompt], n_tokens=12, candidates_per_round=2, max_skip=3)
    assert 1 <= len(result.skip) <= 3 and all(0 <= i < model.n_layer for i in result.skip)
    assert 0.0 <= result.agreement <= 1.0 and 0.0 < result.cost_ratio < 1.0
    assert len(result.tried) >= model.n_layer  # every layer was scored alone first
    # A fresh model directory gets the set in its manifest and uses it by default.
    folder = _linked_copy(model.path, tmp_path)
    save_to_manifest(folder, result)
    assert json.loads((folder / MANIFEST).read_text())["layer_skip"]["skip"] == result.skip
    view = OnnxModel(folder, OnnxOptions(n_threads=1, n_ctx=64)).self_draft()
    assert view.skip == result.skip and view.calibrated == (round(result.agreement, 4), round(result.cost_ratio, 4))
    # Another set than the calibrated one has no calibration to start from.
    other = [i for i in range(model.n_layer) if i not in result.skip][:1]
    assert OnnxModel(folder, OnnxOptions(n_threads=1, n_ctx=64, layer_skip=other)).self_draft().calibrated is None


def test_a_calibrated_draft_that_cannot_pay_is_declined_from_the_start(tmp_path: Path) -> None:
    """A self-draft whose calibration says it agrees rarely and costs nearly a full pass is not tried
    (beyond the controller's occasional exploration), and the output stays the target's."""
    folder = _linked_copy(onnx_export_dir(), tmp_path)
    save_to_manifest(folder, SkipSearchResult(skip=[3], agreement=0.3, cost_ratio=0.97, expected_speedup=1.0,
                                             gamma=0))
    engine = edgespec.load(folder, mode="layerskip", n_ctx=512, n_threads=1, tuning=False)
    try:
        prompt = engine.tokenize("List the planets of the solar system in order:")
        out = engine.generate(prompt, max_tokens=24)
        assert out.stats.drafted <= 1, out.stats  # 24 steps: at most one exploratory draft token
        assert out.tokens == engine.generate(prompt, max_tokens=24, mode="none").tokens
    finally:
        engine.close()


def _linked_copy(model_dir: Path, tmp_path: Path) -> Path:
    """A model directory whose manifest can be edited: the manifest copied, the graphs linked."""
    folder = tmp_path / "m"
    folder.mkdir()
    for f in model_dir.iterdir():
        if f.name == MANIFEST:
            (folder / f.name).write_bytes(f.read_bytes())
        else:
            (folder / f.name).symlink_to(f)
    return folder


def test_cli_generate_layerskip_on_onnx(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["generate", "List three fruits:", "--model", str(onnx_export_dir()), "--draft", "hybrid",
               "--gamma", "2", "--max-tokens", "12", "--threads", "1", "--ctx", "256", "--json", "--compare"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["compare"]["identical"] is True and report["stats"]["mode"] == "hybrid"


def test_cli_layerskip_needs_onnx(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "Hi", "--draft", "layerskip", "--max-tokens", "2", "--threads", "1"]) == 2
    assert "cannot skip layers" in capsys.readouterr().err
