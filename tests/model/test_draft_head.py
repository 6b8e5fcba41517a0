"""The trained draft head (mode head): exported as ONNX beside a real SmolLM2 export, run by the real runtime.

The head used here is trained by the real training code (``head_training.train_eagle``) on the export's own
features of its greedy answers to the test prompts, so it has learnt them by heart: its guesses are accepted
often, in chains too, which exercises the head's cache through acceptances and rejections. Its output must still be
the target's alone, token for token, and its samples the target's distribution; the exported graphs must compute
what the trained module computes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from edgespec.export.head.export import output_rows, write_head

import edgespec
from edgespec.backends.onnx.manifest import MANIFEST, head_folder
from edgespec.backends.onnx.model import OnnxModel, OnnxOptions, open_head
from edgespec.backends.onnx.session import session_options
from edgespec.drafters import head as head_module
from edgespec.engine.arena import common_prefix
from edgespec.engine.engine import Engine
from edgespec.errors import InvalidParameterError, ModelLoadError
from tests.conftest import onnx_export_dir
from tests.model.test_sampling_e2e import assert_sampling_matches_target

torch = pytest.importorskip("torch")  # training the head (the export-hf extra; `make setup-dev` installs it)

PROMPTS = ["Name a colour and a fruit.", "Write three sentences about the sea.", "How do plants grow?"]
ANSWER_TOKENS = 64


def _greedy(model: OnnxModel, prompt: list[int], n: int) -> list[int]:
    model.truncate(0)
    logits = model.decode(prompt, 0, 1)
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(logits[-1].argmax()))
        logits = model.decode(ids[-1:], len(ids) - 1, 1)
    return ids


@pytest.fixture(scope="module")
def head_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An INT8 export (its files linked into a folder of its own) with a head trained on its answers beside it."""
    from edgespec.export.head.training import eagle_module, train_eagle

    source = onnx_export_dir(quant="int8")
    export = tmp_path_factory.mktemp("draft-head") / source.name
    export.mkdir()
    for file in source.iterdir():
        (export / file.name).symlink_to(file)
    engine = edgespec.load(export, n_ctx=1024, n_threads=1)
    model = engine.target
    model.keep_features()  # type: ignore[attr-defined]
    answers = []
    for text in PROMPTS:
        prompt = engine.chat_tokens([{"role": "user", "content": text}])
        ids = _greedy(model, prompt, ANSWER_TOKENS)  # type: ignore[arg-type]
        model.truncate(0)
        choices = model.decode(ids, 0, len(ids)).argmax(1)  # type: ignore[attr-defined]
        answers.append((model.features(0, len(ids)).copy(), np.asarray(ids), choices, len(prompt)))  # type: ignore[attr-defined]
    scale = float(np.sqrt(np.mean(np.concatenate([f for f, *_ in answers]) ** 2)))
    answers = [(f / scale, ids, choice, p) for f, ids, choice, p in answers]
    rows = output_rows(export) * model.manifest["hidden_size"] ** 0.5  # type: ignore[attr-defined]
    vocab = np.unique(np.concatenate([ids for _, ids, _, _ in answers]))
    embed = np.zeros((model.n_vocab, rows.shape[0]), np.float32)
    embed[vocab] = model.embed(vocab.tolist())  # type: ignore[attr-defined]
    engine.close()
    torch.set_num_threads(1)
    head = eagle_module(rows.shape[0], model.manifest["num_attention_heads"], embed, rows, vocab)  # type: ignore[attr-defined]
    train_eagle(head, answers, 60, len(answers), lambda _: None)
    state = {k: v.detach().numpy() for k, v in head.state_dict().items() if k not in ("embed", "out_rows", "vocab")}
    write_head(export, state, vocab, scale)
    np.savez(export.with_name(export.name + ".state.npz"), **state)  # for the comparison with the module
    return export


@pytest.fixture(scope="module")
def head_engine(head_export: Path) -> Iterator[Engine]:
    e = edgespec.load(head_export, n_ctx=1024, n_threads=1)
    yield e
    e.close()


def _prompt(engine: Engine, text: str) -> list[int]:
    return engine.chat_tokens([{"role": "user", "content": text}])


def test_exported_head_computes_what_the_trained_module_does(head_export: Path) -> None:
    """The ONNX head (8-bit products, its q/k rows reordered for the rotation of halves) against the torch module it
    was written from, on pairs of real features and tokens: the same guess at nearly every position."""
    from edgespec.export.head.training import eagle_module

    folder = head_folder(head_export)
    manifest = json.loads((folder / MANIFEST).read_text())
    vocab = np.load(folder / "vocab.npy")
    target = OnnxModel(head_export, OnnxOptions(n_ctx=256, n_threads=1))
    head = open_head(folder, n_ctx=256, n_threads=1)
    rng = np.random.default_rng(0)
    n, width = 40, target.manifest["hidden_size"]
    features = rng.standard_normal((n, width)).astype(np.float32)
    tokens = rng.choice(vocab, n)
    onnx_logits = head.decode(np.concatenate([features, target.embed(tokens.tolist())], 1), 0, n).copy()
    onnx_features = head.features(0, n).copy()
    # The module, rebuilt from the same parameters: read them back from the graphs' source (the trained state).
    state = _state_from_fixture(head_export)
    embed = np.zeros((target.n_vocab, width), np.float32)
    embed[tokens] = target.embed(tokens.tolist())
    module = eagle_module(width, manifest["num_attention_heads"], embed, output_rows(head_export) * width ** 0.5, vocab)
    module.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    with torch.no_grad():
        predicted = module(torch.tensor(features)[None], torch.tensor(tokens)[None])[0]
        logits = module.logits(predicted).numpy()
    assert np.abs(onnx_features - predicted.numpy()).max() < 0.05 * np.abs(predicted.numpy()).max()
    assert np.mean(onnx_logits.argmax(1) == logits.argmax(1)) >= 0.9


def test_the_heads_joined_pass_computes_what_its_three_graphs_do_apart(head_export: Path) -> None:
    """``HeadModel`` (``open_head``) runs the head's embed, layer and output graphs joined into one session
    (``onnx_segments.whole_pass``): its logits and last hidden states equal, bit for bit, those of the three graphs
    run one after the other by onnxruntime as exported (the KV fed back by hand), over a first pass of many rows,
    one-row passes and a pass asking for several logit rows."""
    import onnxruntime as ort

    folder = head_folder(head_export)
    manifest = json.loads((folder / MANIFEST).read_text())
    head = open_head(folder, n_ctx=256, n_threads=1)
    so, _ = session_options(1)
    embed, layer, out = (ort.InferenceSession(str(folder / name), so, providers=["CPUExecutionProvider"])
                         for name in (manifest["embed"], manifest["layers"][0], manifest["head"]))
    kv_shape = (1, manifest["num_kv_heads"], manifest["kv_length"], manifest["head_dim"])
    past = [np.zeros(kv_shape, np.float16 if manifest["kv_dtype"] == "float16" else np.float32) for _ in range(2)]
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((60, 2 * manifest["hidden_size"])).astype(np.float32)
    start = 0
    for n, n_logits in ((40, 1), (1, 1), (1, 1), (3, 1), (5, 3), (1, 1)):
        feed = rows[start:start + n]
        hidden = embed.run(None, {"features": feed[None]})[0]
        hidden, past[0], past[1] = layer.run(None, {
            "hidden": hidden, "past_key": past[0], "past_value": past[1],
            "seqlens_k": np.array([start + n - 1], np.int32), "total_sequence_length": np.array(start + n, np.int32)})
        apart = out.run(None, {"hidden": hidden[:, n - n_logits:]})[0][0]
        joined = head.decode(feed, start, n_logits)
        assert np.array_equal(joined, apart)
        assert np.array_equal(head.features(start, start + n), hidden[0])
        start += n


def _state_from_fixture(export: Path) -> dict[str, np.ndarray]:
    """The parameters ``head_export`` trained, as ``write_head`` received them."""
    with np.load(export.with_name(export.name + ".state.npz")) as z:
        return {k: z[k] for k in z.files}


def test_greedy_head_drafting_equals_target_only(head_engine: Engine) -> None:
    drafted_by_head = kept_from_head = 0
    head = head_engine.drafters["head"]
    original = head.propose
    proposals: list[list[int]] = []

    def recording(context, max_tokens, params, rng):  # type: ignore[no-untyped-def]
        draft = original(context, max_tokens, params, rng)
        proposals.append([len(context), *draft.tokens])
        return draft

    head.propose = recording  # type: ignore[method-assign]
    try:
        for text in PROMPTS:
            prompt = _prompt(head_engine, text)
            reference = head_engine.generate(prompt, max_tokens=ANSWER_TOKENS, mode="none").tokens
            for gamma in (2, "auto"):
                proposals.clear()
                out = head_engine.generate(prompt, max_tokens=ANSWER_TOKENS, mode="head", gamma=gamma)
                assert out.tokens == reference
                full = prompt + reference
                for at, *tokens in proposals:
                    drafted_by_head += len(tokens)
                    kept_from_head += common_prefix(tokens, full[at:])
    finally:
        del head.propose
    # The head learnt these answers: most of its guesses were verified and kept (the target's own answer agreed with
    # the draft's first tokens), not just rejected. Six initial seeds kept 63-74% here.
    assert drafted_by_head > 20 and kept_from_head > drafted_by_head / 2


def test_replay_plays_the_head_the_engine_runs(head_engine: Engine, head_export: Path, tmp_path: Path) -> None:
    """`edgespec replay --annotate-head` records, at every position of a target-only output, the proposal the live
    head makes there: each proposal of a real mode-head run is the start of the recorded one at its position. Mode
    head replayed on it then drafts with the head where lookup has nothing (this head knows these answers)."""
    from edgespec.bench.replay import CURVES, Stream, annotate_head, curve_shape, load_streams, simulate

    head = head_engine.drafters["head"]
    original = head.propose
    live: list[tuple[int, int, list[int]]] = []  # (context length, γ allowed, tokens)

    def recording(context, max_tokens, params, rng):  # type: ignore[no-untyped-def]
        draft = original(context, max_tokens, params, rng)
        live.append((len(context), max_tokens, draft.tokens))
        return draft

    runs = []  # (prompt, output, the live proposals made generating it)
    head.propose = recording  # type: ignore[method-assign]
    try:
        for text in PROMPTS:
            prompt = _prompt(head_engine, text)
            output = head_engine.generate(prompt, max_tokens=ANSWER_TOKENS, mode="none").tokens
            first = len(live)
            assert head_engine.generate(prompt, max_tokens=ANSWER_TOKENS, mode="head").tokens == output
            runs.append((prompt, output, live[first:]))
    finally:
        del head.propose
    path = tmp_path / "streams.jsonl"
    path.write_text("".join(json.dumps(asdict(Stream(i, "chat", 0, prompt, output))) + "\n"
                            for i, (prompt, output, _) in enumerate(runs)))
    annotate_head(str(head_export), path, threads=1, log=lambda _: None)
    recorded = load_streams(path)
    compared = 0
    for stream, (prompt, output, proposals) in zip(recorded, runs, strict=True):
        assert stream.head_tokens is not None and stream.head_keys is not None and stream.head_doubted is not None
        assert len(stream.head_tokens) == len(stream.head_keys) == len(output)
        assert all(1 <= key <= 6 for key in stream.head_keys)
        for length, allowed, tokens in proposals:
            at = length - len(prompt) - 1
            assert tokens == stream.head_tokens[at][:allowed], (at, tokens, stream.head_tokens[at])
            compared += 1
    assert compared > 10
    curve = curve_shape(CURVES["avx512-prefetch-loop"])
    lookup, with_head = simulate(recorded, curve)["overall"], simulate(recorded, curve, head_cost=0.12)["overall"]
    assert with_head["tau"] > lookup["tau"] and with_head["speedup"] > 1.0


def test_head_keeps_its_state_right_across_prompt_reuse_and_restored_conversations(head_engine: Engine) -> None:
    """Chats that extend a cached prompt and alternate with another conversation (the prompt cache restores its
    cache: the target's features come back with it) give the target-only output."""
    first = [{"role": "user", "content": PROMPTS[1]}]
    other = [{"role": "user", "content": PROMPTS[2]}]
    for messages in (first, other, first):
        reference = head_engine.generate(head_engine.chat_tokens(messages), max_tokens=32, mode="none",
                                         cache_prompt=False)
        out = head_engine.chat(messages, max_tokens=32, mode="head")
        assert out.tokens == reference.tokens
        follow = [*messages, {"role": "assistant", "content": out.text}, {"role": "user", "content": "Say more."}]
        reference = head_engine.generate(head_engine.chat_tokens(follow), max_tokens=24, mode="none",
                                         cache_prompt=False)
        out = head_engine.chat(follow, max_tokens=24, mode="head")
        assert out.stats.cached_tokens > 0 and out.tokens == reference.tokens


def test_head_at_the_end_of_the_context_equals_target_only(head_export: Path) -> None:
    engine = edgespec.load(head_export, n_ctx=128, n_threads=1)
    try:
        prompt = _prompt(engine, PROMPTS[0] + " " + "Please answer in detail. " * 12)
        reference = engine.generate(prompt, max_tokens=200, mode="none")
        out = engine.generate(prompt, max_tokens=200, mode="head", gamma=3)
        assert out.finish_reason == reference.finish_reason == "length"
        assert out.tokens == reference.tokens
    finally:
        engine.close()


def test_sampled_head_drafting_follows_the_target_distribution(head_engine: Engine) -> None:
    assert_sampling_matches_target(head_engine, "head")


def test_a_head_for_another_model_is_refused_with_the_reason(head_export: Path, tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    for file in head_export.iterdir():
        (export / file.name).symlink_to(file.resolve())
    head = head_folder(export)
    shutil.copytree(head_folder(head_export), head)
    manifest = json.loads((head / MANIFEST).read_text())
    manifest["draft_head"]["target_vocab_size"] = 32000
    (head / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match=r"not a draft head for .*vocabulary of 32000"):
        edgespec.load(export, n_ctx=256, n_threads=1)


def test_mode_head_without_a_head_says_how_to_make_one() -> None:
    engine = edgespec.load(onnx_export_dir(quant="int8"), n_ctx=256, n_threads=1)
    try:
        with pytest.raises(InvalidParameterError, match="edgespec export head"):
            engine.generate("Hello", max_tokens=2, mode="head")
    finally:
        engine.close()


def test_a_head_loaded_as_a_model_is_refused_with_the_reason(head_export: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"is a draft head, not a model: load the export it drafts for"):
        edgespec.load(head_folder(head_export), n_ctx=256, n_threads=1)


def test_the_export_commands_train_a_head_and_write_it_beside_an_export(head_export: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`edgespec export head-weights` (a tiny run of the real training: the model's sampled answers through
    transformers, then the head; its sampling cut by time after the first batch, as on a GPU lent for minutes) and
    `edgespec export head --weights` (its ONNX beside another export's files, the output rows cut to the tokens its
    answers chose most), then a generation in mode head equal to target-only."""
    from edgespec.catalog.models import resolve
    from edgespec.cli.main import main

    weights = tmp_path / "head.npz"
    assert main(["export", "head-weights", str(resolve("smollm2-135m")), "--out", str(weights), "--prompts", "4",
                 "--samples", "2", "--epochs", "1", "--max-tokens", "12", "--device", "cpu",
                 "--sampling-seconds", "0.001"]) == 0
    export = tmp_path / "export"
    export.mkdir()
    for file in head_export.iterdir():
        (export / file.name).symlink_to(file.resolve())
    assert main(["export", "head", str(export), "--weights", str(weights), "--rows", "30"]) == 0
    assert "draft with it: edgespec generate" in capsys.readouterr().out
    manifest = json.loads((head_folder(export) / MANIFEST).read_text())
    assert manifest["draft_head"]["output_rows"] == 30 and manifest["draft_head"]["training"]["samples"] == 2
    assert manifest["draft_head"]["training"]["sampled"] == 4  # the first batch (all 4 prompts), then the time was up
    engine = edgespec.load(export, n_ctx=256, n_threads=1)
    try:
        prompt = _prompt(engine, PROMPTS[2])
        reference = engine.generate(prompt, max_tokens=24, mode="none").tokens
        assert engine.generate(prompt, max_tokens=24, mode="head", gamma=2).tokens == reference
    finally:
        engine.close()


def test_head_drafting_goes_on_when_its_kept_embeddings_overflow(head_engine: Engine,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The embeddings kept at hand are bounded: where a step's tokens overflow the bound, those already kept must
    come back with the new ones (a 30-minute run of generations once failed there with a KeyError)."""
    monkeypatch.setattr(head_module, "EMBEDDINGS_KEPT", 4)
    head_engine.drafters["head"]._embeddings.clear()  # type: ignore[attr-defined]
    prompt = _prompt(head_engine, PROMPTS[0])
    reference = head_engine.generate(prompt, max_tokens=96, mode="none").tokens
    assert head_engine.generate(prompt, max_tokens=96, mode="head", gamma=3).tokens == reference
    assert len(head_engine.drafters["head"]._embeddings) <= 4 + len(prompt)  # type: ignore[attr-defined]
