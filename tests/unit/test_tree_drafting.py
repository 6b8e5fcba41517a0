"""Token trees: the tree type, greedy tree verification, the suffix-trie and recycled-logits drafters, the tree's
shape, and mode ``tree`` on the scripted fake backend (whose rows are exact for trees), all against target-only."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Sequence

import numpy as np
import pytest

from edgespec.bench.replay import accepted_path
from edgespec.drafters import Draft, NgramDrafter, OutputStore, RecycledDrafter, SuffixDrafter
from edgespec.drafters.base import ROOT, depths
from edgespec.drafters.recycled import top_successors
from edgespec.drafters.suffix import SuffixTrie
from edgespec.drafters.tree import TreeDrafter, merge, shape, subtree
from edgespec.engine.arena import KVArena
from edgespec.engine.engine import Engine
from edgespec.engine.sampling import SamplingParams
from edgespec.engine.verify import verify_greedy, verify_tree_greedy
from edgespec.errors import EdgespecError
from tests.fake_backend import BOS, EOS, N_VOCAB, FakeClock, FakeModel, encode, scripted

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def one_hot_rows(best: Sequence[int], n_vocab: int = 16) -> np.ndarray:
    rows = np.zeros((len(best), n_vocab), dtype=np.float32)
    rows[np.arange(len(best)), best] = 1.0
    return rows


# -- the tree type ------------------------------------------------------------------------------------------
def test_a_chain_is_the_tree_whose_parents_are_the_previous_nodes() -> None:
    chain = Draft([5, 6, 7])
    assert chain.is_chain and chain.parent_list() == [ROOT, 0, 1]
    tree = Draft([5, 6, 7, 8], parents=[ROOT, 0, ROOT, 2], scores=[0.9, 0.5, 0.3, 0.2])
    assert not tree.is_chain and depths(tree.parent_list()) == [1, 2, 1, 2]
    assert tree.truncated(3).parents == [ROOT, 0, ROOT] and tree.truncated(3).scores == [0.9, 0.5, 0.3]
    with pytest.raises(EdgespecError, match="parent must come before"):
        Draft([1, 2], parents=[1, ROOT])


# -- greedy tree verification ----------------------------------------------------------------------------------
def test_tree_verification_takes_the_path_the_target_would_generate() -> None:
    # Row 0 follows the committed text, row i + 1 node i. The target's chain is 3, 4, 9 then 2.
    tokens = [3, 7, 3, 4, 4, 9]
    parents = [ROOT, 0, ROOT, 2, 0, 4]  # node 0 (3) → 7 (wrong) and 4; node 2 (also 3) → 4
    best = [3, 4, 0, 0, 0, 9, 2]
    path, token = verify_tree_greedy(tokens, parents, one_hot_rows(best))
    assert path == [0, 4, 5] and token == 2  # not the first branch at depth 2: the second child of node 0
    assert verify_tree_greedy(tokens, parents, one_hot_rows([8, 0, 0, 0, 0, 0, 0])) == ([], 8)  # nothing matches


def test_of_two_equal_siblings_the_longer_accepted_path_wins() -> None:
    tokens, parents = [3, 5, 3, 4], [ROOT, 0, ROOT, 2]  # two nodes '3' at depth 1; only the second goes on right
    path, token = verify_tree_greedy(tokens, parents, one_hot_rows([3, 9, 9, 4, 6]))
    assert path == [2, 3] and token == 6


def test_on_a_chain_tree_verification_is_chain_verification() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        draft = [int(t) for t in rng.integers(0, 4, rng.integers(0, 6))]
        logits = rng.normal(size=(len(draft) + 1, 4)).astype(np.float32)
        n, token = verify_greedy(draft, logits)
        assert verify_tree_greedy(draft, list(range(-1, len(draft) - 1)), logits) == (list(range(n)), token)


# -- the arena and the fake backend --------------------------------------------------------------------------
SEQUENCE = [BOS, *encode("the cat sat on the mat. " * 6)]
PROMPT = SEQUENCE[:30]


def _arena(n_ctx: int = 256) -> tuple[KVArena, FakeModel]:
    model = FakeModel(scripted(SEQUENCE), n_ctx=n_ctx)
    arena = KVArena({"target": model})
    arena.reset(PROMPT)
    arena.commit([int(arena.extend("target", [], 1)[0].argmax())])  # the first generated token
    return arena, model


def test_a_tree_step_keeps_the_accepted_branch_and_nothing_else() -> None:
    arena, model = _arena()
    n = len(arena.tokens)
    right = SEQUENCE[n:n + 3]
    wrong = [encode("x")[0], encode("y")[0]]
    # First branch wrong at depth 1, second branch right for two tokens, then wrong.
    tokens = [wrong[0], right[0], right[1], wrong[1]]
    parents = [ROOT, ROOT, 1, 2]
    logits = arena.extend_tree("target", tokens, parents)
    path, token = verify_tree_greedy(tokens, parents, logits)
    assert path == [1, 2] and token == right[2]
    arena.keep_path("target", path)
    arena.commit([*right[:2], token])
    assert model.cache_end() == n + 2 == len(arena.held["target"])  # the last committed token, then the path
    assert [e.token for e in model.kv[:n + 2]] == SEQUENCE[:n + 2]  # type: ignore[union-attr]
    # Decoding goes on as after target-only steps.
    assert int(arena.extend("target", [], 1)[0].argmax()) == SEQUENCE[n + 3]


# -- mode tree through the engine ----------------------------------------------------------------------------
@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(time, "perf_counter", c)
    return c


def _copying_model(clock: FakeClock, n_ctx: int = 1024) -> FakeModel:
    """Each pass costs 1 + 0.02 per extra row: trees pay."""
    return FakeModel(scripted(SEQUENCE), n_ctx=n_ctx, clock=clock, pass_cost=lambda n: 0.01 * (1 + 0.02 * (n - 1)))


@pytest.mark.parametrize("gamma", [1, 4, 16, "auto"])
def test_mode_tree_greedy_equals_target_only(clock: FakeClock, gamma: int | str) -> None:
    model = _copying_model(clock)
    reference = Engine(model, mode="none", gamma=0).generate(PROMPT, max_tokens=500)
    engine = Engine(model, mode="tree", gamma=gamma)
    before = len(model.passes) + 1  # after the reference and this run's prefill
    out = engine.generate(PROMPT, max_tokens=500)
    assert out.tokens == reference.tokens and out.finish_reason == reference.finish_reason == "stop"
    assert out.stats.accepted > 0
    if gamma != "auto":  # (auto first times passes of every size)
        assert max(model.passes[before:]) <= gamma + 1
    again = engine.generate(PROMPT, max_tokens=500)  # the prompt cache reuses the arena after tree steps
    assert again.tokens == reference.tokens and again.stats.cached_tokens == len(PROMPT) - 1


def test_mode_tree_verifies_trees_with_several_leaves(clock: FakeClock) -> None:
    """Text where the same two bytes are followed by different ones: the suffix trie offers both, as branches."""
    rng = np.random.default_rng(4)
    text = "".join(f"ab{rng.integers(1, 4)} " for _ in range(40))
    sequence = [BOS, *encode(text)]
    model = FakeModel(scripted(sequence), n_ctx=2048, clock=clock, pass_cost=lambda n: 0.01)  # rows are free
    trees: list[int] = []
    original = model.decode_tree

    def spy(tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        trees.append(sum(1 for i in range(len(tokens)) if i not in set(parents)))
        return original(tokens, parents, start)

    model.decode_tree = spy  # type: ignore[method-assign]
    out = Engine(model, mode="tree", gamma="auto").generate(sequence[:40], max_tokens=200)
    assert out.tokens == sequence[40:]
    assert max(trees) > 1  # some verified tree had several root-to-leaf paths
    # Each step counts for every drafter with a node in its tree: the suffix trie's branches among them.
    steps = out.stats.draft_steps
    assert "suffix" in steps and set(steps) <= {"ngram", "suffix", "recycled"}
    assert max(steps.values()) <= out.stats.steps < sum(steps.values())


def _charging(drafter: SuffixDrafter | RecycledDrafter, clock: FakeClock, seconds: float) -> list[int]:
    """Make a branch drafter's proposals take ``seconds`` of virtual time; the list counts them."""
    calls: list[int] = []
    propose = drafter.propose

    def charged(*args: object) -> Draft:
        calls.append(1)
        clock.now += seconds
        return propose(*args)  # type: ignore[arg-type]

    drafter.propose = charged  # type: ignore[method-assign]
    return calls


def test_a_branch_drafter_that_does_not_pay_for_its_time_is_consulted_only_to_explore(clock: FakeClock) -> None:
    """Random letters: the suffix trie's candidates are never accepted; at half a pass a proposal, it is consulted
    on the exploration steps only, once its first steps have shown that. Output as target-only's."""
    rng = np.random.default_rng(5)
    sequence = [BOS, *encode("".join(rng.choice(list("abcdefgh"), 400)))]
    model = FakeModel(scripted(sequence), n_ctx=1024, clock=clock, pass_cost=lambda n: 0.01)
    reference = Engine(model, mode="none", gamma=0).generate(sequence[:20], max_tokens=300)
    engine = Engine(model, mode="tree", gamma="auto")
    calls = _charging(engine.tree_drafter.suffix, clock, 0.005)
    out = engine.generate(sequence[:20], max_tokens=300)
    assert out.tokens == reference.tokens
    steps = len(out.tokens) - out.stats.accepted  # one target token a step
    assert steps > 200 and len(calls) <= steps // 16 + 10


def test_a_branch_drafter_that_pays_for_its_time_stays_consulted(clock: FakeClock) -> None:
    """Text where the same two bytes are followed by different ones: the recycled table's branches are accepted
    where lookup's spine is wrong, worth more than the 2% of a pass each proposal is charged. The suffix trie, which
    would offer the same branches and take their credit, is made dear (half a pass), so it drops out."""
    rng = np.random.default_rng(4)
    sequence = [BOS, *encode("".join(f"ab{rng.integers(1, 4)} " for _ in range(40)))]
    model = FakeModel(scripted(sequence), n_ctx=2048, clock=clock, pass_cost=lambda n: 0.01)
    engine = Engine(model, mode="tree", gamma="auto")
    calls = _charging(engine.tree_drafter.recycled, clock, 0.0002)
    _charging(engine.tree_drafter.suffix, clock, 0.005)
    out = engine.generate(sequence[:40], max_tokens=200)
    assert out.tokens == sequence[40:]
    steps = len(out.tokens) - out.stats.accepted
    assert len(calls) >= 0.8 * steps


def test_eos_inside_a_branch_ends_the_generation_there(clock: FakeClock) -> None:
    """After EOS, the prompt has 'say ab' twice and 'say ac' once, each ended by EOS; the target says 'say ac' and
    stops. Lookup copies the latest 'say ab' (the spine, wrong at 'b'); the suffix trie offers 'c' then EOS as a
    branch: the accepted path runs through it, and the generation ends at its EOS, as target-only's does."""
    sequence = [BOS, *encode("."), *encode(" say ab"), EOS, *encode(" say ab"), EOS, *encode(" say ac"), EOS,
                *encode(" say ab"), EOS, *encode(" say ac"), EOS]
    prompt = sequence[:-3]  # ... ' say ': the target goes on with 'a' (the prefill's token), 'c' and EOS
    model = FakeModel(scripted(sequence), n_ctx=512, clock=clock, pass_cost=lambda n: 0.01)
    reference = Engine(model, mode="none", gamma=0).generate(prompt, max_tokens=20)
    branches: list[tuple[list[int], list[int]]] = []
    original = model.decode_tree

    def spy(tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        branches.append((tokens, parents))
        return original(tokens, parents, start)

    model.decode_tree = spy  # type: ignore[method-assign]
    out = Engine(model, mode="tree", gamma=16).generate(prompt, max_tokens=20)
    assert out.tokens == reference.tokens == encode("ac") and out.finish_reason == "stop"
    assert out.stats.accepted == 2  # c and EOS, from the branch
    tokens, parents = branches[0]
    first_path_end = next(i for i in range(len(parents)) if i + 1 == len(parents) or parents[i + 1] != i)
    assert EOS in tokens[first_path_end + 1:]  # EOS sits in a branch besides the first path


@pytest.mark.parametrize("gamma", [4, 16])
def test_a_tree_at_the_end_of_the_context(clock: FakeClock, gamma: int) -> None:
    n_ctx = 64
    engine = Engine(_copying_model(clock, n_ctx), mode="tree", gamma=gamma)
    out = engine.generate(PROMPT, max_tokens=500)
    assert out.finish_reason == "length" and out.tokens == SEQUENCE[len(PROMPT):n_ctx]
    last = engine.generate(SEQUENCE[:n_ctx - 1], max_tokens=500)
    assert last.tokens == [SEQUENCE[n_ctx - 1]]


def test_mode_tree_on_a_target_without_exact_trees_verifies_chains(clock: FakeClock) -> None:
    model = _copying_model(clock)
    model.exact_trees = False  # type: ignore[misc]
    model.decode_tree = None  # type: ignore[assignment,method-assign]
    out = Engine(model, mode="tree", gamma="auto").generate(PROMPT, max_tokens=500)
    assert out.tokens == SEQUENCE[len(PROMPT):] and out.stats.accepted > 0


# -- the suffix trie -----------------------------------------------------------------------------------------
def test_suffix_trie_counts_what_followed() -> None:
    trie = SuffixTrie(depth=8)
    trie.start_document()
    trie.extend([1, 2, 3, 1, 2, 4, 1, 2, 3])
    node = trie.find([1, 2])
    assert node is not None
    assert sorted((t, round(p, 3)) for t, _, p in trie.children(node)) == [(3, 0.667), (4, 0.333)]
    tree = trie.grow(node, 3, 0.0)
    assert tree.tokens[0] == 3 and tree.scores[0] == pytest.approx(2 / 3)  # type: ignore[index]
    assert trie.find([2, 2]) is None
    trie.remove_document([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert trie.nodes == 0 and trie.find([1]) is None


def test_suffix_drafter_offers_every_continuation_with_its_frequency() -> None:
    drafter = SuffixDrafter()
    context = [9, 1, 2, 3, 7, 1, 2, 3, 8, 1, 2, 3, 7, 5, 1, 2, 3]
    drafter.begin(context)
    draft = drafter.propose(context, 8, GREEDY, RNG)
    first = {draft.tokens[i]: draft.scores[i] for i, p in enumerate(draft.parent_list()) if p == ROOT}  # type: ignore[index]
    assert first == {7: pytest.approx(2 / 3), 8: pytest.approx(1 / 3)}
    assert draft.key == 3  # matched '1 2 3' (longer matches were tried: ' 5 1 2 3' occurs once, at the end)


def test_earlier_outputs_are_drafted_from_in_the_next_request() -> None:
    store = OutputStore()
    drafter = SuffixDrafter(store)
    drafter.begin([1, 2])
    drafter.propose([1, 2, 40, 41, 42, 43, 44], 8, GREEDY, RNG)  # the output 40..44
    drafter.begin([3, 40, 41])  # a new request: the last output joins the store
    assert len(store) == 1
    draft = drafter.propose([3, 40, 41], 8, GREEDY, RNG)
    assert draft.tokens[:3] == [42, 43, 44]


def test_the_output_store_stays_within_its_bound_on_a_long_session() -> None:
    """Memory as traced, not as estimated: 80 outputs of random text (~15 trie nodes a token at depth 16: ~10 times
    what the bound holds) never take more than ``max_bytes``, the store's trie and the kept tokens together."""
    rng = np.random.default_rng(5)
    outputs = [[int(t) for t in rng.integers(0, 5000, int(rng.integers(50, 250)))] for _ in range(80)]
    tracemalloc.start()
    store = OutputStore(max_bytes=2_000_000, depth=16)
    for output in outputs:
        store.add(output)
        assert store.nbytes <= store.max_bytes
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak <= store.max_bytes
    assert 1 <= len(store) < 10  # the least recently used went
    for output in list(store._outputs.values()):
        store.trie.remove_document(output)
    assert store.trie.nodes == 0  # removal takes back exactly what adding put in


def test_an_output_too_long_for_the_store_keeps_the_prefix_that_fits() -> None:
    store = OutputStore(max_bytes=100_000, depth=16)
    store.add(list(range(10_000)))
    assert len(store) == 1 and store.nbytes <= store.max_bytes
    assert store.trie.find([0, 1, 2]) is not None and store.trie.find([9_998, 9_999]) is None


@pytest.mark.parametrize("drafting", [True, False])
def test_the_output_store_evicts_the_least_recently_used_output(drafting: bool) -> None:
    """Two outputs added together; then a long session of other outputs, each of which evicts some. Drafting from
    the first keeps it (it is used at every request), while the second, never used, goes; without the drafts both
    go (least recently used is then oldest first)."""
    rng = np.random.default_rng(6)
    used, unused = list(range(1000, 1040)), list(range(2000, 2040))
    store = OutputStore(max_bytes=5_000_000)
    drafter = SuffixDrafter(store)
    store.add(used)
    store.add(unused)
    for i in range(60):
        store.add([int(t) for t in rng.integers(0, 1000, 200)])  # ~2 800 nodes; ~14 000 fit
        if drafting:
            at = i % 30
            context = [7, *used[at:at + 3]]
            drafter.begin(context)
            assert drafter.propose(context, 8, GREEDY, RNG).tokens[:3] == used[at + 3:at + 6]
    assert len(store) < 10 and store.trie.find(unused[:3]) is None
    assert (store.trie.find(used[:3]) is not None) is drafting


# -- the recycled table --------------------------------------------------------------------------------------
def test_recycled_table_drafts_the_targets_own_top_successors() -> None:
    drafter = RecycledDrafter(n_vocab=10, k=3, min_prob=0.01)
    logits = np.full((2, 10), -10.0, dtype=np.float32)
    logits[0, [4, 5, 6]] = [3.0, 2.0, 1.0]  # after token 1
    logits[1, 7] = 5.0  # after token 4
    drafter.observe([1, 4], logits)
    assert list(drafter.successors[1]) == [4, 5, 6] and drafter.probs[1].sum() < 1.0
    draft = drafter.propose([0, 1], 4, GREEDY, RNG)
    assert draft.tokens[0] == 4 and draft.parent_list()[0] == ROOT
    assert 7 in draft.tokens and draft.parent_list()[draft.tokens.index(7)] == 0  # 4 → 7, below node 0
    assert drafter.nbytes == 10 * 3 * 8


# -- the shape ----------------------------------------------------------------------------------------------------
def test_merge_shape_and_layout() -> None:
    spine = Draft([1, 2, 3], scores=[0.9, 0.8, 0.7])
    branches = Draft([1, 5, 6], parents=[ROOT, 0, ROOT], scores=[0.95, 0.5, 0.05])
    tree, origins = merge([("ngram", spine, [0.9, 0.9, 0.9]), ("suffix", branches, [0.95, 0.5, 0.05])])
    assert tree.tokens == [1, 2, 3, 5, 6] and tree.parents == [ROOT, 0, 1, 0, ROOT]
    assert origins[0] == ("suffix", 0.95) and origins[3] == ("suffix", 0.5)
    # Rows cost 0.1 tokens each: node 6 (0.05) does not pay, node 5 (0.5) does.
    chosen = shape(tree, 3, 16, 16, lambda rows: 0.1 * rows)
    assert chosen == [0, 1, 2, 3]
    assert shape(tree, 3, 16, 1, lambda rows: 0.1 * rows) == [0, 1, 2]  # one leaf: a chain
    laid, order = subtree(tree, [0, 1, 2, 3])
    assert laid.tokens == [1, 2, 3, 5] and laid.parents == [ROOT, 0, 1, 0] and order == [0, 1, 2, 3]


def test_shape_weighs_the_whole_pass_not_each_row_alone() -> None:
    """A first draft row dearer than the next ones (a CPU's verify curve): two siblings of 0.15 each do not pay
    for the first row alone (0.2 tokens), together they pay for both (0.22); a third of 0.01 does not."""
    tree = Draft([1, 2, 3], parents=[ROOT, ROOT, ROOT], scores=[0.15, 0.15, 0.01])
    cost = {1: 1.0, 2: 1.2, 3: 1.22, 4: 1.24}
    assert shape(tree, 0, 16, 16, cost.__getitem__) == [0, 1]
    assert shape(tree, 0, 1, 16, cost.__getitem__) == []  # within a budget of one, nothing pays
    assert shape(tree, 0, 16, 16, None) == [0, 1, 2]  # no cost: the whole budget


def test_shape_never_exceeds_its_budget_or_leaves() -> None:
    rng = np.random.default_rng(2)
    for _ in range(100):
        n = int(rng.integers(1, 30))
        parents = [ROOT] + [int(rng.integers(-1, i)) for i in range(1, n)]
        scores = []
        for p in parents:
            scores.append((1.0 if p == ROOT else scores[p]) * float(rng.uniform(0.3, 1)))
        tree = Draft(list(range(n)), parents=parents, scores=scores)
        budget, leaves = int(rng.integers(1, 17)), int(rng.integers(1, 5))
        chosen = shape(tree, 0, budget, leaves, lambda rows: 0.0)
        laid, _ = subtree(tree, chosen)
        assert len(laid) <= budget and sum(1 for i in range(len(laid)) if i not in set(laid.parent_list())) <= leaves
        assert all(p == ROOT or p in set(range(len(laid))) for p in laid.parent_list())


def test_vocabulary_of_the_fake_model_fits_the_recycled_table() -> None:
    assert RecycledDrafter(N_VOCAB).successors.shape == (N_VOCAB, 4)


def _old_top_successors(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """What top_successors gave before: its old softmax normaliser (over a rows × vocab copy), after a full sort."""
    rows = np.asarray(logits, dtype=np.float32)
    top = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    top_logits = np.take_along_axis(rows, top, axis=1)
    peak = top_logits[:, :1]
    norm = np.exp(rows - peak, dtype=np.float32).sum(axis=1, keepdims=True)
    return top.astype(np.int32), np.exp(top_logits - peak) / norm


@pytest.mark.parametrize("vocab", [16, 49152])
@pytest.mark.parametrize("min_prob", [0.0, 0.05])
def test_top_successors_equals_the_old_computation(vocab: int, min_prob: float) -> None:
    """With a floor (the recycled table's: less likely successors are never drafted), the successors under it are
    left out (-1, probability 0) and the others are the same."""
    rng = np.random.default_rng(vocab)
    for scale in (0.1, 3.0, 30.0):  # flat rows, LLM-like spreads, near one-hot rows
        logits = (rng.standard_normal((17, vocab)) * scale).astype(np.float32)
        top, probs = top_successors(logits, 4, min_prob)
        old_top, old_probs = _old_top_successors(logits, 4)
        kept = old_probs >= min_prob
        assert np.array_equal(top, np.where(kept, old_top, -1))  # the same successors, in the same order
        np.testing.assert_allclose(probs, np.where(kept, old_probs, 0.0), rtol=1e-6)
        exact = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
        exact /= exact.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(probs, np.where(kept, np.take_along_axis(exact, old_top, axis=1), 0.0), rtol=1e-5)


def test_a_token_fed_twice_keeps_its_last_row() -> None:
    drafter = RecycledDrafter(n_vocab=10, k=2)
    logits = np.zeros((3, 10), dtype=np.float32)
    logits[0, 5] = logits[1, 6] = logits[2, 7] = 4.0
    drafter.observe([3, 4, 3], logits)  # token 3 in two branches: its last row wins
    assert drafter.successors[3, 0] == 7 and drafter.successors[4, 0] == 6
    # The engine names a pass's rows instead of copying them: the same table as from the rows themselves.
    by_rows = RecycledDrafter(n_vocab=10, k=2)
    by_rows.observe([3, 4, 3], np.concatenate([logits[:1] * 0, logits]), rows=[1, 2, 3])
    assert np.array_equal(by_rows.successors, drafter.successors) and np.array_equal(by_rows.probs, drafter.probs)


def test_an_engine_builds_mode_trees_memory_when_mode_tree_is_first_used(clock: FakeClock) -> None:
    """A large vocabulary's recycled table (6.4 MB here) and the earlier outputs' trie are not taken by an engine
    that never uses mode tree; the first generation in mode tree builds them, and its output is target-only's."""
    model = _copying_model(clock)
    model.n_vocab = 200_000  # type: ignore[misc]
    tracemalloc.start()
    engine = Engine(model, mode="ngram", gamma=4)
    plain = engine.generate(PROMPT, max_tokens=40)
    _, peak = tracemalloc.get_traced_memory()
    assert peak < 1_000_000
    tree = engine.generate(PROMPT, max_tokens=40, mode="tree")
    engine.generate(PROMPT, max_tokens=40, mode="tree")  # the first one's output joins the earlier outputs
    grown, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert grown > 200_000 * 4 * 8 and len(engine.tree_drafter.suffix.store) == 1
    assert tree.tokens == plain.tokens == SEQUENCE[len(PROMPT):len(PROMPT) + 40]


def test_branch_scores_follow_what_verification_accepted() -> None:
    """A branch drafter whose tested nodes are never accepted has its scores scaled down."""
    drafter = TreeDrafter(NgramDrafter(), SuffixDrafter(OutputStore()), RecycledDrafter(N_VOCAB))
    context = [BOS, *encode(". say ab"), EOS, *encode(" say ac"), EOS, *encode(" say ab"), EOS, *encode(" say a")]
    drafter.begin(context)  # lookup copies the latest 'say ab'; the suffix trie offers 'c' as well
    tree, origins = drafter.propose_tree(context, 16, None, 16, GREEDY, RNG)
    suffix_nodes = [i for i, (name, _) in enumerate(origins) if name == "suffix"]
    assert suffix_nodes
    for _ in range(50):
        drafter.learn(tree, origins, [])  # tested, never accepted
    again, _ = drafter.propose_tree(context, 16, None, 16, GREEDY, RNG)
    assert again.tokens == tree.tokens
    assert all(again.scores[i] < 0.2 * tree.scores[i] for i in suffix_nodes)  # type: ignore[index]


# -- what the stats report for trees ------------------------------------------------------------------------
def _tree_run(clock: FakeClock) -> tuple[Engine, list[tuple[int, Draft]]]:
    """An engine in mode tree whose drafter records each step's context length and tree."""
    engine = Engine(_copying_model(clock), mode="tree", gamma="auto")
    steps: list[tuple[int, Draft]] = []
    original = engine.tree_drafter.propose_tree

    def spy(context: Sequence[int], *args: object) -> tuple[Draft, list]:
        tree, origins = original(context, *args)  # type: ignore[arg-type]
        steps.append((len(context), tree))
        return tree, origins

    engine.tree_drafter.propose_tree = spy  # type: ignore[method-assign]
    return engine, steps


def test_mode_tree_stats_report_the_tree_size_and_the_accepted_depth(clock: FakeClock) -> None:
    """Per verify pass: the tree's nodes, and the depth of the path the target accepted, worked out here from each
    verified tree and the scripted text (what greedy decoding writes), against what the stats say."""
    engine, steps = _tree_run(clock)
    out = engine.generate(PROMPT, max_tokens=500)
    assert out.tokens == SEQUENCE[len(PROMPT):] and len(steps) == out.stats.steps
    truth = [*SEQUENCE, EOS]
    depth = [len(accepted_path(tree, truth[at:])) for at, tree in steps]
    assert out.stats.tree_size_mean == pytest.approx(np.mean([len(tree) for _, tree in steps]))
    assert out.stats.depth_mean == pytest.approx(np.mean(depth)) and out.stats.depth_mean > 1
    assert max(len(tree) for _, tree in steps) > max(depth)  # trees hold more than the path they give
    d = out.stats.to_dict()
    assert d["tree_size_mean"] == round(out.stats.tree_size_mean, 6) and d["depth_mean"] == round(np.mean(depth), 6)
    chains = Engine(_copying_model(clock), mode="ngram", gamma=4).generate(PROMPT, max_tokens=500).stats
    assert chains.tree_size_mean is None and chains.depth_mean == chains.accepted / chains.steps
