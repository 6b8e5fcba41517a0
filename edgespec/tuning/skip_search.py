"""Searching for the layers the self-draft skips (SWIFT / Draft & Verify style; `edgespec calibrate-skip`).

The search runs on the model's own greedy generations: the full model generates a continuation of each
calibration prompt once; then a candidate skip set is scored by *teacher-forced agreement*, the share of
generated positions where the model without those layers picks the same token, computed in ONE batched pass
over the generated text per candidate (per-layer sessions make any subset a plain chain of sessions). The
estimate is pessimistic: in use the draft reads the target's KV for every committed position, here it reads
its own for the generated part.

A set is worth what it is expected to speed up decoding: with per-token acceptance α, draft/target cost
ratio c (from measured per-layer times) and the verify-cost curve v(k) = cost(k tokens)/cost(1),
γ draft tokens give E[tokens] = (1 − α^(γ+1)) / (1 − α) per step for γ·c + v(γ+1) target-pass times.
The search is greedy: layers are ranked by how little skipping each alone changes the output, then added
one at a time (trying the few best-ranked each round) while the expected speed-up improves.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..backends.onnx.manifest import MANIFEST
from ..backends.onnx.model import OnnxModel
from ..controller.cost import MAX_GAMMA, CostCurve, expected_step
from ..errors import EdgespecError
from ..files import write_text
from .prompts import SEARCH_PROMPTS

MIN_AGREEMENT = 0.3  # below this a draft is not worth searching further


@dataclass
class SkipSearchResult:
    skip: list[int]
    agreement: float  # teacher-forced top-1 agreement with the full model
    cost_ratio: float  # draft pass / target pass, from measured per-layer times
    expected_speedup: float  # of layer-skip speculation at its best γ, vs the target alone
    gamma: int
    tried: list[dict] = field(default_factory=list)  # every candidate scored, in search order

    def manifest_entry(self) -> dict:
        entry = asdict(self)
        entry.pop("tried")
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in entry.items()}


def expected_speedup(alpha: float, cost_ratio: float, verify: np.ndarray) -> tuple[float, int]:
    """Best (speed-up, γ) for per-token acceptance ``alpha``; ``verify[k]`` = cost(k tokens) / cost(1)."""
    tokens, seconds = expected_step(np.full(MAX_GAMMA, alpha), verify, 1.0, cost_ratio, 0.0,
                                    min(MAX_GAMMA, len(verify) - 2))  # in target passes
    speedups = [1.0, *(t / s for t, s in zip(tokens[1:], seconds[1:], strict=True))]  # γ = 0: the target alone
    gamma = max(range(len(speedups)), key=speedups.__getitem__)  # the first best: γ = 0 unless some γ beats it
    return speedups[gamma], gamma


class _Scorer:
    """Teacher-forced agreement of a layer subset with the full model on fixed generations."""

    def __init__(self, model: OnnxModel, prompts: Sequence[Sequence[int]], n_tokens: int) -> None:
        if model.kv_array is None:
            raise EdgespecError("calibration runs on the CPU (it snapshots the KV arena)")
        self.model = model
        # Per run: the sequence, the prompt's length, the full model's tokens, the full model's prompt KV.
        self.runs: list[tuple[list[int], int, np.ndarray, np.ndarray]] = []
        for prompt in prompts:
            seq = list(prompt)
            model.truncate(0)
            logits = model.decode(seq, 0, 1)
            for _ in range(n_tokens):
                token = int(logits[0].argmax())
                if model.is_eog(token):
                    break
                seq.append(token)
                logits = model.decode([token], len(seq) - 1, 1)
            if len(seq) > len(prompt) + 1:
                n = len(prompt)
                self.runs.append((seq, n, np.array(seq[n:]), model.kv_array[..., :n, :].copy()))
        model.truncate(0)
        if not self.runs:
            raise EdgespecError("calibration: the model generated nothing for any prompt")
        self.positions = sum(len(run[2]) for run in self.runs)

    def agreement(self, skip: set[int]) -> float:
        layers = [i for i in range(self.model.n_layer) if i not in skip]
        agree = 0
        kv = self.model.kv_array
        for seq, n_prompt, expected, prompt_kv in self.runs:
            # The prompt's KV is the full model's (restored: other runs and candidates overwrote it); the draft
            # computes the last prompt token and the generated text, whose rows predict the generated tokens.
            kv[..., :n_prompt, :] = prompt_kv
            logits = self.model.forward(layers, seq[n_prompt - 1:-1], n_prompt - 1, len(expected))
            agree += int((logits.argmax(axis=1) == expected).sum())
        return agree / self.positions


def measure_costs(model: OnnxModel, position: int = 256, repeats: int = 9) -> tuple[float, np.ndarray, np.ndarray]:
    """(seconds of embed + head, seconds per layer, verify curve v[k] = cost(k) / cost(1)) for one token.

    Layers are timed inside full passes (each session call clocked), the rest is the pass minus them.
    """
    token = [model.bos if model.bos >= 0 else 0]
    all_layers = range(model.n_layer)
    clocks = np.zeros((repeats, model.n_layer))
    passes = []
    for r in range(repeats):
        t = time.perf_counter()
        model.forward(all_layers, token, position, 1, clock=clocks[r])
        passes.append(time.perf_counter() - t)
    per_layer = np.median(clocks, axis=0)
    full = float(np.median(passes))
    base = max(full - float(per_layer.sum()), 0.0)
    # The verify curve, measured as the engine measures it (k values interleaved over rounds).
    verify = CostCurve.measure(lambda k: model.forward(all_layers, token * k, position, k)).shape
    return base, per_layer, verify


def search_skip_set(model: OnnxModel, prompts: Sequence[Sequence[int]] | None = None, n_tokens: int = 48,
                    candidates_per_round: int = 4, max_skip: int | None = None) -> SkipSearchResult:
    """Search the skip set that maximises the expected speed-up of layer-skip self-speculation.

    ``model`` must be loaded with ``fuse_layers=False``: candidates are arbitrary layer subsets.
    """
    if model.options.fuse_layers:
        raise EdgespecError("skip-set calibration runs any layer subset: load the model with fuse_layers=False")
    if prompts is None:
        prompts = [_chat_prompt(model, text) for text in SEARCH_PROMPTS]
    scorer = _Scorer(model, prompts, n_tokens)
    base, per_layer, verify = measure_costs(model)
    total = base + per_layer.sum()
    max_skip = model.n_layer - 1 if max_skip is None else min(max_skip, model.n_layer - 1)
    tried: list[dict] = []

    def score(skip: set[int]) -> tuple[float, float, float, int]:
        alpha = scorer.agreement(skip)
        c = (total - per_layer[list(skip)].sum()) / total
        speedup, gamma = expected_speedup(alpha, c, verify)
        tried.append({"skip": sorted(skip), "agreement": round(alpha, 4), "cost_ratio": round(c, 4),
                      "expected_speedup": round(speedup, 4)})
        return speedup, alpha, c, gamma

    # Rank layers by the agreement left when each is skipped alone (the first and last layers rank low).
    single = {i: score({i})[1] for i in range(model.n_layer)}
    ranked = sorted(single, key=lambda i: -single[i])
    skip: set[int] = set()
    best = (1.0, 1.0, 1.0, 0, set())  # the target alone
    # Keep adding layers while the draft still agrees often enough to ever pay: a draft that costs nearly
    # a full pass cannot win at any acceptance, so the expected speed-up stays flat at first.
    while len(skip) < max_skip:
        options = [i for i in ranked if i not in skip][:candidates_per_round]
        scored = [(score(skip | {i}), i) for i in options]
        (speedup, alpha, c, gamma), layer = max(scored, key=lambda s: (s[0][1], s[0][0]))
        skip = skip | {layer}
        if speedup > best[0]:
            best = (speedup, alpha, c, gamma, set(skip))
        if alpha < MIN_AGREEMENT:
            break
    speedup, alpha, c, gamma, chosen = best
    if not chosen:  # nothing pays: keep the single most harmless layer so the draft still exists
        chosen = {ranked[0]}
        speedup, alpha, c, gamma = score(chosen)
    model.truncate(0)
    return SkipSearchResult(sorted(chosen), alpha, c, speedup, gamma, tried)


def _chat_prompt(model: OnnxModel, text: str) -> list[int]:
    from ..engine.chat import ChatTemplate

    template = model.chat_template
    if not template:
        return model.tokenize(text)
    bos, eos = (model.token_text(t).decode("utf-8", "replace") for t in (model.bos, model.eos))
    return model.tokenize(ChatTemplate(template, bos, eos).render([{"role": "user", "content": text}]),
                          add_special=False, parse_special=True)


def save_to_manifest(folder: str | os.PathLike[str], result: SkipSearchResult) -> Path:
    """Store the chosen set as the manifest's ``layer_skip`` entry (the runtime's default skip set)."""
    path = Path(folder) / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["layer_skip"] = result.manifest_entry()
    write_text(path, json.dumps(manifest, indent=2) + "\n")
    return path


def search_and_store(folder: str | os.PathLike[str], n_threads: int | None = None, n_tokens: int = 48,
                     save: bool = True) -> SkipSearchResult:
    """Search the skip set of the ONNX model in ``folder`` and (by default) store it in its manifest."""
    from ..backends.onnx.model import OnnxOptions

    # Per-layer sessions: candidates are arbitrary subsets, and each layer's time is clocked.
    model = OnnxModel(folder, OnnxOptions(n_ctx=2048, n_threads=n_threads, fuse_layers=False))
    try:
        result = search_skip_set(model, n_tokens=n_tokens)
    finally:
        model.close()
    if save:
        save_to_manifest(model.path, result)
    return result
