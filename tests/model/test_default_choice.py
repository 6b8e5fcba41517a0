"""The default model: fixed with tuning off (as in every other test), measured and cached with tuning on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from edgespec.export.onnx.graphs import GRAPHS_REVISION

import edgespec
from edgespec.backends.onnx.manifest import FORMAT, MANIFEST
from edgespec.catalog.models import MAX_KL, MIN_TOP1, ModelFamily, families
from edgespec.identity import file_digest
from edgespec.kernels import library as custom_ops
from edgespec.tuning import race as default_race
from edgespec.tuning.default import FIXED, default_choice
from edgespec.tuning.race import Budget, choice_key, choose_default, table
from edgespec.tuning.store import DefaultChoice, default_choice_path
from tests.conftest import onnx_export_dir


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
        assert top1 >= MIN_TOP1 and kl <= MAX_KL


def _row(target: str, mode: str, reply_s: float, identical: str = "4/4") -> dict:
    return {"target": target, "mode": mode, "gamma": "auto" if mode == "ngram" else 0, "reply_s": reply_s,
            "identical": identical}


def test_a_model_runs_lookup_unless_plain_decoding_won_by_the_margin() -> None:
    """γ auto declines drafts that would not pay: a tie on the race's texts (noise) keeps it; plain decoding
    must answer more than ``tune.MARGIN`` quicker to be chosen, and a lookup run that changed the output never is."""
    assert default_race.pick([_row("a", "none", 3.83), _row("a", "ngram", 3.84)])["mode"] == "ngram"
    assert default_race.pick([_row("a", "none", 3.0), _row("a", "ngram", 3.0 * 1.06)])["mode"] == "none"
    assert default_race.pick([_row("a", "none", 3.83), _row("a", "ngram", 3.0, "3/4")])["mode"] == "none"
    # Models compete with the row each would run: b's lookup (4.0 s) loses to a's plain decoding (3.5 s), though
    # b's plain decoding (3.9 s) was quicker than its lookup.
    rows = [_row("a", "none", 3.5), _row("a", "ngram", 3.8), _row("b", "none", 3.9), _row("b", "ngram", 4.0)]
    assert (default_race.pick(rows)["target"], default_race.pick(rows)["mode"]) == ("a", "none")
    rows[1] = _row("a", "ngram", 3.6)
    assert (default_race.pick(rows)["target"], default_race.pick(rows)["mode"]) == ("a", "ngram")


def test_a_trained_draft_head_takes_lookups_place_unless_lookup_won_by_the_margin() -> None:
    """Mode head is lookup plus a drafter the controller consults only while it pays: a tie keeps the head, lookup
    must answer more than ``MARGIN`` quicker to be chosen over it, a head run that changed the output never is, and
    plain decoding still beats both only by the margin."""
    def rows(head: float, identical: str = "4/4") -> list[dict]:
        return [_row("a", "none", 4.0), _row("a", "ngram", 3.5), _row("a", "head", head, identical)]

    assert default_race.pick(rows(3.55))["mode"] == "head"
    assert default_race.pick(rows(3.5 * 1.06))["mode"] == "ngram"
    assert default_race.pick(rows(3.0, "3/4"))["mode"] == "ngram"
    assert default_race.pick([_row("a", "none", 3.0), _row("a", "ngram", 3.5), _row("a", "head", 3.3)])["mode"] \
        == "none"


def test_token_trees_take_lookups_place_only_where_they_answered_quicker() -> None:
    """Raced for a user's own file: more rows a pass for more tokens a pass, kept only where that paid, never where
    it changed the output, and still against plain decoding by the margin."""
    def rows(tree: float, identical: str = "4/4") -> list[dict]:
        return [_row("a", "none", 4.0), _row("a", "ngram", 3.5), _row("a", "tree", tree, identical)]

    assert default_race.pick(rows(3.4))["mode"] == "tree"
    assert default_race.pick(rows(3.55))["mode"] == "ngram"
    assert default_race.pick(rows(3.0, "3/4"))["mode"] == "ngram"
    assert default_race.pick([_row("a", "none", 3.0), _row("a", "ngram", 3.5), _row("a", "tree", 3.2)])["mode"] \
        == "none"


def test_the_key_names_the_shipped_draft_head_else_one_the_user_trained(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """The race's key names the draft head the ONNX candidate races with: the family's shipped one, or, where the
    family ships none, one trained for the default's export (training one races again)."""
    export = tmp_path / "smollm2-int8"
    monkeypatch.setattr(default_race, "onnx_export_path", lambda family, build="int8": export)
    shipped = choice_key(2, "cpu")
    assert shipped is not None and "shipped draft head of" in str(shipped["onnx"])
    monkeypatch.setattr(ModelFamily, "draft_head_path", lambda self: None)
    before = choice_key(2, "cpu")
    assert before is not None and before["onnx"] is not None and "draft head" not in str(before["onnx"])
    head = export.with_name(export.name + ".head")
    head.mkdir()
    (head / MANIFEST).write_text("{}")
    after = choice_key(2, "cpu")
    assert after is not None and after != before and "draft head of" in str(after["onnx"])


def test_the_race_writes_the_shipped_head_beside_the_export_and_keeps_a_users_own(tmp_path: Path) -> None:
    family = families()["smollm2-135m"]
    assert family.draft_head_path() is not None
    source = onnx_export_dir(quant="int8")
    export = tmp_path / source.name
    export.mkdir()
    for file in source.iterdir():
        (export / file.name).symlink_to(file)
    said: list[str] = []
    default_race.write_shipped_head(family, export, said.append)
    head = export.with_name(export.name + ".head")
    info = json.loads((head / MANIFEST).read_text())["draft_head"]
    assert info["shipped"] and info["output_rows"] == 2000 and "writing the shipped draft head" in said[0]
    engine = edgespec.load(export, n_ctx=256, n_threads=1)
    try:
        prompt = engine.chat_tokens([{"role": "user", "content": "Why is the sky blue?"}])
        reference = engine.generate(prompt, max_tokens=32, mode="none").tokens
        out = engine.generate(prompt, max_tokens=32, mode="head")
        assert out.tokens == reference and out.stats.mode == "head"
    finally:
        engine.close()
    # A head the user trained for the export (not marked shipped) is never replaced; a stale shipped one is.
    manifest = json.loads((head / MANIFEST).read_text())
    manifest["draft_head"]["shipped"] = False
    (head / MANIFEST).write_text(json.dumps(manifest))
    said.clear()
    default_race.write_shipped_head(family, export, said.append)
    assert not said
    manifest["draft_head"].update(shipped=True, weights_bytes=1)
    (head / MANIFEST).write_text(json.dumps(manifest))
    default_race.write_shipped_head(family, export, said.append)
    assert said and json.loads((head / MANIFEST).read_text())["draft_head"]["weights_bytes"] > 1
    # Shipped weights of the same size but other bytes (a head retrained with the same shapes): stale too.
    manifest = json.loads((head / MANIFEST).read_text())
    manifest["draft_head"]["weights_sha256"] = "0" * 16
    (head / MANIFEST).write_text(json.dumps(manifest))
    said.clear()
    default_race.write_shipped_head(family, export, said.append)
    assert said and json.loads((head / MANIFEST).read_text())["draft_head"]["weights_sha256"] == \
        file_digest(family.draft_head_path())


def test_the_choice_is_measured_once_stored_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))  # variants, verdicts and the choice land here
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    key = choice_key(1, "cpu")
    assert key is not None
    said: list[str] = []
    # The ONNX candidate is asked for (onnxruntime is installed) but not exported here: test_onnx_export does that.
    monkeypatch.setattr(default_race, "onnx_candidate", lambda *_: (None, "not exported in this test"))
    choice = choose_default(families()["smollm2-135m"], key, 1, "cpu", Budget(prompts=2, max_tokens=12),
                            say=said.append)
    for build in default_race.ONNX_BUILDS:  # INT8 and the shipped file's own 4-bit blocks
        assert choice.skipped.pop(f"onnx {build}") == "not exported in this test"
    # Said first, before anything is measured: once, what, about how long, and where the result is kept.
    assert said[0].startswith("edgespec: first use on this machine: measuring which build of smollm2-135m")
    models = len(key["candidates"]) + 2  # the shipped GGUF's variants and its two ONNX exports
    assert "two ONNX exports" in said[0] and f"a race of {models} models × 2 modes on 2 texts" in said[0]
    assert "once, about 1–5 minutes on 2 cores" in said[0] and said[0].endswith(str(default_choice_path(key)))
    raced = {r["target"] for r in choice.candidates}
    assert raced | set(choice.skipped) == {f"smollm2-135m:{q}" for q in key["candidates"]}  # each raced or skipped
    assert {(r["mode"], r["gamma"]) for r in choice.candidates} == {("none", 0), ("ngram", "auto")}
    best = default_race.pick(choice.candidates)
    assert (choice.target, choice.mode) == (best["target"], best["mode"])  # every row here is lossless
    for r in choice.candidates:  # the first text is the document: prefill is part of what a user waits for
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0
        expected = default_race.reply_seconds(r, r["prompt_tokens"], 2, 12)
        assert r["reply_s"] == pytest.approx(expected, abs=0.01)
    assert all(r["identical"] == "2/2" for r in choice.candidates)
    assert default_choice_path(key).is_file() and any("edgespec: default = " in line for line in said)
    assert table(choice)[-1] == said[-2]

    def measure_again(*_: object, **__: object) -> None:
        raise AssertionError("the stored choice should have been used")

    monkeypatch.setattr(default_race, "choose_default", measure_again)
    engine = edgespec.load(n_threads=1, n_ctx=512)
    try:
        assert engine.target.path == families()["smollm2-135m"].prepare(choice.target.partition(":")[2])
        assert engine.mode == choice.mode
        # Its γ-auto race run calibrated the verify-cost curve: the first reply after the race starts from it.
        monkeypatch.setattr(engine, "calibrate", lambda *a, **k: pytest.fail("calibrated again after the race"))
        assert engine.generate("Hello", max_tokens=2, mode="ngram", gamma="auto").tokens
    finally:
        engine.close()


def test_a_stored_onnx_choice_holds_only_while_its_export_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export rewritten under a stored choice (here: with GroupQueryAttention, as when the kernels could not be
    built for a while) is measured again, not run as the export that was raced; and such an export has a folder
    of its own, so it never overwrites the kernel's."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    monkeypatch.setattr(custom_ops, "default_attention", lambda: "exact")
    key = choice_key(1, "cpu")
    assert key is not None
    export = default_race.onnx_export_path(families()["smollm2-135m"])
    manifest = {"format": FORMAT, "num_layers": 0, "num_kv_heads": 1, "head_dim": 64, "hidden_size": 64,
                "vocab_size": 8, "context_length": 64, "embed": "embed.onnx", "layers": [], "head": "head.onnx",
                "quant_options": {"attention": custom_ops.ATTENTION}, "source": {"graphs": GRAPHS_REVISION}}
    export.mkdir(parents=True)
    (export / MANIFEST).write_text(json.dumps(manifest))
    DefaultChoice(key=key, target=str(export), backend="onnx", mode="ngram", gamma="auto", reason="raced",
                  candidates=[], skipped={}).save()
    measured: list[object] = []
    monkeypatch.setattr(default_race, "choose_default", lambda *args, **_: measured.append(args) or FIXED)
    assert default_choice(1, "cpu").target == str(export) and not measured
    manifest["quant_options"]["attention"] = "com.microsoft.GroupQueryAttention"
    (export / MANIFEST).write_text(json.dumps(manifest))
    assert default_choice(1, "cpu") is FIXED and len(measured) == 1
    monkeypatch.setattr(custom_ops, "default_attention", lambda: "gqa")
    assert default_race.onnx_export_path(families()["smollm2-135m"]) != export


def test_a_race_on_a_gpu_leaves_out_what_cannot_run_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU device the ONNX export is not built (its exact kernels run on the CPU only), and a candidate that
    cannot open there is left out with llama.cpp's reason, instead of ending the race with a traceback. On this
    CPU-only build no candidate can: the race says why, for each."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setattr(default_race, "onnx_candidate", lambda *_: pytest.fail("exported for a GPU race"))
    key = choice_key(1, "cuda")
    assert key is not None
    said: list[str] = []
    with pytest.raises(edgespec.EdgespecError) as raised:
        choose_default(families()["smollm2-135m"], key, 1, "cuda", Budget(prompts=2, max_tokens=12), say=said.append)
    assert "an ONNX export" not in said[0]
    message = str(raised.value)
    assert message.startswith("no default candidate can run losslessly here")
    assert "its exact kernels run on the CPU only, and this race is on cuda" in message
    assert "built for the CPU only" in message  # llama.cpp's own reason, once per GGUF variant


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_a_gpu_choice_never_imports_onnxruntime(device: str) -> None:
    """On the H200 image importing onnxruntime after llama.cpp's CUDA library killed the process (SIGSEGV) before
    the race began: a GPU's choice key has no ONNX part and must not import onnxruntime to say so, whether the GPU
    is named or ``auto`` finds a GPU build (made to, here: this build is CPU-only). A fresh interpreter, since this
    one has imported onnxruntime already."""
    code = ("import sys, edgespec.backends.llamacpp.preload as p, edgespec.tuning.race as r\n"
            "p.gpu_build = lambda: True\n"
            f"key = r.choice_key(1, {device!r})\n"
            "assert key is None or key['onnx'] is None, key\n"
            "print('onnxruntime' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_auto_races_on_the_cpu_with_a_cpu_build() -> None:
    """``auto`` with this CPU-only llama.cpp: the race is the CPU's, ONNX export included."""
    assert not default_race.races_on_gpu("auto") and default_race.races_on_gpu("metal")
    key = choice_key(1, "auto")
    assert key is not None and key["onnx"] is not None


def test_the_shipped_files_own_blocks_are_a_candidate_that_passes_the_bar(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The 4-bit build (the shipped Q4_1 blocks carried into edgespec's 4-bit products) is exported, checked against
    the shipped weights and raced beside the INT8 one, in a folder of its own, with the shipped draft head."""
    if custom_ops.ensure() is None:
        pytest.skip("the kernel library cannot be built here")
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    family = families()["smollm2-135m"]
    said: list[str] = []
    path, note = default_race.onnx_candidate(family, 1, said.append, "gguf")
    assert path == str(default_race.onnx_export_path(family, "gguf")) != str(default_race.onnx_export_path(family))
    assert note.startswith("top-1") and "against the shipped weights" in note
    manifest = json.loads((Path(path) / MANIFEST).read_text())
    assert "Q4_1" in manifest["quant_options"]["carried"] and default_race.has_head(Path(path))
