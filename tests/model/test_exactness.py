"""The exactness self-check: real llama.cpp on the 135M model, exact and not, cached per build and device."""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel
from edgespec.backends.selfcheck import (
    PADDED_ROWS,
    PROBED_ROWS,
    ExactnessWarning,
    NotExactError,
    build_key,
    check,
    enforce,
    probe,
)
from edgespec.catalog.models import families
from edgespec.cli.main import main


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))  # a fresh verdict cache (the shipped Q4_1 needs no cache)
    return tmp_path


def _shipped(exact_numerics: bool = True, n_threads: int = 1) -> LlamaModel:
    return LlamaModel(families()["smollm2-135m"].prepare("q4_1"),
                      ContextOptions(n_ctx=1024, n_threads=n_threads, exact_numerics=exact_numerics))


def test_the_exact_build_passes_quickly_and_the_verdict_is_cached(home: Path) -> None:
    model = _shipped()
    try:
        # CPU seconds (wall time on a shared machine says little), against this machine's own unit of work: a
        # 320-token prefill and 32 one-token steps of the same model (the machines differ in speed).
        tokens = list(range(1000, 1320))
        unit = time.process_time()
        model.decode(tokens, 0, 1)
        for i in range(32):
            model.decode(tokens[i:i + 1], len(tokens) + i, 1)
        model.truncate(0)
        unit = time.process_time() - unit
        cpu = time.process_time()
        first = check(model, "cpu")
        cpu = time.process_time() - cpu
        # every pass size from 2 to the largest verify after the first context, the largest after the other two
        probed = sum(range(2, PROBED_ROWS + 1)) + 2 * PROBED_ROWS
        assert first.exact and first.max_abs_diff == 0.0 and first.argmax_agree == first.positions == probed
        assert first.pass_rows == 0 and first.row_cap == 0  # exact unpadded at every size: no pass padded or held
        # Trees probed too, and not exact with these kernels: a branch's rows depend on the cells it sits in.
        assert not first.exact_trees and first.tree_max_abs_diff > 0 and not model.exact_trees
        # The probe's passes (chains, trees, reuse) took ~4.5 units on a 2-core AMD EPYC (12 s of one core there).
        assert not first.cached and cpu < 8 * unit
        assert first.reuse_max_abs_diff == 0.0 and model.exact_reuse  # a kept prompt prefix is reused here
        again = check(model, "cpu")
        assert again.cached and again.exact and again.key == first.key and not again.exact_trees
        assert len(list((home / "exactness").glob("llamacpp-*.json"))) == 1
        assert model.cache_end() == 0  # the probe leaves the cache empty
    finally:
        model.close()


def test_a_small_context_window_is_probed_within_it(home: Path) -> None:
    model = LlamaModel(families()["smollm2-135m"].prepare("q4_1"), ContextOptions(n_ctx=16, n_threads=1))
    try:
        result = check(model, "cpu")
        window = model.n_ctx  # llama.cpp rounds a small request up (256 here), still below 320 + 5
    finally:
        model.close()
    # no overflow: room left after the last context for the largest pass probed
    assert window < 320 + PROBED_ROWS and result.exact and result.key["contexts"] == [24, window - PROBED_ROWS]


def test_the_key_names_the_build_device_and_quantization() -> None:
    model = _shipped()
    try:
        key = build_key(model, "cpu", True)
    finally:
        model.close()
    assert key["backend"] == "llamacpp" and key["device"] == "cpu" and "Q4_1" in str(key["quant"])
    assert key["library"] and "CPU" in str(key["system_info"]) and key["exact_numerics"] is True


def test_on_a_gpu_both_numerics_share_one_verdict() -> None:
    """Exact and fast numerics load the same settings on a GPU (llama_backend.set_numerics), so the key that files
    the self-check's verdict is the same for both: one probe, not two. On the CPU they differ. Where the model runs
    decides (``on_gpu``: device auto with a GPU build runs there too), made so here on this CPU-only build."""
    model = _shipped()
    try:
        assert build_key(model, "cpu", True) != build_key(model, "cpu", False)
        model.on_gpu = True
        assert build_key(model, "auto", True) == build_key(model, "auto", False)
        assert build_key(model, "auto", True)["gpu"] is True
    finally:
        model.close()


def test_fast_numerics_are_flagged_unpadded_and_made_exact_by_padding(home: Path) -> None:
    """llama.cpp's defaults (F16 KV cache, flash attention) on 2 threads: a batched row's logits differ from
    one-token decoding (real llama.cpp, no wrapper; on one thread they were identical here). With every pass padded
    to the same number of rows they do not: the check keeps the smallest such size and leaves the model padded, and
    verifying trees."""
    model = _shipped(exact_numerics=False, n_threads=2)
    try:
        worst, _, _, _ = probe(model)
        assert worst > 0
        result = check(model, "cpu", exact_numerics=False)
        assert result.exact and result.pass_rows == PADDED_ROWS[0] == model.pass_rows
        assert result.unpadded_max_abs_diff > 0 and "padded to 4 rows" in result.describe()
        # At that shape token trees are exact too (flash attention walks a row's visible cells in order).
        assert result.exact_trees and result.tree_max_abs_diff == 0.0 and model.exact_trees
        model.set_pass_rows(0)
        model.exact_trees = False
        again = check(model, "cpu", exact_numerics=False)  # from the cache: the padding and trees are applied again
        assert again.cached and model.pass_rows == PADDED_ROWS[0] and model.exact_trees
    finally:
        model.close()


class PerturbedBatches:
    """SCRIPTED, not a real backend: the real 135M model whose rows computed in a batch of several tokens get a
    tiny offset, as a non-batch-invariant GPU kernel would give them. Only the probe's own logic is under test."""

    def __init__(self, model: LlamaModel) -> None:
        self.model, self.n_ctx = model, model.n_ctx
        self.description = f"perturbed {model.description}"  # its own verdict in the cache, not the model's

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.model.tokenize(text, add_special, parse_special)

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        logits = self.model.decode(tokens, start, n_logits)
        return logits + np.float32(1e-3) if n_logits > 1 else logits

    def truncate(self, keep: int) -> None:
        self.model.truncate(keep)

    def max_pass_rows(self, start: int) -> int:
        return self.model.max_pass_rows(start)


def test_the_probe_flags_perturbed_batched_rows() -> None:
    model = _shipped()
    try:
        worst, agree, n, _ = probe(PerturbedBatches(model))
    finally:
        model.close()
    assert worst == pytest.approx(1e-3, rel=1e-2) and agree == n  # argmax unchanged, logits not: still flagged


class ChangesKernelAt:
    """SCRIPTED, not a real backend: the real 135M model whose rows in a pass of ``rows`` or more tokens get a tiny
    offset, as a CPU kernel chosen by row count would give them (llama.cpp's K-quant products: tests below). Only the
    check's logic is under test."""

    def __init__(self, model: LlamaModel, rows: int) -> None:
        self.model, self.n_ctx, self.rows = model, model.n_ctx, rows
        self.description = f"kernel change at {rows} rows, {model.description}"  # its own verdict in the cache

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.model.tokenize(text, add_special, parse_special)

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        logits = self.model.decode(tokens, start, n_logits)
        return logits + np.float32(1e-3) if len(tokens) >= self.rows else logits

    def truncate(self, keep: int) -> None:
        self.model.truncate(keep)

    def set_row_cap(self, rows: int) -> None:
        self.model.set_row_cap(rows)

    def max_pass_rows(self, start: int) -> int:
        return self.model.max_pass_rows(start)


def test_passes_exact_only_up_to_a_size_are_held_to_it(home: Path) -> None:
    """Holding verify passes to the largest exact size costs a one-token decode nothing, where padding every pass to
    B rows would charge it B; the cached verdict holds them again."""
    model = _shipped()
    try:
        result = check(ChangesKernelAt(model, 8), "cpu")
        assert result.exact and result.row_cap == 7 == model.max_pass_rows(100) and result.pass_rows == 0
        assert result.unpadded_max_abs_diff == pytest.approx(1e-3, rel=1e-2)
        assert "passes of up to 7 rows" in result.describe()
        model.set_row_cap(0)
        again = check(ChangesKernelAt(model, 8), "cpu")
        assert again.cached and model.max_pass_rows(100) == 7
        model.set_row_cap(0)
        assert not check(ChangesKernelAt(model, 2), "cpu").row_cap  # not even two rows: nothing to hold to
    finally:
        model.close()


def test_a_k_quant_file_is_lossless_at_any_gamma(home: Path, tmp_path: Path) -> None:
    """A Q4_K_M file made by llama.cpp's own quantizer: on an AVX-512 CPU llama.cpp's K-quant products take another
    kernel from 8 rows on, so a probe of 5-row passes found it exact while lookup at γ 7 or more changed the output,
    and a repeated prompt's last token, fed alone after its kept prefix, got other logits than in the prefill. Every
    pass size is probed now: verify passes are held to the largest exact one (or none where all are), reuse is
    probed with a lone last token, and greedy lookup at γ 12 equals target-only decoding, the prompt cached or not."""
    from tests.tiny_gguf import KQ_LAYERS, KQ_TYPES, llama_quantize, write_kquant_gguf

    dense = write_kquant_gguf(tmp_path / "f32.gguf", layer_types=[dict.fromkeys(KQ_TYPES, "F32")] * KQ_LAYERS,
                              embedding="F32")
    path = llama_quantize(dense, tmp_path / "q4_k_m.gguf", "Q4_K_M")
    engine = edgespec.load(path, n_ctx=1024, n_threads=2, tuning=False, require_exact=True)
    try:
        result = check(engine.target, "cpu")
        assert result.cached and result.exact and result.pass_rows == 0
        if result.row_cap:
            assert result.unpadded_max_abs_diff > 0 and engine.target.max_pass_rows(100) == result.row_cap
        assert probe(engine.target)[0] == 0.0  # within the cap, every size probed is exact
        prompt = engine.tokenize("one two three four five six seven eight nine ten " * 12)
        plain = engine.generate(prompt, max_tokens=64, mode="none")
        drafted = engine.generate(prompt, max_tokens=64, mode="ngram", gamma=12, cache_prompt=False)
        assert drafted.tokens == plain.tokens and drafted.stats.accepted > 0
        # The prompt again, its cache kept where reuse is exact: there a lone last token takes the one-row kernel,
        # not the prefill's (the reuse probe feeds it alone too, and turns reuse off where that differs).
        assert result.reuse_max_abs_diff == 0.0 or not engine.target.exact_reuse
        assert engine.generate(prompt, max_tokens=64, mode="ngram", gamma=12).tokens == plain.tokens
    finally:
        engine.close()


def test_require_exact_refuses_and_otherwise_warns_once(home: Path) -> None:
    """A build no padding helps (the scripted perturbation above cannot be padded away): refused with advice for
    its device, or warned about once per build and device."""
    model = _shipped()
    try:
        result = check(PerturbedBatches(model), "cpu")
        assert not result.exact and result.pass_rows == 0
        with pytest.raises(NotExactError, match=r"NOT exact.*--require-exact.*GGML_LLAMAFILE=OFF"):
            enforce(result, True, "perturbed")
        on_gpu = replace(result, key={**result.key, "device": "auto", "gpu": True})  # auto that found a GPU build
        with pytest.raises(NotExactError, match=r"padded to 4, 8, 16 rows were not exact.*--device cpu"):
            enforce(on_gpu, True, "perturbed")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                enforce(result, False, "perturbed")
        assert [w.category for w in caught] == [ExactnessWarning]  # once, not per load
        assert "may drift from target-only" in str(caught[0].message)
    finally:
        model.close()


def test_fast_numerics_with_require_exact_load_padded_and_stay_lossless(home: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    engine = edgespec.load("smollm2-135m:q4_1", exact_numerics=False, require_exact=True, n_ctx=1024, n_threads=2,
                           tuning=False, gamma=3)
    try:
        assert engine.target.pass_rows == PADDED_ROWS[0] and not engine.target.exact_reuse
        prompt = engine.chat_tokens([{"role": "user", "content": "Repeat this line three times: one two three four "
                                                                 "five six seven eight nine ten"}])
        plain = engine.generate(prompt, max_tokens=48, mode="none")
        drafted = engine.generate(prompt, max_tokens=48, mode="ngram")
        assert drafted.tokens == plain.tokens and drafted.stats.accepted > 0
        assert drafted.stats.drafted <= 3 * drafted.stats.steps  # γ ≤ B − 1: every verify fits one padded pass
    finally:
        engine.close()
    assert main(["generate", "hi", "--model", "smollm2-135m:q4_1", "--fast-numerics", "--require-exact",
                 "--max-tokens", "2", "--threads", "2", "--ctx", "1024"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_build_whose_prompt_reuse_differs_is_found_out_and_prefills_every_prompt_whole(home: Path) -> None:
    """Verify passes exact, but a prompt's KV depends on how it was prefilled (the prefill-dependent fake: a kept
    prefix then the rest is not a whole prefill): the reuse probe finds it, its verdict (read back too) turns reuse
    off, and a conversation's next request then answers as a fresh engine does; reusing would have answered else."""
    from edgespec.engine.engine import Engine
    from tests.fake_backend import BOS, FakeModel, encode, scripted

    sequence = [BOS, *encode("the cat sat on the mat. " * 40)]

    def fake() -> FakeModel:
        return FakeModel(scripted(sequence), n_ctx=1024, prefill_dependent=True)

    model = fake()
    result = check(model, "cpu")
    assert result.exact and result.reuse_max_abs_diff and result.reuse_max_abs_diff > 0 and not model.exact_reuse
    again = fake()
    assert check(again, "cpu").cached and not again.exact_reuse
    first = Engine(model, mode="ngram").generate(sequence[:40], max_tokens=12)
    follow_up = sequence[:40] + first.tokens + sequence[52:72]  # a tail longer than a verify pass: a prefill
    alone = fake()
    check(alone, "cpu")  # the cached verdict: no reuse, not even of the BOS its calibration left behind
    fresh = Engine(alone, mode="ngram").generate(follow_up, max_tokens=12).tokens
    engine = Engine(again, mode="ngram")
    engine.generate(sequence[:40], max_tokens=12)
    assert engine.generate(follow_up, max_tokens=12).tokens == fresh
    unprobed = fake()  # the same device believed to reuse exactly: its kept prefix makes another answer
    engine = Engine(unprobed, mode="ngram")
    engine.generate(sequence[:40], max_tokens=12)
    assert engine.generate(follow_up, max_tokens=12).tokens != fresh
