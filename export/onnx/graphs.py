"""The split ONNX decoder (embed.onnx, layer_NN.onnx, head.onnx), written with ``onnx.helper`` from numpy
weights — no torch.onnx tracing, so the graphs contain exactly the ops chosen here for exact numerics.

Layout and I/O names are the contract in docs/onnx-format.md. Each decoder layer is one graph: attention is
com.microsoft GroupQueryAttention over a fixed-length KV buffer (past and present may be the same memory;
rotary embedding, the causal mask and Gemma 3's sliding window happen inside it, positions follow from
seqlens_k). Llama (SmolLM2, Llama 3.x, Mistral), Qwen2, Qwen3, Phi-3, Gemma 2 and 3 differ only in the pieces
``ModelSpec`` describes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.backends.onnx.segments import TREE_INPUT
from edgespec.kernels import library as custom_ops

from .. import UnsupportedArchitectureError, require
from ..gguf.hf import check_architecture
from . import block_kquant, block_q4
from .block_kquant import KQuantWeight
from .block_weights import BLOCK, BlockWeight, stack

OPSET = 21
MS_DOMAIN = "com.microsoft"
ATTENTIONS = ("exact", "gqa")
# Bumped when the graphs of the same model and options change (manifest "source.graphs"): caches re-export.
GRAPHS_REVISION = 15  # 2: calls padded to attention_min_total keys (Gemma 3 batch invariance); 3: packed
# q|k|v and gate|up projections, SkipSimplifiedLayerNormalization; 4: padding rows appended by one Pad op;
# 5: int4 exports pad single-row calls around every product (4-bit level 4 is not one-row exact on AMD);
# 6: attention "exact" (edgespec.ExactAttention, no padding) beside "gqa"; 7: 8-bit products as
# edgespec.BlockInt8MatMul where the export timed it faster (export/onnx/block_int8.py); 8: that op's weights packed
# 16 columns × 4 k per 64 bytes (was 8 × 4 per 32); 9: half KV under the exact attention (``kv_dtype``); 10: the
# exact attention's ``tree_parents`` input (token trees verified in one pass); 11: a Llama MLP's gate under the
# exact attention as edgespec.SwiGlu (one op for Split, QuickGelu and Mul); 12: a GGUF's Q4_0 / Q4_1 blocks as
# edgespec.BlockQ4MatMul under the exact attention (nothing padded); 13: its Q4_K / Q6_K super-blocks as
# edgespec.BlockKQuantMatMul (q|k|v and gate|up of mixed types as one product per run of a type), the embedding's
# gathered and dequantized as llama.cpp does; 14: its Q5_K super-blocks as BlockKQuantMatMul and Q5_0 / Q5_1 blocks as
# BlockQ4MatMul (they were dequantized and quantized to 8 bits); 15: its Q2_K and Q3_K super-blocks as
# BlockKQuantMatMul (were dequantized and quantized to 8 bits)


@dataclass(frozen=True)
class ModelSpec:
    """What the graphs need to know about a model, read from its HF config.json (``from_hf``) or a GGUF's
    metadata (``gguf_source.spec_from_gguf``)."""

    architecture: str  # "llama" (also Mistral) | "qwen2" | "qwen3" | "phi3" | "gemma2" | "gemma3"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    layer_types: tuple[str, ...]
    rope_theta: dict[str, float]  # per layer type
    sliding_window: int | None
    scale: float  # attention scale
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    qkv_bias: bool = False  # [per-architecture] Qwen2: q/k/v projections carry a bias
    # [per-architecture] Llama 3.x RoPE scaling: (factor, low_freq_factor, high_freq_factor, original context)
    rope_llama3: tuple[float, float, float, float] | None = None
    # [per-architecture] Gemma 2: tanh soft-capping of attention scores and final logits (0: none)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    # [per-architecture] Llama 3.x from a GGUF: its rope_freqs tensor, by which llama.cpp divides each rotary
    # frequency (head_dim / 2 factors)
    rope_freq_factors: tuple[float, ...] | None = None
    # [per-architecture] Gemma: whether norm weights are stored as w and the graph adds 1 (transformers) or
    # already as 1 + w (llama.cpp's GGUF converter adds it)
    norm_offset: bool = True
    # Linear RoPE scaling (positions divided by a factor), per layer type: Gemma 3 4B and larger scale their global
    # layers by 8, not their local ones
    rope_linear: dict[str, float] = field(default_factory=dict)
    # [per-architecture] Phi-3 LongRoPE from a GGUF: (short factors, long factors, original context, attention
    # factor). As llama.cpp runs it: each frequency divided by the long factors where the context is longer than the
    # original one, else by the short ones, and cos and sin multiplied by the attention factor
    rope_longrope: tuple[tuple[float, ...], tuple[float, ...], int, float] | None = None

    @property
    def gemma(self) -> bool:  # (1 + w) norms, post-attention/post-FFN norms, scaled embeddings, GELU
        return self.architecture in ("gemma2", "gemma3")

    @property
    def qk_norm(self) -> bool:  # [per-architecture] per-head RMSNorm of q and k before rotary
        return self.architecture in ("gemma3", "qwen3")

    @property
    def fused_projections(self) -> bool:  # [per-architecture] Phi-3 stores qkv_proj and gate_up_proj packed
        return self.architecture == "phi3"

    @classmethod
    def from_hf(cls, folder: Path) -> ModelSpec:
        c = json.loads((folder / "config.json").read_text())
        model_type = c.get("model_type", "?")
        check_architecture(model_type, folder)
        layers = int(c["num_hidden_layers"])
        heads = int(c["num_attention_heads"])
        llama3: tuple[float, ...] | None = None
        head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
        rope = c.get("rope_parameters") or {"rope_theta": c.get("rope_theta", 10000.0), "rope_type": "default"}
        softcaps = (0.0, 0.0)
        if model_type in ("gemma2", "gemma3_text"):
            layer_types = tuple(c["layer_types"])
            # Gemma 3: one RoPE per layer type; Gemma 2: one for both
            per_type = {t: rope.get(t, rope) for t in ("full_attention", "sliding_attention")}
            theta = {t: float(r["rope_theta"]) for t, r in per_type.items()}
            linear = {t: float(r["factor"]) for t, r in per_type.items() if r.get("rope_type") == "linear"}
            bad = {t: r.get("rope_type", "default") for t, r in per_type.items() if t not in linear}
            scale = float(c.get("query_pre_attn_scalar") or head_dim) ** -0.5
            window = int(c["sliding_window"])
            softcaps = (float(c.get("attn_logit_softcapping") or 0), float(c.get("final_logit_softcapping") or 0))
            if model_type == "gemma3_text" and any(softcaps):
                raise UnsupportedArchitectureError(f"{folder}: logit soft-capping is not supported for Gemma 3")
        else:
            if c.get("use_sliding_window"):  # [per-architecture] Qwen2/3's optional window: not written yet
                raise UnsupportedArchitectureError(f"{folder}: use_sliding_window is not supported")
            if model_type == "qwen3" and c.get("attention_bias"):  # [per-architecture] would bias o_proj too
                raise UnsupportedArchitectureError(f"{folder}: attention_bias is not supported")
            if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:  # [per-architecture] some Phi-3 variants
                raise UnsupportedArchitectureError(f"{folder}: partial rotary embedding is not supported")
            # [per-architecture] Mistral and Phi-3 window every layer (when the config sets a window)
            window = int(c["sliding_window"]) if model_type in ("mistral", "phi3") and c.get("sliding_window") else None
            layer_types = ("sliding_attention" if window else "full_attention",) * layers
            theta = {layer_types[0]: float(rope["rope_theta"])}
            bad = {layer_types[0]: rope.get("rope_type", "default")}
            linear = {}
            if bad[layer_types[0]] == "linear":
                linear, bad = {layer_types[0]: float(rope["factor"])}, {}
            elif model_type == "llama" and bad[layer_types[0]] == "llama3":  # [per-architecture] Llama 3.x
                llama3 = tuple(float(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                         "original_max_position_embeddings"))
                bad = {}
            scale = head_dim ** -0.5
        if any(v != "default" for v in bad.values()):
            raise UnsupportedArchitectureError(f"{folder}: RoPE scaling {bad} is not supported")
        eos = c.get("eos_token_id")
        architecture = {"gemma3_text": "gemma3", "mistral": "llama"}.get(model_type, model_type)
        return cls(architecture, layers,
                   int(c["hidden_size"]), heads, int(c["num_key_value_heads"]), head_dim, int(c["vocab_size"]),
                   float(c["rms_norm_eps"]), layer_types, theta, window, scale, c.get("bos_token_id"),
                   tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
                   qkv_bias=model_type == "qwen2", rope_llama3=llama3,  # type: ignore[arg-type]
                   attn_softcap=softcaps[0], final_softcap=softcaps[1], rope_linear=linear)


class GraphBuilder:
    """Collects nodes and initializers; names are made unique with a counter."""

    def __init__(self, name: str, weight_dtype: type = np.float32, q4_products: bool = False) -> None:
        self.onnx = require("onnx")
        self.name = name
        self.weight_dtype = weight_dtype  # float16: stored half size, cast to float32 when the session loads
        # carried 4-bit blocks as edgespec.BlockQ4MatMul (else MatMulNBits), K-quants as BlockKQuantMatMul, Q5_0 /
        # Q5_1 as BlockQ4MatMul
        self.q4_products = q4_products
        self.nodes: list = []
        self.initializers: list = []
        self._n = 0

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def ints(self, *values: int) -> str:
        """An int64 1-D constant (shapes, axes, slice bounds), created once per graph."""
        name = "ints_" + "_".join(str(v).replace("-", "m") for v in values)
        if name not in {t.name for t in self.initializers}:
            self.const(name, np.array(values, np.int64))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "", **attrs) -> list[str]:
        self._n += 1
        names = outputs if isinstance(outputs, list) else [f"{op_type.lower()}_{self._n}_{i}" for i in range(outputs)]
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, names, name=f"{op_type}_{self._n}",
                                                     domain=domain, **attrs))
        return names

    def one(self, op_type: str, inputs: list[str], output: str | None = None, domain: str = "", **attrs) -> str:
        return self.op(op_type, inputs, [output] if output else 1, domain, **attrs)[0]

    def model(self, inputs: list, outputs: list):
        h = self.onnx.helper
        graph = h.make_graph(self.nodes, self.name, inputs, outputs, self.initializers)
        domains = [MS_DOMAIN] + ([custom_ops.DOMAIN] if any(n.domain == custom_ops.DOMAIN for n in self.nodes) else [])
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET), *(h.make_opsetid(d, 1) for d in domains)],
                             producer_name="edgespec")
        model.ir_version = 10
        return model


def _tensor(name: str, elem: int, shape: list) -> object:
    return require("onnx").helper.make_tensor_value_info(name, elem, shape)


def rms_norm(g: GraphBuilder, x: str, weight: np.ndarray, eps: float, name: str) -> str:
    """RMSNorm over the last axis; Gemma's (1 + w) scale is folded into the weight by the caller."""
    return g.one("SimplifiedLayerNormalization", [x, g.const(name, weight.astype(np.float32))],
                 axis=-1, epsilon=eps, stash_type=1)


def skip_rms_norm(g: GraphBuilder, x: str, skip: str, weight: np.ndarray, eps: float, name: str) -> tuple[str, str]:
    """(RMSNorm(x + skip), x + skip) in one com.microsoft op (onnxruntime does not fuse the pair itself)."""
    normed, total = f"{name}_out", f"{name}_sum"
    g.op("SkipSimplifiedLayerNormalization", [x, skip, g.const(name, weight.astype(np.float32))],
         [normed, "", "", total], MS_DOMAIN, epsilon=eps)
    return normed, total


# A GGUF file's own blocks run at the export's default level, the fast integer path (int8 activations): 8-bit is
# exact for one row there, 4-bit not on every CPU, so the exporter pads single-row calls for 4-bit files.
CARRIED_ACCURACY_LEVEL = 4
@dataclass(frozen=True)
class Joined:
    """Several projections' rows where their GGUF types differ (a Q4_K_M file's Q4_K q and k beside a Q6_K v): one
    product per run of a type, the outputs concatenated, so that every part keeps the file's blocks."""

    parts: tuple[np.ndarray | BlockWeight | KQuantWeight, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]


# float rows [out, in], or a GGUF file's blocks carried as they are
Weight = np.ndarray | BlockWeight | KQuantWeight | Joined


def _type(part: Weight) -> object:
    return part.kind if isinstance(part, BlockWeight | KQuantWeight) else "float"


def join_rows(parts: list[Weight]) -> Weight:
    """Several projections' rows stacked into one weight; blocks stay blocks when they are all alike. With K-quants
    among them the parts of one type stay one weight each (``Joined``)."""
    if all(isinstance(p, BlockWeight) for p in parts) and len({p.kind for p in parts}) == 1:  # type: ignore[union-attr]
        return stack(parts)  # type: ignore[arg-type]
    if any(isinstance(p, KQuantWeight) for p in parts):
        runs: list[list] = []
        for p in parts:
            if runs and _type(runs[-1][0]) == _type(p):
                runs[-1].append(p)
            else:
                runs.append([p])
        joined = [block_kquant.stack(r) if isinstance(r[0], KQuantWeight) else
                  stack(r) if isinstance(r[0], BlockWeight) else np.concatenate(r) for r in runs]
        return joined[0] if len(joined) == 1 else Joined(tuple(joined))
    return np.concatenate([p.dequantize() if isinstance(p, BlockWeight) else p for p in parts])


def linear(g: GraphBuilder, x: str, weight: Weight, name: str) -> str:
    """x @ W.T with W stored transposed ([in, out]) so MatMulNBitsQuantizer can quantize it."""
    if isinstance(weight, Joined):
        return g.one("Concat", [linear(g, x, p, f"{name}_{i}") for i, p in enumerate(weight.parts)], axis=-1)
    if isinstance(weight, KQuantWeight):
        if not g.q4_products:  # not under edgespec's kernels: float, quantized to 8 bits as other types are
            return linear(g, x, weight.dequantize(), name)
        codes, scales = block_kquant.pack(weight)
        inputs = [x, g.const(name + "_kq", codes), g.const(name + "_kq_scales", scales)]
        y = g.one(block_kquant.OPS[weight.kind], inputs, domain=custom_ops.DOMAIN)
        n = weight.shape[0]
        return y if codes.shape[0] * block_q4.COLUMNS == n else g.one("Slice", [y, g.ints(0), g.ints(n), g.ints(-1)])
    if isinstance(weight, BlockWeight):
        return block_linear(g, x, weight, name)
    w = g.const(name, np.ascontiguousarray(weight.T.astype(g.weight_dtype)))
    if g.weight_dtype != np.float32:  # constant-folded to float32 at session load: compute stays float32
        w = g.one("Cast", [w], to=g.onnx.TensorProto.FLOAT)
    return g.one("MatMul", [x, w])


def block_linear(g: GraphBuilder, x: str, weight: BlockWeight, name: str) -> str:
    """x @ W.T with a GGUF file's blocks: 4-bit ones as edgespec.BlockQ4MatMul where the graph asks for it (its
    columns in groups of 16: a last group's zero columns sliced off), else as MatMulNBits' weights, Q4_1's minima
    adding (Σ x per block) @ minima."""
    n, k = weight.shape
    if g.q4_products and weight.bits == 4:
        codes, scales = block_q4.pack(weight)
        y = g.one(block_q4.OP, [x, g.const(name + "_q4", codes), g.const(name + "_q4_scales", scales)],
                  domain=custom_ops.DOMAIN)
        return y if codes.shape[0] * block_q4.COLUMNS == n else g.one("Slice", [y, g.ints(0), g.ints(n), g.ints(-1)])
    y = g.one("MatMulNBits", [x, g.const(name + "_q", weight.codes), g.const(name + "_scales", weight.scales.ravel()),
                              g.const(name + "_zp", weight.packed_zero_points())],
              domain=MS_DOMAIN, K=k, N=n, bits=weight.bits, block_size=BLOCK, accuracy_level=CARRIED_ACCURACY_LEVEL)
    if weight.minima is None:
        return y
    sums = g.one("ReduceSum", [g.one("Reshape", [x, g.ints(0, 0, k // BLOCK, BLOCK)]), g.ints(-1)], keepdims=0)
    return g.one("Add", [y, g.one("MatMul", [sums, g.const(name + "_minima", np.ascontiguousarray(weight.minima.T))])])


def single_row_padding(g: GraphBuilder, x: str) -> tuple[str, str]:
    """(pad, S) as [1] int64 for x [1, S, ·]: pad = 1 when S = 1, else 0.

    onnxruntime's CPU kernels take a special path for a single row — the M = 1 GEMM in GroupQueryAttention's
    Q·Kᵀ, and MatMulNBits at accuracy_level 0–2 — which rounds differently from the multi-row path, while every
    path with ≥ 2 rows gives a row bit-identical results whatever the other rows are (with head_dim > 128 only
    past 64 keys: ``attention_min_total``). Padding single-row calls to two rows makes a position's logits
    independent of how many tokens share the call (docs/kernels.md).
    """
    seq = g.one("Slice", [g.one("Shape", [x]), g.ints(1), g.ints(2)])
    return g.one("Max", [g.one("Sub", [g.ints(2), seq]), g.ints(0)]), seq


def pad_rows(g: GraphBuilder, x: str, pad: str) -> str:
    """x with ``pad`` copies of its last row appended (any finite row will do: the extra rows' results are
    dropped); ``pad`` may exceed the number of rows. One Pad op, not Slice + Expand + Concat: per layer and
    token that is two kernel launches fewer (SmolLM2 INT8, 2 threads: 2–3% of a single-token pass in scratch timings,
    docs/kernels.md)."""
    return g.one("Pad", [x, g.one("Concat", [g.ints(0, 0, 0, 0), pad, g.ints(0)], axis=0)], mode="edge")


def drop_padding(g: GraphBuilder, y: str, seq: str, output: str | None = None) -> str:
    return g.one("Slice", [y, g.ints(0), seq, g.ints(1)], output)


def kv_dtype(attention: str, quant: str) -> str:
    """The KV buffer's type (the manifest's ``kv_dtype``). Half under edgespec's attention, which rounds the new
    keys and values once when it writes them and widens them exactly when it reads: reading them is most of the
    attention's time (SmolLM2 INT8, 2 threads: a one-row pass 3–7% faster at 100 tokens of context, 15–18% at
    1000), and llama.cpp's default KV is half too. float32 for an fp32 export (the reference precision, held to
    transformers' logits within 1e-5) and under GroupQueryAttention (whose CPU kernel would compute in half)."""
    return "float16" if attention == "exact" and quant != "fp32" else "float32"


def kv_length(context_length: int) -> int:
    """KV buffer rows: every position plus the scratch slot a padded single-row call at the last position writes
    (padded calls write scratch slots past their last position, see ``layer_graph``)."""
    return context_length + 1


# MLAS's float GEMM (GroupQueryAttention's Q·Kᵀ, reduced over head_dim) sums in passes of StrideK = 128 but
# widens the pass while the key count N is small (N ≤ 64: one pass of 256). With head_dim > 128 a row at a
# position < 64 is therefore rounded one way in a call whose keys end at ≤ 64 and another way in a longer call
# (measured ~4e-7 per op, up to 0.58 in Gemma 3's logits). For every N > 64 the passes are the same.
SGEMM_WIDE_PASS_KEYS = 64


def attention_min_total(spec: ModelSpec, context_length: int, attention: str = "gqa") -> int:
    """The least key count the attention is called with (0: any): calls that end earlier are padded. Only
    GroupQueryAttention needs it; edgespec's kernel is exact at every key count."""
    if attention == "exact" or spec.head_dim <= 128:  # one pass at every N: nothing to pad
        return 0
    return min(SGEMM_WIDE_PASS_KEYS + 1, kv_length(context_length))


def rope_cache(spec: ModelSpec, layer_type: str, context_length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [kv_length(context_length), head_dim/2] as transformers computes them (float32 inverse frequencies),
    for a model of ``context_length`` positions."""
    exponent = np.arange(0, spec.head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(spec.head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(spec.rope_theta[layer_type]) ** exponent)).astype(np.float32)
    if spec.rope_llama3:
        inv_freq = _llama3_scaled(inv_freq, *spec.rope_llama3)
    if spec.rope_freq_factors:  # as ggml's rope with freq_factors: each frequency divided by its factor
        inv_freq = (inv_freq / np.asarray(spec.rope_freq_factors, np.float32)).astype(np.float32)
    if layer_type in spec.rope_linear:  # as transformers' linear scaling (llama.cpp: positions × 1 / factor)
        inv_freq = (inv_freq / np.float32(spec.rope_linear[layer_type])).astype(np.float32)
    attention = np.float32(1.0)
    if spec.rope_longrope:
        short, long, original, factor = spec.rope_longrope
        inv_freq = (inv_freq / np.asarray(long if context_length > original else short, np.float32)).astype(np.float32)
        attention = np.float32(factor)
    freqs = np.arange(kv_length(context_length), dtype=np.float32)[:, None] * inv_freq[None, :]
    return (np.cos(freqs) * attention).astype(np.float32), (np.sin(freqs) * attention).astype(np.float32)


def _llama3_scaled(inv_freq: np.ndarray, factor: float, low: float, high: float, context: float) -> np.ndarray:
    """[per-architecture] Llama 3.x RoPE scaling, in float32 as transformers computes it: wavelengths longer than
    context / low are slowed by ``factor``, shorter than context / high are kept, those between interpolated."""
    f32 = np.float32
    wavelen = f32(2 * np.pi) / inv_freq
    scaled = np.where(wavelen > f32(context / low), inv_freq / f32(factor), inv_freq).astype(f32)
    smooth = (f32(context) / wavelen - f32(low)) / f32(high - low)
    smoothed = (f32(1) - smooth) * scaled / f32(factor) + smooth * scaled
    medium = (wavelen >= f32(context / high)) & (wavelen <= f32(context / low))
    return np.where(medium, smoothed, scaled).astype(f32)


def _norm_weight(spec: ModelSpec, w: np.ndarray) -> np.ndarray:
    return (np.float32(1.0) + w.astype(np.float32)) if spec.gemma and spec.norm_offset else w


def layer_graph(spec: ModelSpec, weights: Callable[[str], Weight], index: int, context_length: int,
                weight_dtype: type = np.float32, pad_matmuls: bool = False, attention: str = "gqa",
                kv: str = "float32", q4_products: bool = False):
    """One decoder layer: hidden → hidden, reading/writing the layer's KV buffer (of type ``kv``) in place.

    ``attention``: "gqa" (GroupQueryAttention: single-row calls padded to two rows around it, see
    ``single_row_padding``) or "exact" (edgespec.ExactAttention: exact for any row count, nothing padded). With
    ``pad_matmuls`` (MatMul kernels that are not exact for one row) single-row calls are padded around the
    whole layer either way. ``q4_products``: carried 4-bit blocks as edgespec.BlockQ4MatMul.
    """
    onnx = require("onnx")
    f32 = onnx.TensorProto.FLOAT
    p = f"model.layers.{index}."
    w = lambda name: weights(p + name)  # noqa: E731
    g = GraphBuilder(f"layer_{index:02d}", weight_dtype, q4_products)
    eps = spec.rms_norm_eps
    exact = attention == "exact"
    hidden, seqlens, total = "hidden", "seqlens_k", "total_sequence_length"
    extra: str | None = None  # rows appended to q/k/v (and dropped after the attention) beyond the layer's
    if pad_matmuls or not exact:
        pad, seq = single_row_padding(g, "hidden")
        if pad_matmuls:
            hidden = pad_rows(g, "hidden", pad)
        # Rows added to the attention's: the single-row pad, and up to the least key count (``attention_min_total``).
        attn_pad = pad
        min_total = attention_min_total(spec, context_length, attention)
        if min_total:
            total64 = g.one("Reshape", [g.one("Cast", [total], to=onnx.TensorProto.INT64), g.ints(1)])
            attn_pad = g.one("Max", [g.one("Sub", [g.ints(min_total), total64]), pad])
        if not pad_matmuls:
            extra = attn_pad
        elif min_total:  # the layer's rows already carry the single-row pad
            extra = g.one("Sub", [attn_pad, pad])
        # The padding rows follow the call's last position: they write scratch K/V slots from index `total` on
        # (overwritten by later calls before anything reads them) and no real row attends to them.
        pad32 = g.one("Cast", [attn_pad], to=onnx.TensorProto.INT32)
        seqlens = g.one("Add", [seqlens, pad32])
        total = g.one("Add", [total, g.one("Squeeze", [pad32, g.ints(0)])])
    h = rms_norm(g, hidden, _norm_weight(spec, w("input_layernorm.weight")), eps, "input_norm")
    # One projection for q, k and v (one MatMulNBits call: its activations are quantized and the thread pool
    # woken once, not three times); each output column is computed as by its own projection.
    qkv_weight = (w("self_attn.qkv_proj.weight") if spec.fused_projections else
                  join_rows([w(f"self_attn.{n}_proj.weight") for n in "qkv"]))
    qkv = linear(g, h, qkv_weight, "qkv_proj")
    if spec.qkv_bias:  # [per-architecture] Qwen2; an elementwise add keeps each row independent of the call
        qkv = g.one("Add", [qkv, g.const("qkv_bias", np.concatenate([w(f"self_attn.{n}_proj.bias") for n in "qkv"]))])
    if extra:
        qkv = pad_rows(g, qkv, extra)
    q_size, kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    if spec.qk_norm:  # per-head RMSNorm of q and k, before rotary (which GroupQueryAttention applies)
        q, k, v = g.op("Split", [qkv, g.ints(q_size, kv_size, kv_size)], 3, axis=-1)
        qkv_inputs = [_head_norm(g, q, spec.num_heads, spec, w("self_attn.q_norm.weight"), "q_norm"),
                      _head_norm(g, k, spec.num_kv_heads, spec, w("self_attn.k_norm.weight"), "k_norm"), v]
    else:  # GroupQueryAttention reads packed q|k|v from `query` when `key` and `value` are empty
        qkv_inputs = [qkv, "", ""]
    layer_type = spec.layer_types[index]
    cos, sin = rope_cache(spec, layer_type, context_length)
    window = spec.sliding_window if layer_type == "sliding_attention" else None
    common = dict(num_heads=spec.num_heads, kv_num_heads=spec.num_kv_heads, scale=spec.scale,
                  # = sliding_window matches transformers' mask (kv > q − window) bit for bit over 700 positions;
                  # window − 1 differs from position 511 on.
                  local_window_size=window or -1)
    if exact:  # edgespec's attention op: GroupQueryAttention's inputs, outputs and masks, exact for any number of
        # rows, so nothing is padded around it; the rotary embedding (non-interleaved) is part of the op
        op, domain, attrs = custom_ops.ATTENTION_OP, custom_ops.DOMAIN, {**common, "softcap": float(spec.attn_softcap)}
    else:
        op, domain = "GroupQueryAttention", MS_DOMAIN
        attrs = {**common, "do_rotary": 1, "rotary_interleaved": 0,
                 **({"softcap": spec.attn_softcap} if spec.attn_softcap else {})}  # [per-architecture] Gemma 2
    # Under the exact attention a token tree can be verified in one call: ``tree_parents`` gives each row's parent
    # row (empty: a chain), the kernel masks every row to its own path (edgespec/kernels/exact_attention.cc).
    # An input with a default (an initializer of the same name, empty): callers that know nothing of trees need
    # not feed it.
    tree = [g.const(TREE_INPUT, np.zeros(0, np.int32))] if exact else []
    attn = g.op(op, [*qkv_inputs, "past_key", "past_value", seqlens, total,
                     g.const("cos_cache", cos), g.const("sin_cache", sin), *tree],
                [g.name + "_attn", "present_key", "present_value"], domain=domain, **attrs)[0]
    if extra:
        attn = drop_padding(g, attn, g.one("Add", [seq, pad]) if pad_matmuls else seq)
    o = linear(g, attn, w("self_attn.o_proj.weight"), "o_proj")
    if spec.gemma:
        o = rms_norm(g, o, _norm_weight(spec, w("post_attention_layernorm.weight")), eps, "post_attn_norm")
    mlp_norm = "pre_feedforward_layernorm.weight" if spec.gemma else "post_attention_layernorm.weight"
    h, x = skip_rms_norm(g, hidden, o, _norm_weight(spec, w(mlp_norm)), eps, "mlp_norm")
    # gate and up as one projection too, split after
    gate_up_weight = (w("mlp.gate_up_proj.weight") if spec.fused_projections else  # Phi-3: gate rows, then up
                      join_rows([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")]))
    intermediate = gate_up_weight.shape[0] // 2
    gate_up = linear(g, h, gate_up_weight, "gate_up_proj")
    if exact and not spec.gemma:  # edgespec's SwiGlu (its library is there): one op for Split, QuickGelu and Mul
        gated = g.one(custom_ops.SWIGLU_OP, [gate_up], domain=custom_ops.DOMAIN)
    else:  # Gemma: GELU (tanh approximation); Llama: SiLU
        gate, up = g.op("Split", [gate_up, g.ints(intermediate, intermediate)], 2, axis=-1)
        act = (g.one("Gelu", [gate], approximate="tanh") if spec.gemma else
               g.one("Mul", [gate, g.one("Sigmoid", [gate])]))
        gated = g.one("Mul", [act, up])
    d = linear(g, gated, w("mlp.down_proj.weight"), "down_proj")
    if spec.gemma:
        d = rms_norm(g, d, _norm_weight(spec, w("post_feedforward_layernorm.weight")), eps, "post_mlp_norm")
    out = g.one("Add", [x, d])
    if pad_matmuls:
        out = drop_padding(g, out, seq)
    g.one("Identity", [out], "hidden_out")
    kv_shape = [1, spec.num_kv_heads, kv_length(context_length), spec.head_dim]
    kv_type = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(kv))
    inputs = [_tensor("hidden", f32, [1, "S", spec.hidden_size]), _tensor("past_key", kv_type, kv_shape),
              _tensor("past_value", kv_type, kv_shape), _tensor("seqlens_k", onnx.TensorProto.INT32, [1]),
              _tensor("total_sequence_length", onnx.TensorProto.INT32, []),
              *([_tensor(TREE_INPUT, onnx.TensorProto.INT32, ["T"])] if exact else [])]
    outputs = [_tensor("hidden_out", f32, [1, "S", spec.hidden_size]), _tensor("present_key", kv_type, kv_shape),
               _tensor("present_value", kv_type, kv_shape)]
    return g.model(inputs, outputs)


def _head_norm(g: GraphBuilder, x: str, heads: int, spec: ModelSpec, weight: np.ndarray, name: str) -> str:
    split = g.one("Reshape", [x, g.ints(0, 0, heads, spec.head_dim)])
    normed = rms_norm(g, split, _norm_weight(spec, weight), spec.rms_norm_eps, name)
    return g.one("Reshape", [normed, g.ints(0, 0, heads * spec.head_dim)])


def embed_graph(spec: ModelSpec, table: Weight):
    """input_ids → hidden. A float16 table is gathered, then cast (the table stays half size in memory); a GGUF
    file's blocks are gathered and dequantized row by row, as llama.cpp does."""
    onnx = require("onnx")
    g = GraphBuilder("embed")
    if isinstance(table, BlockWeight):
        x = _gather_blocks(g, table)
    elif isinstance(table, KQuantWeight):
        x = _gather_kquant(g, table)
    else:
        x = g.one("Gather", [g.const("embed_tokens", table), "input_ids"], axis=0)
    if isinstance(table, np.ndarray) and table.dtype != np.float32:
        x = g.one("Cast", [x], to=onnx.TensorProto.FLOAT)
    if spec.gemma:  # Gemma scales embeddings by sqrt(hidden_size) (in float32, as transformers does)
        x = g.one("Mul", [x, g.const("embed_scale", np.array(spec.hidden_size ** 0.5, np.float32))])
    g.one("Identity", [x], "hidden")
    return g.model([_tensor("input_ids", onnx.TensorProto.INT64, [1, "S"])],
                   [_tensor("hidden", onnx.TensorProto.FLOAT, [1, "S", spec.hidden_size])])


def head_graph(spec: ModelSpec, norm: np.ndarray, lm_head: Weight, weight_dtype: type = np.float32,
               pad_matmuls: bool = False, q4_products: bool = False):
    """hidden rows → logits: final RMSNorm and the (possibly tied) output projection."""
    onnx = require("onnx")
    g = GraphBuilder("head", weight_dtype, q4_products)
    hidden = "hidden"
    if pad_matmuls:
        pad, seq = single_row_padding(g, hidden)
        hidden = pad_rows(g, hidden, pad)
    logits = linear(g, rms_norm(g, hidden, _norm_weight(spec, norm), spec.rms_norm_eps, "final_norm"), lm_head,
                    "lm_head")
    if spec.final_softcap:  # [per-architecture] Gemma 2: cap · tanh(logits / cap)
        cap = g.const("final_softcap", np.array(spec.final_softcap, np.float32))
        logits = g.one("Mul", [g.one("Tanh", [g.one("Div", [logits, cap])]), cap])
    if pad_matmuls:
        logits = drop_padding(g, logits, seq)
    g.one("Identity", [logits], "logits")
    return g.model([_tensor("hidden", onnx.TensorProto.FLOAT, [1, "N", spec.hidden_size])],
                   [_tensor("logits", onnx.TensorProto.FLOAT, [1, "N", spec.vocab_size])])


def _gather_blocks(g: GraphBuilder, table: BlockWeight) -> str:
    """The rows of input_ids, dequantized in float32 as ``BlockWeight.dequantize`` computes them (one byte per
    code: a quarter of a float32 table, and nothing rounded)."""
    codes = g.one("Gather", [g.const("embed_codes", table.unpacked_codes()), "input_ids"], axis=0)
    x = g.one("Cast", [codes], to=g.onnx.TensorProto.FLOAT)
    if table.zero_point:
        x = g.one("Sub", [x, g.const("embed_zero_point", np.array(table.zero_point, np.float32))])
    scales = g.one("Gather", [g.const("embed_scales", table.scales[..., None]), "input_ids"], axis=0)
    x = g.one("Mul", [scales, x])
    if table.minima is not None:
        x = g.one("Add", [x, g.one("Gather", [g.const("embed_minima", table.minima[..., None]), "input_ids"], axis=0)])
    return g.one("Reshape", [x, g.ints(0, 0, table.shape[1])])


def _gather_kquant(g: GraphBuilder, table: KQuantWeight) -> str:
    """The rows of input_ids from K-quant super-blocks or Q5_0 / Q5_1 blocks, dequantized in float32 as gguf and
    llama.cpp compute them (``KQuantWeight.dequantize``: the sub-block's exact float scale times the code, a minimum
    added where the type has one): a byte per code and a float per sub-block, and nothing rounded that they do not
    round."""
    codes, scales, minima = table.gathered()
    x = g.one("Cast", [g.one("Gather", [g.const("embed_codes", codes), "input_ids"], axis=0)],
              to=g.onnx.TensorProto.FLOAT)
    x = g.one("Mul", [g.one("Gather", [g.const("embed_scales", scales), "input_ids"], axis=0), x])
    if minima is not None:
        x = g.one("Add", [x, g.one("Gather", [g.const("embed_minima", minima), "input_ids"], axis=0)])
    return g.one("Reshape", [x, g.ints(0, 0, table.shape[1])])
