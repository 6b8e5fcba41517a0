"""Current: a tool the manual uses.
edgespec's kernels in the whole model: the working tree's build against another git revision's, or one export
against another (their KV type, their graphs), pass by pass.

    python benchmarks/kernels_in_model.py [--against REV] [--against-model DIR] [--model DIR] [--context 100]
                                          [--rows 1,2,3,4] [--rounds 300] [--threads 2] [--out DIR]

benchmarks/products_kernel.py times one loop on one thread with the caches to itself; in a decode pass two threads
stream the weights together between the other operators, and a verify row costs another share there (on the
AVX-512 EPYC a second row: +2–21% of one product standalone, +18–25% of a whole pass in the model). Here both revisions'
kernel sources are compiled as `edgespec build-kernel` builds them, one export (default: what `edgespec generate`
loads) is loaded twice in one process, once on each build, and at ``--context`` tokens the two take turns: per
round each runs one pass of every row count on the same tokens (a pass over k rows keeps one token, as a verify
that accepts nothing), which build goes first alternating, so the shared machine's load falls on both. Per build
and row count: median ms of a pass and its ratio to the same build's one-row pass; and whether the two builds gave
the same logits, bit for bit. The export must be one both revisions can run (the same graphs revision).
With ``--against-model`` the baseline runs that export instead (on REV's build, or on the working tree's without
``--against``); two exports' logits are not compared.
Prints a table, writes kernels_in_model.json and .png. The working tree's build (loaded second) ran 1.5–1.8% faster
than the same sources as REV in four runs on the AVX-512 EPYC: a difference of a few percent holds
only if it holds with the roles swapped (commit the variant, check out the other, compare against the commit).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from edgespec.backends.onnx.model import OnnxModel, OnnxOptions
from edgespec.bench.plots import line_chart
from edgespec.bench.revision import files_at, source_at
from edgespec.bench.turns import add_pass_arguments, passes_taking_turns
from edgespec.identity import cpu_identity
from edgespec.kernels import library as custom_ops
from edgespec.tuning.default import default_choice


def build_revision(rev: str, folder: Path) -> Path:
    """REV's kernel sources (the files its kernels folder has), as git has them, compiled for this CPU into
    ``folder``."""
    files = files_at(rev, custom_ops.KERNELS)
    for path in files:
        (folder / path.name).write_text(source_at(rev, path))
    library = folder / "edgespec_ops.so"
    custom_ops.compile_library(library, sources=[folder / path.name for path in files if path.suffix == ".cc"])
    return library


def take_turns(models: dict[str, OnnxModel], context: int, rows: list[int], rounds: int
               ) -> tuple[dict[str, dict[int, list[float]]], bool]:
    """(seconds of each model's passes by row count, whether every pass gave all models the same logits)."""
    names = list(models)
    seconds: dict[str, dict[int, list[float]]] = {name: {k: [] for k in rows} for name in names}
    same = True
    for k, tokens, start, order in passes_taking_turns(list(models.values()), context, rows, rounds):
        logits = []
        for i in order:
            began = time.perf_counter()
            logits.append(models[names[i]].decode(tokens, start, k).copy())
            seconds[names[i]][k].append(time.perf_counter() - began)
        same = same and all(np.array_equal(logits[0], other) for other in logits[1:])
    return seconds, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default=None, help="the git revision whose kernels to compare with")
    parser.add_argument("--against-model", type=Path, default=None,
                        help="an export for the baseline to run instead of --model's (another KV type, graphs)")
    add_pass_arguments(parser, context=100, rows="1,2,3,4", out="kernels_in_model.json/.png")
    parser.add_argument("--rounds", type=int, default=300, help="passes per row count and build")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.against is None and args.against_model is None:
        parser.error("compare with a revision's kernels (--against), another export (--against-model) or both")
    model_path = args.model or default_choice(args.threads, "cpu").target
    working_tree = custom_ops.ensure()
    if working_tree is None:
        raise SystemExit(f"edgespec's kernels cannot be built here: {custom_ops.build_failure()}")
    baseline = " ".join(filter(None, [args.against, args.against_model and Path(args.against_model).name]))
    with tempfile.TemporaryDirectory(prefix="edgespec-kernels-") as scratch:
        builds = {baseline: build_revision(args.against, Path(scratch)) if args.against else working_tree,
                  "working tree": working_tree}
        paths = {baseline: args.against_model or model_path, "working tree": model_path}
        models = {name: OnnxModel(paths[name], OnnxOptions(n_threads=args.threads, kernels=library))
                  for name, library in builds.items()}
        try:
            seconds, same = take_turns(models, args.context, rows, args.rounds)
        finally:
            for model in models.values():
                model.close()

    ms = {name: {k: 1e3 * float(np.median(s)) for k, s in by_rows.items()} for name, by_rows in seconds.items()}
    print(f"{Path(model_path).name}, {args.context} tokens of context, {args.rounds} rounds, {args.threads} threads, "
          f"{cpu_identity()[:60]}; median ms of a pass (× its own {rows[0]}-row pass)")
    print(f"{'run':<32}" + "".join(f"{f'{k} rows':>16}" for k in rows))
    for name, by_rows in ms.items():
        print(f"{name:<32}" + "".join(f"{by_rows[k]:>8.2f} ({by_rows[k] / by_rows[rows[0]]:.3f})" for k in rows))
    if args.against_model is None:
        print(f"same logits, every pass: {'yes' if same else 'NO'}")

    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "kernels_in_model.json"
    out.write_text(json.dumps({"cpu": cpu_identity(), "threads": args.threads, "model": str(model_path),
                               "against": args.against, "against_model": args.against_model and str(args.against_model),
                               "context": args.context, "rounds": args.rounds, "rows": rows, "median_ms": ms,
                               "same_logits": same if args.against_model is None else None}, indent=1))
    line_chart(args.out / "kernels_in_model.png", rows,
               [(name, [ms[name][k] for k in rows], color, style)
                for (name, color, style) in ((baseline, "C0", "--"), ("working tree", "C1", "-"))],
               "rows in the pass", "median ms per pass", f"one pass at {args.context} tokens of context")
    print(f"wrote {out} and kernels_in_model.png")


if __name__ == "__main__":
    main()
