"""How well an exported artefact agrees with its source, and what it costs: one report for every kind.

The comparison needs only "logits for these token sequences" from each side (``LogitsFn``), so a GGUF
through llama.cpp, an ONNX session or a transformers model plug in alike. The sequences are fixed:
Spec-Bench prompts (``prompts.jsonl``, the first question of each category, not tuned) followed by the
source model's own greedy continuation, scored teacher-forced in one batched pass per prompt — so top-1
agreement is measured exactly where the source would have put its tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgespec.engine.engine import Engine
from edgespec.engine.stats import tokens_per_step
from edgespec.errors import InvalidParameterError

if TYPE_CHECKING:  # the CLI imports this module to register its commands: llama.cpp loads only where one runs
    from edgespec.backends.llamacpp.model import LlamaModel

# (tokens, n) → float logits of the last n positions of ``tokens``, shape n × vocabulary.
LogitsFn = Callable[[Sequence[int], int], np.ndarray]

PROMPTS = Path(__file__).with_name("prompts.jsonl")
EVAL_CTX = 2048


@dataclass(frozen=True)
class Sample:
    """A prompt and the source's greedy continuation; the continuation's positions are scored."""

    tokens: list[int]
    n_prompt: int

    @property
    def scored(self) -> list[int]:
        return self.tokens[self.n_prompt:]


@dataclass
class Agreement:
    top1: float  # fraction of scored positions where both argmaxes agree
    kl: float  # mean KL(source ‖ artefact) in nats per position
    positions: int
    # The source's own numerical noise (``source_ties``): positions where the artefact's pick is within ``tie``
    # nats of the source's top-1 count as agreeing in ``top1_decided`` (= ``top1`` when tie is 0).
    tie: float = 0.0
    top1_decided: float = 0.0
    largest_flip: float = 0.0  # nats: the widest gap, in the source's log-probabilities, of a position it lost


@dataclass
class QualityReport:
    prompts: int
    positions: int
    top1_agreement: float
    kl_mean: float
    file_bytes: int
    decode_tokens_per_s: float
    top1_decided: float = 0.0  # top-1 agreement with the source's own near-ties counted as agreeing (the gate's)
    source_tie: float = 0.0  # nats: the source's own noise, ``source_ties``
    # drafts only: speculation against their target
    acceptance: float | None = None  # α: accepted / drafted, at a fixed γ
    tokens_per_step: float | None = None  # τ
    gamma: int | None = None
    cost_ratio: float | None = None  # c: draft / target time per decoded token
    lossless: bool | None = None  # speculative greedy output == target-only output on every prompt

    def to_dict(self) -> dict[str, object]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def line(self) -> str:
        text = (f"top-1 agreement {self.top1_agreement:.3f} ({tie_note(self.top1_decided, self.source_tie)}), "
                f"KL {self.kl_mean:.4f} on {self.positions} tokens of {self.prompts} prompts · "
                f"{self.decode_tokens_per_s:.1f} tok/s decode")
        if self.acceptance is not None:
            text += (f" · α {self.acceptance:.2f}, τ {self.tokens_per_step:.2f} at γ={self.gamma}, "
                     f"c {self.cost_ratio:.2f}, lossless {'yes' if self.lossless else 'NO'}")
        return text


def tie_note(top1_decided: float, tie: float) -> str:
    return f"{top1_decided:.3f} beyond the source's own ties ≤ {tie:.2f} nats"


def prompts(n: int) -> list[str]:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    return [r["prompt"] for r in rows[:n]]


def check_options(n_prompts: int, n_tokens: int) -> None:
    n = len(prompts(1000))
    if not 1 <= n_prompts <= n or n_tokens < 1:
        raise InvalidParameterError(f"the quality report needs 1..{n} prompts and at least one token each, "
                                    f"got {n_prompts} prompts × {n_tokens} tokens")


def open_model(path: Path, n_threads: int | None = None, exact_numerics: bool = True) -> LlamaModel:
    from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel
    return LlamaModel(path, ContextOptions(n_ctx=EVAL_CTX, n_batch=512, n_threads=n_threads,
                                           exact_numerics=exact_numerics))


def calibration(source: LlamaModel, n_prompts: int = 4, n_tokens: int = 32) -> list[Sample]:
    """The source's greedy continuations of the first ``n_prompts`` fixed prompts."""
    check_options(n_prompts, n_tokens)
    engine = Engine(source, mode="none", gamma=0)
    samples = []
    for text in prompts(n_prompts):
        tokens = engine.user_prompt(text)
        out = engine.generate(tokens, max_tokens=n_tokens, mode="none")
        if out.tokens:
            samples.append(Sample(tokens + out.tokens, len(tokens)))
    return samples


def llama_logits(model: LlamaModel) -> LogitsFn:
    def logits(tokens: Sequence[int], n: int) -> np.ndarray:
        model.truncate(0)
        return model.decode(list(tokens), 0, n).copy()

    return logits


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def agreement(pairs: Iterable[tuple[np.ndarray, np.ndarray]], tie: float = 0.0) -> Agreement:
    """Top-1 agreement and mean KL(reference ‖ candidate) over the rows of (reference, candidate) logit pairs;
    ``top1_decided`` also counts a candidate's pick whose reference log-probability is within ``tie`` of the top."""
    agree, decided, kl, n, largest = 0, 0, 0.0, 0, 0.0
    for ref, cand in pairs:
        top, pick = ref.argmax(-1), cand.argmax(-1)
        lp, lq = _log_softmax(ref), _log_softmax(cand)
        rows = np.arange(len(top))
        gap = lp[rows, top] - lp[rows, pick]  # 0 where the two agree
        agree += int((top == pick).sum())
        decided += int((gap <= tie).sum())
        largest = max(largest, float(gap.max(initial=0.0)))
        kl += float((np.exp(lp) * (lp - lq)).sum())
        n += ref.shape[0]
    if not n:
        return Agreement(0.0, 0.0, 0, tie, 0.0)
    # Rounding can make the KL of identical distributions a hair negative.
    return Agreement(agree / n, max(kl / n, 0.0), n, tie, decided / n, largest)


def scored_logits(model: LogitsFn, samples: Sequence[Sample]) -> list[np.ndarray]:
    """A model's logits at every scored position of the samples (rows n_prompt−1 … end−1 predict them)."""
    return [model(s.tokens[:-1], len(s.scored)) for s in samples]


def compare(reference: Sequence[np.ndarray], candidate: LogitsFn, samples: Sequence[Sample],
            tie: float = 0.0) -> Agreement:
    """Top-1 agreement and KL of ``candidate`` against the reference's ``scored_logits`` on ``samples``."""
    return agreement(zip(reference, scored_logits(candidate, samples), strict=True), tie)


def source_ties(source: Path, samples: Sequence[Sample], reference: Sequence[np.ndarray],
                n_threads: int | None = None) -> float:
    """How far apart two tokens can be in the source's log-probabilities and still swap places under its own
    numerics: the widest gap at which llama.cpp's stock configuration of the same file (F16 KV cache, flash
    attention) picks another top-1 than its exact one (``reference``: the exact one's ``scored_logits``).

    Why: a top-1 flip between near-ties is rounding, not quality. Measured on SmolLM2's shipped Q4_1 (12 fixed
    prompts, 373 positions): its stock configuration agrees with its exact one on 0.976 of top-1 tokens (flips at
    gaps up to 0.27 nats, KL 0.003), so a raw 0.99 bar would refuse the shipped file as llama.cpp runs it."""
    stock = open_model(source, n_threads, exact_numerics=False)
    try:
        return compare(reference, llama_logits(stock), samples).largest_flip
    finally:
        stock.close()


def greedy_agreement(candidate: LogitsFn, samples: Sequence[Sample]) -> float:
    """Top-1 agreement with the source's own greedy tokens (what a draft must predict), without the source's
    logits: the scored tokens are the source's argmaxes."""
    agree = n = 0
    for s in samples:
        k = len(s.scored)
        agree += int((candidate(s.tokens[:-1], k).argmax(-1) == np.asarray(s.scored)).sum())
        n += k
    return agree / n if n else 0.0


def seconds_per_token(model: LlamaModel, n_tokens: int = 16) -> float:
    """Median time of one single-token decode after a short prompt: the draft/target cost ratio's unit."""
    tokens = model.tokenize(prompts(1)[0])
    model.truncate(0)
    logits = model.decode(tokens, 0, 1)
    times = []
    for i in range(n_tokens):
        start = time.perf_counter()
        logits = model.decode([int(logits[0].argmax())], len(tokens) + i, 1)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def cost_ratio(draft: LlamaModel, target: LlamaModel, rounds: int = 3) -> float:
    """c = draft / target time per decoded token; interleaved rounds, the fastest of each, so that load from
    other processes on a shared machine hits both sides alike."""
    d, t = [], []
    for _ in range(rounds):
        d.append(seconds_per_token(draft))
        t.append(seconds_per_token(target))
    return min(d) / min(t)


def decode_speed(model: LlamaModel, n_tokens: int = 64) -> float:
    """Plain (target-only) greedy decode tokens/s on the first fixed prompt."""
    engine = Engine(model, mode="none", gamma=0)
    out = engine.generate(engine.user_prompt(prompts(1)[0]), max_tokens=n_tokens, mode="none")
    return out.stats.decode_tokens_per_s


def speculation(target: LlamaModel, draft: LlamaModel, texts: Sequence[str], max_tokens: int,
                gamma: int = 4) -> tuple[float, float, bool]:
    """α and τ of ``draft`` drafting for ``target`` at a fixed γ, and whether every output was lossless."""
    engine = Engine(target, draft, mode="draft", gamma=gamma)
    drafted = accepted = steps = 0
    lossless = True
    for text in texts:
        tokens = engine.user_prompt(text)
        spec = engine.generate(tokens, max_tokens=max_tokens)
        plain = engine.generate(tokens, max_tokens=max_tokens, mode="none")
        lossless &= spec.tokens == plain.tokens
        s = spec.stats
        drafted, accepted = drafted + s.drafted, accepted + s.accepted
        steps += s.steps
    return accepted / drafted if drafted else 0.0, tokens_per_step(accepted, steps), lossless


def report(artefact: Path, source: Path, n_prompts: int = 4, n_tokens: int = 32, draft_of: Path | None = None,
           n_threads: int | None = None, progress: Callable[[str], None] = lambda _: None) -> QualityReport:
    """The quality report of a GGUF artefact against its source (and, for a draft, against ``draft_of``,
    its target, which is usually also the source)."""
    src = open_model(source, n_threads)
    art = open_model(artefact, n_threads)
    try:
        progress("calibration: the source's greedy continuations")
        samples = calibration(src, n_prompts, n_tokens)
        progress("agreement with the source")
        reference = scored_logits(llama_logits(src), samples)
        agreement = compare(reference, llama_logits(art), samples, source_ties(source, samples, reference, n_threads))
        progress("decode speed")
        result = QualityReport(len(samples), agreement.positions, agreement.top1, agreement.kl,
                               artefact.stat().st_size, decode_speed(art, max(32, n_tokens)),
                               agreement.top1_decided, agreement.tie)
        if draft_of is not None:
            target = src if draft_of == source else open_model(draft_of, n_threads)
            progress("acceptance against the target")
            result.gamma = 4
            result.acceptance, result.tokens_per_step, result.lossless = speculation(
                target, art, prompts(n_prompts), n_tokens, result.gamma)
            result.cost_ratio = cost_ratio(art, target)
            if target is not src:
                target.close()
        return result
    finally:
        art.close()
        src.close()
