"""Current: a tool the manual uses.
Token-mask time per generated token: llguidance against xgrammar, for a JSON schema, at two vocabulary sizes.

49k: the shipped SmolLM2-135M's vocabulary (its GGUF, read through the llama.cpp backend, every token's bytes).
~150k: a synthetic byte-level vocabulary (the 256 bytes plus random multi-byte tokens of letters, digits, spaces and
JSON punctuation), built here, nothing downloaded. Both engines walk the same token sequence of a document that
satisfies the schema: a mask before every token, then the token consumed. Needs `pip install xgrammar` (not a
dependency of edgespec). Prints a table and writes JSON (--out).

    .venv/bin/python benchmarks/constrained_masks.py --out benchmarks/results/constrained_masks.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                "required": ["street", "city"]}},
    "required": ["name", "age", "email", "tags", "address"], "additionalProperties": False}
DOCUMENT = json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
                       "tags": ["mathematics", "poetry", "engines"],
                       "address": {"street": "12 St James's Square", "city": "London"}})


def smollm2_vocab() -> tuple[list[bytes], int, Callable[[str], list[int]]]:
    import edgespec
    engine = edgespec.load("smollm2-135m", n_ctx=512, n_threads=1)  # the shipped GGUF, as it is
    target = engine.target
    tokens = [target.piece(t) or b"\xff" + target.token_text(t) for t in range(target.n_vocab)]
    return tokens, target.eos, lambda text: target.tokenize(text, add_special=False)


def synthetic_vocab(size: int = 150_000, seed: int = 0) -> tuple[list[bytes], int, Callable[[str], list[int]]]:
    """EOS, the 256 bytes, then distinct random tokens of 2-10 characters: what a large byte-level BPE holds."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789      _-.,:\"{}[]"
    tokens = [b"\xff<eos>", *(bytes([b]) for b in range(256))]
    seen = set(tokens)
    while len(tokens) < size:
        t = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 10))).encode()
        if t not in seen:
            seen.add(t)
            tokens.append(t)
    return tokens, 0, lambda text: [1 + b for b in text.encode()]


def llguidance_run(tokens: list[bytes], eos: int, tokenize: Callable[[str], list[int]],
                   sequence: Sequence[int]) -> tuple[float, list[float]]:
    from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

    class Vocabulary:
        eos_token_id, bos_token_id, special_token_ids = eos, None, [eos]

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, text: str) -> list[int]:
            return tokenize(text)

    start = time.perf_counter()
    tokenizer = LLTokenizer(TokenizerWrapper(Vocabulary()), n_vocab=len(tokens), eos_token=eos)
    matcher = LLMatcher(tokenizer, LLMatcher.grammar_from_json_schema(SCHEMA), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    setup = time.perf_counter() - start
    bits = np.zeros((len(tokens) + 31) // 32, dtype=np.int32)
    times = []
    for token in sequence:
        t0 = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        times.append(time.perf_counter() - t0)
        assert matcher.consume_token(token), matcher.get_error()
    return setup, times


def xgrammar_run(tokens: list[bytes], eos: int, sequence: Sequence[int]) -> tuple[float, list[float]]:
    import xgrammar as xgr

    start = time.perf_counter()
    info = xgr.TokenizerInfo(tokens, xgr.VocabType.RAW, vocab_size=len(tokens), stop_token_ids=[eos])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_json_schema(json.dumps(SCHEMA))
    matcher = xgr.GrammarMatcher(compiled)
    setup = time.perf_counter() - start
    bitmask = xgr.allocate_token_bitmask(1, len(tokens))
    times = []
    for token in sequence:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        times.append(time.perf_counter() - t0)
        assert matcher.accept_token(token)
    return setup, times


def summary(setup: float, times: list[float]) -> dict[str, float]:
    us = sorted(t * 1e6 for t in times)
    return {"setup_s": round(setup, 3), "mean_us": round(statistics.fmean(us), 1),
            "median_us": round(statistics.median(us), 1), "p90_us": round(us[int(0.9 * (len(us) - 1))], 1),
            "max_us": round(us[-1], 1), "tokens": len(us)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    results = []
    for name, make in (("smollm2-135m (49k)", smollm2_vocab), ("synthetic byte-level (150k)", synthetic_vocab)):
        tokens, eos, tokenize = make()
        sequence = tokenize(DOCUMENT)
        for engine, (setup, times) in (("llguidance", llguidance_run(tokens, eos, tokenize, sequence)),
                                       ("xgrammar", xgrammar_run(tokens, eos, sequence))):
            results.append({"vocabulary": name, "n_vocab": len(tokens), "engine": engine, **summary(setup, times)})
    header = f"{'vocabulary':<28} {'engine':<11} {'setup s':>8} {'mean µs':>8} {'median':>8} {'p90':>8} {'max':>9}"
    print(header)
    for r in results:
        print(f"{r['vocabulary']:<28} {r['engine']:<11} {r['setup_s']:>8} {r['mean_us']:>8} {r['median_us']:>8} "
              f"{r['p90_us']:>8} {r['max_us']:>9}")
    if args.out:
        import llguidance
        import xgrammar

        meta = {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                "llguidance": llguidance.__version__, "xgrammar": getattr(xgrammar, "__version__", "0.2.9"),
                "note": "2 shared cores, other work running: approximate"}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
