"""A GGUF of the user's own: ``edgespec.load(FILE)`` prepares edgespec's export of its blocks, races it against
llama.cpp on the same file (plain decoding, lookup, token trees), keeps the choice and reads it back; where it cannot
(asked for llama.cpp, an architecture the exporter does not read, a home that cannot be written) the file runs on
llama.cpp as it is, saying why. A tiny random Q4_0 llama (tests/tiny_gguf.py) stands for the user's file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec import home
from edgespec.backends.onnx.manifest import MANIFEST, head_folder
from edgespec.cli.main import main
from edgespec.kernels import library as custom_ops
from edgespec.tuning import own_model
from edgespec.tuning.race import Budget
from edgespec.tuning.store import default_choice_path, find_default_choice
from tests.model.test_home import read_only
from tests.tiny_gguf import N_EMBD, tiny_gguf

pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(custom_ops.ensure() is None, reason="the kernel library cannot be built here")
PROMPT = "List the days of the week: Monday, Tuesday, Wednesday, Monday, Tuesday, Wednesday,"


@pytest.fixture
def tuned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh home with tuning on (the other tests run with it off), a short race, and once-said lines forgotten."""
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(own_model, "budget", lambda _: Budget(prompts=2, max_tokens=16))
    home._said.clear()
    yield tmp_path / "home"
    home._said.clear()


@pytest.fixture
def mine(tmp_path: Path) -> Path:
    return tiny_gguf(tmp_path / "mine.gguf", quant="Q4_0")


def _said(capfd: pytest.CaptureFixture[str]) -> str:
    return capfd.readouterr().err


def test_first_load_prepares_races_and_keeps_the_choice_then_reads_it_back(
        tuned: Path, mine: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    engine = edgespec.load(mine, n_ctx=512, n_threads=1)
    try:
        said = _said(capfd)
        assert "first use on this machine: preparing edgespec's build of it" in said  # said before anything
        assert said.index("preparing") < said.index("  exporting") < said.index("  racing")
        key = own_model.own_key(mine, 1, "cpu")
        choice = find_default_choice(key)
        assert choice is not None and default_choice_path(key).name.startswith("choice-mine-")
        assert f"edgespec: mine runs as {Path(choice.target).name}" in said
        # both candidates raced with plain decoding, lookup and (where their tree rows are exact) token trees
        raced = {(r["backend"], r["mode"]) for r in choice.candidates}
        assert {("llamacpp", "none"), ("llamacpp", "ngram"), ("onnx", "none"), ("onnx", "ngram"),
                ("onnx", "tree")} <= raced
        export = own_model.export_path(mine)
        manifest = json.loads((export / MANIFEST).read_text())
        assert "Q4_0" in manifest["quant_options"]["carried"]  # the file's own blocks, not re-quantized
        assert engine.target.path == Path(choice.target) and engine.mode == choice.mode
        prompt = engine.tokenize(PROMPT)
        assert engine.generate(prompt, max_tokens=24).tokens == engine.generate(prompt, max_tokens=24,
                                                                                mode="none").tokens
    finally:
        engine.close()
    monkeypatch.setattr(own_model, "choose_own", lambda *_, **__: pytest.fail("measured again"))
    again = edgespec.load(mine, n_ctx=512, n_threads=1)
    try:
        assert again.target.path == engine.target.path and again.mode == engine.mode
    finally:
        again.close()
    assert main(["tune", "--default", str(mine), "--show", "--threads", "1"]) == 0
    assert "mine runs as" in capfd.readouterr().out


def test_a_draft_head_trained_for_the_export_changes_the_key(tuned: Path, mine: Path) -> None:
    """A head written beside the file's export (``edgespec export head``) after the race: the choice is made again,
    with the head among the candidates."""
    before = own_model.own_key(mine, 1, "cpu")
    folder = head_folder(own_model.export_path(mine))
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text("{}")
    after = own_model.own_key(mine, 1, "cpu")
    assert after != before and default_choice_path(after) != default_choice_path(before)
    assert own_model.own_key(mine, 1, "cpu") == after  # and stays the same while the head does


def test_the_export_of_a_file_replaced_under_the_same_path_is_removed(tuned: Path, mine: Path) -> None:
    """A new download under the same name: preparing it removes the old one's export (about the file's size),
    not the export of another file that shares the name."""
    exports = tuned / "onnx"
    old, other = exports / "mine-old", exports / "mine-other"
    for folder, src in ((old, mine), (other, mine.parent / "elsewhere" / "mine.gguf")):
        folder.mkdir(parents=True)
        (folder / MANIFEST).write_text(json.dumps({"format": "edgespec-onnx/1", "source": {"src": str(src)}}))
    own_model.drop_replaced(mine.resolve(), own_model.export_path(mine.resolve()))
    assert not old.exists() and other.is_dir()


def test_a_damaged_export_is_made_again(tuned: Path, mine: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The export is the cache's: one that cannot be opened is exported again and the choice measured again."""
    edgespec.load(mine, n_ctx=512, n_threads=1).close()
    choice = find_default_choice(own_model.own_key(mine, 1, "cpu"))
    assert choice is not None
    if choice.backend != "onnx":
        pytest.skip("llama.cpp won the race here: no export is opened")
    graph = next(Path(choice.target).glob("*.onnx"))
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    _said(capfd)
    engine = edgespec.load(mine, n_ctx=512, n_threads=1)
    try:
        assert "cannot be opened" in _said(capfd)
        assert engine.generate(engine.tokenize(PROMPT), max_tokens=8).tokens
    finally:
        engine.close()


def test_asked_for_llamacpp_the_file_runs_as_it_is(tuned: Path, mine: Path) -> None:
    engine = edgespec.load(mine, backend="llamacpp", n_ctx=512, n_threads=1)
    try:
        assert engine.target.path == mine.resolve()
    finally:
        engine.close()
    assert not (tuned / "onnx").exists() and not list(tuned.glob("tuning/choice-*"))


def test_a_file_the_exporter_does_not_read_runs_on_llamacpp_saying_why(
        tuned: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A bias on llama's attention output: llama.cpp runs the file; the exporter has no place for it
    (docs/models.md)."""
    biased = tiny_gguf(tmp_path / "biased.gguf", smollm2_vocabulary=False,
                       extra={"blk.0.attn_output.bias": np.full(N_EMBD, 0.1, np.float32)})
    engine = edgespec.load(biased, n_ctx=512, n_threads=1)
    try:
        assert engine.target.path == biased.resolve()
    finally:
        engine.close()
    assert "biased.gguf runs on llama.cpp as it is: edgespec's exporter does not read" in _said(capfd)
    assert not (tuned / "onnx").exists()


def test_on_a_read_only_home_the_file_runs_as_it_is(
        tmp_path: Path, mine: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Nothing prepared there could be kept (every process would export and race again): llama.cpp, said once."""
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    monkeypatch.setattr(own_model, "choose_own", lambda *_, **__: pytest.fail("raced on a read-only home"))
    home._said.clear()
    with read_only(tmp_path / "home") as ro:
        monkeypatch.setenv("EDGESPEC_HOME", str(ro))
        engine = edgespec.load(mine, n_ctx=512, n_threads=1)
        engine.close()
    assert engine.target.path == mine.resolve()
    assert "cannot be written, so edgespec's build of it could not be kept" in _said(capfd)
    home._said.clear()


def test_a_file_that_is_not_a_gguf_gets_the_loaders_error_and_no_race(
        tuned: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(own_model, "choose_own", lambda *_, **__: pytest.fail("raced a file that is not a GGUF"))
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("not a model")
    with pytest.raises(edgespec.ModelLoadError, match="not a GGUF file"):
        edgespec.load(bogus, n_ctx=512, n_threads=1)
