"""The edge architectures on the GGUF/llama.cpp backend: a tiny random model of each (tests/tiny_gguf.py) decodes,
and greedy speculation with n-gram lookup and with a draft model (another tiny model of the same architecture)
equals target-only decoding, at a short and a long context. docs/models.md's support table cites these tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import edgespec
from edgespec.engine.engine import Engine
from tests.conftest import SpecBench
from tests.tiny_gguf import ARCHITECTURES, SLIDING_WINDOW, VARIANTS, tiny_gguf

MAX_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def tiny_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    folder = tmp_path_factory.mktemp(request.param)
    target = tiny_gguf(folder / "target.gguf", request.param, seed=0, smollm2_vocabulary=False)
    draft = tiny_gguf(folder / "draft.gguf", request.param, seed=1, smollm2_vocabulary=False)
    engine = edgespec.load(target, draft=draft, n_ctx=2048, n_threads=1)
    yield engine
    engine.close()


def _prompts(engine: Engine, spec_bench: SpecBench) -> list[list[int]]:
    short = engine.tokenize("List the days of the week: Monday, Tuesday, Wednesday, Monday, Tuesday,")
    articles = "\n\n".join(q["turns"][0] for q in spec_bench(["summarization"], per_category=2))
    long = engine.tokenize(articles)[:900]
    assert len(long) == 900 > SLIDING_WINDOW
    return [short, long]


@pytest.mark.parametrize("mode, gamma", [("ngram", 3), ("ngram", "auto"), ("draft", 2), ("draft", "auto")])
def test_greedy_speculation_equals_target_only(tiny_pair: Engine, mode: str, gamma: object,
                                               spec_bench: SpecBench) -> None:
    drafted = 0
    for prompt in _prompts(tiny_pair, spec_bench):
        expected = tiny_pair.generate(prompt, max_tokens=MAX_TOKENS, mode="none")
        assert len(expected.tokens) == MAX_TOKENS or expected.finish_reason == "stop"
        out = tiny_pair.generate(prompt, max_tokens=MAX_TOKENS, mode=mode, gamma=gamma)
        assert out.tokens == expected.tokens, f"{mode} γ={gamma}, prompt of {len(prompt)} tokens"
        drafted += out.stats.drafted
    if mode == "draft" and gamma != "auto":
        assert drafted > 0, "nothing was verified speculatively: the test would prove nothing"


def test_target_decodes_a_whole_context(tiny_pair: Engine, spec_bench: SpecBench) -> None:
    """Each architecture's graph runs past its sliding window and fills most of the context."""
    out = tiny_pair.generate(_prompts(tiny_pair, spec_bench)[1], max_tokens=200, mode="none")
    assert out.stats.generated_tokens > 0 and out.stats.prompt_tokens == 900


def test_architecture_names_are_listed(tmp_path: Path) -> None:
    from edgespec.catalog import info as model_info

    for arch in ARCHITECTURES:
        info = model_info.describe(tiny_gguf(tmp_path / f"{arch}.gguf", arch, smollm2_vocabulary=False))
        assert info.architecture == VARIANTS.get(arch, arch) and info.llamacpp
        # the exporter reads every one of them without torch (tests/export/test_export_gguf_archs.py)
        assert info.onnx
