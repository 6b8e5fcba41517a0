"""``edgespec export onnx SRC --quant {gguf,fp32,fp16,int8,int4} --out DIR``: the split ONNX decoder edgespec's
ONNX backend runs (docs/onnx-format.md), with its quality report and gate; ``--format genai`` builds the same
weights with onnxruntime-genai's builder instead, for comparison with its own generation loop.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from .. import gate
from ..quality import tie_note
from . import block_int8
from .export import ATTENTIONS, DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, GGUF_QUANT, MANIFEST, QUANTS


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("onnx", help="ONNX decoder (a GGUF's own blocks, FP32/FP16, MatMulNBits "
                                            "INT8/INT4) with a quality report and gate")
    p.add_argument("src", help="GGUF file, Hugging Face folder, or model name (see `edgespec models`)")
    p.add_argument("--quant", choices=QUANTS, default=None,
                   help=f"weights: {GGUF_QUANT} carries a llama-family GGUF's own Q4_0/Q4_1/Q8_0 blocks (the "
                        "default for one); int8 is the default for other sources")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--format", choices=["edgespec", "genai"], default="edgespec",
                   help="edgespec: per-layer graphs for edgespec's runtime; genai: onnxruntime-genai's builder")
    p.add_argument("--context-length", type=int, default=4096, help="most positions the graphs accept (default 4096)")
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="MatMulNBits block size")
    p.add_argument("--accuracy-level", type=int, default=DEFAULT_ACCURACY_LEVEL, choices=[0, 1, 2, 3, 4],
                   help="MatMulNBits compute type (4 = int8 activations: fast and batch-invariant here; "
                        "1 = float32 activations: slow for 8-bit)")
    p.add_argument("--asymmetric", action="store_true", help="asymmetric (zero-point) weight quantization")
    p.add_argument("--attention", choices=ATTENTIONS, default=None,
                   help="exact: edgespec's attention kernel (built by `make setup`; one row costs one row); gqa: "
                        "onnxruntime's GroupQueryAttention, single-token calls padded to two rows (default: exact "
                        "where the kernel is built)")
    p.add_argument("--products", choices=block_int8.PRODUCTS, default="auto",
                   help="8-bit products (blocks of 32, accuracy level 4): edgespec = the kernel library's "
                        "BlockInt8MatMul (rows of a verify batch share each weight load), nbits = onnxruntime's "
                        "MatMulNBits, auto = whichever one layer's products run faster here (default); a GGUF's "
                        "carried 4-bit blocks: BlockQ4MatMul under the exact attention unless nbits")
    p.add_argument("--head-bits", type=int, choices=[4, 8], default=8, help="bits of the output projection")
    p.add_argument("--no-quality", action="store_true", help="skip the quality report (and so its gate)")
    p.add_argument("--threads", type=int, default=None, help="threads of the quality report's llama.cpp source "
                                                             "(default: physical cores)")
    p.add_argument("--force", action="store_true", help="keep an export that fails the quality gate "
                                                        "(top-1 agreement < 0.99 or KL > 0.01 against the source)")
    p.add_argument("--json", action="store_true", help="print the manifest entry as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.format == "genai":
        from .genai import export_genai

        quant = args.quant or "int8"
        entry = export_genai(args.src, args.out, quant, args.block_size, args.accuracy_level)
        print(json.dumps(entry, indent=2) if args.json else
              f"wrote {args.out} (onnxruntime-genai, {quant}): {entry['size_bytes'] / 1e6:.0f} MB")
        return 0
    from .export import export_onnx

    manifest = export_onnx(args.src, args.out, args.quant, args.context_length, args.block_size,
                           args.accuracy_level, not args.asymmetric, args.head_bits, attention=args.attention,
                           products=args.products)
    if not args.no_quality:
        from .quality import quality_report

        q = manifest["quality"] = quality_report(args.out, threads=args.threads)
        try:
            q["gate"] = gate.check(f"{args.out} ({manifest['quant']})", q["top1_decided"], q["kl"], args.force)
        except gate.QualityGateError:
            shutil.rmtree(args.out, ignore_errors=True)
            raise
        (args.out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if args.json:
        print(json.dumps({k: v for k, v in manifest.items() if k != "chat_template"}, indent=2))
    else:
        print(summary(args.out, manifest))
    return 0


def summary(out: Path, manifest: dict) -> str:
    size = sum(f.stat().st_size for f in out.glob("*.onnx")) / 1e6
    line = (f"wrote {out}: {manifest['architecture']} {manifest['num_layers']} layers, {manifest['quant']}, "
            f"{size:.0f} MB, {manifest['source']['export_seconds']:.0f} s")
    q = manifest.get("quality") or {}
    if q:
        line += (f" · top-1 {q['top1_agreement']:.3f} ({tie_note(q['top1_decided'], q['source_tie'])})"
                 f" · KL {q['kl']:.4f} vs source ({q['positions']} positions)"
                 f" · {q['decode_tok_s']:.0f} tok/s decode (1 thread) · {q['gate']}")
    return line
