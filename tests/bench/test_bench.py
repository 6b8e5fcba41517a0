"""`edgespec bench`: a smoke benchmark on real models and real peers, checked for schema and consistency."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edgespec.bench.configs import CONFIGS, DEFAULT_CONFIGS, select
from edgespec.bench.conversation import lowest_turns, time_to
from edgespec.bench.questions import CONSTRAINED_QUESTIONS, BenchError, conversation, load_questions
from edgespec.bench.report import head_to_head, lookup_hits, ratio_interval, summarize
from edgespec.cli.main import generate_engine, main
from edgespec.engine.engine import Engine
from edgespec.errors import EdgespecError
from tests.conftest import SPEC_BENCH

_SUMMARY_KEYS = {"generations", "tokens", "decode_tok_s", "e2e_tok_s", "e2e_latency_s", "ttft_s", "alpha", "tau",
                 "gamma_mean", "draft_s", "verify_s", "draft_share", "peak_rss_mb", "same_as_baseline", "lossless",
                 "bound_tok_s", "draft_cost_ratio", "verify_only_tok_s", "bound_fraction", "speedup", "speedup_e2e",
                 "latency_ratio", "lookup_share", "prefill_tok_s", "depth_mean", "tree_size_mean",
                 "draft_steps_share", "forced_share", "schema_valid"}


def _bench(tmp_path: Path, *args: str) -> dict:
    assert main(["bench", "--questions", str(SPEC_BENCH), "--threads", "1", "--out", str(tmp_path), *args]) == 0
    (path,) = tmp_path.glob("spec_bench-*.json")
    return json.loads(path.read_text())


def test_smoke_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2 questions, 16 tokens, 2 configurations: the JSON has every field, ratios and bounds are consistent."""
    result = _bench(tmp_path, "--limit", "2", "--max-tokens", "16", "--configs", "target,ngram-g4")
    printed = capsys.readouterr().out
    assert "ngram-g4" in printed and "memory bandwidth" in printed and "ngram-g4: steps drafted by ngram" in printed

    assert result["schema"] == "edgespec-bench/1"
    assert result["machine"]["cpu"] and result["machine"]["versions"]["llama-cpp-python"] == "0.3.36"
    assert result["args"]["max_tokens"] == 16 and result["args"]["limit"] == 2 and result["date"]
    assert [c["name"] for c in result["configs"]] == ["target", "ngram-g4"]
    questions = load_questions(SPEC_BENCH, limit=2)
    turns = sum(len(q["turns"]) for q in questions)
    assert len(result["records"]) == 2 * turns  # every turn of every question, for both configurations
    assert all(0 < r["n_tokens"] <= 16 for r in result["records"])
    assert summarize(result) == result["summary"]  # a saved run can be summarized again from its JSON

    summary = result["summary"]
    categories = {q["category"] for q in questions} | {"overall"}
    for name in ("target", "ngram-g4"):
        assert set(summary[name]) == categories
        for cat, s in summary[name].items():
            assert set(s) == _SUMMARY_KEYS
            # edgespec is lossless: every output equals target-only decoding (the target is its own reference)
            assert s["same_as_baseline"] == s["generations"]
            assert s["lossless"] == (None if name == "target" else s["generations"])
            # the bounds bound: achieved ≤ the verify-only rate (exact), ≤ the curve bound (itself measured: 3%)
            assert s["decode_tok_s"] <= s["verify_only_tok_s"]
            assert 0 < s["bound_fraction"] <= 1.03
            assert s["decode_tok_s"] > 0 and s["ttft_s"] > 0 and s["peak_rss_mb"] > 50
            assert s["e2e_latency_s"] > s["ttft_s"]
            first_turns = [r for r in result["records"] if r["config"] == name and r["turn"] == 0
                           and cat in ("overall", r["category"])]
            assert s["prefill_tok_s"] == pytest.approx(sum(r["prompt_tokens"] for r in first_turns)
                                                       / sum(r["ttft_s"] for r in first_turns))
    for cat, s in summary["target"].items():
        # lossless: the same text, so the same share of it that a 3-gram lookup predicts
        assert 0 <= s["lookup_share"] == summary["ngram-g4"][cat]["lookup_share"] < 1
        assert s["speedup"] == s["speedup_e2e"] == s["latency_ratio"] == 1.0
        assert s["tau"] == 1.0 and s["gamma_mean"] == 0.0 and s["alpha"] is None
        assert s["depth_mean"] == 0.0 and s["tree_size_mean"] is None and s["draft_steps_share"] == {}
    overall = summary["ngram-g4"]["overall"]
    assert set(overall["draft_steps_share"]) == {"ngram"} and 0 < overall["draft_steps_share"]["ngram"] <= 1
    assert 0 < overall["gamma_mean"] <= 4 and overall["alpha"] is not None and overall["tau"] >= 1.0
    assert overall["speedup"] == pytest.approx(overall["decode_tok_s"] / summary["target"]["overall"]["decode_tok_s"])

    assert result["head_to_head"] == {}  # no peer configuration ran (tests below run peers)

    curve = result["workers"]["target"]["verify_curve"]
    assert [int(k) for k in curve] == list(range(1, 18)) and all(v > 0 for v in curve.values())
    bw = result["bandwidth"]
    assert bw["bandwidth_gb_s"] > 0.5 and 50e6 < bw["weights"] < 100e6  # SmolLM2-135M Q4_1 as shipped, ~98 MB
    assert bw["by_category"]["overall"]["bound_tok_s"] > 0
    assert [Path(p).name.rsplit("-", 1)[1] for p in result["plots"]] == ["speedup.png", "acceptance.png",
                                                                         "verify_cost.png"]
    assert all(Path(p).stat().st_size > 10_000 for p in result["plots"])


@pytest.mark.slow  # two transformers workers import torch and dequantize the GGUF: ~30 s quiet, 100 s loaded
def test_transformers_peers(tmp_path: Path) -> None:
    """transformers' plain greedy and prompt lookup on the same dequantized weights, prompts and threads."""
    result = _bench(tmp_path, "--limit", "1", "--max-tokens", "8", "--configs", "hf-pld", "--no-plots")
    assert [c["name"] for c in result["configs"]] == ["target", "hf-plain", "hf-pld"]  # baselines come along
    hf = result["summary"]["hf-pld"]["overall"]
    assert hf["decode_tok_s"] > 0 and hf["tau"] >= 1.0 and hf["bound_tok_s"] is None
    assert result["workers"]["hf-plain"]["engine"].startswith("transformers 5")
    # prompt lookup is lossless against transformers' own greedy output on these short answers
    assert result["summary"]["hf-pld"]["overall"]["lossless"] == hf["generations"]


def test_the_default_configuration_is_what_generate_runs_with_no_flags(tmp_path: Path) -> None:
    """`default` loads through `edgespec generate`'s own code path (whatever the default model, backend, mode and γ
    are), against that same model alone; it is lossless and one of the automatic modes."""
    result = _bench(tmp_path, "--limit", "1", "--max-tokens", "16", "--configs", "default", "--no-plots")
    assert [c["name"] for c in result["configs"]] == ["default-target", "default"]
    engine = generate_engine(["--threads", "1"])
    try:
        expected = {"model_file": str(engine.target.path), "mode": engine.mode, "gamma": engine.gamma}
        manifest = getattr(engine.target, "manifest", None)
        if manifest is not None:  # an ONNX default records which products its export chose
            expected["onnx_weights"] = manifest["quant_options"].get("weights")
    finally:
        engine.close()
    assert {k: result["workers"]["default"][k] for k in expected} == expected
    assert result["workers"]["default-target"]["model_file"] == expected["model_file"]
    assert result["workers"]["default-target"]["mode"] == "none"
    overall = result["summary"]["default"]["overall"]
    assert overall["lossless"] == overall["generations"] > 0
    assert CONFIGS["default"].auto and "default" in DEFAULT_CONFIGS


def test_fast_numerics_run_every_edgespec_configuration_on_them_checked_against_its_own_target(
        tmp_path: Path) -> None:
    """`--fast-numerics`: the target and mode tree both load with llama.cpp's fast numerics (where the self-check pads
    the passes so that trees stay exact), and mode tree's output equals its target's on the same numerics."""
    result = _bench(tmp_path, "--limit", "1", "--max-tokens", "16", "--configs", "tree-auto", "--no-plots",
                    "--fast-numerics")
    assert result["setup"]["fast_numerics"] and result["args"]["fast_numerics"]
    assert {name: result["workers"][name]["exact_numerics"] for name in ("target", "tree-auto")} == {
        "target": False, "tree-auto": False}
    overall = result["summary"]["tree-auto"]["overall"]
    assert overall["lossless"] == overall["generations"] > 0


def test_configs_skip_cleanly_without_their_model_folder() -> None:
    configs, skipped = select(["target", "ortg-plain", "onnx-ngram"], {"ort_genai_model": None, "onnx_model": None})
    assert [c.name for c in configs] == ["target"]
    assert skipped == {"ortg-plain": "needs --ort-genai-model", "onnx-ngram": "needs --onnx-model"}
    configs, _ = select(["ortg-ngram"], {"ort_genai_model": "/some/dir"})
    assert [c.name for c in configs] == ["target", "ortg-plain", "ortg-ngram"]
    assert configs[2].resolved_options({"ort_genai_model": "/some/dir"})["model_dir"] == "/some/dir"
    assert all(c.runner in ("edgespec", "llama-cpp-python", "transformers", "onnxruntime-genai")
               for c in CONFIGS.values())


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def bench(*args: str) -> int:
        return main(["bench", "--out", str(tmp_path), "--questions", str(SPEC_BENCH), *args])

    # Spec-Bench's questions are not part of the repository: without --questions the run says how to give them
    assert main(["bench", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "give its question.jsonl with --questions FILE" in err and "Traceback" not in err

    assert bench("--questions", str(tmp_path / "missing.jsonl")) == 2
    assert "question file not found" in capsys.readouterr().err
    assert bench("--configs", "target,warp-drive") == 2
    assert "unknown configurations warp-drive" in capsys.readouterr().err
    assert bench("--categories", "poetry") == 2
    assert "unknown categories poetry" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["hi"]}\n')
    assert bench("--questions", str(bad)) == 2
    assert "bad.jsonl:1: not a Spec-Bench question" in capsys.readouterr().err
    with pytest.raises(BenchError):
        load_questions(bad)


def test_constrained_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--constrained: the shipped extraction and tool-call prompts, every answer held to its schema, side by side with
    the same model alone and llama-cpp-python holding it to the same schema (its own GBNF); the default equals its
    target, every reply validates, and the forced tokens are counted where the engine says."""
    assert main(["bench", "--constrained", "--per-category", "1", "--max-tokens", "96", "--threads", "1",
                 "--no-plots", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    (path,) = tmp_path.glob("constrained_bench-*.json")
    result = json.loads(path.read_text())
    assert result["machine"]["cpu"] in printed and "forced%" in printed
    assert [c["name"] for c in result["configs"]] == ["default-target", "default", "target", "lcpp-plain"]
    assert len(result["records"]) == 2 * 4 and summarize(result) == result["summary"]
    summary = {name: by_cat["overall"] for name, by_cat in result["summary"].items()}
    assert set(summary["default"]) == _SUMMARY_KEYS
    assert summary["default"]["lossless"] == summary["default"]["generations"] == 2
    assert all(s["schema_valid"] == 2 and s["decode_tok_s"] > 0 for s in summary.values())
    assert summary["default"]["forced_share"] > 0 and summary["default-target"]["forced_share"] == 0
    assert summary["lcpp-plain"]["forced_share"] is None and summary["lcpp-plain"]["alpha"] is None


def test_constrained_questions_are_checked_and_only_constraining_runners_play_them(tmp_path: Path) -> None:
    questions = load_questions(CONSTRAINED_QUESTIONS)
    assert len(questions) >= 30 and {q["category"] for q in questions} == {"extraction", "tool-call"}
    assert all(isinstance(q["schema"], dict) for q in questions)
    with pytest.raises(BenchError, match="hf-plain cannot hold output to a JSON schema"):
        select(["default", "hf-plain"], {}, constrained=True)
    bad = tmp_path / "bad.jsonl"
    for schema, says in (('{"type": "foo"}', "bad.jsonl:1: schema: Invalid type: foo"),
                         ('"an object"', "bad.jsonl:1: 'schema' must be a JSON schema object")):
        bad.write_text(f'{{"category": "x", "turns": ["hi"], "schema": {schema}}}\n')
        with pytest.raises(EdgespecError, match=re.escape(says)):
            load_questions(bad)


def test_a_configuration_that_cannot_start_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tuned` without a tuning file (the tests ignore tuning files): a clear error, no traceback, no hang."""
    assert main(["bench", "--questions", str(SPEC_BENCH), "--out", str(tmp_path), "--limit", "1", "--max-tokens",
                 "4", "--threads", "1", "--configs", "tuned"]) == 2
    err = capsys.readouterr().err
    assert "configuration tuned: no tuning for this model" in err and "Traceback" not in err


def test_head_to_head_takes_the_fastest_lossless_automatic_mode_and_the_fastest_peer() -> None:
    def s(tok_s: float, lossless: int | None, generations: int = 2) -> dict:
        return {"decode_tok_s": tok_s, "lossless": lossless, "generations": generations, "lookup_share": tok_s / 1000}

    configs = [{"name": n, "runner": CONFIGS[n].runner, "auto": CONFIGS[n].auto}
               for n in ("target", "ngram-auto", "ngram-g4", "onnx-ngram", "lcpp-plain", "ortg-ngram")]
    summary = {  # ngram-g4 is fast but fixed-γ (not automatic); onnx-ngram was lossy on "qa" (a bug it would show)
        "target": {"qa": s(90, None), "overall": s(90, None)},
        "ngram-auto": {"qa": s(100, 2), "overall": s(110, 2)},
        "ngram-g4": {"qa": s(200, 2), "overall": s(200, 2)},
        "onnx-ngram": {"qa": s(150, 1), "overall": s(120, 2)},
        "lcpp-plain": {"qa": s(95, None), "overall": s(95, None)},
        "ortg-ngram": {"qa": s(80, 0), "overall": s(130, 1)},
    }
    duel = head_to_head({"configs": configs, "summary": summary})
    assert duel["qa"] == {"edgespec": "ngram-auto", "edgespec_tok_s": 100, "peer": "lcpp-plain", "peer_tok_s": 95,
                          "ratio": 100 / 95, "peer_lossless": None, "generations": 2, "lookup_share": [0.1, 0.095],
                          "ratio_90": None}
    assert (duel["overall"]["edgespec"], duel["overall"]["peer"]) == ("onnx-ngram", "ortg-ngram")
    assert duel["overall"]["ratio"] == pytest.approx(120 / 130) and duel["overall"]["peer_lossless"] == 1


def test_lookup_hits_counts_what_a_3_gram_lookup_would_have_predicted() -> None:
    """The most recent occurrence of the 3 tokens before a position decides; the output itself is indexed."""
    prompt = [1, 2, 3, 4, 1, 2, 3, 5]  # "1 2 3" was last followed by 5
    assert lookup_hits(prompt, [9, 9]) == 0
    assert lookup_hits(prompt[:-1], [5]) == 0  # before the first output token "1 2 3" was last followed by 4
    assert lookup_hits(prompt[:-1], [4]) == 1
    # a period-3 output: its 3-grams are indexed during the second round and predict the third
    assert lookup_hits([7], [1, 2, 3] * 3) == 3
    assert lookup_hits([], []) == 0


def test_the_head_to_head_interval_resamples_questions() -> None:
    """Equal speeds give an interval around 1; one question decoding 3× (a repeated answer) widens it; a
    configuration faster on every question has its whole interval above 1."""
    def record(config: str, question: int, tok_s: float) -> dict:
        return {"config": config, "category": "qa", "question_id": question, "tokens": [0] * 101,
                "first_tokens": 1, "decode_s": 100 / tok_s}

    equal = [record(c, q, 80 + q) for q in range(6) for c in ("ngram-auto", "lcpp-plain")]
    lo, hi = ratio_interval(equal, "ngram-auto", "lcpp-plain", "qa")
    assert lo == pytest.approx(1) and hi == pytest.approx(1)
    lucky = equal + [record("ngram-auto", 6, 240), record("lcpp-plain", 6, 80)]
    lo, hi = ratio_interval(lucky, "ngram-auto", "lcpp-plain", "overall")
    assert lo == pytest.approx(1) and hi > 1.2
    faster = [record("ngram-auto", q, 100 + 5 * q) for q in range(6)] + [record("lcpp-plain", q, 80) for q in range(6)]
    lo, hi = ratio_interval(faster, "ngram-auto", "lcpp-plain", "qa")
    assert 1.2 < lo < hi < 1.5
    assert ratio_interval(faster[:1] + faster[6:7], "ngram-auto", "lcpp-plain", "qa") is None


def test_chat_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: Engine) -> None:
    """3 turns of 16 tokens, edgespec with n-gram drafting and llama-cpp-python with its RAM prompt cache: each
    plays its own conversation, every turn is compared with a fresh engine's, the JSON has every field.
    (γ = 4 rather than the default engine's γ auto: a fresh engine per turn would time its cost curve each time.)"""
    short = ["writing", "roleplay", "reasoning"]  # documents would make every fresh replay a long prefill
    assert main(["bench", "--chat", "--questions", str(SPEC_BENCH), "--turns", "3", "--max-tokens", "16", "--threads",
                 "1", "--configs", "ngram-g4,lcpp-cache", "--categories", ",".join(short), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    (path,) = tmp_path.glob("chat_bench-*.json")
    result = json.loads(path.read_text())
    assert "lcpp-cache" in printed and "turns as a fresh engine writes them" in printed

    assert result["schema"] == "edgespec-bench-chat/1" and result["machine"]["cpu"]
    assert result["machine"]["versions"]["llama-cpp-python"] == "0.3.36"
    assert result["args"]["turns"] == 3 and result["args"]["max_tokens"] == 16 and result["args"]["skip"] == 0
    assert [c["name"] for c in result["configs"]] == ["ngram-g4", "lcpp-cache"]  # no baselines come along
    script = conversation(SPEC_BENCH, short, 3)
    assert result["script"] == script
    for name in ("ngram-g4", "lcpp-cache"):
        turns, conv = result["turns"][name], result["conversations"][name]
        # its own conversation: the script's questions and its own answers, alternating
        assert [m["content"] for m in conv[::2]] == [t["content"] for t in script]
        assert [m["role"] for m in conv] == ["user", "assistant"] * 3 and all(m["content"] for m in conv[1::2])
        assert [r["turn"] for r in turns] == [1, 2, 3]
        for i, r in enumerate(turns):
            assert r["context_tokens"] == len(engine.chat_tokens(conv[:2 * i + 1]))
            # the first turn is all new; later ones only the question and the template around it
            assert r["new_tokens"] == r["context_tokens"] if i == 0 else 0 < r["new_tokens"] < r["context_tokens"]
            assert 0 < r["n_tokens"] <= 16 and 0 < r["ttft_s"] < r["latency_s"] and r["fresh_ttft_s"] > 0
            assert r["prefill_tok_s"] == pytest.approx(r["new_tokens"] / r["ttft_s"]) and r["decode_tok_s"] > 0
            assert isinstance(r["same_as_fresh"], bool)
            counts, times = zip(*r["arrivals"], strict=True)  # every arrival, timed from the request
            assert counts[-1] == r["n_tokens"] and list(counts) == sorted(counts) and list(times) == sorted(times)
            assert times[0] == pytest.approx(r["ttft_s"]) and times[-1] == pytest.approx(r["latency_s"])
        s = result["summary"][name]
        assert 0 <= s["lowest_from_turn_3"] <= 1 and 0 <= s["lowest_at_equal_length_from_turn_3"] <= 1
        assert s["turns"] == 3 and s["last_context_tokens"] == turns[-1]["context_tokens"]
        assert s["mean_latency_from_turn_3_s"] == pytest.approx(turns[2]["latency_s"])
    # edgespec's contract: whatever it reused, every turn's text is what a fresh engine writes
    assert result["summary"]["ngram-g4"]["same_as_fresh"] == 3
    assert all(r["extra"]["cache_save_s"] > 0 for r in result["turns"]["lcpp-cache"])
    (plot,) = result["plots"]
    assert plot.endswith("-ttft.png") and Path(plot).stat().st_size > 10_000


def test_chat_turns_compared_whole_and_at_equal_length() -> None:
    """A faster decoder that writes a longer answer loses on whole answers and wins at the length both reach."""
    def turn(n: int, per_token: float) -> dict:
        arrivals = [(i, 0.1 + i * per_token) for i in range(1, n + 1)]
        return {"n_tokens": n, "latency_s": arrivals[-1][1], "arrivals": arrivals}

    turns = {"long-fast": [turn(8, 0.01)] * 2 + [turn(128, 0.02), turn(10, 0.02)],
             "short-slow": [turn(8, 0.01)] * 2 + [turn(33, 0.03), turn(10, 0.03)]}
    assert time_to(turns["long-fast"][2]["arrivals"], 33) == pytest.approx(0.1 + 33 * 0.02)
    assert lowest_turns(turns, "long-fast", equal_length=False) == 1  # the 128-token answer takes longer
    assert lowest_turns(turns, "long-fast", equal_length=True) == 2
    assert lowest_turns(turns, "short-slow", equal_length=False) == 1
    assert lowest_turns(turns, "short-slow", equal_length=True) == 0


def test_chat_script_takes_turns_between_categories() -> None:
    """Categories with the longest questions first (a chat opens with its documents), each question's first turn,
    --skip passes over questions."""
    questions = load_questions(SPEC_BENCH)
    firsts: dict[str, list[str]] = {}
    for q in questions:
        firsts.setdefault(q["category"], []).append(q["turns"][0])
    by_length = sorted(firsts, key=lambda c: -sum(map(len, firsts[c])) / len(firsts[c]))
    assert by_length[:2] == ["summarization", "rag"]
    chosen = [c for c in by_length if c in ("reasoning", "writing", "rag")]
    script = conversation(SPEC_BENCH, ["reasoning", "writing", "rag"], 5, skip=1)
    assert [t["content"] for t in script] == [firsts[c][1] for c in chosen] + [firsts[c][2] for c in chosen[:2]]
    script = conversation(SPEC_BENCH, None, len(by_length) + 1)
    assert [t["category"] for t in script] == [*by_length, by_length[0]]
    assert len(script[-2]["content"]) < len(script[0]["content"]) / 4  # late turns are questions, not documents
    with pytest.raises(BenchError, match="has only 3 questions to give after skipping 0"):
        conversation(SPEC_BENCH, ["writing"], 4)


def test_chat_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def bench(*args: str) -> int:
        return main(["bench", "--chat", "--questions", str(SPEC_BENCH), "--out", str(tmp_path), *args])

    assert bench("--configs", "hf-plain") == 2
    assert "hf-plain cannot play a conversation" in capsys.readouterr().err
    assert bench("--skip", "-1") == 2
    assert "--skip must be 0 or more" in capsys.readouterr().err
    assert bench("--categories", "writing", "--skip", "5") == 2
    assert "has only 0 questions to give after skipping 5" in capsys.readouterr().err


def test_the_bench_reports_tree_size_and_accepted_depth_for_mode_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripted fake backend in mode tree and mode ngram through the bench's own runner code (``_result``) and
    summary: mode tree's nodes per pass and accepted depth are the generation's, lookup chains have no tree size."""
    import time

    from edgespec.bench.peers.native import _result
    from edgespec.bench.report import table
    from tests.fake_backend import BOS, FakeClock, FakeModel, encode, scripted

    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    sequence = [BOS, *encode("the cat sat on the mat. " * 6)]
    model = FakeModel(scripted(sequence), n_ctx=1024, clock=clock, pass_cost=lambda n: 0.01 * (1 + 0.02 * (n - 1)))
    records, stats = [], {}
    for config, mode in (("tree-auto", "tree"), ("ngram-auto", "ngram")):
        engine = Engine(model, mode=mode, gamma="auto")
        for turn, prompt in enumerate((sequence[:30], sequence[:50])):
            chunks = list(engine.stream(prompt, max_tokens=200))
            stats[config, turn] = chunks[-1].stats
            result = _result(iter(chunks))
            records.append({**result.__dict__, "config": config, "category": "copying", "question_id": 1,
                            "turn": turn, "prompt_tokens": len(prompt), "peak_rss_mb": 1.0,
                            "same_as_baseline": True, "lossless": True})
    result = {"configs": [{"name": n, "baseline": "ngram-auto"} for n in ("tree-auto", "ngram-auto")],
              "records": records, "workers": {"tree-auto": {}, "ngram-auto": {}}}
    result["summary"] = summarize(result)
    tree, chains = result["summary"]["tree-auto"]["overall"], result["summary"]["ngram-auto"]["overall"]
    runs = [stats["tree-auto", t] for t in (0, 1)]
    assert all(r["mode"] == "tree" for r in records[:2])
    assert tree["tree_size_mean"] == pytest.approx(sum(s.drafted for s in runs) / sum(s.steps for s in runs))
    assert tree["depth_mean"] == pytest.approx(sum(s.accepted for s in runs) / sum(s.steps for s in runs))
    assert tree["depth_mean"] > 1
    assert chains["tree_size_mean"] is None and chains["depth_mean"] > 1
    printed = table(result).splitlines()
    assert "dep" in printed[0] and "nodes" in printed[0]
    row = next(line for line in printed if line.startswith("tree-auto") and "overall" in line)
    assert f"{tree['depth_mean']:.2f}{tree['tree_size_mean']:>6.1f}" in row
    # A name longer than the column (default-target, NAME@REV) widens it rather than running into the category.
    renamed = table({**result, "summary": {"default-target@HEAD~1": result["summary"]["ngram-auto"]}}).splitlines()
    assert renamed[1].split()[:2] == ["default-target@HEAD~1", "copying"]
    assert renamed[0].index("category") == renamed[1].index("copying")
