"""Are llama.cpp's rows for a token tree what one-token decoding of each node's path gives? Per numerics setting.

    python benchmarks/tree_rows.py [--contexts 40,300,900] [--trees 6] [--numerics exact,f32-fa] [--threads 2]
                                   [--out DIR]

A token tree verified in one llama.cpp batch (one sequence per root-to-leaf path, each node tagged with the
sequences of the leaves below it: what LlamaModel.decode_tree does) puts node i in the KV cell after node i - 1,
whatever its depth; sequential decoding puts the token at depth d in cell start + d. So only the tree's first root
path sits where sequential decoding would put it. This compares every tree row (SmolLM2-135M as shipped, random
trees of 6-12 nodes after a real text) with (a) one-token decoding of its path, and (b) its path decoded as one
chain pass of at least two rows, for

- ``exact``: F32 KV cache, flash attention off (LlamaModel's exact numerics: batch-invariant chains);
- ``f32-fa``: F32 KV cache, flash attention on. The CPU kernel then walks each row's visible cells in order and
  skips the masked ones, so where a cell sits cannot matter; but one-token passes over ≥ 512 cells take another
  path (KV split across threads), so only passes of 2..63 rows are comparable with each other.

Counts bit-identical rows (max |diff| = 0) per comparison and writes tree_rows.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import llama_cpp as lc
import numpy as np

from edgespec.cpu import physical_cores
from edgespec.models import resolve

TEXT = ("Speculative decoding lets a cheap drafter propose several tokens that the target model then verifies in a "
        "single batched forward pass, and the output stays the same. ") * 40
SETTINGS = {"exact": False, "f32-fa": True}  # flash attention on?
PAD = 13  # a filler token after a one-node path, so that no pass is a single row


@lc.llama_log_callback
def _quiet(level: int, text: bytes, user: object) -> None:
    """llama.cpp prints hundreds of lines per context."""


class Context:
    def __init__(self, model: lc.llama_model_p, flash: bool, threads: int) -> None:
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = 2048, 512, 512
        params.n_seq_max, params.kv_unified = 17, True
        params.n_threads = params.n_threads_batch = threads
        params.type_k = params.type_v = lc.GGML_TYPE_F32
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = lc.llama_init_from_model(model, params)
        self.memory = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(512, 0, 17)
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))

    def decode(self, tokens: list[int], positions: list[int], seqs: list[list[int]], rows: bool) -> np.ndarray:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, (t, p, s) in enumerate(zip(tokens, positions, seqs, strict=True)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p, len(s), rows
            for j, seq in enumerate(s):
                b.seq_id[i][j] = seq
        if lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        n = len(tokens) if rows else 0
        return np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()
                         for i in range(n)]) if n else np.empty(0)

    def prefill(self, prefix: list[int]) -> None:
        lc.llama_memory_clear(self.memory, True)
        for start in range(0, len(prefix), 512):  # the batch holds 512 tokens
            chunk = prefix[start:start + 512]
            self.decode(chunk, list(range(start, start + len(chunk))), [[0]] * len(chunk), False)

    def truncate(self, n: int) -> None:
        """Back to the first n cells of sequence 0, as after their prefill (the next cell used is cell n)."""
        for seq in range(1, 17):
            lc.llama_memory_seq_rm(self.memory, seq, -1, -1)
        lc.llama_memory_seq_rm(self.memory, 0, n, -1)


def paths(parents: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i, p in enumerate(parents):
        out.append([*(out[p] if p >= 0 else []), i])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="40,300,900")
    parser.add_argument("--trees", type=int, default=6)
    parser.add_argument("--numerics", default=",".join(SETTINGS), help="settings to compare (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    lc.llama_log_set(_quiet, None)
    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers, mparams.use_extra_bufts = 0, False
    model = lc.llama_model_load_from_file(str(resolve("smollm2-135m")).encode(), mparams)
    vocab = lc.llama_model_get_vocab(model)
    data = TEXT.encode()
    buf = (lc.llama_token * len(data))()
    text = list(buf[:lc.llama_tokenize(vocab, data, len(data), buf, len(data), True, False)])
    rng = np.random.default_rng(0)
    results = []
    for name in args.numerics.split(","):
        flash = SETTINGS[name]
        tree_ctx, ref_ctx = (Context(model, flash, args.threads or physical_cores()) for _ in range(2))
        for context in (int(c) for c in args.contexts.split(",")):
            tally = {"rows": 0, "first_path_rows": 0, "same_as_one_token": 0, "first_path_same_as_one_token": 0,
                     "same_as_chain_pass": 0, "max_diff_one_token": 0.0}
            prefix = text[:context]
            tree_ctx.prefill(prefix)
            ref_ctx.prefill(prefix)
            for _ in range(args.trees):
                n = int(rng.integers(6, 13))
                parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
                tokens = [int(t) for t in rng.integers(100, 20000, n)]
                leaves = [i for i in range(n) if i not in set(parents)]
                node_paths = paths(parents)
                seqs = [[1 + k for k, leaf in enumerate(leaves) if i in node_paths[leaf]] for i in range(n)]
                tree_ctx.truncate(context)
                for s in range(1, len(leaves) + 1):
                    lc.llama_memory_seq_cp(tree_ctx.memory, 0, s, -1, -1)
                rows = tree_ctx.decode(tokens, [context + len(p) - 1 for p in node_paths], seqs, True)
                first = node_paths[leaves[0]]
                for i, path in enumerate(node_paths):
                    ref_ctx.truncate(context)
                    for d, j in enumerate(path):
                        alone = ref_ctx.decode([tokens[j]], [context + d], [[0]], True)[0]
                    ref_ctx.truncate(context)
                    chain = [tokens[j] for j in path] + [PAD]
                    chained = ref_ctx.decode(chain, list(range(context, context + len(chain))), [[0]] * len(chain),
                                             True)[len(path) - 1]
                    diff = float(np.abs(rows[i] - alone).max())
                    on_first = path == first[:len(path)]
                    tally["rows"] += 1
                    tally["first_path_rows"] += on_first
                    tally["same_as_one_token"] += diff == 0.0
                    tally["first_path_same_as_one_token"] += on_first and diff == 0.0
                    tally["same_as_chain_pass"] += bool(np.array_equal(rows[i], chained))
                    tally["max_diff_one_token"] = max(tally["max_diff_one_token"], diff)
            results.append({"numerics": name, "context": context, **tally})
            print(results[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tree_rows.json").write_text(json.dumps({"model": "smollm2-135m", "results": results}, indent=1))
    print(f"wrote {out / 'tree_rows.json'}")


if __name__ == "__main__":
    main()
