"""Historical: a one-off probe, kept to reproduce a past finding.
Kept for: the decode-loop comparison that kept edgespec.BlockInt8MatMul over MatMulNBits.
One export's products as MatMulNBits and as edgespec.BlockInt8MatMul, side by side in the decode loop.

    python benchmarks/block_int8_products.py --nbits DIR --op DIR --questions FILE [--per-category 3] [--max-tokens 128]
        [--out DIR]

Two ONNX exports of the same GGUF that differ only in their 8-bit products (``edgespec export onnx SRC --quant
int8`` on a machine where the op was timed faster, and the same with the op rewritten back — or an export made
before graphs revision 7), each as the target alone and with n-gram lookup (γ auto, no tuning file): four engines
in one process answering Spec-Bench's questions in file order, multi-turn ones as conversations, in an order that
rotates from one turn to the next so the shared machine's load falls on all four. Every speculative answer is
checked equal to its own target's. Reports decode tok/s per engine and category, the op's ratio to MatMulNBits for
the target and for lookup, prefill tok/s over first turns, and each lookup engine's verify curve in the loop.
Writes block_int8_products.json and .png.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from decode_loop_curve import CURVE_ROWS, ENGINES, loop_curve, open_engines, play, summarize, time_passes

from edgespec.bench.plots import line_chart
from edgespec.bench.questions import load_questions
from edgespec.identity import cpu_identity

EXPORTS = ("nbits", "op")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nbits", type=Path, required=True, help="the export with MatMulNBits products")
    parser.add_argument("--op", type=Path, required=True, help="the export with edgespec.BlockInt8MatMul products")
    parser.add_argument("--questions", type=Path, required=True, help="Spec-Bench's question.jsonl")
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"),
                        help="folder for block_int8_products.json/.png (default benchmarks/results, git-ignored)")
    args = parser.parse_args()
    paths = {"nbits": args.nbits, "op": args.op}
    for export, path in paths.items():
        weights = json.loads((path / "edgespec-onnx.json").read_text())["quant_options"]["weights"]
        if ("BlockInt8MatMul" in weights) != (export == "op"):
            raise SystemExit(f"--{export} {path}: its products are {weights}")
    questions = load_questions(args.questions, per_category=args.per_category)
    engines = {f"{export} {mode}": engine for export in EXPORTS
               for mode, engine in open_engines(str(paths[export]), args.threads).items()}
    passes: dict[str, dict[int, list[float]]] = {export: defaultdict(list) for export in EXPORTS}
    try:
        for export in EXPORTS:
            time_passes(engines[f"{export} ngram"], passes[export])
        records = play(engines, questions, args.max_tokens, reference=lambda name: name.split()[0] + " target")
    finally:
        for engine in engines.values():
            engine.close()
    summary = summarize(records)
    curves = {export: loop_curve(passes[export]) for export in EXPORTS}
    first = [r for r in records if r["turn"] == 0 and r["engine"].endswith("target")]
    prefill = {export: sum(r["computed_prompt_tokens"] for r in first if r["engine"].startswith(export)) /
               sum(r["prefill_s"] for r in first if r["engine"].startswith(export)) for export in EXPORTS}

    print(f"{len(records) // len(engines)} generations per engine, each lookup answer identical to its target's; "
          f"{cpu_identity()[:60]}, {args.threads} threads")
    print(f"{'category':<16}" + "".join(f"{e + ' ' + m:>14}" for e in EXPORTS for m in ENGINES)
          + f"{'op/nbits target':>17}{'op/nbits ngram':>16}")
    for category in sorted(summary, key=lambda c: (c == "overall", c)):
        row = summary[category]
        rate = {(e, m): row[f"{e} {m}"]["tok_s"] for e in EXPORTS for m in ENGINES}
        print(f"{category:<16}" + "".join(f"{rate[e, m]:>14.1f}" for e in EXPORTS for m in ENGINES)
              + f"{rate['op', 'target'] / rate['nbits', 'target']:>16.3f}×"
              + f"{rate['op', 'ngram'] / rate['nbits', 'ngram']:>15.3f}×")
    print(f"prefill tok/s over first turns: nbits {prefill['nbits']:.0f}, op {prefill['op']:.0f} "
          f"({prefill['op'] / prefill['nbits']:.3f}×)")
    print(f"{'k':>4}" + "".join(f"{e + ' loop curve':>18}" for e in EXPORTS))
    for k in CURVE_ROWS:
        print(f"{k:>4}" + "".join(f"{curves[e][k]['relative']:>18.2f}" if k in curves[e] else f"{'-':>18}"
                                  for e in EXPORTS))

    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "block_int8_products.json"
    out.write_text(json.dumps({"cpu": cpu_identity(), "threads": args.threads,
                               "exports": {e: str(p) for e, p in paths.items()},
                               "per_category": args.per_category, "max_tokens": args.max_tokens,
                               "summary": summary, "prefill_tok_s": prefill, "loop_curves": curves,
                               "records": records}, indent=1))
    ks = [k for k in CURVE_ROWS if all(k in curves[e] for e in EXPORTS)]
    one = {e: float(np.median(passes[e][1])) for e in EXPORTS}
    lines = [(f"{e}: k-row pass, ms", [float(np.median(passes[e][k])) * 1e3 for k in ks], color, "-")
             for e, color in (("nbits", "tab:gray"), ("op", "tab:blue"))]
    line_chart(args.out / "block_int8_products.png", ks, lines, "rows in the target pass (1 + draft tokens)",
               f"median ms (1 row: nbits {one['nbits'] * 1e3:.1f}, op {one['op'] * 1e3:.1f})",
               "Target pass time in the decode loop: MatMulNBits vs BlockInt8MatMul")
    print(f"wrote {out} and block_int8_products.png")


if __name__ == "__main__":
    main()
