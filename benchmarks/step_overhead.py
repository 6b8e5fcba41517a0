"""Current: a tool the manual uses.
What a speculative step costs outside the target's pass, and where it goes: the drafter, the γ controller, the
engine's own bookkeeping.

    PYTHONPATH=. python benchmarks/step_overhead.py [MODEL] --questions FILE [--mode ngram|tree|head] [--fast-numerics]
        [--device cpu] [--threads N] [--per-category 1] [--max-tokens 128] [--out benchmarks/results]

MODEL defaults to what `edgespec generate` loads on this machine (its race's choice: the ONNX export, with the draft
head beside it), or with ``--fast-numerics`` to the shipped GGUF (llama.cpp's fast numerics).

One engine (tuning off) answers the first turn of Spec-Bench's questions. The engine's own step statistics give the
time a step spends drafting, verifying (the target's pass and the acceptance check) and elsewhere; the functions below
are wrapped with timers for the run, so each one's time per call and per step is measured inside the decode loop
(caches cold after each pass: several times what the same call costs in isolation). The wrappers add ~1 µs a call.
On a GPU the step outside the pass weighs most (a 1.5 ms pass: docs/gpu.md); `--fast-numerics` on the CPU pads
llama.cpp's passes as a GPU does. Prints a table; writes JSON.
"""

from __future__ import annotations

# First: on the H100 image, numpy imported before llama.cpp's CUDA library crashed
# (edgespec/backends/llamacpp/preload.py).
import edgespec

# isort: split
import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from edgespec.bench.questions import load_questions
from edgespec.bench.run import machine
from edgespec.controller import gamma
from edgespec.cpu import physical_cores
from edgespec.drafters import head, ngram, recycled, suffix, tree
from edgespec.engine import engine as engine_module
from edgespec.tuning.default import default_choice

# (owner, attribute): what is timed. They nest (propose holds the controller's choose and the drafter).
TIMED: list[tuple[object, str]] = [
    (engine_module, "propose"), (engine_module.Engine, "_accept"), (engine_module, "verify_greedy"),
    (gamma.GammaController, "choose"), (gamma.GammaController, "observe"), (gamma.GammaController, "acceptance"),
    (gamma.CostCurve, "observe"), (gamma, "expected_step"), (gamma.GammaController, "_judge_shadows"),
    (ngram.NgramDrafter, "propose"), (tree.TreeDrafter, "propose_tree"), (tree.TreeDrafter, "observe"),
    (suffix.SuffixDrafter, "update"), (suffix.SuffixDrafter, "propose"), (recycled, "top_successors"),
    (head.HeadDrafter, "propose"), (head.HeadDrafter, "_catch_up"), (head.HeadDrafter, "_pairs"),
]
try:  # every onnxruntime call (the target's and the head's sessions): what a pass spends outside them is Python
    from onnxruntime import InferenceSession

    TIMED.append((InferenceSession, "run_with_iobinding"))
except ImportError:  # llama.cpp only (--fast-numerics)
    pass


def timed(owner: object, name: str, seconds: dict[str, float], calls: dict[str, int]) -> Callable[[], None]:
    """Wrap ``owner.name`` with a timer; returns what puts it back."""
    original = getattr(owner, name)
    label = f"{getattr(owner, '__name__', owner)}.{name}"

    def wrapper(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - start
            calls[label] += 1

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--mode", default="ngram", choices=("ngram", "tree", "head"),
                        help="head: the default's mode (lookup, else the draft head; an ONNX export with a head)")
    parser.add_argument("--fast-numerics", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda", "metal"), default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--questions", type=Path, required=True, help="Spec-Bench's question.jsonl")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    model = args.model or (edgespec.DEFAULT_MODEL if args.fast_numerics else
                           default_choice(args.threads or physical_cores(), args.device).target)
    engine = edgespec.load(model, mode=args.mode, device=args.device, n_threads=args.threads, tuning=False,
                           exact_numerics=not args.fast_numerics)
    prompts = [engine.chat_tokens([{"role": "user", "content": q["turns"][0]}])
               for q in load_questions(args.questions, per_category=args.per_category)]
    engine.generate(prompts[0], max_tokens=8)  # warm-up: calibration, the controller
    seconds: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    restore = [timed(owner, name, seconds, calls) for owner, name in TIMED]
    steps = tokens = 0
    decode = verify = draft = 0.0
    try:
        for prompt in prompts:
            s = engine.generate(prompt, max_tokens=args.max_tokens).stats
            steps, tokens = steps + s.steps, tokens + s.generated_tokens
            decode, verify, draft = decode + s.decode_s, verify + s.verify_s, draft + s.draft_s
    finally:
        for undo in restore:
            undo()
    per_step = {"pass_and_check_ms": verify / steps * 1e3, "drafting_ms": draft / steps * 1e3,
                "elsewhere_ms": (decode - verify - draft) / steps * 1e3}
    functions = {k: {"calls": calls[k], "us_per_call": seconds[k] / calls[k] * 1e6,
                     "us_per_step": seconds[k] / steps * 1e6} for k in sorted(seconds, key=lambda k: -seconds[k])}
    target = engine.target
    print(f"{Path(target.path).name} on {args.device}, {target.n_threads} threads, mode {args.mode}, pass rows "
          f"{getattr(target, 'pass_rows', 0) or 'unpadded'}: {len(prompts)} answers, {steps} steps, {tokens} tokens")
    print(f"per step: the pass and its check {per_step['pass_and_check_ms']:.3f} ms, drafting "
          f"{per_step['drafting_ms']:.3f} ms, elsewhere {per_step['elsewhere_ms']:.3f} ms")
    print("| function | calls | µs a call | µs a step |\n|---|---|---|---|")
    for name, f in functions.items():
        print(f"| {name} | {f['calls']} | {f['us_per_call']:.1f} | {f['us_per_step']:.1f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = args.out / f"step_overhead-{stamp}-{args.mode}.json"
    path.write_text(json.dumps({"date": stamp, "machine": machine(), "model": str(target.path), "mode": args.mode,
                                "device": args.device, "fast_numerics": args.fast_numerics,
                                "threads": target.n_threads, "steps": steps, "tokens": tokens, "per_step": per_step,
                                "functions": functions}, indent=1))
    print(f"wrote {path}")
    engine.close()


if __name__ == "__main__":
    main()
