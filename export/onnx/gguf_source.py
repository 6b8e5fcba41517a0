"""A GGUF file as the ONNX graph writer's source, read with the ``gguf`` package (no torch, no transformers):
the ``ModelSpec`` from its metadata and its weights under the Hugging Face names ``onnx_graphs`` asks for.

Q4_0 / Q4_1 / Q8_0 tensors come back as ``BlockWeight`` (carried, nothing rounded) when asked to, and Q4_K / Q6_K
ones as ``KQuantWeight`` where the graphs run them with edgespec's kernels (``kquants``); every other type is
dequantized to float32 by gguf's reference code. llama.cpp's converter permutes the rows of q and k so
that rotary pairs are adjacent (its "normal" RoPE); the graphs rotate halves (GroupQueryAttention,
``rotary_interleaved=0``, as transformers does), so those rows are put back: whole rows move, nothing is rounded.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.errors import ModelLoadError

from .. import UnsupportedArchitectureError, require
from ..gguf.ggufio import field, reader
from ..gguf.hf import check_rope_factors
from . import block_kquant
from .block_kquant import KQuantWeight
from .block_weights import CARRIED, BlockWeight, from_ggml
from .graphs import ModelSpec, Weight

ARCHITECTURES = ("llama",)  # GGUF architectures this reader maps (Gemma 3 still goes through transformers)

# Hugging Face name (after "model.layers.N.") → GGUF name (after "blk.N.")
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def spec_from_gguf(path: Path) -> ModelSpec:
    """The graph writer's ``ModelSpec`` from a GGUF's metadata (llama family)."""
    r = reader(path)
    arch = field(r, "general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitectureError(f"{path}: GGUF architecture {arch!r} cannot be exported to ONNX without "
                                           f"transformers yet (supported: {', '.join(ARCHITECTURES)})")
    check_rope_factors(path)
    scaling = field(r, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise UnsupportedArchitectureError(f"{path}: RoPE scaling {scaling!r} is not supported")

    def number(key: str, default: Any = None) -> Any:
        value = field(r, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{path}: metadata {arch}.{key} is missing")
        return value

    hidden, heads = int(number("embedding_length")), int(number("attention.head_count"))
    head_dim = int(number("attention.key_length", hidden // heads))
    if int(number("rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedArchitectureError(f"{path}: partial rotary embeddings are not supported")
    tokens = field(r, "tokenizer.ggml.tokens")
    vocab = int(number("vocab_size", len(tokens) if tokens else None))
    eos = [field(r, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot")]
    n_layers = int(number("block_count"))
    eos_ids = tuple(dict.fromkeys(int(e) for e in eos if e is not None))
    return ModelSpec("llama", n_layers, hidden, heads, int(number("attention.head_count_kv", heads)), head_dim,
                     vocab, float(number("attention.layer_norm_rms_epsilon")), ("full_attention",) * n_layers,
                     {"full_attention": float(number("rope.freq_base", 10000.0))}, None, head_dim ** -0.5,
                     field(r, "tokenizer.ggml.bos_token_id"), eos_ids)


def unpermute_rows(n_heads: int, rows: int) -> np.ndarray:
    """Row order that undoes llama.cpp's q/k permutation: GGUF row (h, j, i) holds HF row (h, i, j), i ∈ {0, 1}
    the rotary half, j < head_dim/2."""
    return np.arange(rows).reshape(n_heads, rows // n_heads // 2, 2).swapaxes(1, 2).reshape(-1)


class GgufWeights:
    """``weights(hf_name)`` for the graph writer: float32 arrays, or ``BlockWeight`` / ``KQuantWeight`` for carried
    types (K-quants only with ``kquants``: edgespec.BlockKQuantMatMul is in the kernels' library)."""

    def __init__(self, path: Path, spec: ModelSpec, carry: bool, kquants: bool = False) -> None:
        self.path = path
        self.spec = spec
        self.carry = carry
        self.kquants = kquants
        self._tensors = {t.name: t for t in reader(path).tensors}

    def gguf_name(self, name: str) -> str:
        m = _LAYER.match(name)
        mapped = _GLOBAL_NAMES.get(name) if m is None else f"blk.{m.group(1)}.{_LAYER_NAMES.get(m.group(2), '?')}"
        if mapped is None or mapped.endswith("?"):
            raise ModelLoadError(f"{self.path}: no GGUF tensor for {name!r}")
        return mapped

    def __contains__(self, name: str) -> bool:
        return self.gguf_name(name) in self._tensors

    def types(self) -> dict[str, int]:
        """How many tensors of each GGUF type the file holds (for the manifest)."""
        counts: dict[str, int] = {}
        for t in self._tensors.values():
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return counts

    def __call__(self, name: str) -> Weight:
        gguf_name = self.gguf_name(name)
        t = self._tensors.get(gguf_name)
        if t is None:
            raise ModelLoadError(f"{self.path}: tensor {gguf_name} ({name}) is missing")
        kind = t.tensor_type.name
        k = int(t.shape[0])
        n = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        weight: Weight
        if self.carry and kind in CARRIED and len(t.shape) == 2:
            weight = from_ggml(kind, t.data, n, k)
        elif self.carry and self.kquants and kind in block_kquant.KINDS and len(t.shape) == 2:
            weight = block_kquant.from_ggml(kind, t.data, n, k)
        else:
            weight = require("gguf").quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(
                [int(d) for d in reversed(t.shape)])
        if gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = self.spec.num_heads if gguf_name.endswith("attn_q.weight") else self.spec.num_kv_heads
            order = unpermute_rows(heads, n)
            weight = weight.rows(order) if isinstance(weight, BlockWeight | KQuantWeight) else weight[order]
        return weight
