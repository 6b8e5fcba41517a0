"""The prompt cache is exact: reusing cached KV (the arena's prefix, a saved conversation) gives the same
logits, bit for bit, and the same text as a fresh prefill, on both backends and in speculative modes.

Engines here prefill in batches of 32 tokens, so that a prompt tail longer than the batch costs little;
the references are one-thread engines (batches of 512 / 256) prefilling every prompt afresh. The ONNX engines
run the export the default path races (INT8 from the shipped GGUF, half KV under edgespec's attention).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel
from edgespec.backends.onnx.model import OnnxModel, OnnxOptions
from edgespec.catalog.models import DEFAULT_MODEL, resolve
from edgespec.engine.arena import ArenaState, CacheState, common_prefix
from edgespec.engine.chat import Message
from edgespec.engine.engine import Completion, Engine
from edgespec.engine.prompt_cache import PromptCache
from edgespec.kernels import library as custom_ops
from tests.conftest import onnx_export_dir

N_BATCH = 32
MAX_TOKENS = 16
SYSTEM = "You are a concise assistant. Answer in one or two sentences."
QUESTIONS = [
    "What is the capital of France?",
    # Longer than N_BATCH tokens on its own: this turn's uncached tail spans several prefill batches.
    "Here is a paragraph about lighthouses. Lighthouses were built along dangerous coasts to warn ships of "
    "rocks and shoals; their keepers trimmed the wicks, wound the clockwork that turned the lens, and logged "
    "every passing vessel through long winter nights. Summarize it in one sentence.",
    "Now name one famous lighthouse.",
]


@pytest.fixture(scope="module")
def gguf() -> Iterator[Engine]:
    e = Engine(LlamaModel(resolve(DEFAULT_MODEL), ContextOptions(n_ctx=2048, n_batch=N_BATCH, n_threads=1)), gamma=4)
    yield e
    e.close()


@pytest.fixture(scope="module")
def onnx() -> Iterator[Engine]:
    e = Engine(OnnxModel(onnx_export_dir(quant="int8"), OnnxOptions(n_ctx=1024, n_batch=N_BATCH, n_threads=1)),
               gamma=4)
    assert e.target.kv_array.dtype == (np.float16 if custom_ops.library() else np.float32)  # type: ignore[attr-defined]
    yield e
    e.close()


@pytest.fixture(scope="module")
def onnx_fresh() -> Iterator[Engine]:
    """The same export, prefilling in the default batches."""
    e = Engine(OnnxModel(onnx_export_dir(quant="int8"), OnnxOptions(n_ctx=1024, n_threads=1)), gamma=4)
    yield e
    e.close()


@pytest.fixture(params=["gguf", "onnx"])
def pair(request: pytest.FixtureRequest) -> tuple[Engine, Engine]:
    """(an engine that reuses, the session's engine of the same backend that prefills afresh)."""
    if request.param == "gguf":
        return request.getfixturevalue("gguf"), request.getfixturevalue("solo_engine")
    return request.getfixturevalue("onnx"), request.getfixturevalue("onnx_fresh")


@contextlib.contextmanager
def _raw(engine: Engine) -> Iterator[LlamaModel | OnnxModel]:
    """The engine's target model, used directly; its arena forgets what the cache held, before and after."""
    engine.arena.reset([0], reuse=False)
    try:
        yield engine.target
    finally:
        engine.target.truncate(0)
        engine.arena.reset([0], reuse=False)


def _tokens(engine: Engine, n: int) -> list[int]:
    text = " ".join(QUESTIONS * 4)
    tokens = engine.tokenize(text)
    assert len(tokens) >= n
    return tokens[:n]


# -- logits: a kept prefix plus a decoded tail == a fresh prefill -------------------------------------------
@pytest.mark.parametrize(("prefix", "tail"), [(1, 1), (17, 5), (23, 45), (100, 70)])
def test_kept_prefix_plus_tail_is_bit_identical(pair: tuple[Engine, Engine], prefix: int, tail: int) -> None:
    tokens = _tokens(pair[0], prefix + tail)
    with _raw(pair[0]) as model:
        assert model.exact_reuse
        fresh = model.decode(tokens, 0, 3).copy()
        # The prefix as a generation leaves it: most of it prefilled, its end one token at a time, then
        # other tokens after it that the next sequence does not share.
        model.truncate(0)
        half = max(1, prefix - 4)
        model.decode(tokens[:half], 0, 1)
        for i in range(half, prefix):
            model.decode([tokens[i]], i, 1)
        model.decode([7, 8, 9], prefix, 3)
        model.truncate(prefix)
        reused = model.decode(tokens[prefix:], prefix, 3)
        rows = min(3, tail)
        assert np.array_equal(fresh[-rows:], reused[-rows:]), np.abs(fresh[-rows:] - reused[-rows:]).max()


def test_saved_state_restores_bit_identical(pair: tuple[Engine, Engine]) -> None:
    tokens = _tokens(pair[0], 90)
    with _raw(pair[0]) as model:
        fresh = model.decode(tokens, 0, 1).copy()
        model.truncate(0)
        model.decode(tokens[:60], 0, 1)
        state = model.save_state()
        assert state is not None and state.n_tokens == 60 and state.nbytes > 0
        model.truncate(0)
        model.decode(tokens[30:80], 0, 1)  # another conversation overwrites the cache
        model.load_state(state)
        assert model.cache_end() == 60
        assert np.array_equal(model.decode(tokens[60:], 60, 1), fresh)


# -- text: each turn with reuse == a fresh engine's text for the same conversation ------------------------
def _both(pair: tuple[Engine, Engine], messages: list[Message] | list[int], **kwargs: object
          ) -> tuple[Completion, Completion]:
    reuse, fresh = pair
    kwargs = {"gamma": 4, **kwargs}  # one γ for both: with a seed, even samples must then agree
    if isinstance(messages[0], dict):
        out = reuse.chat(messages, max_tokens=MAX_TOKENS, **kwargs)  # type: ignore[arg-type]
        ref = fresh.chat(messages, max_tokens=MAX_TOKENS, cache_prompt=False, **kwargs)  # type: ignore[arg-type]
    else:
        out = reuse.generate(messages, max_tokens=MAX_TOKENS, **kwargs)  # type: ignore[arg-type]
        ref = fresh.generate(messages, max_tokens=MAX_TOKENS, cache_prompt=False, **kwargs)  # type: ignore[arg-type]
    assert ref.stats.cached_tokens == 0
    assert out.tokens == ref.tokens and out.text == ref.text
    return out, ref


def _conversation(pair: tuple[Engine, Engine], mode: str, temperature: float = 0.0) -> list[Completion]:
    """Three turns of a conversation no earlier test had; returns the reusing engine's completions."""
    messages: list[Message] = [{"role": "system", "content": f"{SYSTEM} (Mode {mode}, temperature {temperature}.)"}]
    outs = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        out, _ = _both(pair, messages, mode=mode, temperature=temperature, seed=5)
        outs.append(out)
        messages.append({"role": "assistant", "content": out.text})
    return outs


@pytest.mark.parametrize("mode", ["none", "ngram"])
def test_conversation_turns_equal_fresh_prefill(pair: tuple[Engine, Engine], mode: str) -> None:
    outs = _conversation(pair, mode)
    # Every later turn reused the conversation so far; the second one's new tail spans several batches.
    for before, after in itertools.pairwise(outs):
        assert before.stats.prompt_tokens <= after.stats.cached_tokens < after.stats.prompt_tokens
    assert outs[1].stats.prompt_tokens - outs[1].stats.cached_tokens > N_BATCH
    if mode == "ngram":
        assert sum(o.stats.drafted for o in outs) > 0, "nothing was drafted: the mode was not exercised"


def test_sampled_conversation_equals_fresh_prefill(pair: tuple[Engine, Engine]) -> None:
    """With a seed and fixed γ, even a sample is the same: the drafts and the random draws are."""
    outs = _conversation(pair, "ngram", temperature=0.8)
    assert outs[-1].stats.cached_tokens > 0


@pytest.mark.parametrize("mode", ["layerskip", "hybrid"])
def test_self_draft_modes_continue_from_the_reused_prefix(onnx: Engine, onnx_fresh: Engine, mode: str) -> None:
    outs = _conversation((onnx, onnx_fresh), mode)
    assert outs[-1].stats.cached_tokens > outs[0].stats.prompt_tokens
    assert sum(o.stats.drafted for o in outs) > 0


def test_draft_model_cache_continues_from_the_reused_prefix(pair_engine: Engine) -> None:
    """The draft model's cache is reused too: with a fixed γ its drafts, and so what the target accepted, are
    exactly those of a fresh prefill of both caches."""
    messages: list[Message] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    for question in QUESTIONS[1:]:
        ref = pair_engine.chat(messages, max_tokens=MAX_TOKENS, mode="draft", gamma=4, cache_prompt=False)
        out = pair_engine.chat(messages, max_tokens=MAX_TOKENS, mode="draft", gamma=4)
        assert out.tokens == ref.tokens
        assert (out.stats.drafted, out.stats.accepted) == (ref.stats.drafted, ref.stats.accepted) != (0, 0)
        assert out.stats.cached_tokens == out.stats.prompt_tokens - 1
        messages += [{"role": "assistant", "content": out.text}, {"role": "user", "content": question}]


def test_edited_earlier_message_reuses_up_to_the_edit(pair: tuple[Engine, Engine]) -> None:
    first: list[Message] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[1]}]
    out, _ = _both(pair, first, mode="ngram")
    edited: list[Message] = [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": QUESTIONS[1].replace("winter", "summer")},
                             {"role": "assistant", "content": out.text},
                             {"role": "user", "content": QUESTIONS[2]}]
    again, _ = _both(pair, edited, mode="ngram")
    shared = pair[0].chat_tokens(edited)
    n = next(i for i, (a, b) in enumerate(zip(pair[0].chat_tokens(first), shared, strict=False)) if a != b)
    assert again.stats.cached_tokens == n  # partial reuse: everything before the edit, nothing after


def test_prefix_ending_mid_template(pair: tuple[Engine, Engine]) -> None:
    messages: list[Message] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    full = pair[0].chat_tokens(messages)
    cut = full[:-2]  # ends inside the "<|im_start|>assistant\n" header
    _both(pair, cut, mode="ngram")
    out, _ = _both(pair, messages, mode="ngram")
    assert out.stats.cached_tokens >= len(cut)


def test_cache_prompt_false_prefills_everything(gguf: Engine) -> None:
    prompt = gguf.tokenize(QUESTIONS[1])
    gguf.generate(prompt, max_tokens=2)
    assert gguf.generate(prompt, max_tokens=2).stats.cached_tokens == len(prompt) - 1
    assert gguf.generate(prompt, max_tokens=2, cache_prompt=False).stats.cached_tokens == 0


# -- several conversations: saved states come back exactly ------------------------------------------------
def test_alternating_conversations_restore_their_states(pair: tuple[Engine, Engine]) -> None:
    reuse = pair[0]
    reuse.prompt_cache.resize(64)
    chats: list[list[Message]] = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
                                  for q in (QUESTIONS[0], QUESTIONS[1])]
    before = []
    for messages in chats:  # A, then B: B drops A's entries from the arena, which saves them first
        before.append(reuse.chat_tokens(messages))
        out, _ = _both(pair, messages, mode="ngram")
        messages += [{"role": "assistant", "content": out.text}, {"role": "user", "content": QUESTIONS[2]}]
    shared = common_prefix(before[0], before[1])  # the system prompt and a turn header
    for messages, prompt in zip(chats, before, strict=True):  # A again, then B again: each is restored
        out, _ = _both(pair, messages, mode="ngram")
        assert out.stats.cached_tokens >= len(prompt) > shared
    assert len(reuse.prompt_cache) >= 1


def test_without_room_only_the_shared_system_prompt_is_reused(gguf: Engine, solo_engine: Engine) -> None:
    gguf.prompt_cache.resize(0)
    try:
        a: list[Message] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
        b: list[Message] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[2]}]
        _both((gguf, solo_engine), a)
        _both((gguf, solo_engine), b)
        out, _ = _both((gguf, solo_engine), a)
        assert out.stats.cached_tokens == common_prefix(gguf.chat_tokens(a), gguf.chat_tokens(b))
        assert len(gguf.prompt_cache) == 0
    finally:
        gguf.prompt_cache.resize(64)


def test_fast_numerics_fall_back_to_a_fresh_prefill() -> None:
    """Without batch-invariant numerics a kept prefix is not bit-identical: every prompt is prefilled whole."""
    e = Engine(LlamaModel(resolve(DEFAULT_MODEL), ContextOptions(n_ctx=512, n_threads=1, exact_numerics=False)),
               gamma=0)
    try:
        assert not e.target.exact_reuse
        prompt = e.tokenize(QUESTIONS[0])
        assert [e.generate(prompt, max_tokens=2).stats.cached_tokens for _ in range(2)] == [0, 0]
        assert len(e.prompt_cache) == 0
    finally:
        e.close()


def test_lookup_that_restores_nothing_does_not_refresh_a_state() -> None:
    """Only a state a request restores counts as used: a near miss must not keep it from eviction."""
    def state(tokens: tuple[int, ...]) -> ArenaState:
        return ArenaState({"target": tokens}, {"target": CacheState(len(tokens), 1 << 20, None)})

    cache = PromptCache(max_mb=2)
    old, new = state((1, 2, 3, 4)), state((5, 6, 7))
    cache.put(old)
    cache.put(new)
    assert cache.best([1, 2, 9], longer_than=2) == (None, 0)  # shares 2: no better than what the arena keeps
    cache.put(state((8, 9)))  # over budget: the least recently used goes
    assert cache.best([1, 2, 3, 4, 5]) == (None, 0)
    assert cache.best([5, 6, 7, 1]) == (new, 3)
