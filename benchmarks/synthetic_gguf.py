"""Current: a tool the manual uses.
GGUFs of real architectures' shapes with random weights: speed, verify cost, memory and prefill at the sizes
users run, without downloading anything.

    python benchmarks/synthetic_gguf.py --shape llama-3.2-1b --quant q4_0 --out /tmp/llama-3.2-1b-q4_0.gguf

The file has the real model's hyperparameters (layers, hidden size, heads, KV heads, FFN width, RoPE base and
Llama 3.x's RoPE scaling factors, norm epsilon, tied or separate output matrix, vocabulary size), seeded normal
random weights, written as F16 one tensor at a time (an 8B model is never held in memory twice), then quantized
by llama.cpp's own quantizer (``llama_model_quantize``) to the requested type, as a user's file would be (q4_k_m:
llama.cpp's mix, Q4_K with Q6_K for the output matrix or tied embedding and some layers' attn_v and ffn_down;
q4_0: Q4_0 with a Q6_K output matrix or tied embedding; q3_k_m: Q3_K with Q4_K, Q5_K and Q6_K in llama.cpp's
places; q2_k: Q2_K with Q3_K, Q4_K and Q6_K). Its tokenizer is synthetic: GPT-2 byte-level BPE (the 256 byte
tokens, a few merges, ChatML's special tokens), padded with unused tokens to the real vocabulary size so the
embedding and output matrices have the real shape.

Llama 3.x's shapes carry their RoPE scaling factors as the real files do (a ``rope_freqs`` tensor) and name
their real pre-tokenizer (``llama-bpe``); the GGUF → ONNX exporter (``edgespec export onnx FILE --quant gguf``)
reads both. ``--no-rope-freqs`` leaves the tensor out and ``--pre NAME`` names another pre-tokenizer (a file as an
older converter wrote it). The 1B file as users have it:

    python benchmarks/synthetic_gguf.py --shape llama-3.2-1b --quant q4_k_m --out /tmp/llama-3.2-1b-q4_k_m.gguf

Neither changes what a pass costs: the factors only rescale the rotary angles (the model computed is another one),
and the pre-tokenizer only splits text before the byte-level BPE (the benchmarks feed token ids).

What it is good for: the time a pass costs (per row, per context), prefill, memory. What it says nothing about:
acceptance. A random model's text is noise, so drafts are accepted at random; take acceptance from the real
models' recorded outputs (``edgespec replay``) and combine it with the costs measured here.

Needs only numpy, gguf (and pyyaml, which ``import gguf`` needs) and, to quantize, llama-cpp-python: it runs
without edgespec installed.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

try:
    # Before numpy: on a CUDA build compiled with a newer g++, loading numpy's libstdc++ first made llama.cpp
    # segfault at load.
    import llama_cpp
except ImportError:  # writing F16 needs no llama.cpp; quantizing does (checked where it is used)
    llama_cpp = None

import numpy as np

try:
    import gguf
except ImportError as e:
    raise SystemExit(f"synthetic_gguf needs the gguf package ({e}): pip install gguf pyyaml") from e


@dataclass(frozen=True)
class Shape:
    """A model's hyperparameters as its config.json has them."""

    arch: str  # GGUF architecture
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float
    norm_eps: float
    tied: bool  # the output matrix is the embedding matrix
    context: int
    pre: str  # llama.cpp's pre-tokenizer name for the real model's tokenizer
    llama3_rope: float | None = None  # Llama 3.x RoPE scaling factor (rope_freqs), None if none
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        kv = self.kv_heads * self.head_dim
        layer = 2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.ffn
        return self.layers * layer + self.vocab * self.hidden * (1 if self.tied else 2)


# From each model's config.json (Hugging Face), as of 2024-2025.
SHAPES = {
    "smollm2-135m": Shape("llama", 30, 576, 9, 3, 1536, 49152, 100000.0, 1e-5, True, 8192, "smollm"),
    "llama-3.2-1b": Shape("llama", 16, 2048, 32, 8, 8192, 128256, 500000.0, 1e-5, True, 131072, "llama-bpe",
                          llama3_rope=32.0),
    "llama-3.2-3b": Shape("llama", 28, 3072, 24, 8, 8192, 128256, 500000.0, 1e-5, True, 131072, "llama-bpe",
                          llama3_rope=32.0),
    "llama-3.1-8b": Shape("llama", 32, 4096, 32, 8, 14336, 128256, 500000.0, 1e-5, False, 131072, "llama-bpe",
                          llama3_rope=8.0),
    "qwen2.5-7b": Shape("qwen2", 28, 3584, 28, 4, 18944, 152064, 1000000.0, 1e-6, False, 32768, "qwen2",
                        qkv_bias=True),
}
QUANTS = {"f16": 1, "q4_0": 2, "q8_0": 7, "q2_k": 10, "q3_k_m": 12, "q4_k_m": 15}  # llama_ftype values
WEIGHT_STD = 0.02  # the models' initializer_range: activations stay O(1) through the random layers
CHUNK = 1 << 24  # values generated at a time (64 MiB of float32)

# The synthetic tokenizer: byte tokens, these merges, unused padding tokens, then ChatML's special tokens.
MERGES = ["Ġ t", "h e", "i n", "Ġ a", "e r", "o n", "Ġt he"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NORMAL, CONTROL = 1, 3  # llama.cpp token types


def byte_tokens() -> list[str]:
    """GPT-2's byte-level spelling of the 256 bytes: printable ones as themselves, the rest as chr(256 + n) in
    byte order."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def add_tokenizer(writer: gguf.GGUFWriter, vocab: int, pre: str) -> None:
    merged = [m.replace(" ", "") for m in MERGES]
    padding = vocab - 256 - len(merged) - len(SPECIALS)
    if padding < 0:
        raise SystemExit(f"--vocab {vocab} is too small: the synthetic tokenizer has "
                         f"{vocab - padding} tokens of its own")
    tokens = [*byte_tokens(), *merged, *(f"<unused{i}>" for i in range(padding)), *SPECIALS]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([NORMAL] * (vocab - len(SPECIALS)) + [CONTROL] * len(SPECIALS))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(vocab - 2)  # <|im_start|>, as SmolLM2 has it
    writer.add_eos_token_id(vocab - 1)  # <|im_end|>
    writer.add_pad_token_id(vocab - 3)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """Llama 3.x's per-frequency RoPE scaling (what convert_hf_to_gguf writes as rope_freqs): long wavelengths
    divided by the factor, short ones kept, a smooth blend between (low/high frequency factors 1 and 4 of an 8192
    original context, as in all Llama 3.x configs)."""
    assert shape.llama3_rope is not None
    low, high, original = 1.0, 4.0, 8192
    freqs = shape.rope_theta ** -(np.arange(0, shape.head_dim, 2, dtype=np.float64) / shape.head_dim)
    wavelength = 2 * math.pi / freqs
    smooth = np.clip((original / wavelength - low) / (high - low), 0.0, 1.0)
    factors = 1 / ((1 - smooth) / shape.llama3_rope + smooth)  # 1 for short wavelengths, the factor for long
    return factors.astype(np.float32)


def tensors(shape: Shape) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, numpy shape (out, in), kind) of every tensor, in file order; kind: matrix, embedding, norm,
    bias or rope."""
    kv = shape.kv_heads * shape.head_dim
    yield "token_embd.weight", (shape.vocab, shape.hidden), "embedding"
    if not shape.tied:
        yield "output.weight", (shape.vocab, shape.hidden), "matrix"
    yield "output_norm.weight", (shape.hidden,), "norm"
    if shape.llama3_rope is not None:
        yield "rope_freqs.weight", (shape.head_dim // 2,), "rope"
    for i in range(shape.layers):
        blk = f"blk.{i}."
        yield blk + "attn_norm.weight", (shape.hidden,), "norm"
        yield blk + "attn_q.weight", (shape.hidden, shape.hidden), "matrix"
        yield blk + "attn_k.weight", (kv, shape.hidden), "matrix"
        yield blk + "attn_v.weight", (kv, shape.hidden), "matrix"
        if shape.qkv_bias:
            yield blk + "attn_q.bias", (shape.hidden,), "bias"
            yield blk + "attn_k.bias", (kv,), "bias"
            yield blk + "attn_v.bias", (kv,), "bias"
        yield blk + "attn_output.weight", (shape.hidden, shape.hidden), "matrix"
        yield blk + "ffn_norm.weight", (shape.hidden,), "norm"
        yield blk + "ffn_gate.weight", (shape.ffn, shape.hidden), "matrix"
        yield blk + "ffn_up.weight", (shape.ffn, shape.hidden), "matrix"
        yield blk + "ffn_down.weight", (shape.hidden, shape.ffn), "matrix"


def random_matrix(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Normal(0, WEIGHT_STD) as float16, generated in chunks (float32 is half numpy's float64 cost)."""
    out = np.empty((rows, cols), np.float16)
    step = max(1, CHUNK // cols)
    for start in range(0, rows, step):
        block = rng.standard_normal((min(step, rows - start), cols), dtype=np.float32)
        block *= WEIGHT_STD
        out[start:start + step] = block
    return out


def tensor_data(rng: np.random.Generator, shape: Shape, dims: tuple[int, ...], kind: str) -> np.ndarray:
    if kind in ("matrix", "embedding"):
        return random_matrix(rng, *dims)
    if kind == "norm":  # RMSNorm gains near 1
        return (1 + 0.1 * rng.standard_normal(dims)).astype(np.float32)
    if kind == "bias":
        return (WEIGHT_STD * rng.standard_normal(dims)).astype(np.float32)
    return llama3_rope_factors(shape)


def write_f16(shape: Shape, path: Path, seed: int, name: str) -> None:
    """The model's F16 GGUF, one tensor in memory at a time."""
    writer = gguf.GGUFWriter(str(path), shape.arch)
    writer.add_name(f"synthetic {name} (random weights, seed {seed})")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.norm_eps)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(QUANTS["f16"])
    add_tokenizer(writer, shape.vocab, shape.pre)
    plan = list(tensors(shape))
    for tensor_name, dims, kind in plan:
        dtype = np.float16 if kind in ("matrix", "embedding") else np.float32
        writer.add_tensor_info(tensor_name, dims, np.dtype(dtype), math.prod(dims) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, dims, kind in plan:
        writer.write_tensor_data(tensor_data(rng, shape, dims, kind))
    writer.close()


def quantize(src: Path, dst: Path, quant: str, threads: int) -> None:
    """llama.cpp's quantizer, as ``llama-quantize`` runs it (its default choices per tensor for the type)."""
    if llama_cpp is None:
        raise SystemExit("quantizing needs llama-cpp-python (or ask for --quant f16)")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTS[quant]
    params.nthread = threads
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {src} to {quant}")


def shape_of(name: str, vocab: int | None = None, layers: int | None = None, rope_freqs: bool = True,
             pre: str | None = None) -> Shape:
    """The named shape, with a smaller (or larger) vocabulary, fewer layers, without Llama 3.x's rope_freqs or
    naming another pre-tokenizer if asked."""
    shape = SHAPES[name]
    return replace(shape, vocab=vocab or shape.vocab, layers=layers or shape.layers,
                   llama3_rope=shape.llama3_rope if rope_freqs else None, pre=pre or shape.pre)


def write(shape: Shape, name: str, quant: str, out: Path, seed: int = 0, threads: int | None = None) -> Path:
    """Write the synthetic model to ``out`` (the F16 intermediate beside it, removed after quantizing)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    f16 = out if quant == "f16" else out.with_name(out.name + ".f16.tmp")
    try:
        write_f16(shape, f16, seed, name)
        if quant != "f16":
            quantize(f16, out, quant, threads or os.cpu_count() or 1)
    finally:
        if f16 != out:
            f16.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--quant", required=True, choices=sorted(QUANTS))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the real model's)")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the real model (tests)")
    parser.add_argument("--no-rope-freqs", action="store_true",
                        help="leave out Llama 3.x's rope_freqs tensor (as an older converter wrote the file)")
    parser.add_argument("--pre", default=None, help="the pre-tokenizer's name in llama.cpp (default: the real "
                                                    "model's; gpt-2 for the ONNX exporter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="quantizer threads (default: all CPUs)")
    args = parser.parse_args(argv)
    for flag in ("vocab", "layers", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1")
    shape = shape_of(args.shape, args.vocab, args.layers, rope_freqs=not args.no_rope_freqs, pre=args.pre)
    began = time.perf_counter()
    rope = "" if SHAPES[args.shape].llama3_rope is None else (", no rope_freqs" if args.no_rope_freqs else
                                                               ", rope_freqs")
    print(f"{args.shape}: {shape.parameters() / 1e9:.2f}B parameters, {shape.layers} layers, vocabulary "
          f"{shape.vocab}{rope}, pre-tokenizer {shape.pre} → {args.out} ({args.quant})", file=sys.stderr)
    write(shape, args.shape, args.quant, args.out, args.seed, args.threads)
    print(f"wrote {args.out}: {args.out.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - began:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
