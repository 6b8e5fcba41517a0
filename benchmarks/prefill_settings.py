"""Historical: a one-off probe, kept to reproduce a past finding.
Kept for: the measurement behind the llama.cpp context settings edgespec prefills with.
Prefill time of llama.cpp context settings side by side in one process, and whether they stay exact.

    python benchmarks/prefill_settings.py [MODEL] --questions FILE [--lengths 300,1200,2000] [--rounds 3] [--threads N]

Every setting is a context on the same loaded model; each round prefills every length with every setting in
turn, and the fastest round counts (the machine's drift hits all alike). Beside the times: the largest
difference of the last position's logits from the first setting's, and from the same position decoded alone
after the rest (0 = bit-identical, what greedy losslessness needs). Settings: edgespec's (n_batch = n_ubatch =
512, F32 KV, flash attention off), other micro-batch sizes, and llama-cpp-python's default F16 KV for reference.
Run it on a quiet machine: on a loaded one every extra micro-batch pays extra thread hand-offs.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as lc
import numpy as np

from edgespec.backends.llamacpp.model import physical_cores, split_batches
from edgespec.catalog.models import resolve


@dataclass(frozen=True)
class Setting:
    name: str
    n_batch: int = 512
    n_ubatch: int = 512
    f32_kv: bool = True  # exact numerics; False: llama.cpp's default F16 KV cache


SETTINGS = (Setting("edgespec (b512 ub512)"), Setting("ub256", 512, 256), Setting("b1024 ub1024", 1024, 1024),
            Setting("b2048 ub2048", 2048, 2048), Setting("F16 KV (llama-cpp-python)", f32_kv=False))


class Context:
    def __init__(self, model: object, setting: Setting, threads: int, n_vocab: int) -> None:
        self.setting, self.n_vocab = setting, n_vocab
        params = lc.llama_context_default_params()
        params.n_ctx = 4096
        params.n_batch, params.n_ubatch = setting.n_batch, setting.n_ubatch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        if setting.f32_kv:
            params.type_k = params.type_v = lc.GGML_TYPE_F32
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = lc.llama_init_from_model(model, params)
        self.memory = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(setting.n_batch, 0, 1)

    def decode(self, tokens: list[int], start: int) -> np.ndarray:
        """Decode as edgespec does (its split: the last run holds the final n_batch tokens); the last row's logits."""
        batch = self.batch
        for lo, hi in split_batches(len(tokens), self.setting.n_batch):
            batch.n_tokens = hi - lo
            for i, j in enumerate(range(lo, hi)):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tokens[j], start + j, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = j == len(tokens) - 1
            if lc.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError(f"llama_decode failed ({self.setting.name})")
        row = lc.llama_get_logits_ith(self.ctx, hi - lo - 1)
        return np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy()

    def prefill(self, tokens: list[int]) -> tuple[float, np.ndarray]:
        lc.llama_memory_seq_rm(self.memory, 0, 0, -1)
        start = time.perf_counter()
        logits = self.decode(tokens, 0)
        return time.perf_counter() - start, logits

    def last_alone(self, tokens: list[int]) -> np.ndarray:
        lc.llama_memory_seq_rm(self.memory, 0, 0, -1)
        self.decode(tokens[:-1], 0)
        return self.decode(tokens[-1:], len(tokens) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--questions", type=Path, required=True, help="Spec-Bench's question.jsonl")
    parser.add_argument("--lengths", default="300,1200,2000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=physical_cores())
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]

    model_params = lc.llama_model_default_params()
    model_params.use_extra_bufts = False  # as edgespec loads it
    model = lc.llama_model_load_from_file(str(resolve(args.model)).encode(), model_params)
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    text = " ".join(json.loads(line)["turns"][0] for line in args.questions.read_text().splitlines() if line)
    data = text.encode()
    buf = (lc.llama_token * len(data))()
    tokens = list(buf[:lc.llama_tokenize(vocab, data, len(data), buf, len(data), True, False)])
    if max(lengths) > min(len(tokens), 4095):
        parser.error(f"lengths up to {min(len(tokens), 4095)} tokens")

    contexts = [Context(model, s, args.threads, n_vocab) for s in SETTINGS]
    best = {(c.setting.name, n): float("inf") for c in contexts for n in lengths}
    last: dict[tuple[str, int], np.ndarray] = {}
    for _ in range(args.rounds):
        for n in lengths:
            for c in contexts:
                seconds, last[c.setting.name, n] = c.prefill(tokens[:n])
                best[c.setting.name, n] = min(best[c.setting.name, n], seconds)
    first = SETTINGS[0].name
    print(f"{'setting':<28}" + "".join(f"{f'{n} tok s':>12}" for n in lengths) + "   × first setting"
          + "   max |Δ logits| vs first / vs alone")
    for c in contexts:
        name = c.setting.name
        diffs = [f"{np.abs(last[name, n] - last[first, n]).max():.3g}/"
                 f"{np.abs(last[name, n] - c.last_alone(tokens[:n])).max():.3g}" for n in lengths]
        print(f"{name:<28}" + "".join(f"{best[name, n]:>12.3f}" for n in lengths) + "   "
              + " ".join(f"{best[name, n] / best[first, n]:.2f}" for n in lengths) + "   " + " ".join(diffs))


if __name__ == "__main__":
    main()
