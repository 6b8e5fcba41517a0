"""Current: a tool the manual uses.
Builds of one model side by side through edgespec's engine, taking turns: prefill, plain decoding, n-gram lookup and
peak memory, on exact numerics.

    PYTHONPATH=. python benchmarks/builds_side_by_side.py MODEL MODEL [...] [--threads 2] [--rounds 3]
        [--max-tokens 128] [--ctx 2048] [--label TEXT] [--out benchmarks/results/]

MODEL: anything ``edgespec.load`` opens (an ONNX export folder, a GGUF). For instance the shipped default's two ONNX
builds, the INT8 export its first-use race runs and the 4-bit one carrying the GGUF's own Q4_1 blocks
(edgespec.BlockQ4MatMul):

    edgespec export onnx smollm2-135m --quant int8 --out smollm2-int8
    edgespec export onnx smollm2-135m --quant gguf --out smollm2-gguf
    PYTHONPATH=. python benchmarks/builds_side_by_side.py smollm2-int8 smollm2-gguf

Every model is opened as the race opens its candidates (``open_engine``: the exactness self-check required, no
stored tuning), all in one process; per round they take turns, who goes first alternating, so the machine's drift
falls on all:
- prefill: the race's document (~550 tokens as a chat turn) into an empty cache, to its first token;
- plain decoding and n-gram lookup (γ auto): the race's own loop (``edgespec.tuning.tune.race``) over three texts
  whose replies repeat their prompts (the document to work on, a paragraph to rewrite, a function to annotate),
  ``--max-tokens`` each, and whether lookup's output equals plain decoding's;
- peak RSS: per model in a process of its own (load, then the texts in both modes; Linux).
Prints a table, each model against the first, with the load average (on a shared machine only the ratios mean
anything), and writes builds_side_by_side-DATE-CPU-THREADSt[-LABEL].json into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np

import edgespec
from edgespec.engine.engine import Engine
from edgespec.identity import cpu_identity
from edgespec.loading import open_engine
from edgespec.tuning.prompts import CALIBRATION_PROMPTS, DOCUMENT
from edgespec.tuning.race import HEAD, LOOKUP, PLAIN
from edgespec.tuning.tune import race

TEXTS = (DOCUMENT, CALIBRATION_PROMPTS[0], CALIBRATION_PROMPTS[1])  # a document, a rewrite, code to annotate
MODES = {"plain": PLAIN, "lookup": LOOKUP, "head": HEAD}  # head: where a draft head lies beside the export


def open_build(model: str, args: argparse.Namespace) -> Engine:
    return open_engine(model, mode="none", gamma=0, n_ctx=args.ctx, n_threads=args.threads, tuning=False,
                       require_exact=True)


def modes_of(engine: Engine) -> list[tuple[str, int | str]]:
    """The modes the race runs a candidate in: plain first (the identity reference), lookup, and head where the
    export has a draft head."""
    return [mode for mode in MODES.values() if mode != HEAD or HEAD[0] in engine.modes]


def prompts_of(engine: Engine) -> list[list[int]]:
    return [engine.chat_tokens([{"role": "user", "content": text}]) for text in TEXTS]


def prefill_tok_s(engine: Engine, prompt: list[int]) -> float:
    return len(prompt) / engine.generate(prompt, max_tokens=1, mode="none", cache_prompt=False).stats.prefill_s


def peak_rss(model: str, args: argparse.Namespace) -> float:
    """Peak resident MiB of a fresh process that loads ``model`` and runs the texts in both modes once."""
    command = [sys.executable, str(Path(__file__).resolve()), model, "--peak-rss-of", model, "--threads",
               str(args.threads), "--max-tokens", str(args.max_tokens), "--ctx", str(args.ctx)]
    here = str(Path(edgespec.__file__).resolve().parents[1])  # this very edgespec first on the child's path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True, env=env)
    return float(done.stdout.strip().splitlines()[-1])


def peak_rss_probe(model: str, args: argparse.Namespace) -> None:
    engine = open_build(model, args)
    try:
        race([(engine, modes_of(engine), prompts_of(engine))], args.max_tokens, 1)
    finally:
        engine.close()
    # VmHWM, not getrusage's ru_maxrss: that one carries over the forking parent's resident set through exec
    print(int(re.search(r"^VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) / 1024)


def measure(models: list[str], args: argparse.Namespace) -> dict[str, dict]:
    """Per model and round: prefill tok/s, and the race's decode tok/s and identical count per mode."""
    engines = {name: open_build(name, args) for name in models}
    try:
        prompts = {name: prompts_of(engine) for name, engine in engines.items()}
        for name, engine in engines.items():
            engine.generate(prompts[name][0], max_tokens=4)  # warm-up, as the race does
        rounds: dict[str, dict[str, list]] = {name: {"prefill": [], "identical": []} for name in models}
        for r in range(args.rounds):
            order = models if r % 2 == 0 else models[::-1]
            print(f"round {r + 1} of {args.rounds} ...", file=sys.stderr, flush=True)
            for name in order:
                rounds[name]["prefill"].append(prefill_tok_s(engines[name], prompts[name][0]))
            raced = race([(engines[name], modes_of(engines[name]), prompts[name]) for name in order],
                         args.max_tokens, 1)
            for name, result in zip(order, raced, strict=True):
                for key, mode in MODES.items():
                    if mode in result:
                        rounds[name].setdefault(key, []).append(result[mode]["decode_tok_s"])
                drafted = [r for mode, r in result.items() if mode != PLAIN]  # each against plain decoding's output
                rounds[name]["identical"].append(f"{sum(r['identical'] for r in drafted)}/"
                                                 f"{sum(r['generations'] for r in drafted)}")
        description = {name: engine.target.description for name, engine in engines.items()}
        prompt_tokens = [len(p) for p in prompts[models[0]]]
    finally:
        for engine in engines.values():
            engine.close()
    return {name: {"description": description[name], "prompt_tokens": prompt_tokens, "rounds": rounds[name],
                   **{key: float(np.median(rounds[name][key])) if key in rounds[name] else None
                      for key in ("prefill", *MODES)}}
            for name in models}


def table(result: dict) -> str:
    load = result["loadavg_before"][0], result["loadavg_after"][0]
    rates = ("prefill", *MODES)

    def cells(values: list[float | None], spec: str) -> str:
        return "".join(f"{'-' if v is None else format(v, spec):>9}" for v in values)

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a / b

    lines = [f"{result['cpu']}, {result['threads']} threads, exact numerics, median of {result['rounds']} rounds "
             f"taking turns; prefill {result['prefill_tokens']} tokens, decode up to {result['max_tokens']} tokens "
             f"on {len(TEXTS)} texts; load average {load[0]:.2f} before, {load[1]:.2f} after",
             f"{'model':<34}" + "".join(f"{r:>9}" for r in rates) + f"{'peak RSS':>9}  drafted = plain",
             f"{'':<34}" + "".join(f"{'tok/s':>9}" for _ in rates) + f"{'MiB':>9}"]
    models = result["models"]
    for name, m in models.items():
        lines.append(f"{Path(name).name[:33]:<34}" + cells([m[r] for r in rates], ".1f")
                     + cells([m["peak_rss_mib"]], ".0f") + f"  {', '.join(m['rounds']['identical'])}")
    first_name, *others = models
    first = models[first_name]
    for name in others:
        m = models[name]
        lines.append(f"{(Path(name).name + ' / ' + Path(first_name).name)[:33]:<34}"
                     + cells([ratio(m[r], first[r]) for r in (*rates, "peak_rss_mib")], ".2f"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="two or more builds: ONNX export folders or GGUFs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=2048, help="context each build is opened with (the race's)")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-RSS processes")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    parser.add_argument("--peak-rss-of", default=None, help=argparse.SUPPRESS)  # the probe's own process
    args = parser.parse_args(argv)
    if args.peak_rss_of is not None:
        peak_rss_probe(args.peak_rss_of, args)
        return 0
    if len(set(args.models)) != len(args.models) or len(args.models) < 2 or args.rounds < 1:
        parser.error("name two or more distinct models and at least one round")
    before = os.getloadavg()
    models = measure(args.models, args)
    for name in args.models:
        models[name]["peak_rss_mib"] = peak_rss(name, args) if args.memory else None
    result = {"date": datetime.now().isoformat(timespec="seconds"), "cpu": cpu_identity(), "threads": args.threads,
              "rounds": args.rounds, "max_tokens": args.max_tokens,
              "prefill_tokens": models[args.models[0]]["prompt_tokens"][0], "label": args.label,
              "loadavg_before": list(before), "loadavg_after": list(os.getloadavg()), "models": models}
    print(table(result))
    slug = "".join(c if c.isalnum() else "-" for c in cpu_identity().lower()).strip("-")
    stem = f"builds_side_by_side-{datetime.now():%Y-%m-%d}-{slug}-{args.threads}t" + (
        f"-{args.label}" if args.label else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
