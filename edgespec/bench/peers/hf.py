"""Hugging Face transformers on the CPU, with the run's GGUF dequantized to F32 by transformers' GGUF loader.

The prompt goes in as the same token ids every configuration gets (no second tokenizer). Timing comes from
a streamer: transformers hands it the prompt, then each step's new tokens, so it also sees how many tokens
each target pass produced (τ) under prompt lookup and early-exit drafting; their acceptance α is not exposed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ...extras import require
from ..worker import WARM_UP, Result, Setup, cut_at_eog


class _StepTimer:
    """A transformers streamer that records when each step's tokens arrived, and how many."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.sizes: list[int] = []

    def put(self, value: object) -> None:
        self.times.append(time.perf_counter())
        self.sizes.append(int(value.numel()))  # type: ignore[attr-defined]

    def end(self) -> None:
        pass


def load_dequantized(path: Path) -> object:
    """The GGUF's weights as a transformers model in F32 (export.gguf.hf will do this for every format)."""
    os.environ["TQDM_DISABLE"] = "1"  # the GGUF loader's progress bars would fill the benchmark's log
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # e.g. assisted generation's deprecation notices, once per call
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


class TransformersRunner:
    def __init__(self, options: dict[str, object], setup: Setup) -> None:
        torch = require("torch", "export-hf", "the transformers peer")
        transformers = require("transformers", "export-hf", "the transformers peer")
        torch.set_num_threads(setup.threads)
        torch.manual_seed(setup.seed)
        self.torch, self.setup = torch, setup
        self.model = load_dequantized(Path(setup.model))
        self.kwargs = dict(options)
        self.versions = f"transformers {transformers.__version__}, torch {torch.__version__}"
        self.generate(WARM_UP, 2)

    def info(self) -> dict[str, object]:
        return {"engine": self.versions, "model_file": self.setup.model}

    def verify_curve(self) -> None:
        return None  # its passes are not exposed

    def generate(self, tokens: list[int], max_tokens: int) -> Result:
        torch = self.torch
        ids = torch.tensor([tokens])
        timer = _StepTimer()
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                      do_sample=False, eos_token_id=list(self.setup.eog),
                                      pad_token_id=self.setup.eog[0], streamer=timer, **self.kwargs)
        end = time.perf_counter()
        new = cut_at_eog(out[0, len(tokens):].tolist(), self.setup.eog, max_tokens)
        step_sizes = timer.sizes[2:]  # after the prompt and the first token
        first_at = timer.times[1] if len(timer.times) > 1 else end
        first = min(timer.sizes[1], len(new)) if len(timer.sizes) > 1 else len(new)
        return Result(tokens=new, ttft_s=first_at - start, decode_s=end - first_at, steps=len(step_sizes),
                      first_tokens=first)

    def close(self) -> None:
        del self.model


def open_runner(options: dict[str, object], setup: Setup) -> TransformersRunner:
    return TransformersRunner(options, setup)
