"""A GGUF file as the ONNX graph writer's source, read with the ``gguf`` package (no torch, no transformers):
the ``ModelSpec`` from its metadata and its weights under the Hugging Face names ``onnx_graphs`` asks for.

The model is the one llama.cpp runs from the file (src/models/*.cpp, as llama-cpp-python 0.3.36 pins it), which
is not always what transformers runs from the original checkpoint: llama.cpp's Phi-3, Qwen2/3 and llama
(Mistral) graphs have no sliding window, Llama 3.x's RoPE scaling is the file's ``rope_freqs`` (each rotary
frequency divided by its factor), and Gemma's norms are stored as ``1 + w`` (the converter adds the 1). A
tensor the writer would not use (biases it has no place for, experts, LongRoPE factors) is refused by name
rather than dropped.

Q4_0 / Q4_1 / Q8_0 tensors come back as ``BlockWeight`` (carried, nothing rounded) when asked to, and Q2_K … Q6_K /
Q5_0 / Q5_1 ones as ``KQuantWeight`` where the graphs run them with edgespec's kernels (``kquants``);
every other type is dequantized to float32 by gguf's reference code, one tensor at a time from the memory-mapped file.
For the llama architecture llama.cpp's converter permutes the rows of q and k so that rotary pairs are adjacent (its
"normal" RoPE); the graphs rotate halves (GroupQueryAttention, ``rotary_interleaved=0``, as transformers does and as
llama.cpp's "neox" RoPE of the other architectures does), so those rows are put back: whole rows move, nothing
is rounded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.errors import ModelLoadError

from .. import UnsupportedArchitectureError, require
from ..gguf.ggufio import SLIDING_WINDOW_DEFAULTS, field, reader, sliding_window, sliding_window_layers
from . import block_kquant
from .block_kquant import KQuantWeight
from .block_weights import BLOCK, CARRIED, BlockWeight, from_ggml
from .graphs import ModelSpec, Weight, join_rows

ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")  # GGUF architectures this reader maps
_PERMUTED_QK = ("llama",)  # llama.cpp's "normal" RoPE: q/k rows permuted by its converter
_GEMMA = ("gemma2", "gemma3")

# Hugging Face name (after "model.layers.N.") → GGUF name (after "blk.N."), for every architecture
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",  # Phi-3: gate rows, then up rows, in one tensor
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Gemma's four norms a layer: the one named like Llama's pre-MLP norm is the post-attention norm
_GEMMA_NAMES = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")

# The tensors each architecture's graph reads (GGUF names after "blk.N."; the file must hold no others)
_BASE = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
         "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}
_LAYER_TENSORS = {
    "llama": _BASE,
    "qwen2": _BASE | {"attn_q.bias", "attn_k.bias", "attn_v.bias"},
    "qwen3": _BASE | {"attn_q_norm.weight", "attn_k_norm.weight"},
    "phi3": (_BASE - {"ffn_gate.weight"}) | {"attn_qkv.weight"},  # q, k and v fused or apart
    "gemma2": _BASE | {"post_attention_norm.weight", "post_ffw_norm.weight"},
    "gemma3": _BASE | {"post_attention_norm.weight", "post_ffw_norm.weight", "attn_q_norm.weight",
                       "attn_k_norm.weight"},
}
# What a tensor the writer does not read is, for the refusal
_UNSUPPORTED = (("rope_factors_", "LongRoPE scaling outside Phi-3"), ("_exps", "mixture of experts"),
                ("_inp", "mixture of experts"), ("_shexp", "mixture of experts"), (".bias", "a bias"))
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp scales attention by (hidden/heads)^-½ for these
_GEMMA3_LOCAL_ROPE_BASE = 10000.0  # llama.cpp's rope base of Gemma 3's local layers (unless the file sets one)


def spec_from_gguf(path: Path) -> ModelSpec:
    """The graph writer's ``ModelSpec`` from a GGUF's metadata and tensor list, as llama.cpp runs the file."""
    r = reader(path)
    arch = field(r, "general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitectureError(f"{path}: GGUF architecture {arch!r} cannot be exported to ONNX "
                                           f"(supported: {', '.join(ARCHITECTURES)})")

    def number(key: str, default: Any = None) -> Any:
        value = field(r, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{path}: metadata {arch}.{key} is missing")
        return value

    def refuse(what: str) -> UnsupportedArchitectureError:
        return UnsupportedArchitectureError(f"{path}: {what} is not supported by the ONNX export ({arch})")

    n_layers = int(number("block_count"))
    tensors = {t.name: t for t in r.tensors}
    _check_tensors(path, arch, n_layers, tensors)
    scaling = field(r, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None, "linear"):
        raise refuse(f"RoPE scaling {scaling!r}")
    if int(field(r, f"{arch}.expert_count", 0) or 0):
        raise refuse("a mixture of experts")
    hidden, heads = int(number("embedding_length")), int(number("attention.head_count"))
    if not isinstance(field(r, f"{arch}.attention.head_count_kv", 0), int):
        raise refuse("a per-layer number of KV heads")
    head_dim = int(number("attention.key_length", hidden // heads))
    if int(number("attention.value_length", head_dim)) != head_dim:
        raise refuse("a value head size other than the key head size")
    if int(number("rope.dimension_count", head_dim)) != head_dim:
        raise refuse("partial rotary embedding")
    tokens = field(r, "tokenizer.ggml.tokens")
    vocab = int(number("vocab_size", len(tokens) if tokens else None))
    eos = [field(r, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot")]
    eos_ids = tuple(dict.fromkeys(int(e) for e in eos if e is not None))
    theta = float(number("rope.freq_base", 10000.0))
    layer_types, window = _window_layers(r, arch, n_layers)
    rope_theta = {"full_attention": theta}
    if window:
        # Gemma 2: one RoPE for both kinds of layer; Gemma 3's local layers: 10⁴ (llama.cpp's value)
        local = theta if arch == "gemma2" else _GEMMA3_LOCAL_ROPE_BASE
        rope_theta["sliding_attention"] = float(field(r, f"{arch}.rope.freq_base_swa", local))
    linear = {}
    if scaling == "linear":  # llama.cpp scales every layer's positions, but Gemma 3's local layers (their own RoPE)
        factor = float(number("rope.scaling.factor"))
        linear = {t: factor for t in set(layer_types) if not (arch == "gemma3" and t == "sliding_attention")}
    scale = head_dim ** -0.5
    if arch in _GEMMA and n_layers == _GEMMA_27B_LAYERS[arch]:
        scale = float(hidden // heads) ** -0.5
    softcaps = (0.0, 0.0)
    if arch == "gemma2":  # llama.cpp's defaults where the file has no value
        softcaps = (float(field(r, "gemma2.attn_logit_softcapping", 50.0)),
                    float(field(r, "gemma2.final_logit_softcapping", 30.0)))
    elif arch == "gemma3" and field(r, "gemma3.final_logit_softcapping"):
        raise refuse("final logit soft-capping")
    longrope = None
    if "rope_factors_short.weight" in tensors:  # [per-architecture] Phi-3 LongRoPE, as llama.cpp runs it
        short, long = (tuple(float(f) for f in _dequantized(tensors[f"rope_factors_{k}.weight"]).ravel())
                       for k in ("short", "long"))
        if not len(short) == len(long) == head_dim // 2:
            raise ModelLoadError(f"{path}: LongRoPE holds {len(short)} and {len(long)} factors, not {head_dim // 2}")
        longrope = (short, long, int(number("rope.scaling.original_context_length")),
                    float(field(r, f"{arch}.rope.scaling.attn_factor", 1.0)))
    factors = None
    if "rope_freqs.weight" in tensors:  # [per-architecture] Llama 3.x: llama.cpp divides frequency i by factor i
        factors = tuple(float(f) for f in _dequantized(tensors["rope_freqs.weight"]).ravel())
        if len(factors) != head_dim // 2:
            raise ModelLoadError(f"{path}: rope_freqs holds {len(factors)} factors, not {head_dim // 2}")
    return ModelSpec(arch, n_layers, hidden, heads, int(number("attention.head_count_kv", heads)), head_dim,
                     vocab, float(number("attention.layer_norm_rms_epsilon")), layer_types, rope_theta, window, scale,
                     field(r, "tokenizer.ggml.bos_token_id"), eos_ids, qkv_bias=arch == "qwen2",
                     attn_softcap=softcaps[0], final_softcap=softcaps[1], rope_freq_factors=factors,
                     norm_offset=arch not in _GEMMA, rope_linear=linear, rope_longrope=longrope)


def _window_layers(r: Any, arch: str, n_layers: int) -> tuple[tuple[str, ...], int | None]:
    """(layer types, window) as llama.cpp sets them: Gemma 2 and 3 only (its llama, Qwen2/3 and Phi-3 graphs
    attend to every earlier position whatever the file says of a window)."""
    sliding = sliding_window_layers(r) if arch in SLIDING_WINDOW_DEFAULTS else None
    if sliding is None:
        return ("full_attention",) * n_layers, None
    if len(sliding) != n_layers:
        raise ModelLoadError(f"{arch}.attention.sliding_window_pattern has {len(sliding)} of {n_layers} layers")
    return tuple("sliding_attention" if s else "full_attention" for s in sliding), sliding_window(r)


def unsupported_tensor(arch: str, n_layers: int, names: Iterable[str]) -> str | None:
    """The first tensor a file of ``arch`` holds that the graphs would not read, with what it is, or None.
    Such a file is refused: exporting without it would compute another model."""
    allowed = {"token_embd.weight", "output_norm.weight", "output.weight"}
    if arch == "llama":
        allowed.add("rope_freqs.weight")
    if arch == "phi3":  # LongRoPE (Phi-3 and 3.5 with 128k contexts): the short and the long factors
        allowed |= {"rope_factors_short.weight", "rope_factors_long.weight"}
    layer = _LAYER_TENSORS.get(arch, set())
    for name in names:
        m = _BLOCK.match(name)
        if name in allowed or (m and int(m.group(1)) < n_layers and m.group(2) in layer):
            continue
        what = next((w for key, w in _UNSUPPORTED if key in name), "a tensor the graphs have no place for")
        return f"{name} ({what})"
    return None


def _check_tensors(path: Path, arch: str, n_layers: int, tensors: Iterable[str]) -> None:
    found = unsupported_tensor(arch, n_layers, tensors)
    if found:
        raise UnsupportedArchitectureError(f"{path}: tensor {found} is not supported by the ONNX export ({arch})")


def _dequantized(t: Any) -> np.ndarray:
    return require("gguf").quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(
        [int(d) for d in reversed(t.shape)])


def unpermute_rows(n_heads: int, rows: int) -> np.ndarray:
    """Row order that undoes llama.cpp's q/k permutation: GGUF row (h, j, i) holds HF row (h, i, j), i ∈ {0, 1}
    the rotary half, j < head_dim/2."""
    return np.arange(rows).reshape(n_heads, rows // n_heads // 2, 2).swapaxes(1, 2).reshape(-1)


ROWS_AT_A_TIME = 4096  # rows of a vocabulary-sized matrix dequantized at once (at hidden size 4096: 64 MB)


class GgufWeights:
    """``weights(hf_name)`` for the graph writer: float32 arrays, or ``BlockWeight`` / ``KQuantWeight`` for carried
    types (K-quants only with ``kquants``: edgespec.BlockKQuantMatMul is in the kernels' library). Each call reads
    one tensor from the memory-mapped file: nothing else is held. The vocabulary-sized matrices (embedding,
    output) can be read a chunk of rows at a time instead (``table``, ``blocks_8bit``): a float32 copy of one is
    often larger than the whole file (Llama 3.2 1B Q4_K_M: a 1 GB embedding, 0.8 GB file)."""

    def __init__(self, path: Path, spec: ModelSpec, carry: bool, kquants: bool = False) -> None:
        self.path = path
        self.spec = spec
        self.carry = carry
        self.kquants = kquants
        self._tensors = {t.name: t for t in reader(path).tensors}

    def gguf_name(self, name: str) -> str:
        m = _LAYER.match(name)
        if m is None:
            mapped = _GLOBAL_NAMES.get(name)
            if name == "lm_head.weight" and self.spec.architecture in _GEMMA:
                mapped = None  # llama.cpp's Gemma graphs always project with the embedding
        else:
            names = {**_LAYER_NAMES, **_GEMMA_NAMES} if self.spec.architecture in _GEMMA else _LAYER_NAMES
            mapped = f"blk.{m.group(1)}.{names[m.group(2)]}" if m.group(2) in names else None
        if mapped is None:
            raise ModelLoadError(f"{self.path}: no GGUF tensor for {name!r}")
        return mapped

    def __contains__(self, name: str) -> bool:
        try:
            return self.gguf_name(name) in self._tensors
        except ModelLoadError:
            return False

    def types(self) -> dict[str, int]:
        """How many tensors of each GGUF type the file holds (for the manifest)."""
        counts: dict[str, int] = {}
        for t in self._tensors.values():
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return counts

    def _rows(self, name: str) -> tuple[Any, int, int]:
        """(the GGUF tensor, rows, columns) of a 2-D weight."""
        gguf_name = self.gguf_name(name)
        t = self._tensors.get(gguf_name)
        if t is None:
            raise ModelLoadError(f"{self.path}: tensor {gguf_name} ({name}) is missing")
        return t, int(np.prod(t.shape[1:])), int(t.shape[0])

    def _carried(self, t: Any) -> bool:
        kind = t.tensor_type.name
        return (self.carry and len(t.shape) == 2
                and (kind in CARRIED or (self.kquants and kind in block_kquant.KINDS)))

    def _chunks(self, t: Any, n: int, k: int) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, float32 rows) a chunk at a time, as gguf's reference code dequantizes them."""
        dequantize = require("gguf").quants.dequantize
        for start in range(0, n, ROWS_AT_A_TIME):
            rows = dequantize(t.data[start:start + ROWS_AT_A_TIME], t.tensor_type)
            yield start, rows.astype(np.float32, copy=False).reshape(-1, k)

    def table(self, name: str, dtype: type) -> Weight:
        """A 2-D weight as rows of ``dtype`` (float16 for the embedding of a quantized export), dequantized a chunk
        of rows at a time, or its carried blocks."""
        t, n, k = self._rows(name)
        if self._carried(t):
            return self(name)
        out = np.empty((n, k), dtype)
        for start, rows in self._chunks(t, n, k):
            out[start:start + len(rows)] = rows
        return out

    def blocks_8bit(self, name: str) -> Weight:
        """A 2-D weight (an output projection) as the 8-bit blocks onnxruntime's MatMulNBits quantizer makes of it
        (symmetric, 32 weights a block: codes and scales bit for bit, since each row is quantized alone), a
        chunk of rows at a time; its carried blocks where the file's are carried; float32 where K is not a
        multiple of 32."""
        t, n, k = self._rows(name)
        if self._carried(t) or k % BLOCK:
            return self(name)
        quantize = require("onnxruntime.capi._pybind_state", "onnx").quantize_matmul_8bits
        codes = np.empty((n, k // BLOCK, BLOCK), np.uint8)
        scales = np.empty((n, k // BLOCK), np.float32)
        for start, rows in self._chunks(t, n, k):
            part = slice(start, start + len(rows))
            chunk_codes, chunk_scales = np.empty_like(codes[part]), np.empty_like(scales[part])
            quantize(chunk_codes, np.ascontiguousarray(rows.T), chunk_scales, np.zeros_like(chunk_scales, np.uint8),
                     BLOCK, len(rows), k, True)
            codes[part], scales[part] = chunk_codes, chunk_scales
        return BlockWeight(8, codes, scales, 128)

    def __call__(self, name: str) -> Weight:
        gguf_name = self.gguf_name(name)
        if gguf_name.endswith(".attn_qkv.weight") and gguf_name not in self._tensors:  # Phi-3 with q, k, v apart
            prefix = name.removesuffix("qkv_proj.weight")
            return join_rows([self(f"{prefix}{n}_proj.weight") for n in "qkv"])
        t, n, k = self._rows(name)
        kind = t.tensor_type.name
        weight: Weight
        if self._carried(t):
            weight = (from_ggml if kind in CARRIED else block_kquant.from_ggml)(kind, t.data, n, k)
        else:
            weight = _dequantized(t)
        if self.spec.architecture in _PERMUTED_QK and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = self.spec.num_heads if gguf_name.endswith("attn_q.weight") else self.spec.num_kv_heads
            order = unpermute_rows(heads, n)
            weight = weight.rows(order) if isinstance(weight, BlockWeight | KQuantWeight) else weight[order]
        return weight
