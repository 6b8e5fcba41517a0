"""Quality of an ONNX export against its source: teacher-forced top-1 agreement and KL(source ‖ export) on a
fixed set of Spec-Bench prompts, file size, and single-token decode speed of the reference runner.

The source is the transformers model on the Hugging Face folder the export was made from (FP32). Prompts are
the first question of each Spec-Bench category in file order, chat-formatted when the model has a template.
"""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path

import numpy as np

from . import require
from .onnx_reference import OnnxReference

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "spec_bench" / "question.jsonl"
# Used where the Spec-Bench file is not on disk (an installed package): fixed, one per Spec-Bench category.
FALLBACK_PROMPTS = (
    "Draft a professional email asking your supervisor for feedback on a quarterly report.",
    "Which is larger, 3/7 or 5/11? Explain step by step.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Summarize the causes of the French Revolution in three sentences.",
    "Translate into German: The weather is nice today, let us go for a walk.",
    "Who wrote the novel 'Pride and Prejudice', and when was it published?",
)


def prompts(count: int = 6) -> list[str]:
    if not SPEC_BENCH.is_file():
        return list(FALLBACK_PROMPTS[:count])
    seen: dict[str, str] = {}
    for line in SPEC_BENCH.read_text().splitlines():
        if line.strip():
            q = json.loads(line)
            seen.setdefault(q["category"], q["turns"][0])
    return list(seen.values())[:count]


@cache
def _tokenized(hf_folder: str, count: int, max_tokens: int) -> tuple[tuple[int, ...], ...]:
    tokenizer = require("transformers").AutoTokenizer.from_pretrained(hf_folder)
    out = []
    for text in prompts(count):
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
        else:
            ids = tokenizer(text)["input_ids"]
        out.append(tuple(int(t) for t in ids[:max_tokens]))
    return tuple(out)


@cache
def source_logits(hf_folder: str, count: int = 6, max_tokens: int = 128) -> tuple[np.ndarray, ...]:
    """The transformers model's FP32 logits for each prompt (computed once per process)."""
    torch = require("torch")
    transformers = require("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return tuple(model(torch.tensor([ids])).logits[0].float().numpy()
                     for ids in _tokenized(hf_folder, count, max_tokens))


def compare(reference: list[np.ndarray], candidate: list[np.ndarray]) -> dict[str, float]:
    """Top-1 agreement and mean KL(reference ‖ candidate) over all positions."""
    agree, kl, n = 0, 0.0, 0
    for p, q in zip(reference, candidate, strict=True):
        lp = p - p.max(-1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
        lq = q - q.max(-1, keepdims=True)
        lq -= np.log(np.exp(lq).sum(-1, keepdims=True))
        kl += float((np.exp(lp) * (lp - lq)).sum())
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
        n += p.shape[0]
    return {"top1_agreement": round(agree / n, 4), "kl": round(kl / n, 6), "positions": n}


def export_logits(folder: Path, hf_folder: str, count: int = 6, max_tokens: int = 128,
                  runner: OnnxReference | None = None) -> list[np.ndarray]:
    runner = runner or OnnxReference(folder)
    return [runner.logits(list(ids)) for ids in _tokenized(hf_folder, count, max_tokens)]


def decode_speed(runner: OnnxReference, tokens: int = 32) -> float:
    """Single-token decode tokens/s after a short prompt (reference runner, in-place KV, 1 thread)."""
    runner.logits([1] * 16)
    start = time.perf_counter()
    token = 1
    for _ in range(tokens):
        token = int(runner.forward([token])[-1].argmax())
    return tokens / (time.perf_counter() - start)


def quality_report(folder: Path, count: int = 6, max_tokens: int = 128) -> dict:
    """The ``quality`` entry of the manifest: agreement with the source, size, decode speed."""
    manifest = json.loads((folder / "edgespec-onnx.json").read_text())
    hf_folder = manifest["source"]["hf_folder"]
    runner = OnnxReference(folder)
    report = compare(list(source_logits(hf_folder, count, max_tokens)),
                     export_logits(folder, hf_folder, count, max_tokens, runner))
    report.update(against="transformers FP32 on " + hf_folder, prompts=count,
                  size_bytes=sum(f.stat().st_size for f in folder.glob("*.onnx")),
                  decode_tok_s=round(decode_speed(runner), 1), threads=1)
    return report
