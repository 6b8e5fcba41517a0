"""Tiny random GGUFs of the edge architectures, written with ``gguf``'s writer: 2 layers, hidden size 64, and
either SmolLM2's tokenizer (so they share SmolLM2's vocabulary and can draft for it) or a small byte-level BPE
one (268 tokens: readers parse it in milliseconds, where SmolLM2's ~100k strings take ``gguf``'s pure-Python
reader ~8 s a read, and transformers' GGUF loader reads a file four times). Each architecture gets the tensors
and keys llama.cpp's loader (src/models/*.cpp, as llama-cpp-python 0.3.36 pins it) reads for it."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np
import pytest

from edgespec.backends.onnx.tokenizer import _byte_level_decoder
from edgespec.catalog.models import resolve

gguf = pytest.importorskip("gguf")

SHIPPED = "smollm2-135m:q4_1"  # the shipped file: its tokenizer is copied into every tiny model
N_EMBD, N_FF, N_HEAD, N_KV_HEAD, N_LAYERS = 64, 128, 4, 2, 2
HEAD_DIM = N_EMBD // N_HEAD
SLIDING_WINDOW = 16  # Gemma 2's local layers: short, so a test's few dozen tokens cross it

# architecture name → what it adds to (or fuses in) the llama layer
ARCHITECTURES = {
    "llama": "the base layer",
    "llama3": "llama with llama3 RoPE scaling factors (rope_freqs)",
    "qwen2": "q/k/v biases",
    "qwen3": "per-head q/k RMSNorm",
    "phi3": "fused qkv and gate_up projections",
    "gemma2": "post-attention/post-FFN norms, logit soft-capping, alternating sliding-window layers",
    "gemma3": "per-head q/k RMSNorm, post norms, a local (sliding-window) and a global layer with their own RoPE bases",
    "gemma3-scaled": "gemma3 with linear RoPE scaling of its global layer (Gemma 3 4B and larger)",
    "phi3-longrope": "phi3 with LongRoPE factors (Phi-3 and 3.5 128k), its original context shorter than a test's",
}
# the names above that are another's variant: its GGUF name
VARIANTS = {"llama3": "llama", "gemma3-scaled": "gemma3", "phi3-longrope": "phi3"}
GEMMA3_ROPE_BASES = (1e6, 2e4)
LONGROPE_ORIGINAL_CONTEXT = 256  # global, local: neither the default, so a reader that ignored either would differ
QUANTS = {"F32": 0, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7}  # the matrices' type (norms stay F32) → general.file_type


# The small vocabulary: the 256 byte tokens, a few merges (digits too: the pre-tokenizers split runs of digits
# differently), a word no merge reaches (Llama 3's takes a piece found whole in the vocabulary as it is), and the
# two chat-template specials (BOS and EOS).
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "o n", "Ġ a", "1 2", "12 3", "123 4"]
WHOLE = ["Ġtable"]
SPECIALS = ["<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def small_vocabulary() -> list[str]:
    by_byte = {b: c for c, b in _byte_level_decoder().items()}
    return [by_byte[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES] + WHOLE + SPECIALS


def llama_writer(path: Path, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int) -> gguf.GGUFWriter:
    """A GGUF writer for a tiny llama with these sizes: its header keys written, its tensors and tokenizer to come."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    return w


def add_small_tokenizer(writer: gguf.GGUFWriter, pre: str = "gpt-2") -> int:
    """Write the small vocabulary's tokenizer keys; return the vocabulary size."""
    tokens = small_vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_pad_token_id(len(tokens) - 1)  # else transformers' Phi-3 config pads with token 32000
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    return len(tokens)


def add_sentencepiece_tokenizer(writer: gguf.GGUFWriter) -> int:
    """A small SentencePiece vocabulary as Gemma's GGUFs write theirs (``tokenizer.ggml.model`` "llama", scores,
    byte tokens, no space prefix); return the vocabulary size."""
    pieces = ["▁", "▁t", "he", "▁the", "th", "▁th", "in", "on", "▁a", "e", "t", "h", "a", "i", "n", "o"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces, *SPECIALS]
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0] * len(SPECIALS))
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces) + [3] * len(SPECIALS))  # unknown, control, byte
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(TEMPLATE)
    return len(tokens)


@functools.cache
def _tokenizer() -> dict[str, tuple[object, object, object]]:
    """The shipped SmolLM2's tokenizer.* keys as (value, type, sub-type): read once (gguf parses ~100k strings
    in pure Python, ~20 s on a busy machine)."""
    reader = gguf.GGUFReader(resolve(SHIPPED))
    return {name: (field.contents(), field.types[0],
                   field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
            for name, field in reader.fields.items() if name.startswith("tokenizer.")}


def tiny_gguf(dst: Path, arch: str = "llama", seed: int = 0, rename_token: int | None = None,
              smollm2_vocabulary: bool = True, quant: str = "F32", sentencepiece: bool = False,
              extra: dict[str, np.ndarray | bool | int | float | str] | None = None) -> Path:
    """Write a tiny random model of ``arch`` (a key of ARCHITECTURES) to ``dst``, with SmolLM2's vocabulary or
    the small one (byte-level BPE, or with ``sentencepiece`` a SentencePiece one); ``rename_token`` changes one of
    SmolLM2's tokens' text (same size, another vocabulary);
    ``quant`` (a key of QUANTS): the type of the matrices, the embedding among them; ``extra``: tensors (arrays)
    and metadata keys (numbers, strings; "{arch}" stands for the architecture) added or replaced."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    gguf_arch = VARIANTS.get(arch, arch)
    writer = gguf.GGUFWriter(dst, gguf_arch)
    if smollm2_vocabulary:
        for name, (value, vtype, sub_type) in _tokenizer().items():
            if name == "tokenizer.ggml.tokens" and rename_token is not None:
                value = list(value)
                value[rename_token] = "edgespec-renamed"
            writer.add_key_value(name, value, vtype, sub_type=sub_type)
        n_vocab = len(_tokenizer()["tokenizer.ggml.tokens"][0])
    else:
        n_vocab = add_sentencepiece_tokenizer(writer) if sentencepiece else add_small_tokenizer(writer)
    writer.add_context_length(2048)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_KV_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_file_type(QUANTS[quant])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(50.0)
        writer.add_final_logit_softcapping(30.0)
        writer.add_sliding_window(SLIDING_WINDOW)
    if gguf_arch == "gemma3":
        writer.add_sliding_window(SLIDING_WINDOW)
        writer.add_sliding_window_pattern([True, False])  # layer 0 local, layer 1 global
        writer.add_rope_freq_base(GEMMA3_ROPE_BASES[0])
        writer.add_rope_freq_base_swa(GEMMA3_ROPE_BASES[1])
    if arch == "gemma3-scaled":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(8.0)
    if arch == "phi3-longrope":  # llama.cpp takes the long factors where its context passes this one
        writer.add_rope_scaling_orig_ctx_len(LONGROPE_ORIGINAL_CONTEXT)
        writer.add_rope_scaling_attn_factors(1.19)
    for key, value in (extra or {}).items():  # a key written above is replaced (gguf logs a warning)
        if not isinstance(value, np.ndarray):
            key = key.format(arch=gguf_arch)
            if isinstance(value, str):
                writer.add_string(key, value)
            elif isinstance(value, bool):
                writer.add_bool(key, value)
            else:
                (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(key, value)
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:  # numpy shape (out, in); gguf stores it reversed, as llama.cpp reads it
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    def norm() -> np.ndarray:
        return (1 + rng.standard_normal(N_EMBD) * 0.1).astype(np.float32)

    kv_dim = N_KV_HEAD * HEAD_DIM
    qtype = None if quant == "F32" else gguf.GGMLQuantizationType[quant]

    def add(name: str, value: np.ndarray) -> None:
        if qtype is None or value.ndim == 1:
            writer.add_tensor(name, value)
        else:
            writer.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)

    add("token_embd.weight", w(n_vocab, N_EMBD) * 20)  # wider logits: random text with some peaks
    writer.add_tensor("output_norm.weight", norm())
    if arch == "llama3":
        writer.add_tensor("rope_freqs.weight", np.linspace(1, 8, HEAD_DIM // 2).astype(np.float32))
    if arch == "phi3-longrope":
        writer.add_tensor("rope_factors_short.weight", np.linspace(1, 2, HEAD_DIM // 2).astype(np.float32))
        writer.add_tensor("rope_factors_long.weight", np.linspace(1, 16, HEAD_DIM // 2).astype(np.float32))
    for il in range(N_LAYERS):
        tensors = {"attn_norm": norm(), "ffn_norm": norm(), "attn_output": w(N_EMBD, N_EMBD),
                   "ffn_down": w(N_EMBD, N_FF)}
        if gguf_arch == "phi3":
            tensors |= {"attn_qkv": w(N_EMBD + 2 * kv_dim, N_EMBD), "ffn_up": w(2 * N_FF, N_EMBD)}
        else:
            tensors |= {"attn_q": w(N_EMBD, N_EMBD), "attn_k": w(kv_dim, N_EMBD), "attn_v": w(kv_dim, N_EMBD),
                        "ffn_gate": w(N_FF, N_EMBD), "ffn_up": w(N_FF, N_EMBD)}
        if arch == "qwen2":
            tensors |= {"attn_q.bias": w(N_EMBD), "attn_k.bias": w(kv_dim), "attn_v.bias": w(kv_dim)}
        if gguf_arch in ("gemma2", "gemma3"):
            tensors |= {"post_attention_norm": norm(), "post_ffw_norm": norm()}
        if gguf_arch in ("qwen3", "gemma3"):
            tensors |= {"attn_q_norm": norm()[:HEAD_DIM], "attn_k_norm": norm()[:HEAD_DIM]}
        for name, value in tensors.items():
            add(f"blk.{il}.{name}" + ("" if name.endswith(".bias") else ".weight"), value)
    for name, value in (extra or {}).items():
        if isinstance(value, np.ndarray):
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


# llama.cpp's llama_ftype values of the mixes a test asks its quantizer for
LLAMA_FTYPES = {"Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17}


def llama_quantize(src: Path, dst: Path, ftype: str) -> Path:
    """``src`` quantized to ``ftype`` (a key of LLAMA_FTYPES) by llama.cpp's own quantizer, as llama-quantize runs it
    (its choice of type per tensor)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[ftype]
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0
    return dst


def quantize_kquant(values: np.ndarray, kind: str) -> np.ndarray:
    """float32 [N, K] (K a multiple of 256) → GGUF Q4_K or Q6_K super-blocks, uint8 [N, K/256 · bytes], in
    llama.cpp's layout (ggml-common.h's block_q4_K, block_q6_K; gguf's Python package only dequantizes these). The
    scales are plain (range over 15, or max|x| over 31, each sub-block's rounded to the super-block's 6- or 8-bit
    grid), not llama.cpp's searched ones: a valid file whose weights are close to ``values``."""
    n, k = values.shape
    x = values.astype(np.float32).reshape(n * k // 256, -1)
    if kind == "Q4_K":
        x = x.reshape(-1, 8, 32)
        low, high = np.minimum(x.min(-1), 0), x.max(-1)
        step, lift = (high - low) / 15, -low  # per sub-block: w ≈ step·q − lift
        d = (step.max(-1) / 63).astype(np.float16)
        dmin = (lift.max(-1) / 63).astype(np.float16)
        sc = np.clip(np.rint(step / np.where(d > 0, d, 1).astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
        m = np.clip(np.rint(lift / np.where(dmin > 0, dmin, 1).astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
        ds = d.astype(np.float32)[:, None] * sc
        dm = dmin.astype(np.float32)[:, None] * m
        q = np.clip(np.rint((x + dm[..., None]) / np.where(ds > 0, ds, 1)[..., None]), 0, 15).astype(np.uint8)
        scales = np.concatenate([sc[:, :4] | (sc[:, 4:] >> 4) << 6, m[:, :4] | (m[:, 4:] >> 4) << 6,
                                 (sc[:, 4:] & 0x0F) | (m[:, 4:] & 0x0F) << 4], axis=1)
        qs = (q[:, 0::2] | q[:, 1::2] << 4).reshape(-1, 128)  # sub-block 2j in the low nibbles, 2j + 1 in the high
        blocks = [d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), scales, qs]
    elif kind == "Q6_K":
        x = x.reshape(-1, 16, 16)
        step = np.abs(x).max(-1) / 31
        d = (step.max(-1) / 127).astype(np.float16)
        sc = np.clip(np.rint(step / np.where(d > 0, d, 1).astype(np.float32)[:, None]), -128, 127).astype(np.int8)
        ds = d.astype(np.float32)[:, None] * sc
        u = (np.clip(np.rint(x / np.where(ds > 0, ds, 1)[..., None]), -32, 31) + 32).astype(np.uint8)
        u = u.reshape(-1, 2, 4, 32)  # per half of 128: quarters of 32
        ql = np.concatenate([(u[:, :, 0] & 0x0F) | (u[:, :, 2] & 0x0F) << 4,
                             (u[:, :, 1] & 0x0F) | (u[:, :, 3] & 0x0F) << 4], axis=2).reshape(-1, 128)
        qh = sum((u[:, :, t] >> 4) << 2 * t for t in range(4)).astype(np.uint8).reshape(-1, 64)
        blocks = [ql, qh, sc.view(np.uint8), d[:, None].view(np.uint8)]
    else:
        raise ValueError(f"not a K-quant: {kind}")
    return np.concatenate([b.reshape(x.shape[0], -1) for b in blocks], axis=1).reshape(n, -1)


# A tiny llama whose matrices are K-quant-sized (hidden 256, the K-quants' super-block), in llama.cpp's Q4_K_M mix:
# Q4_K, with Q6_K for attn_v, half the layers' ffn_down and the output (here the tied embedding); layer 1's gate
# Q6_K too, so that gate|up mixes types as q|k|v does.
KQ_HIDDEN, KQ_FFN, KQ_HEADS, KQ_KV_HEADS, KQ_LAYERS = 256, 512, 4, 2, 2
KQ_TYPES = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
            "ffn_up": "Q4_K", "ffn_down": "Q4_K"}
KQ_LAYER_TYPES = [KQ_TYPES | {"ffn_down": "Q6_K"}, KQ_TYPES | {"ffn_gate": "Q6_K"}]


def write_kquant_gguf(path: Path, seed: int = 0, layer_types: list[dict[str, str]] = KQ_LAYER_TYPES,
                      embedding: str = "Q6_K") -> Path:
    """The K-quant-sized tiny llama with its matrices in ``layer_types`` (per layer, GGUF name → type) and its tied
    embedding in ``embedding``: K-quants written in llama.cpp's layout here, other types by gguf.quants."""
    rng = np.random.default_rng(seed)
    w = llama_writer(path, KQ_LAYERS, KQ_HIDDEN, KQ_FFN, KQ_HEADS, KQ_KV_HEADS)
    n_vocab = add_small_tokenizer(w)
    kv = KQ_KV_HEADS * (KQ_HIDDEN // KQ_HEADS)
    shapes = {"attn_q": (KQ_HIDDEN, KQ_HIDDEN, 4.0), "attn_k": (kv, KQ_HIDDEN, 4.0), "attn_v": (kv, KQ_HIDDEN, 1.0),
              "attn_output": (KQ_HIDDEN, KQ_HIDDEN, 1.0), "ffn_gate": (KQ_FFN, KQ_HIDDEN, 1.0),
              "ffn_up": (KQ_FFN, KQ_HIDDEN, 1.0), "ffn_down": (KQ_HIDDEN, KQ_FFN, 1.0)}

    def matrix(name: str, kind: str, rows: int, cols: int, scale: float = 1.0) -> None:
        values = (scale * rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
        qt = gguf.GGMLQuantizationType[kind]
        data = quantize_kquant(values, kind) if kind in ("Q4_K", "Q6_K") else gguf.quants.quantize(values, qt)
        w.add_tensor(name, data, raw_dtype=qt)

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(KQ_HIDDEN)).astype(np.float32))

    matrix("token_embd.weight", embedding, n_vocab, KQ_HIDDEN, scale=16.0)
    norm("output_norm.weight")
    for i, types in enumerate(layer_types):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        for name, (rows, cols, scale) in shapes.items():
            matrix(f"blk.{i}.{name}.weight", types[name], rows, cols, scale)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
