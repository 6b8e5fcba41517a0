"""Passes of several row counts taking turns at a fixed context: how the benchmarks that time one target pass by its
rows (benchmarks/pass_profile.py, benchmarks/kernels_in_model.py) feed their models, so the shared machine's load
falls on every row count (and every model) alike."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ..backends.base import Backend


def passes_taking_turns(models: Sequence[Backend], context: int, rows: Sequence[int], rounds: int,
                        seed: int = 0) -> Iterator[tuple[int, list[int], int, list[int]]]:
    """Every model decodes the same ``context`` random tokens; then per round and row count k this yields
    (k, tokens, start, order): the caller runs each model, in ``order`` (indices, turned around every round), on the
    k tokens at ``start``. Afterwards each keeps one token, as a verify that accepts nothing; a round that would
    not fit in the cache starts again at ``context``."""
    rng = np.random.default_rng(seed)
    vocab = min(model.n_vocab for model in models)

    def tokens(n: int) -> list[int]:
        return [int(t) for t in rng.integers(1000, vocab, n)]

    prompt = tokens(context)
    for model in models:
        model.decode(prompt, 0, 1)
    end, n_ctx = context, min(model.n_ctx for model in models)
    for r in range(rounds):
        if end + len(rows) - 1 + max(rows) > n_ctx:  # the round's last pass would not fit
            for model in models:
                model.truncate(context)
            end = context
        order = list(range(len(models)))[:: 1 if r % 2 == 0 else -1]
        for k in rows:
            yield k, tokens(k), end, order
            for model in models:
                model.truncate(end + 1)
            end += 1


def add_pass_arguments(parser: argparse.ArgumentParser, context: int, rows: str, out: str) -> None:
    """The options those benchmarks share: the export, the context, the row counts, threads, the output folder."""
    parser.add_argument("--model", default=None, help="an ONNX export (default: what this machine's race chose)")
    parser.add_argument("--context", type=int, default=context, help="tokens in the cache before the passes")
    parser.add_argument("--rows", default=rows, help="row counts, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("."), help=f"folder for {out}")
