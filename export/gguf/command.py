"""``edgespec export gguf SRC --quant Q --out FILE``: re-quantize (or convert, then quantize) to one GGUF."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgespec.catalog.models import quantize
from edgespec.errors import ModelLoadError

from .. import gate, quality
from ..common import BITS_PER_WEIGHT, EXPORT_QUANTS, Made, Source, Steps, add_common_args, emit, record, resolve_source
from ..files import ensure_space


def export_gguf(source: Source, quant: str, out: Path, n_prompts: int = 4, n_tokens: int = 32,
                with_quality: bool = True, threads: int | None = None, steps: Steps | None = None,
                draft_of: Path | None = None, force: bool | None = None) -> dict:
    """Write ``source`` quantized to ``quant`` at ``out``, with its manifest; returns the manifest entry.
    ``draft_of``: the target this file drafts for, whose α and c the report then includes. ``force``: None
    leaves the quality gate out (pairs: a draft is meant to differ); False refuses a file that fails it (and
    deletes it), True keeps it with a warning in the manifest entry."""
    progress = steps or (lambda _: None)
    if with_quality:  # before writing: a bad option must not leave an artefact without its manifest
        quality.check_options(n_prompts, n_tokens)
    info = source.info
    ensure_space(out, int(info.n_params * BITS_PER_WEIGHT[quant] / 8) + info.file_bytes - info.tensor_bytes)
    progress(f"llama.cpp quantize → {quant}")
    try:
        quantize(source.path, out, quant)
    except ModelLoadError as e:
        raise ModelLoadError(f"{e} (architecture {info.architecture!r}; --verbose shows llama.cpp's log)") from e
    report = (quality.report(out, source.path, n_prompts, n_tokens, draft_of, threads, progress)
              if with_quality else None)
    made = Made("llama_model_quantize", quant)
    if report is not None and force is not None:
        try:
            made.extra["quality_gate"] = gate.check(f"{out} ({quant})", report.top1_decided, report.kl_mean, force)
        except gate.QualityGateError:
            out.unlink(missing_ok=True)
            raise
    return record("gguf", out, source, made, report)


def _run(args: argparse.Namespace) -> int:
    with Steps(2 if args.no_quality else 5, f"export gguf {args.quant}") as steps:
        steps("reading the source")
        source = resolve_source(args.src)
        entry = export_gguf(source, args.quant, args.out, args.prompts, args.tokens, not args.no_quality,
                            args.threads, steps, force=args.force)
    return emit(args, entry, steps.seconds)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gguf", help="re-quantize a GGUF file, model name or Hugging Face folder into one GGUF")
    p.add_argument("src", help="a GGUF file, a model name (see `edgespec models`) or a Hugging Face folder")
    p.add_argument("--quant", required=True, choices=EXPORT_QUANTS)
    p.add_argument("--out", required=True, type=Path, help="the GGUF file to write")
    add_common_args(p)
    p.add_argument("--force", action="store_true", help="keep a file that fails the quality gate "
                                                        "(top-1 agreement < 0.99 or KL > 0.01 against the source)")
    p.set_defaults(func=_run)
