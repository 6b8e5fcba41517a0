"""Quality of an ONNX export against its source: teacher-forced top-1 agreement and KL(source ‖ export) on
the fixed prompts of ``quality.py`` (every prompt position scored), file size, and single-token decode speed
of the reference runner.

The source is the transformers model on the Hugging Face folder the export was made from (FP32); prompts are
chat-formatted when the model has a template.
"""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path

import numpy as np

from . import require
from .onnx_reference import OnnxReference
from .quality import agreement, prompts


@cache
def _tokenized(hf_folder: str, count: int, max_tokens: int) -> tuple[tuple[int, ...], ...]:
    tokenizer = require("transformers").AutoTokenizer.from_pretrained(hf_folder)
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
    torch = require("torch")
    transformers = require("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return tuple(model(torch.tensor([ids])).logits[0].float().numpy()
                     for ids in _tokenized(hf_folder, count, max_tokens))


def compare(reference: list[np.ndarray], candidate: list[np.ndarray]) -> dict[str, float]:
    """Top-1 agreement and mean KL(reference ‖ candidate) over all positions, as the manifest records them."""
    a = agreement(zip(reference, candidate, strict=True))
    return {"top1_agreement": round(a.top1, 4), "kl": round(a.kl, 6), "positions": a.positions}


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


def quality_report(folder: Path, count: int = 6, max_tokens: int = 128, progress: bool = True) -> dict:
    """The ``quality`` entry of the manifest: agreement with the source, size, decode speed."""
    manifest = json.loads((folder / "edgespec-onnx.json").read_text())
    hf_folder = manifest["source"]["hf_folder"]
    with require("tqdm").tqdm(total=3, desc="quality", unit="step", disable=not progress) as bar:
        reference = list(source_logits(hf_folder, count, max_tokens))
        bar.update()
        runner = OnnxReference(folder)
        report = compare(reference, export_logits(folder, hf_folder, count, max_tokens, runner))
        bar.update()
        report.update(against="transformers FP32 on " + hf_folder, prompts=count,
                      size_bytes=sum(f.stat().st_size for f in folder.glob("*.onnx")),
                      decode_tok_s=round(decode_speed(runner), 1), threads=1)
        bar.update()
    return report
