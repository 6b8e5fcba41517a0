"""Quality of an ONNX export against its source: teacher-forced top-1 agreement and KL(source ‖ export) on
the fixed prompts of ``quality.py`` (every prompt position scored), file size, and single-token decode speed
of the reference runner.

The source is what the export was made from: llama.cpp on the GGUF file (its own kernels and tokenizer, no
torch), or the transformers model on the Hugging Face folder (FP32); prompts are chat-formatted when the model
has a template.
"""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path

import numpy as np

from . import require
from .onnx_reference import OnnxReference
from .quality import agreement, llama_logits, open_model, prompt_tokens, prompts


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
def gguf_source_logits(gguf: str, count: int = 6, max_tokens: int = 128) -> tuple[tuple[tuple[int, ...], ...],
                                                                               tuple[np.ndarray, ...]]:
    """The prompts' token ids as llama.cpp tokenizes them, and llama.cpp's logits for them on the GGUF."""
    from edgespec.engine import Engine

    model = open_model(Path(gguf))
    try:
        engine = Engine(model, mode="none", gamma=0)
        ids = tuple(tuple(prompt_tokens(engine, text)[:max_tokens]) for text in prompts(count))
        return ids, tuple(llama_logits(model)(list(i), len(i)) for i in ids)
    finally:
        model.close()


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
    source = json.loads((folder / "edgespec-onnx.json").read_text())["source"]
    with require("tqdm").tqdm(total=3, desc="quality", unit="step", disable=not progress) as bar:
        if "gguf" in source:
            ids, reference = gguf_source_logits(source["gguf"], count, max_tokens)
            against = "llama.cpp on " + source["gguf"]
        else:
            ids, reference = _tokenized(source["hf_folder"], count, max_tokens), source_logits(source["hf_folder"],
                                                                                               count, max_tokens)
            against = "transformers FP32 on " + source["hf_folder"]
        bar.update()
        runner = OnnxReference(folder)
        report = compare(list(reference), [runner.logits(list(i)) for i in ids])
        bar.update()
        report.update(against=against, prompts=count,
                      size_bytes=sum(f.stat().st_size for f in folder.glob("*.onnx")),
                      decode_tok_s=round(decode_speed(runner), 1), threads=1)
        bar.update()
    return report
