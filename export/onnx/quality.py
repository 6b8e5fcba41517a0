"""Quality of an ONNX export against its source: teacher-forced top-1 agreement and KL(source ‖ export) on
the fixed text every export's quality gate uses (``quality.py``: the fixed prompts followed by the source's own
greedy continuation, the continuation's positions scored), file size, and single-token decode speed of the
reference runner.

The source is what the export was made from: llama.cpp on the GGUF file (its own kernels and tokenizer, no
torch), or the transformers model on the Hugging Face folder (FP32); prompts are chat-formatted when the model
has a template. Prompt positions are not scored: predicting a user's text is full of near-ties, where even
llama.cpp's Q8_0 and Q4_1 of SmolLM2 agree on only 0.96 of top-1 tokens (0.99 on the continuation).
"""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path

import numpy as np

from .. import require
from ..quality import Sample, agreement, calibration, llama_logits, open_model, prompts, scored_logits, source_ties
from .reference import OnnxReference


@cache
def _tokenized(hf_folder: str, count: int, max_tokens: int) -> tuple[tuple[int, ...], ...]:
    tokenizer = require("transformers", "export-hf").AutoTokenizer.from_pretrained(hf_folder)
    out = []
    for text in prompts(count):  # the fixed Spec-Bench prompts every quality report uses
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
        else:
            ids = tokenizer(text)["input_ids"]
        out.append(tuple(int(t) for t in ids[:max_tokens]))
    return tuple(out)


def source_logits(hf_folder: str, count: int = 6, max_tokens: int = 128) -> tuple[np.ndarray, ...]:
    """The transformers model's FP32 logits for each prompt (computed once per process)."""
    return _source_logits(str(hf_folder), count, max_tokens)


@cache
def _source_logits(hf_folder: str, count: int, max_tokens: int) -> tuple[np.ndarray, ...]:
    torch = require("torch", "export-hf")
    transformers = require("transformers", "export-hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return tuple(model(torch.tensor([ids])).logits[0].float().numpy()
                     for ids in _tokenized(hf_folder, count, max_tokens))


@cache
def gguf_samples(gguf: str, n_prompts: int, n_tokens: int,
                 threads: int | None = None) -> tuple[tuple[Sample, ...], tuple[np.ndarray, ...], float]:
    """The fixed text for a GGUF source (llama.cpp's greedy continuations), llama.cpp's logits on it, and the
    source's own near-tie noise on it (``quality.source_ties``)."""
    model = open_model(Path(gguf), threads)
    try:
        samples = tuple(calibration(model, n_prompts, n_tokens))
        logits = tuple(scored_logits(llama_logits(model), samples))
    finally:
        model.close()
    return samples, logits, source_ties(Path(gguf), samples, logits, threads)


@cache
def hf_samples(hf_folder: str, n_prompts: int, n_tokens: int) -> tuple[tuple[Sample, ...], tuple[np.ndarray, ...]]:
    """The fixed text for a Hugging Face source (the FP32 model's greedy continuations) and its logits on it."""
    torch = require("torch", "export-hf")
    model = require("transformers", "export-hf").AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32)
    model.eval()
    samples, logits = [], []
    with torch.no_grad():
        for ids in _tokenized(hf_folder, n_prompts, 1 << 20):
            out = model.generate(torch.tensor([ids]), max_new_tokens=n_tokens, do_sample=False)[0].tolist()
            if len(out) > len(ids):
                samples.append(Sample(out, len(ids)))
                logits.append(model(torch.tensor([out[:-1]])).logits[0, len(ids) - 1:].float().numpy())
    return tuple(samples), tuple(logits)


def compare(reference: list[np.ndarray], candidate: list[np.ndarray], tie: float = 0.0) -> dict[str, float]:
    """Top-1 agreement (raw, and beyond the source's own ties ≤ ``tie`` nats: the gate's) and mean
    KL(reference ‖ candidate) over all positions, as the manifest records them."""
    a = agreement(zip(reference, candidate, strict=True), tie)
    return {"top1_agreement": round(a.top1, 4), "top1_decided": round(a.top1_decided, 4),
            "source_tie": round(a.tie, 4), "kl": round(a.kl, 6), "positions": a.positions}


def export_logits(folder: Path, hf_folder: str, count: int = 6, max_tokens: int = 128) -> list[np.ndarray]:
    """The export's logits at every position of the prompts ``source_logits`` scores."""
    runner = OnnxReference(folder)
    return [runner.logits(list(ids)) for ids in _tokenized(hf_folder, count, max_tokens)]


def decode_speed(runner: OnnxReference, tokens: int = 32) -> float:
    """Single-token decode tokens/s after a short prompt (reference runner, in-place KV, 1 thread)."""
    runner.logits([1] * 16)
    start = time.perf_counter()
    token = 1
    for _ in range(tokens):
        token = int(runner.forward([token])[-1].argmax())
    return tokens / (time.perf_counter() - start)


def quality_report(folder: Path, n_prompts: int = 4, n_tokens: int = 32, progress: bool = True,
                   threads: int | None = None) -> dict:
    """The ``quality`` entry of the manifest: agreement with the source, size, decode speed. ``threads``: the
    llama.cpp source's (default: physical cores)."""
    source = json.loads((folder / "edgespec-onnx.json").read_text())["source"]
    with require("tqdm").tqdm(total=3, desc="quality", unit="step", disable=not progress) as bar:
        if "gguf" in source:
            samples, reference, tie = gguf_samples(source["gguf"], n_prompts, n_tokens, threads)
            against = "llama.cpp on " + source["gguf"]
        else:  # transformers FP32 has one numerics: no ties measured
            (samples, reference), tie = hf_samples(source["hf_folder"], n_prompts, n_tokens), 0.0
            against = "transformers FP32 on " + source["hf_folder"]
        bar.update()
        runner = OnnxReference(folder)
        report = compare(list(reference), [runner.logits(s.tokens[:-1])[-len(s.scored):] for s in samples], tie)
        bar.update()
        report.update(against=against, prompts=n_prompts,
                      size_bytes=sum(f.stat().st_size for f in folder.glob("*.onnx")),
                      decode_tok_s=round(decode_speed(runner), 1), threads=1)
        bar.update()
    return report
