"""Token trees on real llama.cpp (SmolLM2-135M as shipped): one batch, one sequence per root-to-leaf path, the accepted
path kept in sequence 0 (moved to the cells sequential decoding gives it when it is not the tree's first).

What is exact here is measured by the exactness self-check's tree probe (docs/tree-drafting.md): with the exact
numerics (F32 KV, flash attention off) a row whose path sits in the KV cells sequential decoding would give it (the
tree's first root path) is bit-identical to one-token decoding, other branches' rows need not be, so ``exact_trees``
is False and mode ``tree`` verifies chains; with the fast numerics padded to 4 rows (flash attention, F16 KV) every
tree row is, so mode tree verifies trees. Both stay identical to target-only decoding, token for token."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import llama_cpp as lc
import numpy as np
import pytest

import edgespec
from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel
from edgespec.backends.selfcheck import PADDED_ROWS
from edgespec.catalog.models import resolve
from edgespec.drafters.base import ROOT, Draft
from edgespec.engine.arena import MAX_TREE_LEAVES
from edgespec.engine.engine import Completion, Engine
from edgespec.engine.verify import verify_tree_greedy
from tests.decoding_reference import counting_leaves, decode_on, one_at_a_time, started
from tests.model.test_sampling_e2e import assert_sampling_matches_target

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


def _tree_tokens(model: LlamaModel, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """Tokens for PARENTS whose first root path is what the model generates, and target-only's rows along it."""
    greedy = []
    for _ in range(3):
        greedy.append(int(one_at_a_time(model, prompt, greedy)[-1].argmax()))
    other = model.tokenize(" cat", add_special=False)[0]
    return [*greedy, other, other, greedy[0]], one_at_a_time(model, prompt, greedy)


def test_first_path_rows_are_one_token_decoding_and_decoding_goes_on_exactly(
        models: tuple[LlamaModel, LlamaModel]) -> None:
    model, reference = models
    prompt = model.tokenize(TEXT)
    tokens, rows_alone = _tree_tokens(reference, prompt)
    arena = started(model, prompt)
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
    assert np.array_equal(decode_on(arena, generated, 12), one_at_a_time(reference, prompt, generated)[4:16])


def test_keeping_another_branch_leaves_only_its_cells(models: tuple[LlamaModel, LlamaModel]) -> None:
    model, reference = models
    prompt = model.tokenize(TEXT)
    tokens, _ = _tree_tokens(reference, prompt)
    arena = started(model, prompt)
    start = len(arena.tokens) - 1
    arena.extend_tree("target", tokens, PARENTS)
    arena.keep_path("target", [4, 5])
    assert model.cache_end() == start + 3 and arena.held["target"] == [*arena.tokens, tokens[4], tokens[5]]
    assert all(lc.llama_memory_seq_pos_max(model._memory, s) == -1 for s in range(1, MAX_TREE_LEAVES + 1))
    assert lc.llama_memory_seq_pos_min(model._memory, 0) == 0
    arena.commit([tokens[4]])  # the arena rolls node 5 back like any rejected token
    assert model.cache_end() == start + 2
    assert not model.exact_trees  # not checked: no trees


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


# -- the self-check's verdicts, and mode tree on both numerics with scripted trees ------------------------------------

LONG = ("The river starts in the hills north of the town, runs past the mill and the old stone bridge, and reaches "
        "the sea after forty kilometres. ") * 30


@pytest.fixture(scope="module")
def fast() -> Iterator[Engine]:
    """The fast numerics (flash attention, F16 KV), made exact by the self-check: passes padded to 4 rows, trees."""
    e = edgespec.load("smollm2-135m:q4_1", exact_numerics=False, require_exact=True, n_ctx=512, n_threads=2,
                      tuning=False, gamma=16)
    yield e
    e.close()


@pytest.fixture(scope="module")
def exact() -> Iterator[Engine]:
    """The exact numerics (the default): chains exact unpadded, trees not (the check's tree probe)."""
    e = edgespec.load("smollm2-135m:q4_1", n_ctx=512, n_threads=1, tuning=False, gamma=16)
    yield e
    e.close()


def test_the_self_check_finds_trees_exact_with_fast_numerics_padded_and_not_with_the_exact_ones(
        fast: Engine, exact: Engine) -> None:
    assert fast.target.pass_rows == PADDED_ROWS[0] and fast.target.exact_trees
    assert exact.target.pass_rows == 0 and not exact.target.exact_trees


def _scripted_trees(engine: Engine, prompt: list[int], reference: Completion,
                    monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], int]]:
    """Every step drafts a tree whose first root path is wrong at its root and whose second branch is target-only's
    continuation (EOS included where it stopped): the best path is never the first. Returns (tokens, leaves) of each
    tree the target verified as one."""
    truth = [*reference.tokens, *([engine.target.eos] if reference.finish_reason == "stop" else [])]
    verified: list[tuple[list[int], int]] = []
    target = engine.target
    decode_tree = target.decode_tree

    def propose_tree(context: Sequence[int], budget: int, controller: object, max_leaves: int, params: object,
                     rng: object) -> tuple[Draft, list[tuple[str, float]]]:
        done = len(context) - len(prompt)
        right = truth[done:done + budget]
        if max_leaves == 1 or len(right) < 2:  # chains only: the right one
            return Draft(right), [("scripted", 1.0)] * len(right)
        first = [(right[0] + 1) % target.n_vocab, *right[1:budget // 2]]
        branch = right[:budget - len(first)]
        parents = [ROOT, *range(len(first) - 1), ROOT, *range(len(first), len(first) + len(branch) - 1)]
        return Draft([*first, *branch], parents=parents), [("scripted", 1.0)] * (len(first) + len(branch))

    def spy(tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        assert len(tokens) <= target.max_tree_rows(start)
        verified.append((list(tokens), len([i for i in range(len(tokens)) if i not in set(parents)])))
        return decode_tree(tokens, parents, start)

    monkeypatch.setattr(engine.tree_drafter, "propose_tree", propose_tree)
    monkeypatch.setattr(target, "decode_tree", spy)
    return verified


@pytest.mark.parametrize("case", ["eos in a branch", "across the n_kv step", "the context's end"])
def test_mode_tree_with_the_best_path_never_first_equals_target_only(fast: Engine, exact: Engine, case: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """On both numerics: trees verified (fast) or chains (exact), output identical to target-only, token for token;
    every accepted draft token came from a tree's second branch. Then a second request after those tree steps."""
    for engine in (fast, exact):
        if case == "eos in a branch":
            prompt, max_tokens = engine.chat_tokens([{"role": "user", "content": "What is 2+2? Answer with one "
                                                                                 "number."}]), 40
        else:
            start = 245 if case == "across the n_kv step" else engine.n_ctx - 30
            prompt, max_tokens = engine.tokenize(LONG)[:start], 30 if case == "across the n_kv step" else 100
        reference = engine.generate(prompt, max_tokens=max_tokens, mode="none", cache_prompt=False)
        assert reference.finish_reason == ("stop" if case == "eos in a branch" else "length")
        with monkeypatch.context() as patch:
            verified = _scripted_trees(engine, prompt, reference, patch)
            out = engine.generate(prompt, max_tokens=max_tokens, mode="tree")
        assert out.tokens == reference.tokens and out.finish_reason == reference.finish_reason
        assert out.stats.accepted > 0
        if engine is fast:
            assert verified and max(leaves for _, leaves in verified) == 2
            if case == "eos in a branch":  # the last tree held EOS in its second branch, and the generation ended
                assert engine.target.eos in verified[-1][0][1:]
        else:
            assert not verified  # chains only
        again = engine.generate(prompt, max_tokens=max_tokens, mode="none")  # the arena after tree steps
        assert again.tokens == reference.tokens


def test_mode_tree_drafting_on_its_own_equals_target_only(fast: Engine, spec_bench: object,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The real tree drafter on the fast numerics: it verifies trees of several leaves, and nothing changes."""
    leaves: list[int] = []
    decode_tree = fast.target.decode_tree

    def spy(tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        leaves.append(len([i for i in range(len(tokens)) if i not in set(parents)]))
        return decode_tree(tokens, parents, start)

    monkeypatch.setattr(fast.target, "decode_tree", spy)
    for q in spec_bench(["writing", "coding"]):  # type: ignore[operator]
        messages = [{"role": "user", "content": q["turns"][0]}]
        prompt = fast.chat_tokens(messages)[:fast.n_ctx - 60]
        out = fast.generate(prompt, max_tokens=48, mode="tree")
        assert out.tokens == fast.generate(prompt, max_tokens=48, mode="none").tokens
    assert leaves and max(leaves) > 1


def test_sampled_mode_tree_on_the_fast_numerics_follows_the_target_distribution(fast: Engine) -> None:
    """Sampling verifies trees here too (``verify_tree_sampled``, padded tree passes): the sampled tokens pass the
    distribution tests of tests/model/test_sampling_e2e.py, with trees of several leaves verified."""
    with counting_leaves(fast) as leaves:
        assert_sampling_matches_target(fast, "tree", max_tokens=6, gamma=4)
    assert max(leaves) > 1


def test_a_kept_second_branch_and_what_follows_are_one_token_decoding_on_the_fast_numerics(fast: Engine) -> None:
    """Bit for bit, on the padded fast numerics: a tree whose greedy path is its second root branch (its cells are
    not where sequential decoding puts them, so keeping it moves them), then twelve tokens one at a time."""
    model = fast.target
    prompt = model.tokenize(TEXT)
    greedy, rows_alone = _tree_tokens(model, prompt)
    other = model.tokenize(" cat", add_special=False)[0]
    tokens = [other, other, other, other, greedy[0], greedy[1]]  # nodes 4, 5: the second root branch
    arena = started(model, prompt)
    rows = arena.extend_tree("target", tokens, PARENTS).copy()
    path, token = verify_tree_greedy(tokens, PARENTS, rows)
    assert path == [4, 5] and token == greedy[2]
    assert np.array_equal(rows[[0, 5, 6]], rows_alone[:3])
    arena.keep_path("target", path)
    arena.commit([greedy[0], greedy[1], token])
    generated = [*greedy[:3]]
    assert np.array_equal(decode_on(arena, generated, 12), one_at_a_time(model, prompt, generated)[3:15])
