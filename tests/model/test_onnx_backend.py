"""The ONNX Runtime backend on a real export of SmolLM2-135M: losslessness of every drafting mode, the KV
arena shared by the target and its layer-skip self-draft, and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import psutil
import pytest

import edgespec
from edgespec.backends.onnx import segments
from edgespec.backends.onnx.layerskip import LayerSkipView
from edgespec.backends.onnx.manifest import MANIFEST
from edgespec.backends.onnx.model import OnnxModel, OnnxOptions
from edgespec.engine.engine import Engine
from edgespec.errors import EdgespecError, InvalidParameterError, ModelLoadError
from edgespec.kernels import library as custom_ops
from tests.conftest import SpecBench, onnx_export_dir
from tests.model.test_sampling_e2e import assert_sampling_matches_target

MAX_TOKENS = 24


def _prompt(engine: Engine, question: dict) -> list[int]:
    return engine.chat_tokens([{"role": "user", "content": question["turns"][0]}])


@pytest.fixture(scope="module")
def reference(onnx_engine: Engine, questions: list[dict]) -> dict[int, list[int]]:
    return {q["question_id"]: onnx_engine.generate(_prompt(onnx_engine, q), max_tokens=MAX_TOKENS, mode="none").tokens
            for q in questions}


@pytest.mark.parametrize("mode", ["layerskip", "ngram", "hybrid"])
def test_greedy_equals_target_only(onnx_engine: Engine, questions: list[dict], reference: dict[int, list[int]],
                                  mode: str) -> None:
    """Each of the 9 questions at one of γ = 1, 3, auto (every γ on three questions), per mode."""
    drafted = 0
    for i, q in enumerate(questions):
        gamma = (1, 3, "auto")[i % 3]
        out = onnx_engine.generate(_prompt(onnx_engine, q), max_tokens=MAX_TOKENS, mode=mode, gamma=gamma)
        assert out.tokens == reference[q["question_id"]], f"{mode} γ={gamma}: {q['category']} {q['question_id']}"
        drafted += out.stats.drafted if gamma != "auto" else 0
    assert drafted > 0, "nothing was verified speculatively at fixed γ: the test would prove nothing"


def test_greedy_at_long_context(onnx_engine: Engine, spec_bench: SpecBench) -> None:
    """Batch invariance matters most at long contexts: a prompt of well over 1000 tokens."""
    articles = [q["turns"][0] for q in spec_bench(["summarization"], per_category=2)]
    prompt = onnx_engine.chat_tokens([{"role": "user", "content": "\n\n".join(articles)}])
    assert len(prompt) > 1000
    expected = onnx_engine.generate(prompt, max_tokens=24, mode="none")
    for mode in ("hybrid", "layerskip"):
        assert onnx_engine.generate(prompt, max_tokens=24, mode=mode, gamma=4).tokens == expected.tokens


# -- the arena ---------------------------------------------------------------------------------------------
def test_random_accept_reject_leaves_exact_cache(onnx_engine: Engine) -> None:
    """Random drafts (layer-skip and arbitrary tokens), random verify outcomes and commits: the logits for
    the next position always equal those of a fresh prefill of the committed sequence, bit for bit."""
    arena, rng = onnx_engine.arena, np.random.default_rng(7)
    target: OnnxModel = onnx_engine.target  # type: ignore[assignment]
    kv_before = target.kv_array
    prompt = onnx_engine.tokenize("The committee met on Tuesday to discuss the budget for next year.")
    arena.reset(prompt)
    arena.commit([int(arena.extend("target", [], 1)[0].argmax())])
    for step in range(12):
        draft: list[int] = []
        if step % 2 == 0:  # the layer-skip view drafts into the shared memory first
            logits = arena.extend("layerskip", [], 1)
            for _ in range(int(rng.integers(1, 4))):
                draft.append(int(logits[0].argmax()))
                logits = arena.extend("layerskip", [draft[-1]], 1)
        else:
            draft = [int(t) for t in rng.integers(0, target.n_vocab, size=int(rng.integers(1, 5)))]
        arena.extend("target", draft, len(draft) + 1)
        keep = int(rng.integers(0, len(draft) + 1))
        # The token after the kept prefix: any token but the draft's (the target's verify would have kept that).
        rejected = draft[keep] if keep < len(draft) else -1
        arena.commit(draft[:keep] + [next(t for t in map(int, rng.integers(0, 1000, 2)) if t != rejected)])
    got = arena.extend("target", [], 1).copy()
    assert target.kv_array is kv_before  # the arena was never reallocated
    tokens = list(arena.tokens)
    arena.reset(tokens, reuse=False)
    fresh = arena.extend("target", [], 1)
    np.testing.assert_array_equal(got, fresh)


def test_layerskip_never_overwrites_committed_kv(onnx_engine: Engine, questions: list[dict]) -> None:
    """After a layer-skip generation, the KV of every committed position is exactly what the target alone
    wrote: the draft only ever wrote speculative positions, and the verify pass replaced them."""
    target: OnnxModel = onnx_engine.target  # type: ignore[assignment]
    prompt = _prompt(onnx_engine, questions[0])
    plain = onnx_engine.generate(prompt, max_tokens=20, mode="none")
    n = len(prompt) + len(plain.tokens) - 1  # the last token is committed but never fed
    kv_plain = target.kv_array[..., :n, :].copy()
    pointer = target.kv_array.ctypes.data
    spec = onnx_engine.generate(prompt, max_tokens=20, mode="layerskip", gamma=3)
    assert spec.tokens == plain.tokens and spec.stats.drafted > 0
    assert target.kv_array.ctypes.data == pointer
    np.testing.assert_array_equal(target.kv_array[..., :n, :], kv_plain)


def test_draft_and_target_share_sessions_and_memory(onnx_engine: Engine) -> None:
    target: OnnxModel = onnx_engine.target  # type: ignore[assignment]
    view = onnx_engine.arena.caches["layerskip"]
    assert isinstance(view, LayerSkipView)
    assert view.model is target  # one set of sessions: the view has none of its own
    assert set(vars(view)) == {"model", "skip", "layers", "n_ctx", "_end", "calibrated"}
    assert 0 < len(view.layers) < target.n_layer and not set(view.layers) & set(view.skip)


def test_fused_segments_split_at_the_skip_set_and_change_no_logit(onnx_engine: Engine, questions: list[dict]) -> None:
    """Consecutive layers run as one session (merged at load), split at the skip set once the layer-skip draft
    first runs, with the per-layer sessions' logits bit for bit before and after: prefill, a verify batch,
    single tokens and the draft's passes."""
    skip = [3, 4, 10]
    fused = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, n_ctx=256, layer_skip=skip))
    single = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, n_ctx=256, layer_skip=skip, fuse_layers=False))
    # At load: runs of layers capped in size (3 FP32 layers here), whatever the skip set.
    assert [i for segment in fused.segments for i in segment] == list(range(fused.n_layer))
    assert (3, 4, 5) in fused.segments and len(fused.segments) < fused.n_layer // 2
    assert single.segments == [(i,) for i in range(single.n_layer)]
    prompt = fused.tokenize(questions[0]["turns"][0])
    n = len(prompt)
    for model in (fused, single):
        model.decode(prompt, 0, 1)
    for tokens, n_logits in ((prompt[:4], 4), (prompt[4:5], 1)):  # a verify batch, then one token
        end = fused.cache_end()
        np.testing.assert_array_equal(fused.decode(tokens, end, n_logits), single.decode(tokens, end, n_logits))
    draft = fused.self_draft()
    kept = draft.layers
    np.testing.assert_array_equal(fused.forward(kept, prompt[:3], n + 5, 3), single.forward(kept, prompt[:3], n + 5, 3))
    # The draft's first pass split the segments at the skip set's boundaries; the target's logits are unchanged.
    assert [i for segment in fused.segments for i in segment] == list(range(fused.n_layer))
    assert {(0, 1, 2), (3, 4), (10,)} <= set(fused.segments)
    assert all(len({i in skip for i in segment}) == 1 for segment in fused.segments)
    end = fused.cache_end()
    np.testing.assert_array_equal(fused.decode(prompt[5:8], end, 3), single.decode(prompt[5:8], end, 3))
    with pytest.raises(EdgespecError, match="split a fused segment"):
        fused.forward([0, 1], prompt[:1], n + 5, 1)
    fused.close()
    single.close()


def test_hidden_states_of_chosen_layers(questions: list[dict]) -> None:
    """``forward``'s ``hidden`` tap (benchmarks/head_feature_probe.py): the keyed layers' output rows of a pass; the
    last layer's are the features a draft head reads. Only where each layer is a session of its own."""
    single = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, n_ctx=256, fuse_layers=False))
    fused = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, n_ctx=256))
    last = single.n_layer - 1
    single.keep_features()
    prompt = single.tokenize(questions[0]["turns"][0])
    single.decode(prompt, 0, 1)
    features = single.features(0, len(prompt)).copy()
    single.truncate(0)
    taps: dict[int, list[np.ndarray]] = {3: [], last: []}
    assert single.forward(range(single.n_layer), prompt, 0, 0, hidden=taps).shape[0] == 0
    np.testing.assert_array_equal(np.concatenate(taps[last]), features)
    assert np.concatenate(taps[3]).shape == features.shape and not np.array_equal(np.concatenate(taps[3]), features)
    with pytest.raises(EdgespecError, match="fuse_layers=False"):
        fused.forward(range(fused.n_layer), prompt, 0, 0, hidden={last: []})
    single.close()
    fused.close()


def test_a_passs_bindings_are_made_once_per_shape_and_bound_anew_nowhere(questions: list[dict]) -> None:
    """Passes reuse the IO bindings of their plan and number of rows (``_pass_io``): many passes of a few shapes
    keep as many sets as shapes, and their logits stay those of a fresh model's passes of the same tokens (a binding
    reused for another call's tokens reads them, not the first call's)."""
    model = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, n_ctx=256))
    fresh = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, n_ctx=256))
    prompt = (model.tokenize(questions[1]["turns"][0]) * 3)[:60]
    model.decode(prompt[:40], 0, 1)
    at = 40
    for width in [1, 3, 1, 2, 3, 1, 2, 1, 3, 3]:  # 10 passes after the first, of 3 shapes
        model.decode(prompt[at:at + width], at, width)
        at += width
    assert at == 60 and sorted(n for _, n in model._passes) == [1, 2, 3, 40]
    assert len(model._head_ios) == 4  # one per (rows, logit rows): (40, 1), (1, 1), (2, 2), (3, 3)
    model.truncate(40)
    np.testing.assert_array_equal(model.decode(prompt[40:43], 40, 3), fresh.decode(prompt[:43], 0, 3))
    model.close()
    fresh.close()


def test_segment_plan() -> None:
    half = segments.MAX_SEGMENT_BYTES // 2
    assert segments.plan(7, [2, 3], [half] * 7, fuse=True) == [[0, 1], [2, 3], [4, 5], [6]]  # skip runs, size cap
    assert segments.plan(3, [1], [1] * 3, fuse=True) == [[0], [1], [2]]
    assert segments.plan(3, [], [1] * 3, fuse=False) == [[0], [1], [2]]


def test_self_speculation_memory_within_10_percent(onnx_engine: Engine, questions: list[dict]) -> None:
    prompt = _prompt(onnx_engine, questions[1])
    process = psutil.Process(os.getpid())
    onnx_engine.generate(prompt, max_tokens=16, mode="none")
    alone = process.memory_info().rss
    for mode in ("layerskip", "hybrid"):
        onnx_engine.generate(prompt, max_tokens=16, mode=mode, gamma=3)
    assert process.memory_info().rss < 1.10 * alone


# -- sampling -----------------------------------------------------------------------------------------------
def test_layerskip_sampling_matches_target(onnx_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens sampled at speculative positions follow the target's distribution, with the layer-skip draft
    proposing them (its confidence stop off, so that every step drafts: where a draft stops never matters to
    the distribution, only to speed)."""
    monkeypatch.setattr(onnx_engine.drafters["layerskip"], "min_confidence", 0.0)
    assert_sampling_matches_target(onnx_engine, "layerskip", runs=120)


# -- bad input ---------------------------------------------------------------------------------------------
def _linked_copy(src: Path, dst: Path, manifest_changes: dict | None = None) -> Path:
    """A model directory whose files link to ``src``'s, with the manifest edited."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != MANIFEST:
            (dst / f.name).symlink_to(f)
    manifest = json.loads((src / MANIFEST).read_text())
    manifest.update(manifest_changes or {})
    (dst / MANIFEST).write_text(json.dumps(manifest))
    return dst


def _graph_without_kv(path: Path) -> None:
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "S", 576])
    y = helper.make_tensor_value_info("hidden_out", TensorProto.FLOAT, [1, "S", 576])
    graph = helper.make_graph([helper.make_node("Identity", ["hidden"], ["hidden_out"])], "no_kv", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    save(model, str(path))


def test_layer_without_kv_inputs(tmp_path: Path) -> None:
    folder = _linked_copy(onnx_export_dir(), tmp_path / "m")
    (folder / "layer_00.onnx").unlink()
    _graph_without_kv(folder / "layer_00.onnx")
    with pytest.raises(ModelLoadError, match="no KV cache inputs"):
        edgespec.load(folder, n_threads=1)



def test_an_export_folder_named_like_a_graph_file_loads(tmp_path: Path) -> None:
    """`edgespec export onnx ... --out m.onnx` writes a folder with that name: it is the export, not a lone graph."""
    folder = _linked_copy(onnx_export_dir(), tmp_path / "m.onnx")
    engine = edgespec.load(folder, n_threads=1, n_ctx=64, tuning=False)
    try:
        assert engine.generate("Hello", max_tokens=3).tokens
    finally:
        engine.close()

def test_lone_onnx_file_without_kv(tmp_path: Path) -> None:
    _graph_without_kv(tmp_path / "model.onnx")
    with pytest.raises(ModelLoadError, match="no KV cache inputs"):
        edgespec.load(tmp_path / "model.onnx")


def test_not_a_model_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not an edgespec ONNX model directory"):
        edgespec.load(tmp_path)  # a directory goes to the ONNX backend, which says what is missing


@pytest.mark.parametrize(("change", "message"), [({"num_kv_heads": 4}, "shape"), ({"head_dim": 32}, "shape"),
                                                 ({"kv_dtype": "bfloat16"}, "not supported"),
                                                 ({"kv_dtype": "the other"}, "but the manifest's KV is")])
def test_mismatched_arena_shape_or_dtype(tmp_path: Path, change: dict, message: str) -> None:
    """A manifest that does not match its graphs (hand-edited, or graphs copied from another export)."""
    source = onnx_export_dir()
    if change.get("kv_dtype") == "the other":  # half under the exact attention, float32 under GroupQueryAttention
        graphs = json.loads((source / MANIFEST).read_text())["kv_dtype"]
        change = {"kv_dtype": "float32" if graphs == "float16" else "float16"}
    folder = _linked_copy(source, tmp_path / "m", change)
    with pytest.raises(ModelLoadError, match=message):
        OnnxModel(folder, OnnxOptions(n_threads=1))


def test_skip_every_layer(onnx_engine: Engine) -> None:
    n = onnx_engine.target.n_layer
    with pytest.raises(InvalidParameterError, match="skips all"):
        OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, layer_skip=range(n)))
    with pytest.raises(InvalidParameterError, match="outside"):
        OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, layer_skip=[n]))


def test_self_draft_modes_need_an_onnx_model(engine: Engine) -> None:
    with pytest.raises(EdgespecError, match=r"llama\.cpp cannot skip layers"):
        engine.generate("Hello", max_tokens=2, mode="layerskip")


# -- Gemma 3 270M through the same path --------------------------------------------------------------------
@pytest.mark.slow
def test_gemma3_greedy_equals_target_only(spec_bench: SpecBench) -> None:
    """Gemma 3 (sliding-window layers, 262k vocabulary, no chat template in its GGUF), the default INT8 export.

    The translation prompt's verify batches cross 64 keys, where GroupQueryAttention's Q·Kᵀ over head_dim 256
    changes its summation passes; before the graphs padded calls past it, one position's logits differed by
    0.58 between a verify batch and single-token decoding (tests/model/test_onnx_batch_invariance.py).
    """
    engine = edgespec.load(onnx_export_dir("gemma3-270m", "int8"), n_ctx=1024, n_threads=1)
    try:
        for q in spec_bench(["translation", "coding"]):  # translation: 43 prompt tokens, verify crosses 64
            prompt = engine.tokenize(q["turns"][0])
            expected = engine.generate(prompt, max_tokens=24, mode="none").tokens
            for mode, gamma in (("layerskip", 2), ("hybrid", 3)):  # fixed γ: no cost calibration (slow on Gemma)
                out = engine.generate(prompt, max_tokens=24, mode=mode, gamma=gamma)
                assert out.tokens == expected, f"{mode} γ={gamma}: {q['category']}"
    finally:
        engine.close()


def test_every_session_in_the_process_runs_on_the_one_shared_pool(onnx_engine: Engine) -> None:
    """onnxruntime allows one process-wide pool, and then every session must use it: a second model asking
    for another thread count loads (and says what it really runs on), and so do the exporter's sessions."""
    from edgespec.export.onnx.reference import OnnxReference

    threads = onnx_engine.target.n_threads
    other = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=threads + 1, n_ctx=64))
    try:
        assert other.n_threads == threads
        ids = other.tokenize("The capital of France is")
        logits = other.decode(ids, 0, 1)[0].copy()
    finally:
        other.close()
    assert np.array_equal(OnnxReference(onnx_export_dir()).logits(ids)[-1], logits)


def test_profiling_writes_each_sessions_kernels(tmp_path: Path) -> None:
    """`OnnxOptions.profile` (benchmarks/pass_profile.py): every session in use writes its runs and kernel times
    under the prefix, and the logits are the unprofiled model's."""
    plain = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1))
    profiled = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, profile=str(tmp_path / "pass")))
    try:
        expected = plain.decode([1, 504, 3], 0, 2).copy()
        assert np.array_equal(profiled.decode([1, 504, 3], 0, 2), expected)
        sessions = len(profiled.segments) + 2  # the embedding, the layer segments, the head
        files = profiled.end_profiling()
    finally:
        plain.close()
        profiled.close()
    assert len(files) == sessions and all(f.parent == tmp_path and f.name.startswith("pass") for f in files)
    events = [json.loads(f.read_text()) for f in files]
    assert all(sum(e.get("name") == "model_run" for e in session) == 1 for session in events)
    kernels = {e["args"]["op_name"] for session in events for e in session
               if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")}
    assert {"Gather", "MatMul"} <= kernels


def test_a_model_runs_on_the_kernel_build_it_is_given(tmp_path: Path) -> None:
    """`OnnxOptions.kernels` (benchmarks/kernels_in_model.py): a copy of this machine's build, by path, gives the
    default build's logits; a path with no library is a clear error before any session exists, and so is a file
    onnxruntime cannot load as one."""
    with pytest.raises(InvalidParameterError, match="kernels must be a built library"):
        OnnxOptions(kernels=tmp_path / "missing.so")
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"not a library")
    with pytest.raises(ModelLoadError, match=r"cannot load edgespec's kernels from .*build-kernel"):
        OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, kernels=garbage))
    built = custom_ops.library()
    if built is None:
        pytest.skip("the kernel library is not built here")
    copy = tmp_path / built.name
    copy.write_bytes(built.read_bytes())
    plain = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1))
    other = OnnxModel(onnx_export_dir(), OnnxOptions(n_threads=1, kernels=copy))
    try:
        assert np.array_equal(other.decode([1, 504, 3], 0, 2), plain.decode([1, 504, 3], 0, 2))
    finally:
        plain.close()
        other.close()
