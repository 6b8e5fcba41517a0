"""Current: a tool the manual uses.
Verify-cost curves, decode and prefill speed and memory at the sizes users run: for each GGUF
(the random models of real shapes from benchmarks/synthetic_gguf.py, or any real one) through edgespec's engine.

    PYTHONPATH=. python benchmarks/verify_curve_sizes.py FILE.gguf [FILE.gguf ...] [--device cpu|cuda]
        [--threads N] [--contexts 128 1024] [--rounds 7] [--label TEXT] [--out benchmarks/results]

Per file, in one engine (target only, the engine's default numerics for the device):
- the verify curve: one target pass over k rows through the engine's KV arena (what a verify of k−1 drafted
  tokens costs), k = 1, 2, 3, 4, 6, 8, 12, 16, after each context length; the k's interleaved within each round
  and their order shuffled from round to round, so a busy moment falls on all; the median of the rounds;
- plain decoding: the engine with no drafter, ``--decode-tokens`` tokens after a ~128-token prompt (median of 3);
- prefill: a ``--prefill-tokens``-token prompt, nothing reused, to its first token (median of 3);
- memory: the process's peak resident set while the file is loaded and measured (Linux: reset per file), and on
  CUDA the GPU memory in use beside the baseline before loading (nvidia-smi, where present).
Acceptance is not measured here: a random model's drafts are accepted at random. Combine these costs with the
acceptance recorded from real models' outputs (``edgespec replay``).

Writes STEM.json, STEM.png (verify cost relative to one row; without matplotlib, no plot) and prints a table;
STEM is verify_curve_sizes-DATE-CPU-DEVICE[-LABEL]. Needs edgespec importable (this checkout on PYTHONPATH),
numpy and llama-cpp-python; nothing else.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

# llama_cpp before numpy: on a CUDA build compiled with a newer g++, loading numpy's libstdc++ first made
# llama.cpp segfault at load.
import llama_cpp
import numpy as np

import edgespec
from edgespec.cpu import physical_cores
from edgespec.engine.engine import Engine
from edgespec.identity import cpu_identity

ROWS = (1, 2, 3, 4, 6, 8, 12, 16)
PROMPT_TEXT = ("Speculative decoding lets a cheap drafter propose several tokens that the target model then "
               "verifies in a single batched forward pass, so the costs measured here decide what it can gain. ")


def text_tokens(engine: Engine, n: int) -> list[int]:
    """``n`` tokens of English text in the model's own tokenizer (any vocabulary, real or synthetic)."""
    unit = engine.tokenize(PROMPT_TEXT)
    return (unit * (n // len(unit) + 1))[:n]


def verify_curve(engine: Engine, context: list[int], rows: tuple[int, ...], rounds: int,
                 rng: np.random.Generator) -> dict[int, list[float]]:
    """Seconds of each pass over k rows after ``context``, k interleaved and shuffled per round. The pass is the
    one ``Engine.calibrate`` times: k tokens through the arena, rolled back after."""
    arena = engine.arena
    arena.reset(context, reuse=False)
    arena.extend("target", [], 1)
    filler = arena.tokens[-1]
    samples: dict[int, list[float]] = {k: [] for k in rows}
    for k in rows:  # warm-up: first passes of a shape allocate (and on CUDA build graphs)
        arena.extend("target", [filler] * k, k)
        arena.commit([])
    for _ in range(rounds):
        for k in rng.permutation(rows):
            began = time.perf_counter()
            arena.extend("target", [filler] * int(k), int(k))
            arena.commit([])
            samples[int(k)].append(time.perf_counter() - began)
    return samples


def decode_speed(engine: Engine, tokens: int, runs: int) -> dict[str, object]:
    """Plain decoding (no drafter): tokens after the first over the time after the first, per run."""
    prompt = text_tokens(engine, 128)
    speeds = []
    for _ in range(runs):
        stats = engine.generate(prompt, max_tokens=tokens, mode="none", cache_prompt=False).stats
        speeds.append((stats.generated_tokens - 1) / stats.decode_s if stats.decode_s else float("nan"))
    return {"tok_s": float(np.median(speeds)), "runs": speeds, "tokens": tokens, "prompt_tokens": len(prompt)}


def prefill_speed(engine: Engine, tokens: int, runs: int) -> dict[str, object]:
    """A ``tokens``-token prompt to its first token, nothing reused, per run."""
    prompt = text_tokens(engine, tokens)
    speeds = [tokens / engine.generate(prompt, max_tokens=1, mode="none", cache_prompt=False).stats.prefill_s
              for _ in range(runs)]
    return {"tok_s": float(np.median(speeds)), "runs": speeds, "tokens": tokens}


def reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS count for this process (Linux); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_mib() -> dict[str, float]:
    """This process's resident and peak resident set (Linux /proc), MiB."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M))
    return {name: int(kb) / 1024 for name, kb in found.items()}


def gpu() -> tuple[str | None, float | None]:
    """The first GPU's name and MiB in use (nvidia-smi), or Nones."""
    if shutil.which("nvidia-smi") is None:
        return None, None
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()[0]
    except (subprocess.SubprocessError, IndexError):
        return None, None
    name, used = line.rsplit(",", 1)
    return name.strip(), float(used)


def measure(path: Path, args: argparse.Namespace, rng: np.random.Generator) -> dict[str, object]:
    reset = reset_peak_rss()
    _, gpu_before = gpu()
    began = time.perf_counter()
    n_ctx = max(max(args.contexts) + max(ROWS) + 1, args.prefill_tokens + 1, 128 + args.decode_tokens + 1)
    engine = edgespec.load(str(path), mode="none", n_ctx=n_ctx, device=args.device, n_threads=args.threads,
                           tuning=False)
    try:
        loaded_s = time.perf_counter() - began
        after_load = memory_mib()
        _, gpu_loaded = gpu()
        model = engine.target
        curves = {}
        for context in args.contexts:
            print(f"  verify passes after {context} tokens ...", file=sys.stderr, flush=True)
            samples = verify_curve(engine, text_tokens(engine, context), ROWS, args.rounds, rng)
            one = float(np.median(samples[1]))
            curves[str(context)] = {str(k): {"ms": float(np.median(s)) * 1e3, "relative": float(np.median(s)) / one,
                                             "samples_ms": [x * 1e3 for x in s]} for k, s in samples.items()}
        print("  decoding, prefill ...", file=sys.stderr, flush=True)
        decode = decode_speed(engine, args.decode_tokens, 3)
        prefill = prefill_speed(engine, args.prefill_tokens, 3)
        memory = memory_mib()
        return {"path": str(path), "name": model.description, "file_bytes": path.stat().st_size,
                "n_layer": model.n_layer, "n_vocab": model.n_vocab, "n_ctx": n_ctx, "load_s": loaded_s,
                "curves": curves, "decode": decode, "prefill": prefill,
                "rss_after_load_mib": after_load.get("VmRSS"),
                "rss_peak_mib": memory.get("VmHWM") if reset else None,
                "gpu_mib_used": None if gpu_loaded is None or gpu_before is None else gpu_loaded - gpu_before}
    finally:
        engine.close()


def slug(text: str) -> str:
    text = re.sub(r"\(r\)|\(tm\)|\bprocessor\b|\bcpu\b|@.*|\[.*\]", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def table(result: dict) -> str:
    lines = [f"{result['cpu']}, {result['threads']} threads, device {result['device']}"
             + (f" ({result['gpu']})" if result["gpu"] else "") + f", llama-cpp-python {result['llama_cpp']}; "
             f"{result['note']}",
             f"{'model':<34}{'GiB':>6}{'decode':>8}{'prefill':>9}{'peak RSS':>10}{'ctx':>6}{'1 row':>9}"
             + "".join(f"{'k=' + str(k):>7}" for k in ROWS[1:]),
             f"{'':<34}{'':>6}{'tok/s':>8}{'tok/s':>9}{'MiB':>10}{'':>6}{'ms':>9}"
             + f"{'(cost of k rows / 1 row)':>{7 * (len(ROWS) - 1)}}"]
    for m in result["models"]:
        peak = f"{m['rss_peak_mib']:.0f}" if m["rss_peak_mib"] is not None else "-"
        head = (f"{Path(m['path']).name[:33]:<34}{m['file_bytes'] / 2**30:>6.2f}{m['decode']['tok_s']:>8.1f}"
                f"{m['prefill']['tok_s']:>9.1f}{peak:>10}")
        for i, (context, curve) in enumerate(m["curves"].items()):
            lines.append((head if i == 0 else " " * len(head)) + f"{context:>6}{curve['1']['ms']:>9.1f}"
                         + "".join(f"{curve[str(k)]['relative']:>7.2f}" for k in ROWS[1:]))
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ["-", "--", ":", "-."]
    for i, m in enumerate(result["models"]):
        for j, (context, curve) in enumerate(m["curves"].items()):
            ax.plot(ROWS, [curve[str(k)]["relative"] for k in ROWS], styles[j % len(styles)], color=f"C{i}",
                    marker="o", label=f"{Path(m['path']).stem}, context {context}")
    ax.plot(ROWS, ROWS, color="grey", linestyle=":", label="k rows = k passes")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("rows in the pass (1 + draft tokens)")
    ax.set_ylabel("cost relative to one row")
    label = f" ({result['label']})" if result.get("label") else ""
    ax.set_title(f"Verify cost by model size, {result['device']}: {result['gpu'] or result['cpu'][:40]}{label}",
                 fontsize=9)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="GGUF files")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="default: the physical cores")
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--label", default="", help="appended to the output's name (e.g. shared-machine)")
    parser.add_argument("--note", default="", help="recorded in the JSON and the table's heading")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.models if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    if min(args.contexts) < 2 or args.rounds < 1 or args.decode_tokens < 2 or args.prefill_tokens < 1:
        parser.error("--contexts ≥ 2, --rounds ≥ 1, --decode-tokens ≥ 2, --prefill-tokens ≥ 1")
    args.threads = args.threads or physical_cores()
    rng = np.random.default_rng(0)
    gpu_name = gpu()[0] if args.device == "cuda" else None
    result: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": args.device,
                    "cpu": cpu_identity(), "gpu": gpu_name, "threads": args.threads,
                    "llama_cpp": llama_cpp.__version__, "rows": list(ROWS), "rounds": args.rounds, "label": args.label,
                    "note": args.note or "random weights: costs only, no acceptance (take it from edgespec replay)",
                    "models": []}
    for path in args.models:
        print(f"measuring {path} ...", file=sys.stderr, flush=True)
        result["models"].append(measure(path, args, rng))
    print(table(result))
    where = slug(gpu_name) if gpu_name else slug(cpu_identity()) + f"-{args.threads}t"
    stem = f"verify_curve_sizes-{datetime.now().strftime('%Y-%m-%d')}-{where}-{args.device}"
    stem += f"-{slug(args.label)}" if args.label else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    plotted = plot(result, args.out / f"{stem}.png")
    print(f"wrote {args.out / stem}.json" + (" and .png" if plotted else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
