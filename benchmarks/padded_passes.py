"""Current: a tool the manual uses.
Fixed-shape (padded) passes on llama.cpp: are they exact over a long run, and what does a pass cost?

    PYTHONPATH=. python benchmarks/padded_passes.py [MODEL] [--device cpu|cuda] [--fast-numerics]
        [--rows 0,4,8,16] [--positions 200:1100] [--seeds 0,1] [--out benchmarks/results]

Exactness, per pass size B (0: unpadded): the model prefills a fixed text up to the first position, then decodes
every following position in a one-token pass (padded to B rows when B > 0) and keeps each row's logits; then it
rolls back and decodes the same tokens again in passes of random size (1..B tokens, or 1..8 unpadded, cut where
``LlamaModel.max_pass_rows`` says, as the engine cuts its drafts) and compares every row bit for bit. A pass size
whose rows all match over hundreds of positions — across llama.cpp's n_kv steps at multiples of 256 — is one the
engine may verify drafts in losslessly; the self-check (edgespec/backends/selfcheck.py) probes the same on three
contexts.

Cost, per pass size: the median time of a pass of 1 and of B tokens at the middle position (decode, logits read,
filler removed), and a plain greedy decode loop's tokens/s, unpadded and padded. Prints a table; writes JSON.
"""

from __future__ import annotations

# First: on the H100 image, numpy imported before llama.cpp's CUDA library crashed this script
# (edgespec/backends/llamacpp/preload.py).
import edgespec  # noqa: F401

# isort: split
import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel
from edgespec.bench.run import machine
from edgespec.catalog.models import DEFAULT_MODEL, resolve

_TEXT = ("The committee met on Tuesday to review the budget. def mean(xs):\n    return sum(xs) / len(xs)\n"
         "Rivers carry sediment to the sea, where it settles into deltas over thousands of years. ")
UNPADDED_MAX = 8  # the largest unpadded pass tried


def text_tokens(model: LlamaModel, n: int) -> list[int]:
    text = model.tokenize(_TEXT)
    return (text * (n // len(text) + 1))[:n]


def long_run(model: LlamaModel, rows: int, first: int, last: int, seed: int) -> dict[str, object]:
    """Rows compared, mismatching rows, the first mismatching position and the largest difference."""
    model.set_pass_rows(rows)
    tokens = text_tokens(model, last)
    model.truncate(0)
    model.decode(tokens[:first], 0, 1)
    alone = np.stack([model.decode([tokens[p]], p, 1)[0].copy() for p in range(first, last)])
    model.truncate(first)
    rng = np.random.default_rng(seed)
    worst, bad, first_bad, pos = 0.0, 0, None, first
    while pos < last:
        k = min(int(rng.integers(1, (rows or UNPADDED_MAX) + 1)), model.max_pass_rows(pos), last - pos)
        batched = model.decode(tokens[pos:pos + k], pos, k)
        diff = np.abs(batched - alone[pos - first:pos - first + k]).max(axis=1)
        if diff.max() > 0:
            bad += int((diff > 0).sum())
            first_bad = first_bad if first_bad is not None else pos + int(np.argmax(diff > 0))
            worst = max(worst, float(diff.max()))
        pos += k
    model.truncate(0)
    return {"rows": rows, "seed": seed, "compared": last - first, "mismatched": bad, "first_mismatch": first_bad,
            "max_abs_diff": worst}


def pass_cost(model: LlamaModel, rows: int, context: int, repeats: int = 30) -> dict[str, float]:
    """Median seconds of a pass of 1 and of max(rows, 1) tokens at ``context``; decode-loop tokens/s."""
    model.set_pass_rows(rows)
    tokens = text_tokens(model, context + 16)
    model.truncate(0)
    model.decode(tokens[:context], 0, 1)
    out = {}
    for k in sorted({1, max(rows, 1)}):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model.decode(tokens[context:context + k], context, k)
            times.append(time.perf_counter() - start)
            model.truncate(context)
        out[f"pass_{k}_ms"] = float(np.median(times)) * 1e3
    token, pos, n = tokens[context], context, 128
    start = time.perf_counter()
    for _ in range(n):
        token = int(model.decode([token], pos, 1)[0].argmax())
        pos += 1
    out["loop_tok_s"] = n / (time.perf_counter() - start)
    model.truncate(0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    parser.add_argument("--device", choices=("cpu", "cuda", "metal"), default="cpu")
    parser.add_argument("--fast-numerics", action="store_true", help="F16 KV cache and flash attention")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rows", default="0,4,8,16", help="pass sizes; 0 is unpadded (default: %(default)s)")
    parser.add_argument("--positions", default="200:1100", help="first:last position of the long run")
    parser.add_argument("--seeds", default="0,1", help="pass-size sequences per pass size")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    first, last = (int(x) for x in args.positions.split(":"))
    model = LlamaModel(resolve(args.model), ContextOptions(n_ctx=max(2048, last + 64), n_threads=args.threads,
                                                           device=args.device,
                                                           exact_numerics=not args.fast_numerics))
    sizes = [int(r) for r in args.rows.split(",")]
    runs = [long_run(model, r, first, last, int(s)) for r in sizes for s in args.seeds.split(",")]
    costs = {r: pass_cost(model, r, (first + last) // 2) for r in sizes}
    numerics = "fast (F16 KV, flash attention)" if args.fast_numerics else "exact (F32 KV, no flash attention)"
    print(f"{model.path.name} on {args.device}, {numerics}, positions {first}..{last}")
    print("| pass rows | seed | rows compared | mismatched | first mismatch | max |diff| |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['rows'] or 'unpadded'} | {r['seed']} | {r['compared']} | {r['mismatched']} | "
              f"{r['first_mismatch']} | {r['max_abs_diff']:.3g} |")
    print("\n| pass rows | 1-token pass ms | full pass ms | decode loop tok/s |")
    print("|---|---|---|---|")
    for r, c in costs.items():
        full = c.get(f"pass_{max(r, 1)}_ms", c["pass_1_ms"])
        print(f"| {r or 'unpadded'} | {c['pass_1_ms']:.3f} | {full:.3f} | {c['loop_tok_s']:.1f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = args.out / f"padded_passes-{stamp}-{args.device}{'-fast' if args.fast_numerics else ''}.json"
    path.write_text(json.dumps({"date": stamp, "machine": machine(), "model": str(model.path), "device": args.device,
                                "numerics": numerics, "positions": [first, last], "runs": runs,
                                "costs": {str(r): c for r, c in costs.items()}}, indent=1))
    print(f"wrote {path}")
    model.close()


if __name__ == "__main__":
    main()
