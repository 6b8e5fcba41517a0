"""Current: a tool the manual uses.
Where a target pass's time goes, by operator, at each row count: onnxruntime's profiler on an ONNX export.

    python benchmarks/pass_profile.py [--model DIR] [--context 300] [--rows 1,2,4,8] [--passes 40] [--out DIR]

One model (default: the export `edgespec generate` loads, as this machine's race chose it) with onnxruntime's
profiler on. After a prompt of ``--context`` tokens, passes of each row count take turns (a pass over k rows keeps
one token and the rest are rolled back, as a verify that accepts nothing does), so the shared machine's load falls
on every row count alike. Per operator type: µs per pass of its kernels at each row count (the embedding, every
layer and the head); and each pass's wall time in the sessions (``model_run``) beside its kernels' sum. The profiler
costs time per node, so read differences between row counts, not totals. Prints a table, writes pass_profile.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path

from edgespec.backends.onnx.model import OnnxModel, OnnxOptions
from edgespec.bench.turns import add_pass_arguments, passes_taking_turns
from edgespec.identity import cpu_identity
from edgespec.tuning.default import default_choice


def per_operator(files: list[Path], rows: list[int], passes: int) -> tuple[dict, dict]:
    """(µs per pass of each operator type's kernels at each row count, µs per pass in model_run at each row count).
    Each session's last ``passes · len(rows)`` runs are the rotation's, in its order."""
    kernels: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    wall: dict[int, float] = defaultdict(float)
    for file in files:
        events = json.loads(file.read_text())
        runs = [e for e in events if e.get("name") == "model_run"][-passes * len(rows):]
        for i, run in enumerate(runs):
            wall[rows[i % len(rows)]] += run["dur"] / passes
        starts = [run["ts"] for run in runs]
        for e in events:  # each kernel to the run it falls in (runs are in time order)
            i = bisect_right(starts, e["ts"]) - 1
            if (e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and i >= 0
                    and e["ts"] <= runs[i]["ts"] + runs[i]["dur"]):
                kernels[e["args"]["op_name"]][rows[i % len(rows)]] += e["dur"] / passes
    return {op: dict(by_rows) for op, by_rows in kernels.items()}, dict(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pass_arguments(parser, context=300, rows="1,2,4,8", out="pass_profile.json")
    parser.add_argument("--passes", type=int, default=40, help="passes per row count")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    model_path = args.model or default_choice(args.threads, "cpu").target
    with tempfile.TemporaryDirectory(prefix="edgespec-profile-") as scratch:
        model = OnnxModel(model_path, OnnxOptions(n_threads=args.threads, profile=str(Path(scratch) / "pass")))
        try:
            for k, tokens, start, _ in passes_taking_turns([model], args.context, rows, args.passes):
                model.decode(tokens, start, k)
            files = model.end_profiling()
            kernels, wall = per_operator(files, rows, args.passes)
        finally:
            model.close()

    order = sorted(kernels, key=lambda op: -kernels[op].get(rows[0], 0.0))
    print(f"{Path(model_path).name}, {args.context} tokens of context, {args.passes} passes per row count, "
          f"{cpu_identity()[:60]}, {args.threads} threads; µs per pass (profiled)")
    print(f"{'operator':<34}" + "".join(f"{f'{k} rows':>11}" for k in rows))
    for op in order:
        print(f"{op:<34}" + "".join(f"{kernels[op].get(k, 0.0):>11.0f}" for k in rows))
    total = {k: sum(by_rows.get(k, 0.0) for by_rows in kernels.values()) for k in rows}
    print(f"{'kernels, all':<34}" + "".join(f"{total[k]:>11.0f}" for k in rows))
    print(f"{'model_run, all sessions':<34}" + "".join(f"{wall.get(k, 0.0):>11.0f}" for k in rows))

    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "pass_profile.json"
    out.write_text(json.dumps({"cpu": cpu_identity(), "threads": args.threads, "model": str(model_path),
                               "context": args.context, "passes": args.passes, "rows": rows,
                               "kernels_us": kernels, "model_run_us": wall}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
