"""Current: a tool the manual uses.
Are llama.cpp's rows for a token tree what one-token decoding of each node's path gives? Per numerics and pass size.

    PYTHONPATH=. python benchmarks/tree_rows.py [--contexts 40,250,300,900] [--trees 6] [--nodes 6:12]
                                               [--settings exact:0,fast:4] [--device cpu] [--threads 2] [--out DIR]

A setting is NUMERICS:ROWS: ``exact`` (F32 KV cache, flash attention off: LlamaModel's default on a CPU; on a GPU it
loads llama.cpp's defaults too, ``llama_backend.set_numerics``) or ``fast`` (llama.cpp's defaults: F16 KV cache, flash
attention on: ``--fast-numerics``), and the pass size B every pass is padded to (``LlamaModel.set_pass_rows``; 0:
unpadded). For each setting, context and random tree (``--nodes``, default 6-12 nodes, after a real text,
node 0 the trunk as ``KVArena.extend_tree`` lays it out), the model verifies the tree in one pass
(``LlamaModel.decode_tree``: one sequence per root-to-leaf path; padded to a multiple of B rows) and every row is
compared, bit for bit, with one-token decoding of the node's path (each token in a pass of its own, padded to B rows
alike): what target-only decoding computes. Then the model keeps a random root path that is not the first
(``keep_tree_path``: its cells are not where sequential decoding would have put them) and decodes three more tokens
one at a time; those rows are compared with one-token decoding of the same tokens too.

Why the cells matter (docs/tree-drafting.md): node i of the batch goes to the cell after node i - 1 whatever its depth,
while sequential decoding puts the token at depth d in cell start + d. Without flash attention the CPU kernels'
sums depend on where the visible cells sit (soft_max in blocks, products lane by lane); the flash-attention kernel
walks a row's cells in order and skips the masked ones.

Writes tree_rows.json: per setting and context, rows compared, rows equal to one-token decoding (all, and those whose
path sits in the cells sequential decoding gives it: nodes 0, 1, .., d), the largest difference, and continuation
rows equal after keeping another path.
"""

from __future__ import annotations

# First: numpy imported before llama.cpp's CUDA library crashes the process
# (edgespec/backends/llamacpp/preload.py).
import edgespec  # noqa: F401

# isort: split
import argparse
import json
from pathlib import Path

import numpy as np

from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel
from edgespec.bench.run import machine
from edgespec.catalog.models import resolve
from edgespec.cpu import physical_cores

TEXT = ("Speculative decoding lets a cheap drafter propose several tokens that the target model then verifies in a "
        "single batched forward pass, and the output stays the same. ") * 40
GOES_ON = 3  # one-token decodes after the kept path


def paths(parents: list[int]) -> list[list[int]]:
    """Each node's root path (root first), for parents listed before their children."""
    out: list[list[int]] = []
    for i, p in enumerate(parents):
        out.append([*(out[p] if p >= 0 else []), i])
    return out


def one_token_rows(model: LlamaModel, context: int, tokens: list[int]) -> np.ndarray:
    """The rows after each of ``tokens`` fed one a pass from ``context``: target-only decoding."""
    model.truncate(context)
    return np.stack([model.decode([t], context + d, 1)[0].copy() for d, t in enumerate(tokens)])


def random_tree(rng: np.random.Generator, nodes: tuple[int, int]) -> tuple[list[int], list[int]]:
    """Tokens and parents of a random tree of ``nodes`` (min, max) nodes whose node 0 is the trunk (the one root), as
    extend_tree feeds it."""
    n = int(rng.integers(nodes[0], nodes[1] + 1))
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    return [int(t) for t in rng.integers(100, 20000, n)], parents


def measure(model: LlamaModel, prefix: list[int], trees: int, rng: np.random.Generator,
            nodes: tuple[int, int] = (6, 12)) -> dict[str, object]:
    context = len(prefix)
    tally: dict[str, object] = {"rows": 0, "same_as_one_token": 0, "in_place_rows": 0,
                                "in_place_same_as_one_token": 0, "max_diff_one_token": 0.0,
                                "rows_after_another_path": 0, "same_after_another_path": 0}
    model.truncate(0)
    model.decode(prefix, 0, 1)
    for _ in range(trees):
        tokens, parents = random_tree(rng, nodes)
        node_paths = paths(parents)
        leaves = [i for i in range(len(tokens)) if i not in set(parents)]
        rows = model.decode_tree(tokens, parents, context).copy()
        model.keep_tree_path([])
        first = node_paths[leaves[0]]
        for i, path in enumerate(node_paths):
            alone = one_token_rows(model, context, [tokens[j] for j in path])[-1]
            diff = float(np.abs(rows[i] - alone).max())
            in_place = path == list(range(len(path)))  # in the cells sequential decoding gives it
            tally["rows"] += 1  # type: ignore[operator]
            tally["same_as_one_token"] += diff == 0.0  # type: ignore[operator]
            tally["in_place_rows"] += in_place  # type: ignore[operator]
            tally["in_place_same_as_one_token"] += in_place and diff == 0.0  # type: ignore[operator]
            tally["max_diff_one_token"] = max(tally["max_diff_one_token"], diff)  # type: ignore[call-overload]
        kept = node_paths[leaves[int(rng.integers(1, len(leaves)))]] if len(leaves) > 1 else first
        more = [int(t) for t in rng.integers(100, 20000, GOES_ON)]
        model.truncate(context)
        model.decode_tree(tokens, parents, context)
        model.keep_tree_path(kept)
        end = context + len(kept)
        after = np.stack([model.decode([t], end + d, 1)[0].copy() for d, t in enumerate(more)])
        reference = one_token_rows(model, context, [*(tokens[j] for j in kept), *more])[len(kept):]
        tally["rows_after_another_path"] += GOES_ON  # type: ignore[operator]
        tally["same_after_another_path"] += int((np.abs(after - reference).max(axis=1) == 0).sum())  # type: ignore[operator]
        model.truncate(context)
    model.truncate(0)
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="40,250,300,900")
    parser.add_argument("--trees", type=int, default=6)
    parser.add_argument("--nodes", default="6:12", help="a random tree's size, MIN:MAX nodes (the trunk included); "
                        "at most the pass rows keeps a padded tree one pass shape (a GPU: docs/gpu.md)")
    parser.add_argument("--settings", default="exact:0,exact:4,fast:0,fast:4,fast:8")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "metal"))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    threads = args.threads or physical_cores()
    try:
        low, high = (int(n) for n in args.nodes.split(":"))
    except ValueError:
        low = high = 0
    if not 2 <= low <= high:
        parser.error(f"--nodes must be MIN:MAX with 2 <= MIN <= MAX, got {args.nodes!r}")
    results = []
    for setting in args.settings.split(","):
        numerics, rows = setting.split(":")
        if numerics not in ("exact", "fast"):
            parser.error(f"numerics must be exact or fast, got {numerics!r}")
        model = LlamaModel(resolve("smollm2-135m"), ContextOptions(n_ctx=2048, n_threads=threads, device=args.device,
                                                                   exact_numerics=numerics == "exact"))
        model.set_pass_rows(int(rows))
        text = model.tokenize(TEXT)
        rng = np.random.default_rng(0)
        for context in (int(c) for c in args.contexts.split(",")):
            tally = measure(model, text[:context], args.trees, rng, (low, high))
            results.append({"numerics": numerics, "pass_rows": int(rows), "context": context, "nodes": [low, high],
                            **tally})
            print(results[-1], flush=True)
        model.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tree_rows.json").write_text(json.dumps({"model": "smollm2-135m", "threads": threads, "device": args.device,
                                                    "machine": machine(), "results": results}, indent=1))
    print(f"wrote {out / 'tree_rows.json'}")


if __name__ == "__main__":
    main()
