"""Current: a tool the manual uses.
Verify-cost curves, decode and prefill speed and memory at the sizes users run: for each GGUF or edgespec ONNX
export (the random models of real shapes from benchmarks/synthetic_gguf.py, or any real one) through edgespec's
engine, or (``--compare``) edgespec's ONNX export of a GGUF against llama.cpp on that same file, taking turns.

The comparison at Llama-3.2-1B (all 16 layers), Q4_K_M and Q4_0, on a quiet machine, 2 threads (from the checkout;
the files as users have them: Llama 3's rope_freqs and llama-bpe pre-tokenizer, quantized by llama.cpp):

    python benchmarks/synthetic_gguf.py --shape llama-3.2-1b --quant q4_k_m --threads 2 \
        --out /tmp/llama-3.2-1b-q4_k_m.gguf
    PYTHONPATH=. python benchmarks/verify_curve_sizes.py --compare /tmp/llama-3.2-1b-q4_k_m.gguf --label quiet
    python benchmarks/synthetic_gguf.py --shape llama-3.2-1b --quant q4_0 --threads 2 \
        --out /tmp/llama-3.2-1b-q4_0.gguf
    PYTHONPATH=. python benchmarks/verify_curve_sizes.py --compare /tmp/llama-3.2-1b-q4_0.gguf --label quiet

Measured on the 2-core EPYC: each GGUF 30-50 s to write (2.5 GB of F16, then quantized), each comparison 100-180 s
(the export ~15 s the first time, ~1.1 GB beside the file in FILE-onnx/; the peak-memory probes; 30 rounds of
verify passes; decoding; prefill); 3B about 2.5× as long, 8B ~6× (and ~11 GB of memory with both backends loaded).
``--backends onnx,llamacpp,llamacpp-stock`` adds llama.cpp with its own defaults (F16 KV cache, flash attention);
``--backends llamacpp`` alone shows what taking turns costs a backend, if anything. ``--backends
onnx,llamacpp,genai`` adds onnxruntime-genai as a plain-decoding peer: its own INT4 model of the file (its model
builder, as ``edgespec export onnx FILE --format genai`` runs it: blocks of 32, symmetric, accuracy level 4, i.e.
int8 activations), built once to ``--genai-to`` (default FILE-genai-int4 beside the file; ``--genai DIR`` names a
built one) with its build time and peak memory recorded there, and timed through its generator in the same turns.
The builder re-quantizes the weights transformers' GGUF loader dequantized (the same model, not the file's numbers),
and its generator hands out the last position's logits only: its k-row passes time what appending k tokens costs
it, not a verify. The build goes through the file's Hugging Face folder in float32, cached under EDGESPEC_HOME, and
the builder quantizes a whole float32 graph: ~10 bytes of memory a weight (at Llama-3.2-1B 12.6 GB at the peak, and
~5 GB of disk), so an 8B file does not build in 24 GB.

    PYTHONPATH=. python benchmarks/verify_curve_sizes.py --compare FILE.gguf [--onnx DIR | --export-to DIR]
        [--genai DIR | --genai-to DIR] [--backends onnx,llamacpp] [--threads 2] [--context 1024] [--rows 1,2,4,8]
        [--rounds 30] [--runs 3] [--decode-tokens 64] [--prefill-tokens 512] [--no-memory]
        [--label TEXT] [--out benchmarks/results/]

``--compare``: the file's export (``--onnx DIR``; or ``edgespec export onnx FILE --quant gguf --no-quality``
written to ``--export-to``, default FILE-onnx beside the file, and reused while it is current) and llama.cpp on
the file, each opened through edgespec's backend API as the engine opens it (after the exactness self-check),
both in one process, in turns (who goes first alternating, so the machine's drift falls on both; before each timed
pass an untimed one-row pass of the same backend, so the other runtime's spinning threads are quiet):
- verify: ``decode(tokens, 1024, k)`` then ``truncate(1024)``, a verify that accepts nothing, at exactly
  ``--context`` tokens, k = 1, 2, 4, 8 shuffled each round; the median of the rounds, and each k against one row
  (the goal at 1B, context 1024: k=2 ≤ 1.25×, k=4 ≤ 1.6×, k=8 ≤ 2.4×);
- plain decoding: ``--decode-tokens`` one-row passes in sequence after a 128-token prompt, greedy; and the median
  step against the one-row verify pass, which it should not exceed (a shorter context). The two are timed in
  phases a minute or more apart, and taking turns evens the machine's drift between backends, not between phases:
  on the shared machine an 8B decoding run took 78 ms a step and the next 212 ms, and the verify phase 270 ms (no
  other change), so a step dearer than the pass says the load moved, not the backend;
- prefill: ``--prefill-tokens`` tokens into an empty cache (each backend's own batches), to the last logits;
- peak RSS: per backend in a process of its own (load, prefill, the context, every pass, a few decoding steps).
It prints one table (backend, decode and prefill tok/s, k-row ms and × one row, peak RSS, ONNX against each other)
and writes verify_curve_compare-DATE-CPU-THREADSt-FILE[-LABEL].json into ``--out``. Random token ids throughout.

Without ``--compare``, per file or export, in one engine (target only, the engine's default numerics for the
device):

    PYTHONPATH=. python benchmarks/verify_curve_sizes.py FILE.gguf|DIR [...] [--device cpu|cuda]
        [--threads N] [--contexts 128 1024] [--rounds 7] [--label TEXT] [--out benchmarks/results/]

- the verify curve: one target pass over k rows through the engine's KV arena (what a verify of k−1 drafted
  tokens costs), k = 1, 2, 3, 4, 6, 8, 12, 16, after each context length; the k's interleaved within each round
  and their order shuffled from round to round, so a busy moment falls on all; the median of the rounds;
- plain decoding: the engine with no drafter, ``--decode-tokens`` tokens after a ~128-token prompt (median of 3);
- prefill: a ``--prefill-tokens``-token prompt, nothing reused, to its first token (median of 3);
- memory: the process's peak resident set while the file is loaded and measured (Linux: reset per file), and on
  CUDA the GPU memory in use beside the baseline before loading (nvidia-smi, where present).
It writes STEM.json, STEM.png (verify cost relative to one row; without matplotlib, no plot) and prints a table;
STEM is verify_curve_sizes-DATE-CPU-DEVICE[-LABEL]; the JSON names each model's backend.

Acceptance is not measured here: a random model's drafts are accepted at random. Combine these costs with the
acceptance recorded from real models' outputs (``edgespec replay``). Measure on a quiet machine: beside other work
llama.cpp's spinning thread barriers slow down many-fold (``BUSY``). Needs edgespec importable (this checkout on
PYTHONPATH), numpy and llama-cpp-python; ``--compare`` and exports also onnxruntime, onnx, gguf and tokenizers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

# llama_cpp before numpy: on a CUDA build compiled with a newer g++, loading numpy's libstdc++ first made
# llama.cpp segfault at load.
import llama_cpp
import numpy as np

import edgespec
from edgespec.backends.onnx.manifest import MANIFEST
from edgespec.backends.registry import ModelOptions, choose, open_model
from edgespec.backends.selfcheck import check as check_exactness
from edgespec.bench.peers.ort_genai import load_model as load_genai
from edgespec.cpu import physical_cores
from edgespec.engine.engine import Engine
from edgespec.identity import cpu_identity

ROWS = (1, 2, 3, 4, 6, 8, 12, 16)
COMPARE_ROWS = (1, 2, 4, 8)
# The ONNX path's goal for a verify pass of k rows at 1B and 1024 tokens of context, relative to its one-row pass
GOALS = {2: 1.25, 4: 1.6, 8: 2.4}
# --compare's backends: name → (edgespec's backend, exact numerics). llamacpp is llama.cpp as edgespec runs it
# (F32 KV cache, flash attention off: batch-invariant on a CPU); llamacpp-stock is llama.cpp's own defaults (F16 KV
# cache, flash attention where it has it), what plain llama.cpp decodes at.
COMPARED = {"onnx": ("onnx", True), "llamacpp": ("llamacpp", True), "llamacpp-stock": ("llamacpp", False)}
# --compare's plain-decoding peer: onnxruntime-genai's own INT4 model of the file (its builder, as `edgespec export
# onnx --format genai` runs it: blocks of 32, symmetric, accuracy level 4 = int8 activations, the fastest 4-bit CPU
# decoder we know), timed in the same turns through its generator.
GENAI = "genai"
GENAI_BUILD = {"quant": "int4", "block_size": 32, "accuracy_level": 4}
GENAI_RECORD = "edgespec-build.json"  # beside the genai model: what it was built from and what the build cost
GENAI_NOTE = ("onnxruntime-genai's builder re-quantized the file's weights (dequantized to float32 by transformers' "
              "GGUF loader) to INT4 blocks of 32, symmetric, accuracy level 4: the same model, not the file's "
              "numbers; its generator hands out the last position's logits only, so its k-row passes "
              "(append_tokens of k tokens) time what such a pass costs it, not a verify it could use")
DECODE_PROMPT = 128  # tokens before plain decoding starts
# A 1-minute load average above this before --compare starts: other work is running. llama.cpp's threads meet at
# spinning barriers hundreds of times a pass, so a core taken away stalls them all: on the shared 2-core machine,
# one-row passes of a 2-layer model took 9-12 ms quiet and 60-270 ms beside another job, onnxruntime's 8-16 ms.
BUSY = 0.5
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
        if engine.target.n_ctx < n_ctx:  # an ONNX export's graphs take at most its context length
            raise SystemExit(f"{path} takes {engine.target.n_ctx} tokens of context, the passes need {n_ctx}: "
                             f"export it with --context-length {n_ctx} or more")
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
        decode = decode_speed(engine, args.decode_tokens, args.runs)
        prefill = prefill_speed(engine, args.prefill_tokens, args.runs)
        memory = memory_mib()
        return {"path": str(path), "backend": choose(path), "name": model.description, "file_bytes": size_of(path),
                "n_layer": model.n_layer, "n_vocab": model.n_vocab, "n_ctx": n_ctx, "load_s": loaded_s,
                "curves": curves, "decode": decode, "prefill": prefill,
                "rss_after_load_mib": after_load.get("VmRSS"),
                "rss_peak_mib": memory.get("VmHWM") if reset else None,
                "gpu_mib_used": None if gpu_loaded is None or gpu_before is None else gpu_loaded - gpu_before}
    finally:
        engine.close()


def size_of(path: Path) -> int:
    """Bytes of a GGUF file, or of every file in an export directory."""
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


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
        name = ("onnx: " if m.get("backend") == "onnx" else "") + Path(m["path"]).name
        head = (f"{name[:33]:<34}{m['file_bytes'] / 2**30:>6.2f}{m['decode']['tok_s']:>8.1f}"
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


# -- --compare: edgespec's ONNX export against llama.cpp on the same GGUF, taking turns in one process ------------

def compare_n_ctx(args: argparse.Namespace) -> int:
    """The context both backends are given: room for every pass, rounded up to llama.cpp's 256-cell steps."""
    need = max(args.context + max(args.rows), args.prefill_tokens, DECODE_PROMPT + args.decode_tokens) + 1
    return -(-need // 256) * 256


def gguf_summary(path: Path) -> dict[str, object]:
    """The file's layers, vocabulary and tensor types (gguf's reader: nothing loaded)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = str(reader.fields["general.architecture"].contents())
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    layers = int(reader.fields[f"{arch}.block_count"].contents())
    return {"path": str(path), "bytes": path.stat().st_size, "layers": layers,
            "vocab": len(tokens.data) if tokens is not None else None, "types": types,
            "rope_freqs": any(t.name == "rope_freqs.weight" for t in reader.tensors)}


def child_env() -> dict[str, str]:
    """The environment for this run's child processes (the export, the memory probes): this very edgespec first on
    their path, whichever checkout or install it came from."""
    env = dict(os.environ)
    here = str(Path(edgespec.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    return env


def read_export(folder: Path) -> dict | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def export_for(gguf: Path, args: argparse.Namespace, n_ctx: int) -> tuple[Path, dict[str, object]]:
    """The export to time and how it came: ``--onnx`` as given; else ``--export-to`` (default: beside the file,
    FILE-onnx), reused where it is an up-to-date ``--quant gguf`` export of this very file with room for the passes,
    else written now by ``edgespec export onnx`` (in a process of its own: its memory is not this one's)."""
    if args.onnx is not None:
        manifest = read_export(args.onnx)
        if manifest is None:
            raise SystemExit(f"--onnx {args.onnx}: not an edgespec ONNX export (no {MANIFEST})")
        source = manifest.get("source", {}).get("gguf")
        if source is None or Path(source).resolve() != gguf.resolve():
            print(f"note: {args.onnx} was exported from {source or 'another source'}, not {gguf}", file=sys.stderr)
        return args.onnx, {"made": False, "seconds": None}
    folder = args.export_to or gguf.with_name(gguf.stem + "-onnx")  # not *.onnx: that names a graph file
    manifest = read_export(folder)
    if manifest is not None:
        source = manifest.get("source", {}).get("gguf")
        if source is None or Path(source).resolve() != gguf.resolve():
            raise SystemExit(f"{folder} holds an export of {source or 'another source'}, not of {gguf}: remove it "
                             "or name another folder with --export-to")
        stale = (manifest.get("quant") != "gguf" or manifest.get("context_length", 0) < n_ctx
                 or (folder / MANIFEST).stat().st_mtime < gguf.stat().st_mtime)
        if not stale:
            print(f"reusing the export {folder}", file=sys.stderr)
            return folder, {"made": False, "seconds": None}
    elif folder.exists():
        raise SystemExit(f"{folder} exists and is not an edgespec ONNX export: remove it or name another folder "
                         "with --export-to")
    command = [sys.executable, "-m", "edgespec.cli", "export", "onnx", str(gguf), "--quant", "gguf",
               "--out", str(folder), "--context-length", str(n_ctx), "--no-quality"]
    print(f"exporting: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    began = time.perf_counter()
    if subprocess.run(command, env=child_env()).returncode != 0:
        raise SystemExit(f"the export of {gguf} failed (see above; a synthetic Llama 3.x file exports written with "
                         "benchmarks/synthetic_gguf.py's --no-rope-freqs --pre gpt-2)")
    return folder, {"made": True, "seconds": time.perf_counter() - began}


def genai_for(gguf: Path, args: argparse.Namespace) -> tuple[Path, dict[str, object]]:
    """The onnxruntime-genai model to time and how it came: ``--genai DIR`` as given; else ``--genai-to`` (default:
    beside the file, FILE-genai-int4), reused where its record names this very file and build, else built now by
    ``edgespec export onnx --format genai`` in a process of its own, whose time and peak resident set (the
    builder's process included) are recorded beside the model. The build goes through the file's Hugging Face
    folder, cached under EDGESPEC_HOME (float32: 4 bytes a weight) and reused by later builds."""
    if args.genai is not None:
        if not (args.genai / "genai_config.json").is_file():
            raise SystemExit(f"--genai {args.genai}: not an onnxruntime-genai model (no genai_config.json)")
        return args.genai, {"made": False, "build": None}
    folder = args.genai_to or gguf.with_name(gguf.stem + "-genai-int4")
    source = {"gguf": str(gguf.resolve()), "bytes": gguf.stat().st_size, "mtime_ns": gguf.stat().st_mtime_ns,
              **GENAI_BUILD}
    try:
        record = json.loads((folder / GENAI_RECORD).read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("source") == source:
        print(f"reusing the onnxruntime-genai model {folder}", file=sys.stderr)
        return folder, {"made": False, "build": record}
    if folder.exists():
        raise SystemExit(f"{folder} exists and is not an onnxruntime-genai build of {gguf} ({GENAI_RECORD}): remove "
                         "it or name another folder with --genai-to")
    command = [sys.executable, "-m", "edgespec.cli", "export", "onnx", str(gguf), "--format", "genai", "--out",
               str(folder), *(f"--{k.replace('_', '-')}={v}" for k, v in GENAI_BUILD.items())]
    print(f"building: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    began = time.perf_counter()
    child = subprocess.Popen(command, env=child_env())
    _, status, usage = os.wait4(child.pid, 0)  # its rusage: the peak of it and the builder it waited for
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the onnxruntime-genai build of {gguf} failed (see above)")
    record = {"source": source, "seconds": time.perf_counter() - began, "peak_rss_mib": usage.ru_maxrss / 1024,
              "onnxruntime_genai": _version("onnxruntime_genai")}
    (folder / GENAI_RECORD).write_text(json.dumps(record, indent=1))
    return folder, {"made": True, "build": record}


class GenaiPeer:
    """onnxruntime-genai's generator as the turns time a backend: ``decode(tokens, start, k)`` rewinds its sequence
    to ``start``, appends the tokens (one pass) and returns the last position's logits, the only ones it hands out;
    ``truncate`` rewinds."""

    def __init__(self, folder: Path, n_ctx: int, threads: int) -> None:
        og, self.model = load_genai(str(folder), threads)
        self.n_vocab = int(json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"])
        self.n_batch = n_ctx  # a prompt goes in as one pass
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=n_ctx, batch_size=1)
        self.generator: Any = og.Generator(self.model, params)

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        self.truncate(start)
        self.generator.append_tokens(tokens)
        return self.generator.get_logits().reshape(1, -1)

    def truncate(self, start: int) -> None:
        if start < self.generator.token_count():
            self.generator.rewind_to(start)

    def close(self) -> None:
        del self.generator, self.model


class Compared(Protocol):
    """What the turns use of a backend (edgespec's, or the genai peer)."""

    n_vocab: int
    n_batch: int

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray: ...

    def truncate(self, start: int) -> None: ...

    def close(self) -> None: ...


def open_compared(name: str, path: Path, n_ctx: int, threads: int) -> tuple[Compared, dict | None]:
    """One backend as edgespec's engine opens it (for edgespec's numerics, after the exactness self-check, which
    pads llama.cpp's passes where unpadded ones are not batch-invariant), and the check's verdict; or the genai
    peer on its model folder."""
    if name == GENAI:
        return GenaiPeer(path, n_ctx, threads), None
    backend, exact = COMPARED[name]
    model = open_model(path, backend, ModelOptions(n_ctx=n_ctx, n_threads=threads, exact_numerics=exact))
    if model.n_ctx < n_ctx:
        model.close()
        raise SystemExit(f"{path} takes {model.n_ctx} tokens of context, the passes need {n_ctx}: export it with "
                         f"--context-length {n_ctx} or more")
    if not exact:
        return model, None
    verdict = asdict(check_exactness(model, "cpu", exact))
    verdict.pop("key")
    return model, verdict


def random_tokens(rng: np.random.Generator, n_vocab: int, n: int) -> list[int]:
    """``n`` token ids clear of the byte tokens and the first merges (any id costs the same)."""
    return [int(t) for t in rng.integers(min(1000, n_vocab // 2), n_vocab, n)]


def turns(names: list[str], turn: int) -> list[str]:
    """Who goes first alternates from turn to turn, so the machine's drift falls on every backend alike."""
    return names if turn % 2 == 0 else names[::-1]


def lead_in(model: Compared, start: int, rng: np.random.Generator) -> None:
    """One untimed one-row pass at ``start``, rolled back, before a backend's timed one: the other runtime's
    threads, still spinning from its turn (libgomp's behind llama.cpp, onnxruntime's pool), go quiet during it, and
    this runtime's wake, so the timed pass runs as it does in the engine, after its own runtime's last pass."""
    model.decode(random_tokens(rng, model.n_vocab, 1), start, 1)
    model.truncate(start)


def verify_turns(models: dict[str, Compared], context: int, rows: tuple[int, ...], rounds: int,
                 rng: np.random.Generator) -> dict[str, dict[int, list[float]]]:
    """Seconds of each backend's pass over k rows at exactly ``context`` tokens (as ``decode(tokens, start, k)``
    and ``truncate`` in a verify that accepts nothing): per round every k once, k shuffled, backends taking turns
    on the same tokens (each after its ``lead_in``), the cache cut back to ``context`` after each pass."""
    names = list(models)
    vocab = min(model.n_vocab for model in models.values())
    prompt = random_tokens(rng, vocab, context)
    for model in models.values():
        model.truncate(0)
        model.decode(prompt, 0, 1)
    for k in rows:  # warm-up: a shape's first pass allocates
        for model in models.values():
            model.decode(random_tokens(rng, vocab, k), context, k)
            model.truncate(context)
    seconds: dict[str, dict[int, list[float]]] = {name: {k: [] for k in rows} for name in names}
    for r in range(rounds):
        for k in (int(k) for k in rng.permutation(rows)):
            tokens = random_tokens(rng, vocab, k)
            for name in turns(names, r):
                lead_in(models[name], context, rng)
                began = time.perf_counter()
                models[name].decode(tokens, context, k)
                seconds[name][k].append(time.perf_counter() - began)
                models[name].truncate(context)
    return seconds


def decode_turns(models: dict[str, Compared], tokens: int, runs: int, rng: np.random.Generator
                 ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Plain decoding: after a ``DECODE_PROMPT``-token prompt (untimed), ``tokens`` one-row passes in sequence,
    each feeding the last one's greedy token; tokens per second per run, and the seconds of every step, backends
    taking turns."""
    names = list(models)
    prompt = random_tokens(rng, min(model.n_vocab for model in models.values()), DECODE_PROMPT)
    speeds: dict[str, list[float]] = {name: [] for name in names}
    steps: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs):
        for name in turns(names, run):
            model = models[name]
            model.truncate(0)
            token = int(np.argmax(model.decode(prompt, 0, 1)[-1]))
            began = last = time.perf_counter()
            for i in range(tokens):
                token = int(np.argmax(model.decode([token], len(prompt) + i, 1)[-1]))
                now = time.perf_counter()
                steps[name].append(now - last)
                last = now
            speeds[name].append(tokens / (last - began))
    return speeds, steps


def prefill_turns(models: dict[str, Compared], tokens: int, runs: int, rng: np.random.Generator
                  ) -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """A ``tokens``-token prompt into an empty cache to its last position's logits (the backend's own batches:
    its ``n_batch`` rows a pass), tokens per second per run, backends taking turns, each after its ``lead_in``; and
    each backend's last logits, to compare."""
    names = list(models)
    prompt = random_tokens(rng, min(model.n_vocab for model in models.values()), tokens)
    speeds: dict[str, list[float]] = {name: [] for name in names}
    last: dict[str, np.ndarray] = {}
    for run in range(runs):
        for name in turns(names, run):
            models[name].truncate(0)
            lead_in(models[name], 0, rng)
            began = time.perf_counter()
            logits = models[name].decode(prompt, 0, 1)
            speeds[name].append(tokens / (time.perf_counter() - began))
            last[name] = logits[-1].copy()
    return speeds, last


def agreement(last: dict[str, np.ndarray]) -> dict[str, dict[str, object]]:
    """Each backend's last prefill logits beside the first's: the same model computed (not bit for bit: each
    rounds its activations its own way)."""
    names = list(last)
    first = last[names[0]]
    top2 = np.sort(first)[-2:]
    return {name: {"against": names[0], "same_top1": bool(np.argmax(last[name]) == np.argmax(first)),
                   "max_abs_diff": float(np.max(np.abs(last[name] - first))), "logit_std": float(np.std(first)),
                   "correlation": float(np.corrcoef(last[name], first)[0, 1]),
                   "top2_gap": float(top2[1] - top2[0])}
            for name in names[1:]}


def memory_probe(name: str, path: Path, args: argparse.Namespace) -> dict[str, float | None]:
    """Run in a process of its own (``--memory-probe``): load one backend, prefill, fill the context, run every
    pass and a few decoding steps; the resident set before loading, after, and at its peak."""
    before = memory_mib()
    model, _ = open_compared(name, path, compare_n_ctx(args), args.threads)
    try:
        loaded = memory_mib()
        rng = np.random.default_rng(1)
        model.decode(random_tokens(rng, model.n_vocab, args.prefill_tokens), 0, 1)
        model.truncate(0)
        model.decode(random_tokens(rng, model.n_vocab, args.context), 0, 1)
        for k in args.rows:
            model.decode(random_tokens(rng, model.n_vocab, k), args.context, k)
            model.truncate(args.context)
        for i in range(min(8, args.decode_tokens)):
            model.decode(random_tokens(rng, model.n_vocab, 1), args.context + i, 1)
        peak = memory_mib()
    finally:
        model.close()
    return {"rss_before_load_mib": before.get("VmRSS"), "rss_after_load_mib": loaded.get("VmRSS"),
            "rss_peak_mib": peak.get("VmHWM")}


def probe_memory(name: str, path: Path, args: argparse.Namespace) -> dict[str, float | None]:
    """``memory_probe`` in a fresh process: this one holds every backend at once."""
    command = [sys.executable, str(Path(__file__).resolve()), str(path), "--memory-probe", name,
               "--threads", str(args.threads), "--context", str(args.context),
               "--rows", ",".join(map(str, args.rows)), "--prefill-tokens", str(args.prefill_tokens),
               "--decode-tokens", str(args.decode_tokens)]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=child_env())
    if done.returncode != 0:
        raise SystemExit(f"the memory probe of {name} failed (see above)")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> dict[str, object]:
    gguf = args.compare
    phases: dict[str, float] = {}  # seconds each part of the run took
    clock = [time.perf_counter()]

    def lap(phase: str) -> None:
        now = time.perf_counter()
        phases[phase] = phases.get(phase, 0.0) + now - clock[0]
        clock[0] = now

    load_before = os.getloadavg()
    n_ctx = compare_n_ctx(args)
    paths = {name: gguf for name in args.backends}
    export: dict[str, object] | None = None
    if "onnx" in args.backends:
        paths["onnx"], made = export_for(gguf, args, n_ctx)
        manifest = read_export(paths["onnx"]) or {}
        export = {"path": str(paths["onnx"]), "bytes": size_of(paths["onnx"]),
                  "graphs": manifest.get("source", {}).get("graphs"),
                  "context_length": manifest.get("context_length"), "kv_dtype": manifest.get("kv_dtype"),
                  "quant_options": manifest.get("quant_options"), **made}
        lap("export")
    genai: dict[str, object] | None = None
    if GENAI in args.backends:
        paths[GENAI], made = genai_for(gguf, args)
        genai = {"path": str(paths[GENAI]), "bytes": size_of(paths[GENAI]), **GENAI_BUILD, "note": GENAI_NOTE,
                 **made}
        lap("genai_build")
    memory: dict[str, dict | None] = {name: None for name in args.backends}
    if args.memory:
        for name in args.backends:
            print(f"peak memory of {name} (a process of its own) ...", file=sys.stderr, flush=True)
            memory[name] = probe_memory(name, paths[name], args)
        lap("memory_probes")
    reset = reset_peak_rss()
    models: dict[str, Compared] = {}
    verdicts: dict[str, dict | None] = {}
    rng = np.random.default_rng(0)
    try:
        for name in args.backends:
            print(f"loading {name} ...", file=sys.stderr, flush=True)
            models[name], verdicts[name] = open_compared(name, paths[name], n_ctx, args.threads)
        lap("load")
        print(f"verify passes of {', '.join(map(str, args.rows))} rows at {args.context} tokens, {args.rounds} "
              "rounds ...", file=sys.stderr, flush=True)
        verify = verify_turns(models, args.context, args.rows, args.rounds, rng)
        lap("verify")
        print(f"plain decoding ({args.decode_tokens} tokens), prefill ({args.prefill_tokens} tokens), {args.runs} "
              "runs ...", file=sys.stderr, flush=True)
        decode, steps = decode_turns(models, args.decode_tokens, args.runs, rng)
        lap("decode")
        prefill, last = prefill_turns(models, args.prefill_tokens, args.runs, rng)
        lap("prefill")
        both = memory_mib()
        batches = {name: model.n_batch for name, model in models.items()}
    finally:
        for model in models.values():
            model.close()
    backends = {}
    for name in args.backends:
        one = float(np.median(verify[name][1]))
        backend, exact = COMPARED.get(name, ("onnxruntime-genai", False))
        backends[name] = {
            "backend": backend, "exact_numerics": exact, "path": str(paths[name]),
            "n_batch": batches[name], "exactness": verdicts[name],
            "verify": {str(k): {"ms": float(np.median(s)) * 1e3, "relative": float(np.median(s)) / one,
                                "samples_ms": [x * 1e3 for x in s]} for k, s in verify[name].items()},
            "decode": {"tok_s": float(np.median(decode[name])), "runs": decode[name],
                       "step_ms_median": float(np.median(steps[name])) * 1e3},
            "prefill": {"tok_s": float(np.median(prefill[name])), "runs": prefill[name]},
            "memory": memory[name]}
    return {"mode": "compare", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": "cpu",
            "cpu": cpu_identity(), "threads": args.threads, "llama_cpp": llama_cpp.__version__,
            "onnxruntime": _version("onnxruntime"), "edgespec": edgespec.__version__, "label": args.label,
            "note": args.note or "random weights: costs only, no acceptance (take it from edgespec replay)",
            "gguf": gguf_summary(gguf),
            "export": export, "genai": genai, "onnxruntime_genai": _version("onnxruntime_genai"),
            "context": args.context, "rows": list(args.rows), "rounds": args.rounds, "runs": args.runs,
            "decode_tokens": args.decode_tokens, "decode_prompt_tokens": DECODE_PROMPT,
            "prefill_tokens": args.prefill_tokens, "n_ctx": n_ctx, "goals": {str(k): v for k, v in GOALS.items()},
            "backends": backends, "agreement": agreement(last),
            "rss_peak_all_loaded_mib": both.get("VmHWM") if reset else None,
            "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()),
            "seconds": sum(phases.values()), "phases_s": {k: round(v, 1) for k, v in phases.items()}}


def _version(package: str) -> str | None:
    try:
        return str(importlib.import_module(package).__version__)
    except ImportError:
        return None


def compare_table(result: dict) -> str:
    g, e, m = result["gguf"], result["export"], result["genai"]
    types = ", ".join(f"{n} {t}" for t, n in sorted(g["types"].items(), key=lambda item: -item[1]))
    rows = [int(k) for k in result["rows"]]
    made = [f"ONNX export {e['bytes'] / 2**30:.2f} GiB (graphs {e['graphs']}, KV {e['kv_dtype']})"] if e else []
    if m:
        build = m["build"]
        made.append(f"onnxruntime-genai {result['onnxruntime_genai']} INT4 model {m['bytes'] / 2**30:.2f} GiB"
                    + (f" (built in {build['seconds']:.0f} s, peak RSS {build['peak_rss_mib']:.0f} MiB)" if build
                       else ""))
    lines = [f"{Path(g['path']).name}: {g['bytes'] / 2**30:.2f} GiB, {g['layers']} layers, vocabulary {g['vocab']} "
             f"({types}); {'; '.join(made)}",
             f"{result['cpu']}, {result['threads']} threads, llama-cpp-python {result['llama_cpp']}, onnxruntime "
             f"{result['onnxruntime']}; passes at {result['context']} tokens of context, median of {result['rounds']} "
             f"rounds; decode {result['decode_tokens']} tokens, prefill {result['prefill_tokens']} tokens, median of "
             f"{result['runs']}; {result['note']}; load average before {result['loadavg_before'][0]:.2f}, after "
             f"{result['loadavg_after'][0]:.2f} (1 min: the run's own share included)",
             f"{'backend':<20}{'decode':>8}{'prefill':>9}" + "".join(f"{f'k={k}':>15}" for k in rows)
             + f"{'peak RSS':>10}",
             f"{'':<20}{'tok/s':>8}{'tok/s':>9}" + "".join(f"{'ms (× 1 row)':>15}" for _ in rows) + f"{'MiB':>10}"]
    backends = result["backends"]
    for name, b in backends.items():
        peak = f"{b['memory']['rss_peak_mib']:.0f}" if b["memory"] else "-"
        lines.append(f"{name:<20}{b['decode']['tok_s']:>8.2f}{b['prefill']['tok_s']:>9.1f}"
                     + "".join(f"{b['verify'][str(k)]['ms']:>8.1f} ({b['verify'][str(k)]['relative']:.2f})"
                               for k in rows) + f"{peak:>10}")
    if "onnx" in backends:
        o = backends["onnx"]
        for name, b in backends.items():
            if name == "onnx":
                continue
            peak = (f"{o['memory']['rss_peak_mib'] / b['memory']['rss_peak_mib']:.2f}"
                    if o["memory"] and b["memory"] else "-")
            lines.append(f"{'onnx/' + name:<20}{o['decode']['tok_s'] / b['decode']['tok_s']:>8.2f}"
                         f"{o['prefill']['tok_s'] / b['prefill']['tok_s']:>9.2f}"
                         + "".join(f"{o['verify'][str(k)]['ms'] / b['verify'][str(k)]['ms']:>15.2f}" for k in rows)
                         + f"{peak:>10}")
        lines.append("(onnx/X: tok/s a ratio of speeds, ms and MiB of times and sizes)")
    goals = [k for k in GOALS if k in rows]

    def against_goals(b: dict) -> str:
        relative = {k: b["verify"][str(k)]["relative"] for k in goals}
        return " ".join(f"{relative[k]:.2f}{'✓' if relative[k] <= GOALS[k] else '✗'}" for k in goals)

    lines.append(f"decode step, median ms (× the one-row pass at {result['context']}): " + "; ".join(
        f"{name} {b['decode']['step_ms_median']:.1f} ({b['decode']['step_ms_median'] / b['verify']['1']['ms']:.2f})"
        for name, b in backends.items()))
    if goals:
        lines.append("goal at 1B, context 1024: " + ", ".join(f"k={k} ≤ {GOALS[k]}×" for k in goals) + " one row: "
                     + "; ".join(f"{name} {against_goals(b)}" for name, b in backends.items() if name != GENAI))
    if m:
        lines.append(f"{GENAI}: {m['note']}")
    if result["loadavg_before"][0] > BUSY:
        lines.append(f"WARNING: the machine was busy before the run (load average {result['loadavg_before'][0]:.2f}): "
                     "other work on the cores slows llama.cpp's spinning thread barriers many-fold; measure on a "
                     "quiet machine")
    for name, a in result["agreement"].items():
        same = "the same" if a["same_top1"] else "differs"
        lines.append(f"{name} beside {a['against']} after the prefill: top-1 {same}, max |Δ logit| "
                     f"{a['max_abs_diff']:.3g} (logits' std {a['logit_std']:.3g}, {a['against']}'s top-2 gap "
                     f"{a['top2_gap']:.3g}), correlation {a['correlation']:.4f}")
    return "\n".join(lines)


def rows_list(text: str) -> tuple[int, ...]:
    rows = tuple(sorted({int(r) for r in text.split(",")}))
    if rows[0] != 1:
        raise argparse.ArgumentTypeError("the rows must include 1 (every pass is measured against one row)")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path, help="GGUF files or edgespec ONNX export directories")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="default: the physical cores (--compare: 2)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--rounds", type=int, default=None, help="default 7 (--compare: 30)")
    parser.add_argument("--runs", type=int, default=3, help="decode and prefill runs (each backend)")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--label", default="", help="appended to the output's name (e.g. shared-machine)")
    parser.add_argument("--note", default="", help="recorded in the JSON and the table's heading")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    compared = parser.add_argument_group("--compare: edgespec's ONNX export against llama.cpp on one GGUF")
    compared.add_argument("--compare", type=Path, default=None, metavar="FILE.gguf")
    compared.add_argument("--onnx", type=Path, default=None, metavar="DIR",
                          help="an existing export of the file (default: export it to --export-to)")
    compared.add_argument("--export-to", type=Path, default=None, metavar="DIR",
                          help="where to export it, reused while current (default: FILE-onnx beside the file)")
    compared.add_argument("--genai", type=Path, default=None, metavar="DIR",
                          help=f"(--backends ...,{GENAI}) an existing onnxruntime-genai model of the file (default: "
                               "build it to --genai-to)")
    compared.add_argument("--genai-to", type=Path, default=None, metavar="DIR",
                          help="where to build the onnxruntime-genai model, reused while current (default: "
                               "FILE-genai-int4 beside the file)")
    compared.add_argument("--backends", default="onnx,llamacpp",
                          help=f"comma-separated, of {', '.join([*COMPARED, GENAI])} (default onnx,llamacpp)")
    compared.add_argument("--context", type=int, default=1024, help="tokens in the cache before each pass")
    compared.add_argument("--rows", type=rows_list, default=COMPARE_ROWS, help="row counts (default 1,2,4,8)")
    compared.add_argument("--no-memory", dest="memory", action="store_false",
                          help="skip the peak-RSS probes (a process per backend)")
    compared.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)  # the probe's own process
    args = parser.parse_args(argv)
    if args.memory_probe is not None:
        args.threads = args.threads or 2
        print(json.dumps(memory_probe(args.memory_probe, args.models[0], args)))
        return 0
    if args.compare is not None:
        return main_compare(parser, args)
    if not args.models:
        parser.error("name GGUF files or ONNX export directories, or --compare FILE.gguf")
    missing = [str(p) for p in args.models if not (p.is_file() or (p / MANIFEST).is_file())]
    if missing:
        parser.error(f"no such GGUF file or ONNX export: {', '.join(missing)}")
    args.rounds = args.rounds or 7
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


def main_compare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.models:
        parser.error("--compare takes one GGUF file and no other models")
    if not args.compare.is_file() or args.compare.suffix != ".gguf":
        parser.error(f"--compare needs a GGUF file: {args.compare}")
    if args.device != "cpu":
        parser.error("--compare runs on the CPU")
    args.backends = list(dict.fromkeys(b.strip() for b in args.backends.split(",") if b.strip()))
    unknown = [b for b in args.backends if b not in [*COMPARED, GENAI]]
    if unknown or not args.backends:
        parser.error(f"--backends: {', '.join(unknown) or 'none'}; choose from {', '.join([*COMPARED, GENAI])}")
    args.rounds = args.rounds or 30
    args.threads = args.threads or 2
    if args.context < 1 or args.rounds < 1 or args.runs < 1 or args.decode_tokens < 1 or args.prefill_tokens < 1:
        parser.error("--context, --rounds, --runs, --decode-tokens and --prefill-tokens must be at least 1")
    result = compare(args)
    print(compare_table(result))
    stem = (f"verify_curve_compare-{datetime.now().strftime('%Y-%m-%d')}-{slug(cpu_identity())}-{args.threads}t-"
            f"{slug(args.compare.stem)}")
    stem += f"-{slug(args.label)}" if args.label else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    took = ", ".join(f"{phase} {s:.0f}" for phase, s in result["phases_s"].items())
    print(f"wrote {args.out / stem}.json ({result['seconds']:.0f} s in all: {took})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
