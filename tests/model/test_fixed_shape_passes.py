"""Fixed-shape passes: every pass padded to B rows where unpadded passes are not batch-invariant.

Real llama.cpp on the CPU: padding changes nothing on the exact build and makes the fast numerics exact (on a GPU it
is what makes speculation lossless at all: docs/gpu.md). The scripted fake's shape-dependent mode stands in for a
device whose kernels change with the pass shape, to show that the engine needs both halves of the rule: the same
row count, and no pass crossing a step of the attended cache length.
"""

from __future__ import annotations

import time
from pathlib import Path

import llama_cpp as lc
import numpy as np
import pytest

from edgespec.backends.base import padded_pass_limit
from edgespec.backends.llamacpp.model import KV_STEP, ContextOptions, LlamaModel, set_numerics
from edgespec.backends.selfcheck import PADDED_ROWS, check
from edgespec.catalog.models import families
from edgespec.engine.engine import Engine
from edgespec.errors import InvalidParameterError
from tests.fake_backend import BOS, FakeClock, FakeModel, encode, scripted
from tests.fake_backend import KV_STEP as FAKE_KV_STEP

SEQUENCE = [BOS, *encode("the cat sat on the mat. " * 12)]
PROMPT = SEQUENCE[:30]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))  # a fresh exactness-verdict cache
    return tmp_path


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(time, "perf_counter", c)
    return c


def test_the_pass_limit_keeps_every_row_in_the_step_its_pass_is_in() -> None:
    for rows in (4, 8, 16):
        for start in range(0, 3 * KV_STEP):
            k = padded_pass_limit(start, rows, KV_STEP)
            step = -(-(start + rows) // KV_STEP)
            assert 1 <= k <= rows
            assert all(-(-(start + i + rows) // KV_STEP) == step for i in range(k))  # each row's own pass: same n_kv
            if k < rows:  # cut short only where the next row's own pass would end in the next step
                assert -(-(start + k + rows) // KV_STEP) != step


@pytest.fixture(scope="module")
def exact_model() -> LlamaModel:
    model = LlamaModel(families()["smollm2-135m"].prepare("q4_1"), ContextOptions(n_ctx=1024, n_threads=1))
    yield model
    model.close()


def test_padded_passes_give_unpadded_logits_on_the_exact_build(exact_model: LlamaModel) -> None:
    model = exact_model
    text = model.tokenize("The river starts in the hills north of the town and reaches the sea. " * 30)
    full = model.n_ctx
    try:
        for context in (40, KV_STEP - 3):  # a pass inside one n_kv step, and one across it
            model.set_pass_rows(0)
            model.truncate(0)
            model.decode(text[:context], 0, 1)
            plain = model.decode(text[context:context + 3], context, 3).copy()
            for rows in (4, 8):
                model.set_pass_rows(rows)
                assert model.n_ctx == full - (rows - 1)  # the filler's cells are kept free at the end
                model.truncate(context)
                padded = model.decode(text[context:context + 3], context, 3)
                assert np.array_equal(padded, plain)
                assert model.cache_end() == context + 3  # the filler's entries are gone
    finally:
        model.set_pass_rows(0)
        model.truncate(0)
    assert model.exact_reuse  # unpadded again: a kept prefix is reused
    for bad in (-1, 1, model.n_batch + 1):
        with pytest.raises(InvalidParameterError, match="pass rows"):
            model.set_pass_rows(bad)


def _shape_dependent(clock: FakeClock, home: Path) -> FakeModel:
    """A fake device whose rows depend on their pass's shape, padded as its self-check chooses."""
    model = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock, shape_dependent=True)
    result = check(model, "cpu")
    assert result.exact and result.pass_rows == PADDED_ROWS[0] and result.unpadded_max_abs_diff > 0
    return model


@pytest.mark.parametrize("gamma", [3, "auto"])
def test_padding_makes_a_shape_dependent_device_lossless(clock: FakeClock, home: Path, gamma: int | str) -> None:
    target_only = Engine(_shape_dependent(clock, home), mode="none").generate(PROMPT, max_tokens=120)
    model = _shape_dependent(clock, home)
    out = Engine(model, mode="ngram", gamma=gamma).generate(PROMPT, max_tokens=120)
    assert out.tokens == target_only.tokens and out.stats.accepted > 0
    generation = model.passes[len(model.passes) - model.passes[::-1].index(len(PROMPT)):]  # after its prefill
    assert max(generation) <= PADDED_ROWS[0]  # every verify fitted one padded pass


def test_without_padding_the_shape_dependent_device_drifts(clock: FakeClock, home: Path) -> None:
    plain = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock, shape_dependent=True)
    target_only = Engine(plain, mode="none").generate(PROMPT, max_tokens=120)
    out = Engine(FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock, shape_dependent=True), mode="ngram",
                 gamma=3).generate(PROMPT, max_tokens=120)
    assert out.tokens != target_only.tokens  # what the self-check's padding prevents


def test_padded_passes_that_cross_an_attended_length_step_drift(clock: FakeClock, home: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Padding alone is not enough: a pass whose cells end in the next step of the attended length gives its first
    rows another n_kv than their own one-token passes (measured on CUDA with F32 KV: docs/gpu.md)."""
    target_only = Engine(_shape_dependent(clock, home), mode="none").generate(PROMPT, max_tokens=120)
    model = _shape_dependent(clock, home)
    monkeypatch.setattr(model, "max_pass_rows", lambda start: model.pass_rows)  # no cut at the step
    out = Engine(model, mode="ngram", gamma=3).generate(PROMPT, max_tokens=120)
    assert len(PROMPT) + 120 > FAKE_KV_STEP and out.tokens != target_only.tokens


# -- token trees under fixed shapes ------------------------------------------------------------------------------------

def _tree_spy(model: FakeModel) -> list[tuple[int, int]]:
    """(start, nodes) of every tree the fake verifies, each checked against the step rule."""
    trees: list[tuple[int, int]] = []
    original = model.decode_tree

    def spy(tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        assert len(tokens) <= model.max_tree_rows(start)
        trees.append((start, len(tokens)))
        return original(tokens, parents, start)

    model.decode_tree = spy  # type: ignore[method-assign]
    return trees


def test_the_tree_limit_keeps_every_node_in_the_step_its_padded_pass_is_in() -> None:
    for rows in (4, 8, 16):
        for start in range(0, 3 * KV_STEP):
            n = padded_pass_limit(start, rows, KV_STEP, 64)
            cells_end = start + -(-n // rows) * rows  # the tree padded to a multiple of rows
            step = -(-cells_end // KV_STEP)
            assert all(-(-(start + depth + rows) // KV_STEP) == step for depth in range(n))  # each node's own pass


def test_padded_trees_on_a_device_whose_trees_are_exact(clock: FakeClock, home: Path) -> None:
    """Passes padded to 4 rows (a device that needs it) on a fake whose tree rows are exact: the self-check keeps
    trees, every tree stays within the step rule, the output is target-only's, and the next request reuses the
    arena's cache after the tree steps."""
    model = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock)
    model.set_pass_rows(PADDED_ROWS[0])
    model.exact_trees = False  # type: ignore[misc]
    result = check(model, "cpu")
    assert result.exact_trees and result.tree_max_abs_diff == 0.0 and model.exact_trees
    target_only = Engine(FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock), mode="none").generate(
        PROMPT, max_tokens=200)
    trees = _tree_spy(model)
    engine = Engine(model, mode="tree", gamma=16)
    out = engine.generate(PROMPT, max_tokens=200)
    assert out.tokens == target_only.tokens and out.stats.accepted > 0
    assert max(n for _, n in trees) > PADDED_ROWS[0]  # trees of several padded blocks
    again = engine.generate(PROMPT, max_tokens=200)
    assert again.tokens == target_only.tokens and again.stats.cached_tokens == len(PROMPT) - 1


def test_a_device_whose_padded_trees_drift_verifies_chains(clock: FakeClock, home: Path) -> None:
    """The shape-dependent fake: a tree of more rows than one padded block meets other kernels than a one-token
    pass. The self-check's tree probe finds it, mode tree verifies chains and stays lossless; trusting its trees
    anyway changes the output."""
    model = _shape_dependent(clock, home)
    assert not model.exact_trees and check(model, "cpu").tree_max_abs_diff > 0
    target_only = Engine(_shape_dependent(clock, home), mode="none").generate(PROMPT, max_tokens=120)
    trees = _tree_spy(model)
    out = Engine(model, mode="tree", gamma=16).generate(PROMPT, max_tokens=120)
    assert out.tokens == target_only.tokens and out.stats.accepted > 0 and not trees
    trusting = _shape_dependent(clock, home)
    trusting.exact_trees = True  # type: ignore[misc]
    assert Engine(trusting, mode="tree", gamma=16).generate(PROMPT, max_tokens=120).tokens != target_only.tokens


def test_exact_numerics_are_the_cpu_settings_and_the_defaults_on_a_gpu() -> None:
    """On a CPU exact numerics are an F32 KV cache without flash attention; on a GPU, where fixed-shape passes are
    what make verification exact, llama.cpp's defaults (measured exact padded and cheaper there: docs/gpu.md)."""
    def settings(exact: bool, on_gpu: bool) -> tuple[int, int, int]:
        params = lc.llama_context_default_params()
        set_numerics(params, exact, on_gpu)
        return params.type_k, params.type_v, params.flash_attn_type

    defaults = settings(False, False)
    assert settings(True, False) == (lc.GGML_TYPE_F32, lc.GGML_TYPE_F32, lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    assert settings(True, True) == settings(False, True) == defaults
    assert defaults[0] != lc.GGML_TYPE_F32 and defaults[2] != lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
