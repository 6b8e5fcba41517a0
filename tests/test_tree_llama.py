"""Token trees on real llama.cpp (SmolLM2-135M as shipped, exact numerics): one batch, one sequence per root-to-leaf
path, the accepted path kept in sequence 0. What is exact here and what is not (docs/tree-drafting.md): a row whose
path sits in the KV cells sequential decoding would give it (the tree's first root path) is bit-identical to
one-token decoding; other branches' rows need not be (the kernels' sums depend on the cells), so the engine verifies
chains on this backend (``exact_trees`` False) and mode ``tree`` stays identical to target-only."""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp as lc
import numpy as np
import pytest

from edgespec.arena import KVArena
from edgespec.drafters.base import MAX_TREE_LEAVES, ROOT
from edgespec.engine import Engine
from edgespec.llama_backend import ContextOptions, LlamaModel
from edgespec.models import resolve
from edgespec.verify import verify_tree_greedy

TEXT = "The quick brown fox jumps over the lazy dog. " * 8
# Nodes 0-2: the first root path; node 3 hangs off node 0; node 4 is a second root, node 5 its child.
PARENTS = [ROOT, 0, 1, 0, ROOT, 4]


@pytest.fixture(scope="module")
def models() -> Iterator[tuple[LlamaModel, LlamaModel]]:
    """A model verifying trees, and one decoding one token at a time: the reference."""
    path = resolve("smollm2-135m")
    pair = (LlamaModel(path, ContextOptions(n_ctx=1024)), LlamaModel(path, ContextOptions(n_ctx=1024)))
    yield pair
    for m in pair:
        m.close()


def _started(model: LlamaModel, prompt: list[int]) -> KVArena:
    """An arena holding ``prompt``, with the first generated token committed (not yet fed)."""
    arena = KVArena({"target": model})
    arena.reset(prompt, reuse=False)
    arena.commit([int(arena.extend("target", [], 1)[0].argmax())])
    return arena


def _one_at_a_time(model: LlamaModel, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """Rows after the first generated token and after each of ``tokens``, one token a pass: target-only decoding."""
    arena = _started(model, prompt)
    rows = [arena.extend("target", [], 1)[0].copy()]
    for token in tokens:
        arena.commit([token])
        rows.append(arena.extend("target", [], 1)[0].copy())
    return np.stack(rows)


def _tree_tokens(model: LlamaModel, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """Tokens for PARENTS whose first root path is what the model generates, and target-only's rows along it."""
    greedy = []
    for _ in range(3):
        greedy.append(int(_one_at_a_time(model, prompt, greedy)[-1].argmax()))
    other = model.tokenize(" cat", add_special=False)[0]
    return [*greedy, other, other, greedy[0]], _one_at_a_time(model, prompt, greedy)


def test_first_path_rows_are_one_token_decoding_and_decoding_goes_on_exactly(
        models: tuple[LlamaModel, LlamaModel]) -> None:
    model, reference = models
    prompt = model.tokenize(TEXT)
    tokens, rows_alone = _tree_tokens(reference, prompt)
    arena = _started(model, prompt)
    start = len(arena.tokens) - 1
    rows = arena.extend_tree("target", tokens, PARENTS).copy()
    assert rows.shape == (len(tokens) + 1, model.n_vocab)
    assert np.array_equal(rows[:4], rows_alone)  # bit for bit: the committed token's row and the first path's
    path, token = verify_tree_greedy(tokens, PARENTS, rows)
    assert path == [0, 1, 2] and token == int(rows_alone[-1].argmax())
    arena.keep_path("target", path)
    arena.commit([*tokens[:3], token])
    assert model.cache_end() == start + 4 and all(
        lc.llama_memory_seq_pos_max(model._memory, s) == -1 for s in range(1, MAX_TREE_LEAVES + 1))
    # Twelve more tokens one at a time: the same logits as target-only, bit for bit (the path's cells are contiguous).
    generated = [*tokens[:3], token]
    ours = []
    for _ in range(12):
        ours.append(arena.extend("target", [], 1)[0].copy())
        generated.append(int(ours[-1].argmax()))
        arena.commit([generated[-1]])
    assert np.array_equal(np.stack(ours), _one_at_a_time(reference, prompt, generated)[4:16])


def test_keeping_another_branch_leaves_only_its_cells(models: tuple[LlamaModel, LlamaModel]) -> None:
    model, reference = models
    prompt = model.tokenize(TEXT)
    tokens, _ = _tree_tokens(reference, prompt)
    arena = _started(model, prompt)
    start = len(arena.tokens) - 1
    arena.extend_tree("target", tokens, PARENTS)
    arena.keep_path("target", [4, 5])
    assert model.cache_end() == start + 3 and arena.held["target"] == [*arena.tokens, tokens[4], tokens[5]]
    assert all(lc.llama_memory_seq_pos_max(model._memory, s) == -1 for s in range(1, MAX_TREE_LEAVES + 1))
    assert lc.llama_memory_seq_pos_min(model._memory, 0) == 0
    arena.commit([tokens[4]])  # the arena rolls node 5 back like any rejected token
    assert model.cache_end() == start + 2
    assert not model.exact_trees


def test_mode_tree_equals_target_only_with_prompt_reuse(engine: Engine, spec_bench: object) -> None:
    """Mode tree on the default model (chains here: exact_trees is False), greedy, against mode none; the second
    turn of each conversation reuses the first turn's cache after tree-mode steps."""
    questions = spec_bench(["writing", "coding"])  # type: ignore[operator]
    for q in questions:
        messages = [{"role": "user", "content": q["turns"][0]}]
        first = engine.chat(messages, max_tokens=32, mode="tree")
        assert first.tokens == engine.chat(messages, max_tokens=32, mode="none", cache_prompt=False).tokens
        messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": q["turns"][-1]}]
        engine.chat(messages[:1], max_tokens=32, mode="tree")  # leave tree steps in the arena
        second = engine.chat(messages, max_tokens=32, mode="tree")
        assert second.stats.cached_tokens > 0
        assert second.tokens == engine.chat(messages, max_tokens=32, mode="none", cache_prompt=False).tokens
