"""Token trees on the ONNX backend (SmolLM2-135M exported INT8 with edgespec's attention, the default path's export):
one pass, each row masked to its own path by the kernel's ``tree_parents`` (edgespec/kernels/exact_attention.cc), so
every row is the bits of one-token decoding over its path, on any branch; the accepted path's K/V is moved to its
positions' cells and decoding goes on exactly. The self-check's tree probe finds them so (``exact_trees``), the
engine's mode ``tree`` then verifies real trees here, and its greedy output is target-only's, token for token,
through prompt reuse and at the context's end."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from edgespec.backends.onnx.model import OnnxModel, OnnxOptions
from edgespec.backends.selfcheck import check
from edgespec.drafters.base import ROOT
from edgespec.engine.engine import Engine
from edgespec.engine.verify import verify_tree_greedy
from edgespec.kernels import library as custom_ops
from tests.conftest import onnx_export_dir
from tests.decoding_reference import counting_leaves, decode_on, one_at_a_time, started
from tests.model.test_sampling_e2e import assert_sampling_matches_target

pytestmark = pytest.mark.skipif(custom_ops.library() is None and custom_ops.ensure() is None,
                                reason="needs edgespec's kernels (make setup)")

TEXT = "The quick brown fox jumps over the lazy dog. " * 4
# Node 0: a wrong root; nodes 1-2-5-6: the path the model generates (from the second root), node 3 a sibling of
# node 2 with a child (4). The accepted path is therefore not the first branch, and its cells are not contiguous.
PARENTS = [ROOT, ROOT, 1, 1, 3, 2, 5]


@pytest.fixture(scope="module")
def models() -> Iterator[tuple[OnnxModel, OnnxModel]]:
    """A model verifying trees, and one decoding one token at a time: the reference."""
    folder = onnx_export_dir(quant="int8")
    yield OnnxModel(folder, OnnxOptions(n_ctx=512, n_threads=1)), OnnxModel(folder, OnnxOptions(n_ctx=512, n_threads=1))


def _checked(model: OnnxModel) -> OnnxModel:
    """The model after the self-check (measured, or read from its cache), as ``edgespec.load`` leaves it."""
    verdict = check(model, "cpu")
    assert verdict.exact and verdict.exact_trees and model.exact_trees and verdict.tree_max_abs_diff == 0.0
    return model


def _path(node: int) -> list[int]:
    path = []
    while node != ROOT:
        path.append(node)
        node = PARENTS[node]
    return path[::-1]


def test_every_tree_row_is_one_token_decoding_and_another_branch_decodes_on_exactly(
        models: tuple[OnnxModel, OnnxModel]) -> None:
    model, reference = models
    assert model.tree_passes and not model.exact_trees  # trees are fed by any such export; used once checked
    prompt = model.tokenize(TEXT)
    greedy: list[int] = []
    for _ in range(4):
        greedy.append(int(one_at_a_time(reference, prompt, greedy)[-1].argmax()))
    cat = model.tokenize(" cat", add_special=False)[0]
    tokens = [cat, greedy[0], greedy[1], cat, greedy[2], greedy[2], greedy[3]]
    arena = started(model, prompt)
    start = len(arena.tokens) - 1
    rows = arena.extend_tree("target", tokens, PARENTS).copy()
    for node in range(len(tokens)):  # bit for bit, every branch's rows
        alone = one_at_a_time(reference, prompt, [tokens[i] for i in _path(node)])[-1]
        assert np.array_equal(rows[node + 1], alone), f"node {node} (path {_path(node)})"
    path, token = verify_tree_greedy(tokens, PARENTS, rows)
    assert path == [1, 2, 5, 6]  # the second root's branch, through nodes whose cells are not contiguous
    arena.keep_path("target", path)
    generated = [tokens[i] for i in path] + [token]
    arena.commit(generated)
    assert model.cache_end() == start + 5
    # Twelve more tokens one at a time: target-only's logits, bit for bit (the path's K/V moved right).
    assert np.array_equal(decode_on(arena, generated, 12), one_at_a_time(reference, prompt, generated)[5:17])


@pytest.fixture(scope="module")
def onnx_int8_engine() -> Iterator[Engine]:
    e = Engine(_checked(OnnxModel(onnx_export_dir(quant="int8"), OnnxOptions(n_ctx=1024, n_threads=1))))
    yield e
    e.close()


def test_mode_tree_verifies_trees_and_equals_target_only_with_prompt_reuse(onnx_int8_engine: Engine,
                                                                            spec_bench: object) -> None:
    """Greedy mode tree against mode none on two Spec-Bench conversations; the second turn reuses the first
    turn's cache after tree steps. γ 6 (no controller: every candidate within the budget is verified), so trees with
    several leaves were verified, not only chains."""
    engine = onnx_int8_engine
    with counting_leaves(engine) as leaves:
        for q in spec_bench(["writing", "coding"]):  # type: ignore[operator]
            messages = [{"role": "user", "content": q["turns"][0]}]
            first = engine.chat(messages, max_tokens=48, mode="tree", gamma=6)
            assert first.tokens == engine.chat(messages, max_tokens=48, mode="none", cache_prompt=False).tokens
            messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": q["turns"][-1]}]
            engine.chat(messages[:1], max_tokens=48, mode="tree", gamma=6)  # leave tree steps in the arena
            second = engine.chat(messages, max_tokens=48, mode="tree", gamma=6)
            assert second.stats.cached_tokens > 0
            assert second.tokens == engine.chat(messages, max_tokens=48, mode="none", cache_prompt=False).tokens
    assert max(leaves) > 1


def test_sampled_mode_tree_follows_the_target_distribution(onnx_int8_engine: Engine) -> None:
    """Sampling verifies trees too (one draw per row down the tree: ``verify_tree_sampled``): the sampled tokens
    pass the same distribution tests as a draft model's and lookup's (tests/model/test_sampling_e2e.py). Six tokens at
    γ 4:
    room for trees of several leaves from the first step on."""
    with counting_leaves(onnx_int8_engine) as leaves:
        assert_sampling_matches_target(onnx_int8_engine, "tree", max_tokens=6, gamma=4)
    assert max(leaves) > 1


def test_a_tree_at_the_context_end(onnx_int8_engine: Engine) -> None:
    """A prompt that leaves 40 positions: mode tree shapes its trees into what is left and stops where target-only
    stops, with the same tokens."""
    engine = onnx_int8_engine
    text = "one two three four five six seven eight nine ten. " * 100
    tokens = engine.target.tokenize(text)
    prompt = tokens[:engine.target.n_ctx - 40]
    assert len(prompt) == engine.target.n_ctx - 40
    tree, alone = (engine.generate(prompt, max_tokens=100, mode=mode, gamma="auto") for mode in ("tree", "none"))
    assert tree.finish_reason == alone.finish_reason == "length"
    assert tree.tokens == alone.tokens and len(tree.tokens) == 40
    assert tree.stats.accepted > 0
