"""``edgespec export draft SRC (--keep-layers L | --skip-layers L | --search [--budget B]) --out FILE``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import quality, require
from ..common import EXPORT_QUANTS, Made, Source, Steps, add_common_args, emit, record, resolve_source
from .layers import LayerSetError, format_layers, parse_layers, write_draft
from .search import SearchResult, search


def export_draft(source: Source, out: Path, keep: list[int], quant: str | None = None,
                 searched: SearchResult | None = None, n_prompts: int = 4, n_tokens: int = 32,
                 with_quality: bool = True, threads: int | None = None, steps: Steps | None = None) -> dict[str, Any]:
    """Write the layer-skip draft of ``source`` keeping ``keep``, with its manifest (quality includes α and c
    against ``source`` as the target)."""
    progress = steps or (lambda _: None)
    if with_quality:  # before writing: a bad option must not leave an artefact without its manifest
        quality.check_options(n_prompts, n_tokens)
    progress(f"writing {len(keep)} of {source.info.n_layers} layers")
    keep = write_draft(source.path, out, keep, quant)
    report = (quality.report(out, source.path, n_prompts, n_tokens, draft_of=source.path, n_threads=threads,
                             progress=progress) if with_quality else None)
    extra: dict[str, Any] = {"layers": format_layers(keep), "kept_fraction": round(len(keep) / source.info.n_layers, 4)}
    if searched is not None:
        extra["search"] = searched.to_dict()
    return record("draft", out, source, Made("llama_model_quantize prune_layers" + ("" if quant else " only_copy"),
                                              quant, keep, extra), report)


def run_search(source: Source, budget: float, n_prompts: int, n_tokens: int, candidates: int,
               threads: int | None) -> SearchResult:
    with require("tqdm").tqdm(desc="layer search", unit="set", leave=False, disable=None) as bar:
        def progress(done: int, total: int, note: str) -> None:
            bar.total = total
            bar.update(done - bar.n)
            bar.set_postfix_str(note)

        return search(source.path, source.info.n_layers, budget, n_prompts, n_tokens, candidates, threads, progress)


def _run(args: argparse.Namespace) -> int:
    source = resolve_source(args.src)
    n = source.info.n_layers
    searched = None
    if args.keep_layers is not None:
        keep = parse_layers(args.keep_layers, n)
    elif args.skip_layers is not None:
        skip = set(parse_layers(args.skip_layers, n))
        keep = [il for il in range(n) if il not in skip]
        if not keep:
            raise LayerSetError(f"--skip-layers {args.skip_layers} removes every layer of {n}")
    else:
        searched = run_search(source, args.budget, args.search_prompts, args.search_tokens, args.candidates,
                              args.threads)
        keep = searched.keep
    with Steps(1 if args.no_quality else 5, "export draft") as steps:
        entry = export_draft(source, args.out, keep, args.quant, searched, args.prompts, args.tokens,
                             not args.no_quality, args.threads, steps)
    return emit(args, entry, steps.seconds)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("draft", help="write a layer-skip draft (a subset of the target's layers) as a GGUF")
    p.add_argument("src", help="the target: a GGUF file, a model name or a Hugging Face folder")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--keep-layers", help="layers to keep, e.g. 0-11,20-29")
    which.add_argument("--skip-layers", help="layers to drop, e.g. 12-19")
    which.add_argument("--search", action="store_true", help="choose the layers by agreement with the target")
    p.add_argument("--budget", type=float, default=0.5, help="with --search: fraction of layers kept")
    p.add_argument("--search-prompts", type=int, default=3, help="with --search: calibration prompts")
    p.add_argument("--search-tokens", type=int, default=32, help="with --search: greedy tokens per prompt")
    p.add_argument("--candidates", type=int, default=0,
                   help="with --search: layers tried per round (default 0: all; fewer is faster but worse)")
    p.add_argument("--quant", choices=EXPORT_QUANTS, default=None,
                   help="re-quantize the kept layers (default: copy them as they are)")
    p.add_argument("--out", required=True, type=Path, help="the GGUF file to write")
    add_common_args(p)
    p.set_defaults(func=_run)
