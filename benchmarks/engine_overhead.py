"""Current: a tool the manual uses.
What the engine adds to a decode step: its target-only loop against a bare loop over the same model.

    PYTHONPATH=. python benchmarks/engine_overhead.py [MODEL] [--device cpu|cuda] [--threads N] [--tokens 128]
        [--rounds 5] [--out benchmarks/results]

Per round, interleaved: a bare greedy loop (``LlamaModel.decode`` of one token, argmax) and ``Engine.generate``
with mode ``none`` (the arena, the text stream, stop checks, the stats) over the same prompt and the same number of
tokens, on one loaded model, so both pay the same passes (padded alike where the self-check chose padding). The
median ms per token of each and their ratio (the engine's should stay within 10% of the bare loop's).
Prints a table; writes JSON.
"""

from __future__ import annotations

# First: on the H100 image, numpy imported before llama.cpp's CUDA library crashed
# (edgespec/backends/llamacpp/preload.py).
import edgespec

# isort: split
import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from edgespec.backends.llamacpp.model import LlamaModel
from edgespec.bench.run import machine
from edgespec.engine.engine import Engine

_PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def bare_loop(model: LlamaModel, prompt: list[int], n: int) -> float:
    """Seconds per token of n one-token passes after the prompt's first token."""
    model.truncate(0)
    token = int(model.decode(prompt, 0, 1)[0].argmax())
    pos = len(prompt)
    start = time.perf_counter()
    for _ in range(n):
        token = int(model.decode([token], pos, 1)[0].argmax())
        pos += 1
    model.truncate(0)
    return (time.perf_counter() - start) / n


def engine_loop(engine: Engine, prompt: list[int], n: int) -> tuple[float, int]:
    """Seconds per decoded token of ``generate`` (mode none), and how many tokens it decoded after the first."""
    out = engine.generate(prompt, max_tokens=n + 1, mode="none", cache_prompt=False)
    decoded = out.stats.generated_tokens - 1
    return out.stats.decode_s / max(decoded, 1), decoded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=edgespec.DEFAULT_MODEL)
    parser.add_argument("--device", choices=("cpu", "cuda", "metal"), default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    engine = edgespec.load(args.model, mode="none", device=args.device, n_threads=args.threads, tuning=False)
    model = engine.target
    if not isinstance(model, LlamaModel):
        raise SystemExit(f"{args.model}: needs a GGUF model (the bare loop drives llama.cpp directly)")
    prompt = engine.tokenize(_PROMPT)
    engine_loop(engine, prompt, 8)  # warm-up
    bare, through, decoded = [], [], args.tokens
    for _ in range(args.rounds):
        per_token, decoded = engine_loop(engine, prompt, args.tokens)  # EOS may end it early: same count bare
        through.append(per_token)
        bare.append(bare_loop(model, prompt, decoded))
    b, e = float(np.median(bare)) * 1e3, float(np.median(through)) * 1e3
    print(f"{model.path.name} on {args.device}, {model.n_threads} threads, pass rows {model.pass_rows or 'unpadded'},"
          f" {decoded} tokens, median of {args.rounds}")
    print("| loop | ms per token | tok/s |\n|---|---|---|")
    print(f"| bare LlamaModel.decode | {b:.3f} | {1e3 / b:.1f} |")
    print(f"| Engine.generate, mode none | {e:.3f} | {1e3 / e:.1f} |")
    print(f"engine / bare: {e / b:.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = args.out / f"engine_overhead-{stamp}-{args.device}.json"
    path.write_text(json.dumps({"date": stamp, "machine": machine(), "model": str(model.path), "device": args.device,
                                "threads": model.n_threads, "pass_rows": model.pass_rows, "tokens": decoded,
                                "bare_ms": bare, "engine_ms": through, "ratio": e / b}, indent=1))
    print(f"wrote {path}")
    engine.close()


if __name__ == "__main__":
    main()
