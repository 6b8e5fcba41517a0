"""`edgespec replay`: the γ controller and n-gram lookup replayed over greedy outputs, timed by fixed cost curves."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgespec.bench.questions import BenchError
from edgespec.bench.replay import (
    CURVES,
    LookupCutWhereWrong,
    LookupThenGuess,
    RecordedHead,
    Stream,
    accepted_path,
    curve_shape,
    load_streams,
    measured_curves,
    simulate,
)
from edgespec.cli.main import main
from edgespec.drafters import Draft
from edgespec.drafters.base import ROOT
from edgespec.drafters.tree import TreeDrafter
from edgespec.engine.sampling import SamplingParams
from tests.conftest import SPEC_BENCH


def test_a_curve_is_the_measured_points_joined_and_extended() -> None:
    shape = curve_shape(CURVES["amd-q4_1"])
    assert np.isnan(shape[0]) and shape[1] == 1.0 and shape[2] == 1.75 and shape[5] == 2.95
    assert shape[4] == pytest.approx((2.29 + 2.95) / 2)
    assert shape[10] == pytest.approx(4.84 + (4.84 - 2.95) / 4)  # past the last point: its last slope
    assert len(shape) == len(curve_shape(CURVES["flat"]))


def test_a_measured_curve_that_dips_is_pooled_not_extended_downward() -> None:
    """A timed tail below the point before it (noise: 6 rows at 1.73, 7 at 1.64) is pooled with it, so the curve past
    the last point keeps rising or stays level, and no point costs more than that many single passes."""
    shape = curve_shape({1: 1.0, 2: 1.23, 6: 1.73, 7: 1.64})
    assert shape[6] == shape[7] == pytest.approx((1.73 + 1.64) / 2)
    assert np.all(np.diff(shape[1:]) >= 0)
    assert curve_shape({1: 1.0, 2: 5.0, 3: 9.0})[2] == 2.0


def test_a_decode_loop_curve_result_is_replayed_as_its_loop_and_its_calibration(tmp_path: Path) -> None:
    """`--curve-file` takes a benchmarks/decode_loop_curve.py result: the curve the loop paid, each dip pooled with
    its neighbour by their passes, and the start-up calibration."""
    result = {"loop_curve": {"1": {"relative": 1.0, "passes": 900}, "2": {"relative": 1.2, "passes": 300},
                             "3": {"relative": 1.1, "passes": 100}, "4": {"relative": 1.5, "passes": 50}},
              "calibrated_curve": {"1": 1.0, "2": 1.05, "3": 1.1}}
    (tmp_path / "loop.json").write_text(json.dumps(result))
    curves = measured_curves(tmp_path / "loop.json")
    assert curves["calibration@loop"] == {1: 1.0, 2: 1.05, 3: 1.1}
    assert curves["loop@loop"] == pytest.approx({1: 1.0, 2: 1.175, 3: 1.175, 4: 1.5})  # (1.2·300 + 1.1·100) / 400


def test_a_bench_result_is_replayed_as_each_model_files_timed_curve(tmp_path: Path) -> None:
    """`--curve-file` takes an `edgespec bench` result (another machine's costs): each model file's timed curve once,
    relative to one row, named after the first configuration on that file; a result without one is refused."""
    curve = {"1": 0.008, "2": 0.0088, "3": 0.0088, "4": 0.0096}
    result = {"summary": {}, "workers": {
        "default": {"model_file": "/m/int8", "verify_curve": curve},
        "default-target": {"model_file": "/m/int8", "verify_curve": curve},
        "lcpp-plain": {"model_file": "/m/q4_1.gguf", "verify_curve": None}}}
    (tmp_path / "run.json").write_text(json.dumps(result))
    assert measured_curves(tmp_path / "run.json") == {"default@run": pytest.approx({1: 1.0, 2: 1.1, 3: 1.1, 4: 1.2})}
    (tmp_path / "peers.json").write_text(json.dumps({"summary": {}, "workers": {"lcpp-plain": {"verify_curve": None}}}))
    with pytest.raises(BenchError, match="timed a verify curve"):
        measured_curves(tmp_path / "peers.json")


def _scripted_streams() -> list[Stream]:
    """Three kinds of text after a 300-token prompt (fixed seed): 'copying' repeats spans of the prompt, 'fresh'
    shares nothing with it (lookup matches only by chance), 'mixed' alternates copied spans and fresh stretches."""
    rng = np.random.default_rng(7)
    streams = []
    for i in range(24):
        prompt = [int(t) for t in rng.integers(0, 400, 300)]
        kind = ("copying", "fresh", "mixed")[i % 3]
        out: list[int] = []
        while len(out) < 160:
            copy = kind == "copying" or (kind == "mixed" and len(out) // 40 % 2 == 0)
            if copy:
                start = int(rng.integers(0, 280))
                out += prompt[start:start + int(rng.integers(6, 20))]
            else:
                out += [int(t) for t in rng.integers(400, 800, 5)]  # tokens the prompt does not have
        streams.append(Stream(i, kind, 0, prompt, out[:160]))
    return streams



def test_a_backend_comparison_is_replayed_as_each_backends_curve(tmp_path: Path) -> None:
    """`--curve-file` takes `verify_curve_sizes.py --compare`'s result: one curve per backend on the same file,
    relative to its own one-row pass, so one recording replays on edgespec's kernels and on llama.cpp's alike."""
    result = {"mode": "compare", "backends": {
        "onnx": {"verify": {"1": {"ms": 22.0, "relative": 1.0}, "2": {"ms": 23.1, "relative": 1.05},
                            "8": {"ms": 34.8, "relative": 1.58}}},
        "llamacpp": {"verify": {"1": {"ms": 34.0, "relative": 1.0}, "2": {"ms": 60.9, "relative": 1.79}}}}}
    (tmp_path / "cmp.json").write_text(json.dumps(result))
    assert measured_curves(tmp_path / "cmp.json") == {"onnx@cmp": {1: 1.0, 2: 1.05, 8: 1.58},
                                                      "llamacpp@cmp": {1: 1.0, 2: 1.79}}

def test_the_controller_never_loses_on_a_steep_curve_and_drafts_where_it_pays() -> None:
    streams = _scripted_streams()
    steep = simulate(streams, curve_shape({1: 1.0, 2: 2.0, 9: 9.0}))  # a draft token costs a whole pass
    assert all(s["speedup"] >= 1.0 for s in steep.values()), steep
    amd = simulate(streams, curve_shape(CURVES["amd-q4_1"]))
    # One controller plays every stream in turn, as a server's does: a lookup key learned right on copied text is
    # tried a few times more on the fresh text after it (the steep curve's price: ~0.3% here).
    assert amd["overall"]["speedup"] > 1.1 and all(s["speedup"] >= 0.99 for s in amd.values()), amd
    assert amd["copying"]["speedup"] > 1.2  # long copied spans pay even there
    flat = simulate(streams, curve_shape(CURVES["flat"]))
    assert flat["mixed"]["speedup"] > 1.5 and flat["copying"]["speedup"] > amd["copying"]["speedup"]
    # Where verifying is nearly free, lookup keeps trying on text with nothing to copy for a while after a copied
    # passage (its statistics remember ~30 drafts): a small price, paid back many times on the other two.
    assert flat["fresh"]["gamma_mean"] > amd["fresh"]["gamma_mean"] and flat["fresh"]["speedup"] > 0.95
    assert simulate(streams, curve_shape(CURVES["flat"])) == flat  # deterministic


def test_a_controller_started_from_a_calibration_of_another_form_learns_the_curve_the_passes_cost() -> None:
    """The engine starts from its start-up calibration and pays the decode loop's curve. Calibrated flat at 2 rows
    with a fifth of the loop's excess (measured on the EPYC, docs/controller.md), on the scripted streams, lookup
    makes nearly what it makes when the calibration is the truth, on the loop curves measured there, with noisy
    timings; one steepness fitted to every k made 0.93× of it on the steeper one (the 16-column products' loop)."""
    streams = _scripted_streams()
    calibration = curve_shape(CURVES["avx512-prefetch-calibration"])
    for truth in ("avx512-prefetch-loop", "avx512-16col-loop"):
        shape = curve_shape(CURVES[truth])
        started_right = simulate(streams, shape, noise=0.2)["overall"]["speedup"]
        started_off = simulate(streams, shape, noise=0.2, calibration=calibration)["overall"]["speedup"]
        assert started_off >= 0.95 * started_right, (truth, started_off, started_right)


def test_the_replayed_drafter_can_be_another_one() -> None:
    """benchmarks/draft_ceiling.py replays lookup plus a second drafter of a given accuracy: the drafter given is
    the one played; one always right pays where lookup has nothing, one never right costs next to nothing."""
    streams = [s for s in _scripted_streams() if s.category == "fresh"]
    amd = curve_shape(CURVES["amd-q4_1"])
    alone = simulate(streams, amd)["overall"]
    helped = simulate(streams, amd, drafter=lambda: LookupThenGuess(streams, 1.0, chain=4))["overall"]
    assert alone["speedup"] < 1.1 < 1.5 < helped["speedup"] and helped["tau"] > 3 * alone["tau"]
    misled = simulate(streams, amd, drafter=lambda: LookupThenGuess(streams, 0.0))["overall"]
    assert misled["speedup"] >= 0.99 * alone["speedup"]  # free drafts are judged before any is verified


def _with_head(streams: list[Stream], right: bool, chain: int = 4) -> list[Stream]:
    """The streams with a recorded head that guesses the next ``chain`` tokens after every position, right or (token
    −1) wrong, sure of itself (key 6) and stopping on doubt after them."""
    out = []
    for s in streams:
        ahead = [s.output[j + 1:j + 1 + chain] for j in range(len(s.output))]
        tokens = [row if right else [-1] * len(row) for row in ahead]
        out.append(replace(s, head_tokens=tokens, head_keys=[6] * len(tokens), head_doubted=[True] * len(tokens)))
    return out


def test_a_recorded_head_stops_where_the_live_one_would_and_counts_its_passes() -> None:
    """HeadDrafter.propose: a pass per guess, and one more when its chain ended on doubt before the γ it was given;
    a draft cut by γ claims no extra pass."""
    stream = Stream(0, "x", 0, [1, 2], [3, 4, 5], head_tokens=[[4, 5], [5], []], head_keys=[3, 2, 1],
                    head_doubted=[True, False, False])
    head = RecordedHead([stream])
    head.begin([1, 2])
    params, rng = SamplingParams(), np.random.default_rng(0)
    draft = head.propose([1, 2, 3], 16, params, rng)
    assert (draft.tokens, draft.passes, draft.key, head.take_passes()) == ([4, 5], 3, 3, 3)
    draft = head.propose([1, 2, 3], 1, params, rng)  # γ 1 stops the chain first: no doubt paid
    assert (draft.tokens, draft.passes, head.take_passes()) == ([4], None, 1)
    draft = head.propose([1, 2, 3, 4], 16, params, rng)
    assert (draft.tokens, draft.passes, head.take_passes()) == ([5], None, 1)
    assert head.propose([1, 2, 3, 4, 5], 16, params, rng).tokens == [] and head.take_passes() == 0
    with pytest.raises(BenchError, match="no head guesses recorded"):
        RecordedHead([Stream(1, "x", 0, [9], [8])]).begin([9])


def test_mode_head_replays_lookup_then_the_recorded_head_at_its_cost() -> None:
    """Where lookup has nothing (fresh text), a head that is right pays and one that is always wrong is soon left
    alone; a dear head is asked less."""
    streams = _scripted_streams()
    curve = curve_shape(CURVES["avx512-prefetch-loop"])
    lookup = simulate(streams, curve)
    right = simulate(_with_head(streams, True), curve, head_cost=0.12)
    wrong = simulate(_with_head(streams, False), curve, head_cost=0.12)
    assert right["fresh"]["tau"] > 2 * lookup["fresh"]["tau"] and right["fresh"]["speedup"] > 1.5
    assert right["overall"]["speedup"] > lookup["overall"]["speedup"]
    assert wrong["overall"]["speedup"] > 0.95 * lookup["overall"]["speedup"]
    dear = simulate(_with_head(streams, True), curve, head_cost=0.6)
    assert dear["fresh"]["speedup"] < right["fresh"]["speedup"]
    with pytest.raises(BenchError, match="no head guesses recorded"):
        simulate(streams, curve, head_cost=0.12)


def test_lookup_cut_where_wrong_is_the_controllers_ceiling() -> None:
    """draft_ceiling's oracle row: lookup's drafts cut at their first wrong token are never rejected, lookup's own
    drafts as far as they go, so the controller (which then only weighs the curve) does at least as well."""
    streams = _scripted_streams()
    amd = curve_shape(CURVES["amd-q4_1"])
    lookup = simulate(streams, amd)
    oracle = simulate(streams, amd, drafter=lambda: LookupCutWhereWrong(streams))
    assert oracle["overall"]["alpha"] == 1.0
    for category, own in lookup.items():
        assert oracle[category]["speedup"] >= own["speedup"], (category, oracle[category], own)
    assert oracle["mixed"]["speedup"] > 1.05 * lookup["mixed"]["speedup"]  # mixed text: when a copy ends is news


def test_record_then_replay_with_the_real_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Record one question's target-only greedy output, replay it on two curves, and resume a recording that
    is already complete without recording again."""
    path = tmp_path / "streams.jsonl"
    args = ["replay", str(path), "--record", "--questions", str(SPEC_BENCH), "--categories", "writing",
            "--per-category", "1", "--max-tokens", "24", "--threads", "1", "--curves", "amd-q4_1,flat", "--json"]
    assert main(args) == 0
    results = json.loads(capsys.readouterr().out.split("\n", 1)[1])  # after the progress line
    streams = load_streams(path)
    assert [(s.category, s.turn) for s in streams] == [("writing", 0), ("writing", 1)]  # both turns of it
    assert all(0 < len(s.output) <= 24 and len(s.prompt) > 10 for s in streams)
    assert len(streams[1].prompt) > len(streams[0].prompt) + len(streams[0].output)  # the conversation so far
    assert all(results[curve]["overall"]["generations"] == 2 for curve in ("amd-q4_1", "flat"))
    # A 24-token text leaves little to win, and the first drafts of a request rest on the prior: one rejected
    # early draft cost ~0.2% on both curves here (the shipped Q4_1's text). Bounded, not a claim of gain.
    assert all(results[curve]["overall"]["speedup"] >= 0.99 for curve in ("amd-q4_1", "flat"))
    assert main(args) == 0  # already recorded: nothing is added
    assert load_streams(path) == streams
    # The recycled table's rows: the model's top-4 after every output token, the first the recorded next token.
    assert main(["replay", str(path), "--annotate", "--threads", "1", "--drafter", "tree", "--curves", "flat"]) == 0
    assert "argmax equals the recorded next token" in capsys.readouterr().out
    for stream in load_streams(path):
        assert stream.successors is not None and stream.successor_probs is not None
        assert len(stream.successors) == len(stream.output) and all(len(row) == 4 for row in stream.successors)
        assert [row[0] for row in stream.successors[:-1]] == stream.output[1:]
        assert all(1 >= p[0] >= p[1] >= p[2] >= p[3] > 0 for p in stream.successor_probs)


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "none.jsonl")]) == 2
    assert "no recorded streams" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "none.jsonl"), "--record"]) == 2  # Spec-Bench is not in the repository
    assert "give its question.jsonl with --questions FILE" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text("{\"tokens\": 1}\n")
    assert main(["replay", str(tmp_path / "bad.jsonl")]) == 2
    assert "not a file of recorded streams" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "bad.jsonl"), "--curves", "gpu"]) == 2
    assert "unknown curves gpu" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "bad.jsonl"), "--curve-file", str(tmp_path / "bad.jsonl")]) == 2
    assert "is not a verify_curve_sizes, decode_loop_curve or bench result" in capsys.readouterr().err


def test_accepted_path_is_the_greedy_tree_rule_on_recorded_tokens() -> None:
    tree = Draft([5, 6, 5, 7, 8], parents=[ROOT, 0, ROOT, 2, 3])
    assert accepted_path(tree, [5, 7, 8, 9]) == [2, 3, 4]  # the second root, not the first
    assert accepted_path(tree, [5, 6]) == [0, 1] and accepted_path(tree, [4]) == []
    assert accepted_path(tree, [5, 7, 8][:1]) == [0]  # never deeper than the recorded tokens


def test_tree_replay_judges_trees_without_timing() -> None:
    """Mode tree replayed: deterministic, never far below target-only where rows are dear, and on a flat curve at
    least lookup's τ (the same spine, plus branches where they pay); its chain variant verifies one leaf."""
    streams = _scripted_streams()
    flat = curve_shape(CURVES["flat"])
    lookup = simulate(streams, flat)["overall"]
    tree = simulate(streams, flat, tree_leaves=16)
    assert tree == simulate(streams, flat, tree_leaves=16)
    assert tree["overall"]["tau"] >= lookup["tau"] and tree["overall"]["depth_mean"] == pytest.approx(
        tree["overall"]["tau"] - 1, abs=0.01)
    steep = simulate(streams, curve_shape({1: 1.0, 2: 2.0, 9: 9.0}), tree_leaves=16)
    assert all(s["speedup"] >= 0.97 for s in steep.values()), steep


def test_a_drafters_own_time_is_paid_by_speculation_only() -> None:
    """``draft_overhead``: each speculative step pays it, plain decoding does not, so the speed-up falls by what it
    costs while what is drafted and accepted stays; ``overhead`` (the engine's, paid by both) does not: a step
    that commits several tokens pays it once, so it even raises the speed-up."""
    streams = _scripted_streams()
    flat = curve_shape(CURVES["flat"])
    free, dear = simulate(streams, flat)["overall"], simulate(streams, flat, draft_overhead=0.2)["overall"]
    assert dear["speedup"] < free["speedup"] and dear["tau"] == pytest.approx(free["tau"], abs=0.05)
    both = simulate(streams, flat, overhead=0.2)["overall"]
    assert dear["speedup"] < free["speedup"] < both["speedup"]


def test_tree_replay_reports_the_tree_size_and_the_accepted_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes per pass and accepted depth, worked out here from every replayed tree and the recorded output."""
    streams = _scripted_streams()[:6]
    outputs = {tuple(s.prompt): s for s in streams}
    trees: list[tuple[Draft, list[int]]] = []
    original = TreeDrafter.propose_tree

    def spy(self: TreeDrafter, context: list[int], *args: object) -> tuple[Draft, list]:
        tree, origins = original(self, context, *args)  # type: ignore[arg-type]
        stream = outputs[tuple(context[:300])]
        trees.append((tree, stream.output[len(context) - 300:]))
        return tree, origins

    monkeypatch.setattr(TreeDrafter, "propose_tree", spy)
    overall = simulate(streams, curve_shape(CURVES["flat"]), tree_leaves=16)["overall"]
    assert overall["tree_size_mean"] == pytest.approx(np.mean([len(t) for t, _ in trees]), abs=1e-3)
    assert overall["depth_mean"] == pytest.approx(np.mean([len(accepted_path(t, truth)) for t, truth in trees]),
                                                  abs=1e-3)
    assert overall["tree_size_mean"] > overall["depth_mean"] > 0
    assert simulate(streams, curve_shape(CURVES["flat"]))["overall"]["tree_size_mean"] is None  # lookup chains


def test_replay_cli_replays_trees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "streams.jsonl"
    path.write_text("".join(json.dumps(s.__dict__) + "\n" for s in _scripted_streams()[:3]))
    assert main(["replay", str(path), "--drafter", "tree", "--curves", "flat", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["flat"]["overall"]["generations"] == 3 and result["flat"]["overall"]["gamma_mean"] > 0
    overall = result["flat"]["overall"]
    assert main(["replay", str(path), "--drafter", "tree", "--curves", "flat"]) == 0
    assert (f"flat: τ {overall['tau']:.3f} · tree size {overall['tree_size_mean']:.2f} nodes a pass · accepted depth "
            f"{overall['depth_mean']:.3f}") in capsys.readouterr().out
