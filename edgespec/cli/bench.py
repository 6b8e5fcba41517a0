"""``edgespec bench`` and ``edgespec tune``, registered into the main parser. Imports stay light here."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from ..backends.base import GPU_DEVICES
from ..bench.configs import CONFIGS, DEFAULT_CHAT_CONFIGS, DEFAULT_CONFIGS, DEFAULT_CONSTRAINED_CONFIGS
from ..bench.questions import CONSTRAINED_QUESTIONS, BenchError, spec_bench
from ..bench.replay import CURVES, HEAD_COST, TREE_DRAFTERS
from ..extras import needed, require


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _command(sub: argparse._SubParsersAction, name: str, func: Callable[[argparse.Namespace], int], summary: str,
             description: str | None = None) -> argparse.ArgumentParser:
    """Subcommand ``name``, run by ``func``; its --help opens with ``description``, else with ``summary``."""
    parser = sub.add_parser(name, help=summary, description=description or summary[0].upper() + summary[1:] + ".")
    parser.set_defaults(func=func)
    return parser


def _add_results(parser: argparse.ArgumentParser, what: str) -> None:
    """--out (where ``what`` goes) and --no-plots, for the commands that write results and plots."""
    parser.add_argument("--out", default="benchmarks/results", help=f"where {what} go (default: %(default)s)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs (no matplotlib needed)")


def add_bench_commands(sub: argparse._SubParsersAction) -> None:
    b = _command(sub, "bench", _bench, "Spec-Bench: edgespec's modes against the peers, interleaved, with plots",
                 "Plays Spec-Bench questions (multi-turn ones as conversations) through every configuration, each in "
                 "its own process, interleaved question by question; greedy. Prints a table, writes JSON and PNG "
                 "plots.")
    b.add_argument("--questions", default=None,
                   help="Spec-Bench's question.jsonl, not part of edgespec (required; with --constrained the "
                        f"default is {CONSTRAINED_QUESTIONS})")
    b.add_argument("--constrained", action="store_true",
                   help="structured output: edgespec's own JSON-schema extraction and tool-call prompts (or "
                        "--questions FILE whose questions carry a 'schema'), every answer held to its schema; "
                        "reports the share of tokens forced and how many replies validate (default configurations: "
                        f"{','.join(DEFAULT_CONSTRAINED_CONFIGS)}; every question unless --per-category)")
    b.add_argument("--categories", default=None, help="comma-separated categories (default: all)")
    b.add_argument("--per-category", type=_positive, default=None,
                   help="questions per category (default: 3; every one with --constrained)")
    b.add_argument("--limit", type=_positive, default=None, help="at most this many questions in all")
    b.add_argument("--max-tokens", type=_positive, default=None, help="(default: 256; 128 with --chat)")
    b.add_argument("--configs", default=None,
                   help=f"comma-separated, from: {', '.join(CONFIGS)} (default: {','.join(DEFAULT_CONFIGS)}; "
                        f"with --chat {','.join(DEFAULT_CHAT_CONFIGS)}); NAME@REV: edgespec's NAME as the "
                        "edgespec of git revision REV runs it, beside this checkout's (e.g. default,default@HEAD~1)")
    b.add_argument("--model", default="smollm2-135m", help="target model name or GGUF path, shared by the peers")
    b.add_argument("--threads", type=_positive, default=None, help="threads for every configuration (default: "
                                                                   "physical cores)")
    b.add_argument("--ctx", type=_positive, default=4096)
    b.add_argument("--device", default="cpu", choices=["cpu", *GPU_DEVICES],
                   help="where every configuration runs its models (default: %(default)s)")
    b.add_argument("--fast-numerics", action="store_true",
                   help="edgespec's configurations on llama.cpp's fast numerics (F16 KV cache, flash attention), as "
                        "`edgespec generate --fast-numerics`: each speculative configuration is still checked "
                        "against its own target on the same numerics (the peers keep their own)")
    b.add_argument("--seed", type=int, default=0, help="orders configurations within each question; seeds peers")
    b.add_argument("--ort-genai-model", default=None,
                   help="onnxruntime-genai model folder (ortg-* configs; `edgespec export onnx MODEL --format genai "
                        "--quant int4 --out DIR` builds one of --model)")
    b.add_argument("--onnx-model", default=None, help="edgespec ONNX model folder (onnx-* configs)")
    _add_results(b, "JSON and PNGs")
    c = b.add_argument_group("multi-turn chat (--chat)")
    c.add_argument("--chat", action="store_true",
                   help="one scripted conversation instead: the categories take turns giving questions, each "
                        "configuration answers its own conversation reusing what it cached; per turn context, "
                        "time to first token, prefill and decode tok/s, latency, and whether the text equals a "
                        "fresh engine's")
    c.add_argument("--turns", type=_positive, default=10, help="user turns in the conversation (default: "
                                                                 "%(default)s)")
    c.add_argument("--skip", type=int, default=0, help="questions skipped at the start of each category (default: "
                                                        "%(default)s)")

    t = _command(sub, "tune", _tune, "measure this machine for a model and store the best mode and γ policy",
                 "Measures the verify-cost curve, draft costs and acceptance on a short fixed calibration set (not "
                 "Spec-Bench), runs the candidate policies on it, and stores the best; edgespec.load then uses it by "
                 "default for this model file, thread count and device.")
    t.add_argument("model", nargs="?", default="smollm2-135m", help="model name or GGUF path")
    t.add_argument("--draft", default=None, help="also consider a draft model (name or GGUF path)")
    t.add_argument("--threads", type=_positive, default=None, help="(default: physical cores)")
    t.add_argument("--device", default="cpu", choices=["cpu", *GPU_DEVICES])
    t.add_argument("--quick", action="store_true", help="a CI-sized run (~half a minute) instead of a few minutes")
    t.add_argument("--show", action="store_true", help="print the stored tuning instead of measuring")
    t.add_argument("--json", action="store_true", help="print the tuning as JSON")
    t.add_argument("--default", action="store_true",
                   help="choose the model, backend and drafter `edgespec generate` / edgespec.load() use without a "
                        "model (measured on first use anyway): quality-passing variants × n-gram/none, and ONNX; "
                        "with a GGUF of your own as MODEL, what runs it: edgespec's export or llama.cpp, each with "
                        "plain decoding, lookup and token trees")

    r = _command(sub, "row-cost", _row_cost, "what each onnxruntime kernel of an ONNX export charges per row of a call",
                 "Times one layer of an ONNX export at each row count (a verify pass over k tokens is one call over k "
                 "rows): the layer graph, each weight product alone, the same products as MatMulInteger, and "
                 "GroupQueryAttention alone. Prints a table, writes JSON and a PNG.")
    r.add_argument("model", help="edgespec ONNX model folder (`edgespec export onnx`)")
    r.add_argument("--rows", default="1,2,3,4,5,8,12,17", help="row counts (default: %(default)s)")
    r.add_argument("--context", type=_positive, default=200, help="committed positions before the call")
    r.add_argument("--threads", type=_positive, default=2)
    r.add_argument("--repeats", type=_positive, default=100, help="calls timed per kernel and row count")
    _add_results(r, "JSON and PNG")

    p = _command(sub, "replay", _replay, "the γ controller and its drafters replayed over recorded target-only greedy "
                 "outputs (--record), timed by fixed verify-cost curves: the simulated speed-up per category, "
                 "deterministic")
    p.add_argument("streams", help="JSON lines of recorded generations (written by --record)")
    p.add_argument("--record", action="store_true", help="first record (or complete) the streams with the model")
    p.add_argument("--questions", default=None, help="(--record, required) Spec-Bench's question.jsonl")
    p.add_argument("--categories", default=None, help="(--record) comma-separated categories (default: all)")
    p.add_argument("--per-category", type=_positive, default=None, help="(--record) questions per category")
    p.add_argument("--max-tokens", type=_positive, default=128, help="(--record) tokens per generation")
    p.add_argument("--model", default="smollm2-135m", help="(--record) model name or path")
    p.add_argument("--threads", type=_positive, default=None)
    p.add_argument("--curves", default=None,
                   help=f"cost curves to replay on (default: {','.join(CURVES)}, or the --curve-file's)")
    p.add_argument("--curve-file", action="append", default=[],
                   help="a benchmarks/verify_curve_sizes.py result (its curves, named MODEL@CONTEXT) or a "
                        "benchmarks/decode_loop_curve.py result (the loop's curve and the calibration, named loop@FILE "
                        "and calibration@FILE) or an `edgespec bench` result (each model file's curve it timed, named "
                        "CONFIG@FILE: another machine's costs) to replay on (repeatable)")
    p.add_argument("--overhead", type=float, default=0.0,
                   help="time per step outside verifying, in single-token passes (default: %(default)s)")
    p.add_argument("--draft-overhead", type=float, default=0.0,
                   help="time per step the drafter itself takes (drafting, its upkeep), in single-token passes; "
                        "plain decoding does not pay it (default: %(default)s)")
    p.add_argument("--calibration", default=None,
                   help="the curve the γ controller starts from, as the engine starts from its start-up calibration "
                        "(default: each replayed curve itself), e.g. avx512-prefetch-calibration")
    p.add_argument("--noise", type=float, default=0.0,
                   help="the controller sees each pass's time times exp(NOISE · N(0,1)), as on a busy machine")
    p.add_argument("--annotate", action="store_true",
                   help="first add the target's top-4 successors after every output token to the streams (with "
                        "--model, the model that recorded them): the recycled table's rows, for --drafter tree")
    p.add_argument("--annotate-head", action="store_true",
                   help="first add the draft head's proposal after every output token to the streams (--model: an "
                        "ONNX export with its head beside it, the one that recorded them): for --drafter head")
    p.add_argument("--drafter", default="ngram", choices=sorted([*TREE_DRAFTERS, "head"]),
                   help="ngram: lookup chains (mode ngram); head: lookup, else the draft head (mode head, the "
                        "default's; needs --annotate-head once); tree: mode tree's token trees (lookup, suffix tries; "
                        "the recycled table needs --annotate); tree-chain: the same as chains")
    p.add_argument("--head-cost", type=float, default=HEAD_COST,
                   help="(--drafter head) a head pass as the engine pays it, in single-token target passes "
                        "(default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def _run_args(args: argparse.Namespace, chat: bool) -> dict[str, object]:
    """The options ``bench`` and ``bench --chat`` share, with the defaults of the one asked for."""
    configs = args.configs or ",".join(DEFAULT_CHAT_CONFIGS if chat else
                                       DEFAULT_CONSTRAINED_CONFIGS if args.constrained else DEFAULT_CONFIGS)
    questions = (args.questions or str(CONSTRAINED_QUESTIONS)) if args.constrained else spec_bench(args.questions)
    return {"questions": questions, "categories": args.categories.split(",") if args.categories else None,
            "max_tokens": args.max_tokens or (128 if chat else 256),
            "configs": tuple(n for n in configs.split(",") if n),
            "model": args.model, "threads": args.threads, "ctx": args.ctx, "seed": args.seed,
            "ort_genai_model": args.ort_genai_model, "onnx_model": args.onnx_model, "device": args.device,
            "fast_numerics": args.fast_numerics}


def _bench(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.chat and args.constrained:
        raise BenchError("--chat and --constrained are separate runs: choose one")
    if args.chat:
        return _bench_chat(args, out_dir)
    from ..bench.bandwidth import bytes_per_token, measure_bandwidth
    from ..bench.report import bandwidth_bounds, constrained_table, head_to_head, summarize, table, versions
    from ..bench.run import BenchArgs, run

    on_cpu = args.device == "cpu"  # the bandwidth bound is the host memory's: it bounds decoding on the CPU only
    if on_cpu:
        require("gguf", "bench", "edgespec bench's bandwidth bound")  # before the run, not after it
    if args.constrained:
        require("jsonschema", "bench", "edgespec bench --constrained's schema check")
    per_category = args.per_category or (None if args.constrained else 3)
    result = run(BenchArgs(per_category=per_category, limit=args.limit, **_run_args(args, chat=False)))
    result["summary"] = summarize(result)
    result["head_to_head"] = head_to_head(result)
    result["versions"] = versions(result)
    result["bandwidth"] = (bandwidth_bounds(result, measure_bandwidth(result["setup"]["threads"]),
                                            bytes_per_token(result["setup"]["model"])) if on_cpu else None)
    constrained = any(r["schema_valid"] is not None for r in result["records"])
    print(constrained_table(result) if constrained else table(result))
    stem = _stem(out_dir, "constrained_bench" if constrained else "spec_bench", result)
    result["plots"] = [] if args.no_plots else _plots(result, stem)
    for r in result["records"]:  # token ids make the file large; their comparisons are kept
        r["n_tokens"] = len(r.pop("tokens"))
    return _write(result, stem)


def _bench_chat(args: argparse.Namespace, out_dir: Path) -> int:
    from ..bench.conversation import ChatArgs, chat_table, run_chat

    if args.skip < 0:
        raise BenchError(f"--skip must be 0 or more, got {args.skip}")
    result = run_chat(ChatArgs(turns=args.turns, skip=args.skip, **_run_args(args, chat=True)))
    print(chat_table(result))
    stem = _stem(out_dir, "chat_bench", result)
    result["plots"] = [] if args.no_plots else _plots(result, stem, chat=True)
    return _write(result, stem)


def _stem(out_dir: Path, kind: str, result: dict) -> Path:
    return out_dir / f"{kind}-{datetime.fromisoformat(result['date']).strftime('%Y%m%dT%H%M%S')}"


def _write(result: dict, stem: Path) -> int:
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(f"wrote {stem.with_suffix('.json')}" + "".join(f", {p}" for p in result["plots"]))
    return 0


def _plots(result: dict, stem: Path, chat: bool = False) -> list[str]:
    from ..bench.plots import plot, plot_chat

    with needed("bench", "plotting", ", or pass --no-plots"):
        return (plot_chat if chat else plot)(result, stem)


def _replay(args: argparse.Namespace) -> int:
    from ..bench.questions import load_questions
    from ..bench.replay import (
        annotate,
        annotate_head,
        curve_shape,
        load_streams,
        measured_curves,
        record,
        simulate,
        table,
    )

    measured: dict[str, dict[int, float]] = {}
    for path in args.curve_file:
        measured |= measured_curves(path)
    known = CURVES | measured
    curves = [c for c in (args.curves or ",".join(measured or CURVES)).split(",") if c]
    unknown = [c for c in curves + ([args.calibration] if args.calibration else []) if c not in known]
    if unknown or not curves:
        raise BenchError(f"unknown curves {', '.join(unknown)}; choose from {', '.join(known)}")
    if min(args.overhead, args.draft_overhead, args.noise, args.head_cost) < 0:
        raise BenchError(f"--overhead, --draft-overhead, --noise and --head-cost must be >= 0, got {args.overhead}, "
                         f"{args.draft_overhead}, {args.noise} and {args.head_cost}")
    if args.record:
        categories = args.categories.split(",") if args.categories else None
        questions = load_questions(spec_bench(args.questions), categories, args.per_category)
        record(args.model, questions, args.max_tokens, args.streams, args.threads)
    if args.annotate:
        annotate(args.model, args.streams, threads=args.threads)
    if args.annotate_head:
        annotate_head(args.model, args.streams, threads=args.threads)
    streams = load_streams(args.streams)
    calibration = curve_shape(known[args.calibration]) if args.calibration else None
    results = {c: simulate(streams, curve_shape(known[c]), args.overhead, args.noise,
                           tree_leaves=TREE_DRAFTERS.get(args.drafter, 0), draft_overhead=args.draft_overhead,
                           calibration=calibration, head_cost=args.head_cost if args.drafter == "head" else None)
               for c in curves}
    print(json.dumps(results, indent=1) if args.json else table(results))
    return 0


def _row_cost(args: argparse.Namespace) -> int:
    from ..bench.row_cost import run

    try:
        rows = sorted({int(k) for k in args.rows.split(",")})
    except ValueError:
        rows = []
    if not rows or rows[0] < 1:
        raise BenchError(f"--rows needs positive integers separated by commas, got {args.rows!r}")
    return run(args.model, rows, args.context, args.threads, args.repeats, args.out, not args.no_plots)


def _tune(args: argparse.Namespace) -> int:
    from ..tuning.tune import show, tune

    if args.default:  # the default model's choice, or a GGUF of the user's own given as MODEL
        from ..cpu import physical_cores
        from ..tuning.default import show as show_default
        from ..tuning.own_model import own_gguf

        return show_default(args.threads or physical_cores(), args.device, measure=not args.show,
                            source=own_gguf(args.model))
    if args.show:
        return show(args.model, args.draft, args.threads, args.device, args.json)
    return tune(args.model, args.draft, args.threads, args.device, args.quick, args.json)
