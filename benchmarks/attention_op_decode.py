"""Current: a tool the manual uses.
The whole model with each attention op: edgespec's kernel against GroupQueryAttention, side by side.

    python benchmarks/attention_op_decode.py [--contexts 100,500,1000,2000] [--rounds 2] [--threads 2] [--out DIR]

Exports the default model's shipped GGUF to ONNX INT8 twice (``--attention exact`` and ``--attention gqa``; no
quality report), then, round by round and model by model (alternating, so the shared machine's load falls on
both), times a single-token step and a 5-token verify pass at each context length (medians of 30 passes), and
a 1024-token prefill in calls of 256; it checks that the verify pass's logits equal five single-token steps'
bit for bit. Prints a table (the range over rounds), writes attention_op_decode.json and .png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from edgespec.export.onnx.export import export_onnx

from edgespec.backends.onnx.model import OnnxModel, OnnxOptions
from edgespec.bench.plots import line_chart
from edgespec.catalog.models import DEFAULT_MODEL, families
from edgespec.home import home_dir
from edgespec.identity import cpu_identity

OPS = ("exact", "gqa")
VERIFY = 5
PREFILL, CHUNK = 1024, 256


def export(op: str) -> Path:
    family = families()[DEFAULT_MODEL]
    out = home_dir("onnx") / f"bench-{family.name}-int8-{op}"
    if not (out / "edgespec-onnx.json").is_file():
        export_onnx(family.variant_path(family.source_quant), out, quant="int8", attention=op, progress=False)
    return out


def _median_ms(model: OnnxModel, tokens: list[int], start: int, n: int, repeats: int = 30) -> float:
    times = []
    for _ in range(repeats):
        model.truncate(start)
        began = time.perf_counter()
        model.decode(tokens, start, n)
        times.append(time.perf_counter() - began)
    return float(np.median(times) * 1e3)


def measure(folder: Path, contexts: list[int], threads: int) -> dict:
    model = OnnxModel(folder, OnnxOptions(n_ctx=max(contexts) + 2 * CHUNK, n_threads=threads))
    try:
        tokens = [int(t) for t in np.random.default_rng(0).integers(100, 40000, max(contexts) + VERIFY)]
        result: dict = {"single_ms": {}, "verify_ms": {}}
        for n in contexts:
            model.truncate(0)
            for lo in range(0, n, CHUNK):
                model.decode(tokens[lo:min(n, lo + CHUNK)], lo, 0)
            result["single_ms"][n] = _median_ms(model, tokens[n:n + 1], n, 1)
            result["verify_ms"][n] = _median_ms(model, tokens[n:n + VERIFY], n, VERIFY)
        model.truncate(contexts[0])
        verify = model.decode(tokens[contexts[0]:contexts[0] + VERIFY], contexts[0], VERIFY).copy()
        model.truncate(contexts[0])
        single = np.stack([model.decode([tokens[contexts[0] + i]], contexts[0] + i, 1)[0].copy()
                           for i in range(VERIFY)])
        result["verify_equals_single"] = bool(np.array_equal(verify, single))
        model.truncate(0)
        began = time.perf_counter()
        for lo in range(0, PREFILL, CHUNK):
            model.decode(tokens[lo:lo + CHUNK], lo, 0)
        result["prefill_s"] = time.perf_counter() - began
        return result
    finally:
        model.close()


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.1f}" if abs(hi - lo) < 0.05 else f"{lo:.1f}–{hi:.1f}"


def plot(rounds: list[dict], contexts: list[int], path: Path) -> None:
    lines = [(f"{op}, {'1 token' if kind == 'single_ms' else f'{VERIFY}-token verify'}",
              [min(r[op][kind][n] for r in rounds) for n in contexts], color, style)
             for op, color in zip(OPS, ("tab:green", "tab:gray"), strict=True)
             for kind, style in (("single_ms", "-"), ("verify_ms", "--"))]
    line_chart(path, contexts, lines, "tokens of context", "ms per pass (best round)",
               "SmolLM2 INT8: attention op, whole model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="100,500,1000,2000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"),
                        help="folder for attention_op_decode.json/.png (default benchmarks/results, git-ignored)")
    args = parser.parse_args()
    contexts = [int(n) for n in args.contexts.split(",")]
    folders = {op: export(op) for op in OPS}
    rounds = [{op: measure(folders[op], contexts, args.threads) for op in OPS} for _ in range(args.rounds)]
    print(f"{'context':>8} {'1 token, exact / gqa (ms)':>30} {f'{VERIFY}-token verify (ms)':>30}")
    for n in contexts:
        cells = [" / ".join(_span([r[op][kind][n] for r in rounds]) for op in OPS)
                 for kind in ("single_ms", "verify_ms")]
        print(f"{n:>8} {cells[0]:>30} {cells[1]:>30}")
    prefill = " / ".join(_span([r[op]["prefill_s"] for r in rounds]) for op in OPS)
    same = all(r[op]["verify_equals_single"] for r in rounds for op in OPS)
    print(f"prefill of {PREFILL} tokens (s), exact / gqa: {prefill}; verify logits equal single steps': {same}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "attention_op_decode.json"
    out.write_text(json.dumps({"cpu": cpu_identity(), "threads": args.threads,
                               "contexts": contexts, "rounds": rounds}, indent=1))
    plot(rounds, contexts, args.out / "attention_op_decode.png")
    print(f"wrote {out} and attention_op_decode.png")


if __name__ == "__main__":
    main()
