"""Historical: a one-off probe, kept to reproduce a past finding.
Kept for: what a draft head would cost, measured before one existed. benchmarks/draft_head_runtime.py
times the shipped head.
What one token of an EAGLE-style draft head would cost against a target pass, on this CPU.

    python benchmarks/head_cost.py [TARGET_EXPORT] [--rows 13000] [--context 300] [--passes 200] [--rounds 3]
        [--threads 2] [--out benchmarks/results]

The head of `benchmarks/draft_head_probe.py` is one Llama decoder layer of the target's width plus the target's
output rows for the tokens its training text chose (13k for SmolLM2-135M's). Its cost is measured, not estimated
from bytes: a random-weight GGUF of that shape (SmolLM2-135M's layer, one layer, ROWS tokens:
`benchmarks/synthetic_gguf.py`) exported to ONNX INT8 as the target is (`edgespec export onnx --quant int8`), and
one-token passes of it timed against one-token passes of TARGET_EXPORT (default: the default model's INT8 export),
taking turns pass by pass as drafting does, each at CONTEXT cells of KV (the head attends over as many positions
as the target). (Timed model by model, the head's 11 MB stayed in this EPYC's L3: a third of its cost in turns.)
What the probe's head has beyond that shape: the 2w → w map of [feature, embedding] (0.66M weights, ~5% of its
bytes) and no embedding of its own (it reads the target's). Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from edgespec.backends.onnx.manifest import MANIFEST
from edgespec.backends.onnx.model import OnnxModel, OnnxOptions
from edgespec.bench.run import machine
from edgespec.catalog.models import DEFAULT_MODEL, families
from edgespec.tuning.race import onnx_export_path

HERE = Path(__file__).parent


def head_shaped_export(rows: int, folder: Path) -> Path:
    """SmolLM2-135M's decoder layer, once, with ``rows`` output rows, as an ONNX INT8 export (made once)."""
    export = folder / f"head-shaped-{rows}-int8"
    if not export.is_dir():
        gguf = folder / f"head-shaped-{rows}.gguf"
        subprocess.run([sys.executable, str(HERE / "synthetic_gguf.py"), "--shape", "smollm2-135m", "--layers", "1",
                        "--vocab", str(rows), "--quant", "q8_0", "--out", str(gguf)], check=True)
        subprocess.run([sys.executable, "-m", "edgespec.cli", "export", "onnx", str(gguf), "--quant", "int8",
                        "--no-quality", "--out", str(export)], check=True)
    return export


def interleaved_ms(models: dict[str, OnnxModel], context: int, passes: int,
                   rng: np.random.Generator) -> dict[str, float]:
    """Median ms of each model's one-token pass after ``context`` cached positions, the models taking turns pass by
    pass (as drafting and verifying do: the target's 134 MB of weights pass through the caches between two head
    tokens, so the head reads its weights from memory, not from a cache it had to itself), each cache cut back to
    ``context`` after each pass."""
    for model in models.values():
        model.truncate(0)
        model.decode(rng.integers(0, model.n_vocab, context).tolist(), 0, 1)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(passes):
        for name, model in models.items():
            token = int(rng.integers(0, model.n_vocab))
            start = time.perf_counter()
            model.decode([token], context, 1)
            times[name].append(time.perf_counter() - start)
            model.truncate(context)
    return {name: float(np.median(t)) * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", type=Path, default=None)
    parser.add_argument("--rows", type=int, default=13000, help="the head's output rows (tokens it can guess)")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    target_path = args.target or onnx_export_path(families()[DEFAULT_MODEL])
    if not (target_path / MANIFEST).is_file():
        parser.error(f"{target_path}: not an edgespec ONNX export (`edgespec export onnx`, or run `edgespec "
                     "generate` once to make the default's)")
    if min(args.rows, args.context, args.passes, args.rounds, args.threads) < 1:
        parser.error("--rows, --context, --passes, --rounds and --threads must be 1 or more")
    args.out.mkdir(parents=True, exist_ok=True)
    options = OnnxOptions(n_ctx=args.context + 8, n_threads=args.threads)
    models = {"target": OnnxModel(target_path, options),
              "head-shaped": OnnxModel(head_shaped_export(args.rows, args.out), options)}
    rng = np.random.default_rng(0)
    measured: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, ms in interleaved_ms(models, args.context, args.passes, rng).items():
            measured[name].append(ms)
    target, head = np.median(measured["target"]), np.median(measured["head-shaped"])
    print("| model | ms per one-token pass (median of rounds) | rounds |\n|---|---|---|")
    for name, values in measured.items():
        print(f"| {name} | {np.median(values):.3f} | {' '.join(f'{v:.3f}' for v in values)} |")
    print(f"head token / target pass: {head / target:.3f}")
    result = {"date": datetime.now(timezone.utc).isoformat(), "machine": machine(), "args": {
        k: str(v) for k, v in vars(args).items()}, "target": str(target_path), "ms": measured,
        "head_over_target": head / target}
    path = args.out / f"head_cost-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
