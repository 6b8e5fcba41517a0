"""Current: a tool the manual uses.
edgespec.BlockInt8MatMul's products loop against the same loop at another git revision: time and bits.

    python benchmarks/products_kernel.py --against REV [--shapes 576x960,576x576,576x3072,1536x576]
                                         [--rows 1,2,4,8] [--copies 48] [--repeats 20] [--march ARCH] [--out DIR]

Both revisions of edgespec/kernels/block_int8_matmul.cc (REV's from git, and the working tree's) are compiled into
one program with this CPU's flags, as `edgespec build-kernel` builds the library (or ``--march``'s, to time
another build's loop here, e.g. x86-64-v3 for AVX2 without VNNI): each loop behind the same calls,
one thread, no onnxruntime. The weights are random, packed each revision's own way; the activations are quantized
by each revision's own code. Per shape (K × N: SmolLM2's q|k|v, o, gate|up and down by default) and row count: µs
per product with ``--copies`` weight matrices in turn (past the caches: weights from memory, as in a decode pass)
and with one (in cache), the two revisions taking turns, best of ``--repeats``; and whether the two give the same
bits. Revisions since the op's first (graphs revision 7) work. Prints a table, writes products_kernel.json and .png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from edgespec.bench.plots import line_chart
from edgespec.bench.revision import source_at
from edgespec.identity import cpu_identity
from edgespec.kernels import library as custom_ops

SOURCE = custom_ops.KERNELS / "block_int8_matmul.cc"
HARNESS = Path(__file__).with_name("products_kernel.cc")
# Each revision's loop behind the calls the harness makes: its codes' type and packing width are its own.
ADAPTER = """
using Code = std::remove_cv_t<std::remove_pointer_t<decltype(Rows::codes)>>;
void quantize_any(const float* x, int64_t k, uint8_t* codes, float* scales) {
  quantize_row(x, k, reinterpret_cast<Code*>(codes), scales);
}
void product_any(const uint8_t* codes, const float* row_scales, const int8_t* w, const float* s, float* out,
                 int64_t m, int64_t k, int64_t n) {
  const Call c{{reinterpret_cast<const Code*>(codes), row_scales}, w, s, out, m, k, n};
  for (int64_t n0 = 0; n0 < n; n0 += kColumns) columns(c, n0);
}
"""


def loop_only(source: str, name: str) -> str:
    """The kernel's loop (its anonymous namespace up to the onnxruntime glue) in namespace ``name``, with the
    adapter."""
    start, end = source.index("namespace {\n"), source.index("void columns_task")
    return f"namespace {name} {{\n{source[start + len('namespace {'):end]}{ADAPTER}}}  // namespace {name}\n"


def program(base: str, head: str) -> str:
    """One translation unit: the kernel's headers and instruction-set macros (the working tree's), both loops,
    the table of the two, the harness."""
    macros = head[head.index('#include "ops.h"'):head.index("namespace {\n")].replace('#include "ops.h"', "")
    return "\n".join([
        "#include <cstdint>", "#include <type_traits>", "#include <vector>", macros,
        loop_only(base, "base"), loop_only(head, "head"),
        "struct Kernel {\n  void (*quantize)(const float*, int64_t, uint8_t*, float*);\n"
        "  void (*product)(const uint8_t*, const float*, const int8_t*, const float*, float*, int64_t, int64_t,"
        " int64_t);\n  int64_t columns;\n};",
        "const Kernel kKernels[2] = {{base::quantize_any, base::product_any, base::kColumns},\n"
        "                            {head::quantize_any, head::product_any, head::kColumns}};",
        f'#include "{HARNESS}"'])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision to compare the working tree's loop with")
    parser.add_argument("--shapes", default="576x960,576x576,576x3072,1536x576", help="K×N, comma-separated")
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--copies", type=int, default=48, help="weight matrices taken in turn (past the caches)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--march", default=None, help="compile for this -march instead of this CPU's")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"),
                        help="folder for products_kernel.json/.png (default benchmarks/results, git-ignored)")
    args = parser.parse_args()
    base, head = source_at(args.against, SOURCE), SOURCE.read_text()
    rows = [int(r) for r in args.rows.split(",")]
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="edgespec-products-") as scratch:
        source, exe = Path(scratch) / "products.cc", Path(scratch) / "products"
        source.write_text(program(base, head))
        custom_ops.compile_program(exe, [source], [f"-march={args.march}"] if args.march else None)
        for shape in args.shapes.split(","):
            k, n = (int(v) for v in shape.lower().split("x"))
            done = subprocess.run([str(exe), str(k), str(n), str(args.copies), str(args.repeats), *map(str, rows)],
                                  capture_output=True, text=True, check=True)
            results[f"{k}×{n}"] = [json.loads(line) for line in done.stdout.splitlines()]

    build = f"-march={args.march}" if args.march else "this CPU's build"
    print(f"one thread, µs per product, best of {args.repeats}; {args.against} → working tree; {build}; "
          f"{cpu_identity()[:60]}")
    print(f"{'K×N':<10}{'rows':>5}{'from memory':>22}{'×':>7}{'in cache':>20}{'×':>7}  same bits")
    for shape, lines in results.items():
        for r in lines:
            (mb, mh), (cb, ch) = r["memory_us"], r["cache_us"]
            print(f"{shape:<10}{r['rows']:>5}{mb:>11.1f} → {mh:>7.1f}{mb / mh:>7.2f}{cb:>9.1f} → {ch:>7.1f}"
                  f"{cb / ch:>7.2f}  {'yes' if r['same_bits'] else 'NO'}")

    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "products_kernel.json"
    out.write_text(json.dumps({"cpu": cpu_identity(), "against": args.against, "march": args.march or "native",
                               "copies": args.copies,
                               "repeats": args.repeats, "results": results}, indent=1))
    lines = [(f"{shape} {label}", [r["memory_us"][i] for r in rs], color, style)
             for shape, rs, color in zip(results, results.values(), ("C0", "C1", "C2", "C3", "C4"), strict=False)
             for i, label, style in ((0, args.against, "--"), (1, "working tree", "-"))]
    line_chart(args.out / "products_kernel.png", rows, lines, "rows in the call", "µs per product (from memory)",
               "BlockInt8MatMul's loop, one thread")
    print(f"wrote {out} and products_kernel.png")


if __name__ == "__main__":
    main()
