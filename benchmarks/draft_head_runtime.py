"""Current: a tool the manual uses.
The exported draft head in the runtime: how often its guesses are accepted, and what a pass of it costs.

    python benchmarks/draft_head_runtime.py [EXPORT] --questions FILE [--count 10] [--max-tokens 128]
        [--passes 200] [--out benchmarks/results]

EXPORT: an ONNX export with a draft head beside it (default: the default model's, whose race writes the shipped
head). Acceptance: the head alone drafts (lookup left out, its confidence gate off) at a fixed γ of 1 and 2 on the
first turns of COUNT Spec-Bench questions spread over the file: the share of its guesses the target accepts, and τ.
Cost: one-row passes of the head timed taking turns with one-token passes of the target at 300 cells of context, as
drafting runs them (timed alone, the head stays in the CPU's cache and looks cheaper). Every generation is checked
against target-only decoding. Prints a table; writes draft_head_runtime.json and .png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import edgespec
from edgespec.bench.plots import line_chart
from edgespec.bench.run import machine
from edgespec.catalog.models import DEFAULT_MODEL, families
from edgespec.tuning.race import onnx_export_path

GAMMAS = (1, 2)
CONTEXT = 300


def acceptance(engine: edgespec.Engine, questions: list[dict], max_tokens: int) -> list[dict]:
    """The head alone at each fixed γ: drafted, accepted, τ; and how many outputs equal target-only's."""
    head = engine.drafters["head"]
    lookup_first, engine.modes["head"] = engine.modes["head"], (head,)  # for this measurement: the head alone
    gate, head.min_path_probability = head.min_path_probability, 0.0  # type: ignore[attr-defined]
    rows = []
    try:
        prompts = [engine.chat_tokens([{"role": "user", "content": q["turns"][0]}]) for q in questions]
        references = [engine.generate(p, max_tokens=max_tokens, mode="none").tokens for p in prompts]
        for gamma in GAMMAS:
            drafted = accepted = steps = identical = 0
            for prompt, reference in zip(prompts, references, strict=True):
                out = engine.generate(prompt, max_tokens=max_tokens, mode="head", gamma=gamma)
                drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
                steps += out.stats.steps
                identical += out.tokens == reference
            rows.append({"gamma": gamma, "drafted": drafted, "accepted": accepted,
                         "acceptance": round(accepted / drafted, 4), "tau": round((accepted + steps) / steps, 4),
                         "identical": f"{identical}/{len(prompts)}"})
    finally:
        head.min_path_probability = gate  # type: ignore[attr-defined]
        engine.modes["head"] = lookup_first
    return rows


def pass_costs(engine: edgespec.Engine, passes: int) -> dict[str, float]:
    """Median seconds of a one-token target pass and of a one-row head pass, taking turns at CONTEXT cells."""
    target, head = engine.target, engine.drafters["head"].head  # type: ignore[attr-defined]
    text = engine.tokenize("The history of the bicycle begins in the early nineteenth century. " * 40)[:CONTEXT]
    target.truncate(0)
    target.decode(text, 0, 1)  # type: ignore[attr-defined]
    head.truncate(0)
    rows = np.zeros((CONTEXT, 2 * target.manifest["hidden_size"]), np.float32)  # type: ignore[attr-defined]
    head.decode(rows, 0, 1)
    times: dict[str, list[float]] = {"target": [], "head": []}
    for _ in range(passes):
        start = time.perf_counter()
        target.decode(text[-1:], CONTEXT, 1)  # type: ignore[attr-defined]
        times["target"].append(time.perf_counter() - start)
        target.truncate(CONTEXT)
        start = time.perf_counter()
        head.decode(rows[-1:], CONTEXT, 1)
        times["head"].append(time.perf_counter() - start)
        head.truncate(CONTEXT)
    target.truncate(0)
    medians = {k: float(np.median(v)) for k, v in times.items()}
    return {"target_pass_ms": round(medians["target"] * 1e3, 3), "head_pass_ms": round(medians["head"] * 1e3, 3),
            "head_share_of_a_pass": round(medians["head"] / medians["target"], 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", nargs="?", type=Path, default=None)
    parser.add_argument("--questions", type=Path, required=True, help="Spec-Bench's question.jsonl")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    if min(args.count, args.max_tokens, args.passes) < 1:
        parser.error("--count, --max-tokens and --passes must be 1 or more")
    if not args.questions.is_file():
        parser.error(f"{args.questions}: no such file (Spec-Bench's question.jsonl)")
    export = args.export or onnx_export_path(families()[DEFAULT_MODEL])
    engine = edgespec.load(export, n_ctx=2048)
    if "head" not in engine.modes:
        parser.error(f"{export} has no draft head beside it (`edgespec export head`, docs/draft-head.md)")
    questions = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    questions = questions[::max(1, len(questions) // args.count)][:args.count]
    try:
        rows = acceptance(engine, questions, args.max_tokens)
        costs = pass_costs(engine, args.passes)
        info = engine.drafters["head"].head.manifest["draft_head"]  # type: ignore[attr-defined]
    finally:
        engine.close()
    print(f"head beside {export}: {info.get('output_rows')} output rows; {len(questions)} questions, "
          f"{args.max_tokens} tokens")
    print(f"{'γ':>3} {'drafted':>8} {'accepted':>9} {'acceptance':>11} {'τ':>6}  identical")
    for r in rows:
        print(f"{r['gamma']:>3} {r['drafted']:>8} {r['accepted']:>9} {r['acceptance']:>11.3f} {r['tau']:>6.3f}  "
              f"{r['identical']}")
    print(f"one-row head pass {costs['head_pass_ms']} ms against a one-token target pass {costs['target_pass_ms']} ms "
          f"at {CONTEXT} cells: {costs['head_share_of_a_pass']:.3f} of a pass")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "draft_head_runtime.json").write_text(json.dumps(
        {"machine": machine(), "export": str(export), "head": info, "questions": len(questions),
         "max_tokens": args.max_tokens, "acceptance": rows, "costs": costs}, indent=1))
    line_chart(args.out / "draft_head_runtime.png", [r["gamma"] for r in rows],
               [("acceptance of its guesses", [r["acceptance"] for r in rows], "tab:blue", "-"),
                ("τ / 2", [r["tau"] / 2 for r in rows], "tab:orange", "--")],
               "γ (the head alone)", "share", "The draft head in the runtime")
    print(f"wrote {args.out / 'draft_head_runtime.json'}, draft_head_runtime.png")


if __name__ == "__main__":
    main()
