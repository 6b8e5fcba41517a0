"""Current: a tool the manual uses.
The verify curve the decode loop pays, beside the start-up calibration, and n-gram lookup's speed-up side by side.

    python benchmarks/decode_loop_curve.py --questions FILE [--model PATH] [--per-category 6] [--max-tokens 128]
        [--probe-every N] [--out DIR]

Two engines on one model in one process (default: the model `edgespec generate` loads, as this machine's race
chose it): the target alone and n-gram lookup, γ auto, no tuning file. Spec-Bench's questions in file order,
multi-turn ones as conversations carrying the target's answers; both engines answer every turn, in an order that
turns around from one turn to the next, so the shared machine's load falls on both; every speculative answer is
checked equal to the target's. (Before the weights were put on huge pages at load, an engine loaded second into a
process ran 3-4% faster than the same engine loaded first, docs/kernels.md, "Side by side in one process": results
of this script from before then may read lookup's speed-up that much high; the curve compares passes of one
engine.) The speculative engine's target passes in the decode loop are timed by the rows
they compute and the context they start at: the verify curve the loop pays (per k, the median of each k-row pass's
seconds over the median 1-row pass at the same context, within ``CONTEXT_BIN`` tokens) beside a start-up calibration
(best of 5 at ~100 tokens, as the engine calibrates), which is what the γ controller starts from, and beside the
controller's belief: what it believed each k-row pass would cost when it chose one, averaged over those moments (the
fair comparison: its curve moves with the context and the machine, and the loop's curve is of the passes it priced),
and the curve it had learned by the end (one moment's: a snapshot after the last request). Matching the
context matters: lookup drafts most where the prompt is long (summaries, RAG), where every pass is dearer, so the
median k-row pass over the median 1-row pass of all contexts (also printed) overstates what a row costs.
Prints a table per category and the curves, writes decode_loop_curve.json and .png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

import edgespec
from edgespec.bench.plots import line_chart
from edgespec.bench.questions import load_questions
from edgespec.engine.engine import Engine
from edgespec.identity import cpu_identity
from edgespec.tuning.default import default_choice

ENGINES = ("target", "ngram")
CURVE_ROWS = (1, 2, 3, 4, 5, 6, 7)
PROBE_ROWS = (1, 2, 4)  # --probe-every: the rows of the probe passes
CONTEXT_BIN = 128  # tokens: a k-row pass is set against the 1-row passes whose context is in the same bin
Passes = dict[int, list[tuple[int, float]]]  # rows → (context the pass started at, seconds) of each pass


def open_engines(model: str, threads: int) -> dict[str, Engine]:
    return {name: edgespec.load(model, mode="none" if name == "target" else name, n_threads=threads, tuning=False)
            for name in ENGINES}


def time_passes(engine: Engine, passes: Passes, probes: Passes | None = None, probe_every: int = 0,
                beliefs: dict[int, list[float]] | None = None) -> None:
    """Record every target pass of ``engine`` of up to 17 rows (decode steps, not prefill chunks) by its rows, and
    in ``beliefs`` what the γ controller believed such a pass cost (over one row) when it chose it. With
    ``probes`` and ``probe_every`` n, before every n-th of them the target also runs a pass of each of PROBE_ROWS
    random tokens at the same context, rolled back: what a row costs at the loop's own moments, beside what its own
    passes cost (a machine whose one-row pass moves from minute to minute moves both alike)."""
    arena = engine.arena
    extend = arena.extend
    counted = itertools.count(1)
    rng = np.random.default_rng(0)

    def probe(context: int) -> None:
        target = engine.target
        end = target.cache_end()
        for k in PROBE_ROWS:
            tokens = rng.integers(1000, target.n_vocab, k).tolist()
            began = time.perf_counter()
            target.decode(tokens, end, k)
            probes[k].append((context, time.perf_counter() - began))  # type: ignore[index]
            target.truncate(end)

    def timed(name: str, speculative: list[int], n_logits: int) -> np.ndarray:
        context = len(arena.held[name])
        rows = len(arena.tokens) - context + len(speculative)
        if name == "target" and rows <= 17 and probes is not None and next(counted) % probe_every == 0:
            probe(context)
        controller = engine.controller
        began = time.perf_counter()
        logits = extend(name, speculative, n_logits)
        if name == "target" and rows <= 17:
            passes[rows].append((context, time.perf_counter() - began))
            if controller is not None and beliefs is not None:
                beliefs[rows].append(float(controller.curve.shape[rows]))
        return logits

    arena.extend = timed  # type: ignore[method-assign]


def play(engines: dict[str, Engine], questions: list[dict], max_tokens: int,
         reference: Callable[[str], str] = lambda name: "target") -> list[dict]:
    """Every engine answers every turn, in an order that rotates from one turn to the next (so the shared machine's
    load falls on all); each answer is checked equal to its ``reference`` engine's (a target alone), whose answers
    carry the conversation. One record per engine and turn."""
    records, order = [], list(engines)
    for q in questions:
        messages: dict[str, list[dict[str, str]]] = {ref: [] for ref in map(reference, engines)}
        for turn, user in enumerate(q["turns"]):
            prompts = {}
            for ref, conversation in messages.items():
                conversation.append({"role": "user", "content": user})
                prompts[ref] = engines[ref].chat_tokens(conversation)
            results = {name: engines[name].generate(prompts[reference(name)], max_tokens=max_tokens)
                       for name in order}
            order = order[1:] + order[:1]
            for name, r in results.items():
                if r.tokens != results[reference(name)].tokens:
                    raise SystemExit(f"{name} wrote another answer than {reference(name)} to question "
                                     f"{q['question_id']} turn {turn}: a lossless contract broken")
                records.append({"engine": name, "question_id": q["question_id"], "category": q["category"],
                                "turn": turn, "tokens": len(r.tokens),
                                "computed_prompt_tokens": r.stats.prompt_tokens - r.stats.cached_tokens,
                                "prefill_s": r.stats.prefill_s, "decode_s": r.stats.decode_s,
                                "steps": r.stats.steps, "drafted": r.stats.drafted, "accepted": r.stats.accepted})
            for ref, conversation in messages.items():
                conversation.append({"role": "assistant", "content": results[ref].text})
    return records


def summarize(records: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Per category and overall, per engine: decode tok/s (tokens after the first over decode time), τ, α."""
    sums: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for r in records:
        for category in (r["category"], "overall"):
            s = sums[category][r["engine"]]
            for field in ("decode_s", "steps", "drafted", "accepted"):
                s[field] += r[field]
            s["decoded"] += max(r["tokens"] - 1, 0)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for category, engines in sums.items():
        out[category] = {name: {"tok_s": s["decoded"] / s["decode_s"] if s["decode_s"] else 0.0,
                                "tau": (s["accepted"] + s["steps"]) / s["steps"] if s["steps"] else 0.0,
                                "alpha": s["accepted"] / s["drafted"] if s["drafted"] else 0.0}
                         for name, s in engines.items()}
    return out


def loop_curve(passes: Passes) -> dict[int, dict[str, float]]:
    """Per row count k: the median of each k-row pass over the median 1-row pass at its context ("relative", of
    "passes" passes that had 1-row passes in their context bin), and the median k-row pass over the median 1-row
    pass of every context ("all_contexts")."""
    bins: dict[int, list[float]] = defaultdict(list)
    for context, seconds in passes[1]:
        bins[context // CONTEXT_BIN].append(seconds)
    one_at = {b: float(np.median(s)) for b, s in bins.items()}
    one = float(np.median([seconds for _, seconds in passes[1]]))
    curve = {}
    for k in sorted(passes):
        matched = [seconds / one_at[context // CONTEXT_BIN] for context, seconds in passes[k]
                   if context // CONTEXT_BIN in one_at]
        if matched:
            curve[k] = {"relative": float(np.median(matched)), "passes": len(matched),
                        "all_contexts": float(np.median([seconds for _, seconds in passes[k]])) / one}
    return curve


def median_ms(passes: Passes, k: int) -> str:
    """The median k-row pass in ms, as printed ("-" where there was none)."""
    return f"{np.median([seconds for _, seconds in passes[k]]) * 1e3:.2f}" if passes.get(k) else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model path or name (default: what this machine's race chose)")
    parser.add_argument("--questions", type=Path, required=True, help="Spec-Bench's question.jsonl")
    parser.add_argument("--per-category", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--probe-every", type=int, default=0,
                        help="before every N-th pass of the speculative engine, time probe passes of 1, 2 and 4 rows "
                             "at the same context (rolled back; default 0: none). Their time counts in the "
                             "speculative engine's: read its speed-up from a run without them")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"),
                        help="folder for decode_loop_curve.json/.png (default benchmarks/results, git-ignored)")
    args = parser.parse_args()
    model = args.model or default_choice(args.threads, "cpu").target
    questions = load_questions(args.questions, per_category=args.per_category)
    engines = open_engines(model, args.threads)
    try:
        curve = engines["ngram"].calibrate(rounds=5, statistic=np.min)
        calibrated = {k: curve.seconds(k) / curve.seconds(1) for k in CURVE_ROWS}
        passes: Passes = defaultdict(list)
        probes: Passes = defaultdict(list)
        beliefs: dict[int, list[float]] = defaultdict(list)
        time_passes(engines["ngram"], passes, probes if args.probe_every > 0 else None, args.probe_every, beliefs)
        records = play(engines, questions, args.max_tokens)
        controller = engines["ngram"].controller
        assert controller is not None  # γ auto: set up by the first generation
        learned = {k: float(controller.curve.shape[k]) for k in CURVE_ROWS}
        steepness = controller.curve.steepness
    finally:
        for engine in engines.values():
            engine.close()
    summary = summarize(records)
    loop = loop_curve(passes)
    believed = {k: float(np.mean(beliefs[k])) for k in CURVE_ROWS if beliefs.get(k)}

    print(f"{Path(model).name}, {len(records) // len(ENGINES)} generations, all identical to the target's; "
          f"{cpu_identity()[:60]}, {args.threads} threads")
    print(f"{'category':<16}{'target tok/s':>13}{'ngram tok/s':>12}{'speed-up':>10}{'τ':>7}{'α':>7}")
    for category in sorted(summary, key=lambda c: (c == "overall", c)):
        plain, spec = summary[category]["target"], summary[category]["ngram"]
        print(f"{category:<16}{plain['tok_s']:>13.1f}{spec['tok_s']:>12.1f}{spec['tok_s'] / plain['tok_s']:>9.2f}×"
              f"{spec['tau']:>7.2f}{spec['alpha']:>7.2f}")
    print("verify curve, cost of a k-row pass / a 1-row pass (k = 1 + draft tokens):")
    print(f"{'k':>4}{'calibration':>13}{'decode loop, same context (passes)':>37}{'all contexts':>14}"
          f"{'controller at its passes':>26}{'at the end':>12}")
    for k in CURVE_ROWS:
        cell = (f"{loop[k]['relative']:>28.2f} ({loop[k]['passes']:>5}){loop[k]['all_contexts']:>14.2f}" if k in loop
                else f"{'-':>37}{'-':>14}")
        print(f"{k:>4}{calibrated[k]:>13.2f}{cell}{believed.get(k, float('nan')):>26.2f}{learned[k]:>12.2f}")
    probed = loop_curve(probes) if probes else None
    if probed is not None:
        print(f"probes (before every {args.probe_every} passes, rolled back; their time is in ngram's tok/s above), "
              "same context: "
              + ", ".join(f"{k} rows {probed[k]['relative']:.2f}" for k in PROBE_ROWS if k in probed)
              + "; median ms, loop / probes: "
              + ", ".join(f"{k} rows {median_ms(passes, k)} / {median_ms(probes, k)}" for k in PROBE_ROWS))
    print("controller: what the speculative engine's γ controller believed a k-row pass cost, averaged over the "
          "moments it chose one (the fair comparison with the loop's curve: a belief is followed by the pass it "
          "priced), and at the end (each k verified lately at what its verifies cost, the others at "
          f"{steepness:.2f} × its own start-up calibration's excess over one row: one moment's, after the last "
          "request)")

    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "decode_loop_curve.json"
    out.write_text(json.dumps({"cpu": cpu_identity(), "threads": args.threads, "model": str(model),
                               "per_category": args.per_category, "max_tokens": args.max_tokens,
                               "summary": summary, "loop_curve": loop, "calibrated_curve": calibrated,
                               "controller_curve": learned, "controller_at_its_passes": believed,
                               "controller_steepness": steepness,
                               "probe_every": args.probe_every, "probe_curve": probed,
                               "records": records}, indent=1))
    ks = [k for k in CURVE_ROWS if k in loop]
    lines = [("start-up calibration (best of 5, ~100 tokens)", [calibrated[k] for k in ks], "tab:gray", "--"),
             ("decode loop, ngram, same context", [loop[k]["relative"] for k in ks], "tab:blue", "-"),
             ("decode loop, ngram, all contexts", [loop[k]["all_contexts"] for k in ks], "tab:blue", ":"),
             ("the γ controller's belief, at its passes", [believed.get(k, np.nan) for k in ks], "tab:red", "-"),
             ("the γ controller's learned curve, at the end", [learned[k] for k in ks], "tab:red", "-.")]
    line_chart(args.out / "decode_loop_curve.png", ks, lines, "rows in the pass (1 + draft tokens)",
               "cost relative to one row", "Verify cost: decode loop vs calibration")
    print(f"wrote {out} and decode_loop_curve.png")


if __name__ == "__main__":
    main()
