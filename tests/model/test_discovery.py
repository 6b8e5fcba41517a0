"""Models found where users keep them (Ollama, LM Studio, the Hugging Face cache, named folders), draft pairing
and ``--draft auto``. The stores are built in temporary folders around REAL GGUFs: the shipped SmolLM2 file
(hard-linked) and tiny random llama models written with ``gguf``'s writer and SmolLM2's tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

import edgespec
from edgespec.catalog import discovery
from edgespec.catalog import info as model_info
from edgespec.catalog.models import resolve
from edgespec.catalog.pairing import choose_draft, drafts_for
from edgespec.cli.main import main
from edgespec.errors import ModelLoadError
from tests.tiny_gguf import SHIPPED, tiny_gguf


def _place(src: Path, dst: Path) -> Path:
    """``src`` at ``dst`` without copying 100 MB where a hard link will do."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    return dst


def _ollama_store(root: Path, model: Path, name: str, tag: str) -> None:
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    _place(model, root / "blobs" / f"sha256-{digest}")
    template = b"{{ .Prompt }}"
    template_digest = hashlib.sha256(template).hexdigest()
    (root / "blobs" / f"sha256-{template_digest}").write_bytes(template)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
                            "size": model.stat().st_size},
                           {"mediaType": "application/vnd.ollama.image.template",
                            "digest": f"sha256:{template_digest}", "size": len(template)}]}
    path = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))


def _hf_cache(root: Path, repo: str, model: Path, filename: str) -> None:
    base = root / f"models--{repo.replace('/', '--')}"
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    _place(model, base / "blobs" / digest)
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text("abc123")
    link = base / "snapshots" / "abc123" / filename
    link.parent.mkdir(parents=True)
    link.symlink_to(Path("../../blobs") / digest)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def store_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every store kind, in a fake home: Ollama (the shipped SmolLM2), LM Studio and a user folder (tiny
    llamas), the hub cache (SmolLM2 behind a symlink, as huggingface_hub writes it)."""
    home = tmp_path_factory.mktemp("stores") / "home"
    shipped = resolve(SHIPPED)
    _ollama_store(home / "ollama", shipped, "smollm2", "135m")
    tiny_gguf(home / ".lmstudio" / "models" / "tinyorg" / "tiny-GGUF" / "tiny-f32.gguf")
    _hf_cache(home / "hub", "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", shipped, "smollm2-135m-q4_1.gguf")
    tiny_gguf(home / "mine" / "tiny-renamed.gguf", rename_token=1234)
    (home / "mine" / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    return home


@pytest.fixture()
def stores(store_files: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stores of ``store_files``, where discovery looks."""
    home = store_files
    monkeypatch.setenv("HOME", str(home))
    # edgespec's own cache (exactness verdicts, prepared files) lives outside the stores it must not write to
    monkeypatch.setenv("EDGESPEC_HOME", str(home.parent / "edgespec-home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(home / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("EDGESPEC_MODEL_PATH", str(home / "mine"))
    return home


def test_stores_are_listed_with_header_facts(stores: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json"]) == 0
    found = {r["name"]: r for r in json.loads(capsys.readouterr().out)["found"]}
    assert set(found) == {"ollama:smollm2:135m", "lmstudio:tinyorg/tiny-GGUF/tiny-f32",
                          "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-q4_1", "local:tiny-renamed",
                          "local:broken"}
    smol = found["ollama:smollm2:135m"]
    assert (smol["architecture"], smol["quant"], smol["llamacpp"], smol["onnx_export"]) == ("llama", "q4_1", True,
                                                                                             True)
    assert smol["size_bytes"] == resolve(SHIPPED).stat().st_size and smol["context_length"] == 8192
    tiny = found["lmstudio:tinyorg/tiny-GGUF/tiny-f32"]
    assert (tiny["architecture"], tiny["quant"], tiny["llamacpp"]) == ("llama", "f32", True)
    assert "truncated" in found["local:broken"]["error"]
    assert main(["models"]) == 0
    assert "ollama:smollm2:135m  llama q4_1" in capsys.readouterr().out


def test_a_listed_name_loads_and_generates_without_writing_to_the_store(stores: Path) -> None:
    before = _snapshot(stores)
    prompt = "The capital of France is"
    # One thread and a fixed γ throughout: no start-up cost calibration, no OpenMP barriers on a busy machine.
    reference = edgespec.load(resolve(SHIPPED), mode="none", n_ctx=256, n_threads=1)
    try:
        expected = reference.generate(prompt, max_tokens=6).tokens
    finally:
        reference.close()
    for name in ("ollama:smollm2:135m", "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-q4_1"):
        engine = edgespec.load(name, mode="ngram", gamma=3, n_ctx=256, n_threads=1)
        try:
            assert engine.generate(prompt, max_tokens=6).tokens == expected
        finally:
            engine.close()
    tiny = edgespec.load("lmstudio:tinyorg/tiny-GGUF/tiny-f32", mode="none", n_ctx=256, n_threads=1)
    try:
        assert len(tiny.generate(prompt, max_tokens=4).tokens) == 4
    finally:
        tiny.close()
    assert model_info.listing()
    assert _snapshot(stores) == before  # no file added, changed or touched


def test_store_names_resolve_and_unknown_ones_say_what_exists(stores: Path) -> None:
    assert resolve("ollama:smollm2:135m").name.startswith("sha256-")
    assert resolve("local:tiny-renamed") == stores / "mine" / "tiny-renamed.gguf"
    with pytest.raises(ModelLoadError, match=r"no model 'ollama:smollm2'.*ollama:smollm2:135m"):
        resolve("ollama:smollm2")  # tag latest: not in this store
    with pytest.raises(ModelLoadError, match=r"lmstudio store \(found: lmstudio:tinyorg/tiny-GGUF/tiny-f32\)"):
        resolve("lmstudio:nobody/nothing")


def test_config_file_names_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "edgespec-home"
    tiny_gguf(tmp_path / "models" / "sub" / "tiny.gguf")
    home.mkdir()
    (home / "config.toml").write_text(f'[models]\npaths = ["{tmp_path / "models"}"]\n')
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    monkeypatch.setenv("HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("EDGESPEC_MODEL_PATH", raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert [m.name for m in discovery.found_models()] == ["local:sub/tiny"]
    (home / "config.toml").write_text("[models]\npaths = 3\n")
    with pytest.raises(edgespec.EdgespecError, match="must be a list"):
        discovery.found_models()


def test_drafts_for_lists_same_vocabulary_models_smallest_first(stores: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    names = [d.name for d in drafts_for("ollama:smollm2:135m")]
    # The tiny llama shares SmolLM2's vocabulary; the one with a renamed token and the broken file do not; the
    # hub copy and the family's shipped file are the target's own bytes or no smaller.
    assert names[0] == "lmstudio:tinyorg/tiny-GGUF/tiny-f32"
    assert "local:tiny-renamed" not in names and "local:broken" not in names
    assert not any("q4_1" in n or n.startswith(("hf:", "ollama:")) for n in names)
    sizes = [d.size_bytes for d in drafts_for("ollama:smollm2:135m")]
    assert sizes == sorted(sizes)
    assert main(["models", "--drafts-for", "ollama:smollm2:135m"]) == 0
    assert "lmstudio:tinyorg/tiny-GGUF/tiny-f32" in capsys.readouterr().out


def test_a_listed_draft_speculates_losslessly(stores: Path) -> None:
    """llama.cpp's own vocabulary check agrees with the header one, and drafting with a random tiny model keeps
    greedy output identical to target-only decoding."""
    engine = edgespec.load("ollama:smollm2:135m", draft="lmstudio:tinyorg/tiny-GGUF/tiny-f32", gamma=3, n_ctx=512,
                           n_threads=1)
    try:
        prompt = "List the days of the week: Monday, Tuesday,"
        speculative = engine.generate(prompt, max_tokens=24, mode="draft")
        assert speculative.stats.drafted > 0
        assert speculative.tokens == engine.generate(prompt, max_tokens=24, mode="none").tokens
    finally:
        engine.close()


def _tuned(target: Path, draft: Path, draft_speedup: float, ngram_speedup: float, acceptance: float) -> None:
    """A stored tuning for the pair, as `edgespec tune` writes it (its race's candidates and acceptance)."""
    from edgespec.tuning.store import Tuning, tuning_key

    rows = [{"mode": "none", "gamma": 0, "decode_tok_s": 100.0, "speedup": 1.0},
            {"mode": "ngram", "gamma": "auto", "decode_tok_s": 100 * ngram_speedup, "speedup": ngram_speedup},
            {"mode": "draft", "gamma": "auto", "decode_tok_s": 100 * draft_speedup, "speedup": draft_speedup}]
    best = max(rows, key=lambda r: r["speedup"])
    Tuning(tuning_key(target, draft, 1, "cpu"), best["mode"], "auto", [0.0, 1.0, 1.5], 0.01,
           {"ngram": [0.5], "draft": [acceptance]}, {"ngram": 0.0, "draft": 0.001}, 0.0, best["speedup"],
           {"candidates": rows}).save()


@pytest.mark.parametrize("draft_speedup, acceptance, chosen", [(1.30, 0.6, True), (1.12, 0.6, False),
                                                               (1.30, 0.0, False)])
def test_draft_auto_decides_from_the_stored_race(stores: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 draft_speedup: float, acceptance: float, chosen: bool) -> None:
    """The decision on a stored tuning (no measuring): the draft must beat the best single-model mode (n-gram,
    1.10× here) by more than 5%, and some of its tokens must have been accepted."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "edgespec-home"))
    draft = stores / ".lmstudio" / "models" / "tinyorg" / "tiny-GGUF" / "tiny-f32.gguf"
    _tuned(resolve("ollama:smollm2:135m"), draft, draft_speedup, 1.10, acceptance)
    choice = choose_draft("ollama:smollm2:135m", 1, "cpu")
    assert (choice.draft == str(draft)) == chosen and (choice.mode == "draft") == chosen
    assert "tiny-f32" in choice.reason and (chosen or ("mode ngram 1.10×" in choice.reason and choice.mode == "ngram"))


@pytest.mark.slow
def test_draft_auto_measures_once(stores: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``--draft auto`` tunes the pair (quick run) the first time only; a random tiny draft, none of whose tokens
    SmolLM2 accepts, is turned down (~30 s on a quiet machine, minutes on a busy one)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "edgespec-home"))  # no prepared quantizations, no tunings
    choice = choose_draft("ollama:smollm2:135m", 1, "cpu")
    assert "tuning" in capsys.readouterr().err  # tune's report, on stderr
    assert choice.draft is None and "no draft model beat" in choice.reason
    assert main(["generate", "Hello", "--model", "ollama:smollm2:135m", "--draft", "auto", "--threads", "1",
                 "--max-tokens", "4", "--json"]) == 0
    captured = capsys.readouterr()
    assert "--draft auto: " + choice.reason in captured.err and "tuning" not in captured.err  # no second race
    assert len(json.loads(captured.out)["tokens"]) == 4
