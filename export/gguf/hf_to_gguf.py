"""A local Hugging Face folder (Llama or Gemma 3 text) → an F16 GGUF, written with the ``gguf`` package.

llama.cpp's own converter (``convert_hf_to_gguf.py``) lives only in its source tree; no installed package
ships it, so this is an equivalent writer for the two architectures edgespec supports: config → metadata,
tensors renamed to llama.cpp's names, Llama's Q/K rows permuted into llama.cpp's RoPE layout, Gemma's
``1 + w`` norm weights stored as llama.cpp multiplies them, and the tokenizer (tokenizer.json) and chat
template included. Weight matrices are written as F16, norms as F32 (as llama.cpp's converter does);
other quantizations are made from that file by llama.cpp's quantizer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.errors import ModelLoadError
from edgespec.files import staged
from edgespec.home import home_dir

from .. import UnsupportedArchitectureError, require
from ..files import ensure_space
from .hf import check_architecture

ARCHITECTURES = {"llama": "llama", "gemma3_text": "gemma3"}  # HF model_type → GGUF architecture

_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_LAYER_BY_ARCH = {
    "llama": {**_LAYER, "post_attention_layernorm": "ffn_norm"},
    "gemma3": {**_LAYER, "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm"},
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} is not a Hugging Face model folder (no config.json)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from e
    check_architecture(str(config.get("model_type")), folder, ARCHITECTURES)
    return config


def _rope(config: dict[str, Any], layer_type: str = "full_attention") -> dict[str, Any]:
    """RoPE parameters: transformers 5 writes ``rope_parameters`` (per layer type for Gemma 3), 4 wrote
    ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling``."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params:
        params = params[layer_type]
    if not isinstance(params, dict):
        local = layer_type == "sliding_attention" and "rope_local_base_freq" in config
        params = {"rope_theta": config["rope_local_base_freq" if local else "rope_theta"],
                  **(config.get("rope_scaling") or {})}
    if params.get("rope_type", "default") != "default":
        raise UnsupportedArchitectureError(f"RoPE scaling {params.get('rope_type')!r} is not supported by the "
                                           "GGUF writer")
    return params


def _tensors(folder: Path) -> Iterator[tuple[str, np.ndarray]]:
    safetensors = require("safetensors", "export-hf")
    require("torch", "export-hf")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors weights")
    for path in files:
        with safetensors.safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, f.get_tensor(name).float().numpy()


def _rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF keeps each head's rotary halves apart; llama.cpp's Llama RoPE wants them interleaved in pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(name: str, arch: str) -> str | None:
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _LAYER_NAME.match(name)
    if m and m.group(2) in _LAYER_BY_ARCH[arch]:
        return f"blk.{m.group(1)}.{_LAYER_BY_ARCH[arch][m.group(2)]}.weight"
    return None


def _add_tokenizer(writer: Any, folder: Path, config: dict[str, Any], arch: str) -> None:
    gguf = require("gguf")
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no tokenizer.json: the GGUF needs the tokenizer")
    tok = json.loads(path.read_text())
    model = tok["model"]
    vocab: dict[str, int] = dict(model["vocab"]) if isinstance(model["vocab"], dict) else {
        piece: i for i, (piece, _score) in enumerate(model["vocab"])}
    special = {t["content"]: t for t in tok.get("added_tokens", [])}
    vocab.update({t["content"]: t["id"] for t in special.values()})
    n_vocab = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [gguf.TokenType.UNUSED] * n_vocab
    for piece, i in vocab.items():
        if i < n_vocab:
            tokens[i] = piece
            types[i] = gguf.TokenType.NORMAL
    for t in special.values():
        if t["id"] < n_vocab:
            types[t["id"]] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    if arch == "llama":
        if model["type"] != "BPE":
            raise UnsupportedArchitectureError(f"{path}: a {model['type']} tokenizer for Llama is not supported")
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(_bpe_pre(tok.get("pre_tokenizer"), path))
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    else:  # Gemma 3: llama.cpp's SentencePiece tokenizer, byte-fallback tokens <0x..> marked as such
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        for i, piece in enumerate(tokens):
            if re.fullmatch(r"<0x[0-9A-F]{2}>", piece):
                types[i] = gguf.TokenType.BYTE
        writer.add_token_scores(_spm_scores(model, tokens, types))
        # SentencePiece's "▁" before the first word: only if the normalizer / pre-tokenizer prepends one.
        writer.add_add_space_prefix("Prepend" in json.dumps(tok.get("normalizer"))
                                    or '"prepend_scheme": "always"' in json.dumps(tok.get("pre_tokenizer")))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    settings = _read_json(folder / "tokenizer_config.json")
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("unk", writer.add_unk_token_id), ("pad", writer.add_pad_token_id)):
        text = settings.get(f"{key}_token")
        text = text.get("content") if isinstance(text, dict) else text
        token_id = vocab.get(text) if text is not None else config.get(f"{key}_token_id")
        if isinstance(token_id, int):
            add(token_id)
    writer.add_add_bos_token(bool(settings.get("add_bos_token", _post_processor_adds_bos(tok))))
    writer.add_add_eos_token(bool(settings.get("add_eos_token", False)))
    template = settings.get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)


def _spm_scores(model: dict[str, Any], tokens: list[str], types: list[Any]) -> list[float]:
    """Piece scores for llama.cpp's SentencePiece merge loop, which joins the adjacent pair whose result
    scores highest. A Unigram tokenizer.json carries the scores; a BPE one (what transformers writes for
    Gemma) carries merge ranks instead, and scoring each piece by minus the rank of the merge that makes
    it gives the same merge order. Control and user-defined pieces get -1000, bytes 0, as in Gemma's GGUF."""
    if model["type"] == "Unigram":
        return [float(score) for _piece, score in model["vocab"]][:len(tokens)]
    rank: dict[str, int] = {}
    for r, m in enumerate(model.get("merges", [])):
        left, right = m.split(" ", 1) if isinstance(m, str) else m
        rank.setdefault(left + right, r)
    unranked = len(rank)
    return [-1000.0 if t in (3, 4) else 0.0 if t == 6 else -float(rank.get(piece, unranked + i))
            for i, (piece, t) in enumerate(zip(tokens, types, strict=True))]


def _bpe_pre(pre: dict[str, Any] | None, path: Path) -> str:
    """llama.cpp's name for the pre-tokenizer (it chooses the split regex by name)."""
    steps = pre.get("pretokenizers", [pre]) if pre else []
    kinds = [(s["type"], s.get("individual_digits")) for s in steps]
    if kinds == [("Digits", True), ("ByteLevel", None)]:
        return "smollm"  # single digits, then GPT-2's regex
    if kinds == [("ByteLevel", None)] and steps[0].get("use_regex", True):
        return "gpt-2"
    raise UnsupportedArchitectureError(f"{path}: pre-tokenizer {kinds} has no llama.cpp equivalent known here")


def _post_processor_adds_bos(tok: dict[str, Any]) -> bool:
    post = tok.get("post_processor") or {}
    return any("SpecialToken" in step for step in post.get("single", []))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def convert(folder: Path, out: Path) -> Path:
    """Write ``folder`` as an F16 GGUF at ``out`` (atomically)."""
    gguf = require("gguf")
    config = read_config(folder)
    arch = ARCHITECTURES[config["model_type"]]
    n_layers, n_head = config["num_hidden_layers"], config["num_attention_heads"]
    n_head_kv = config.get("num_key_value_heads", n_head)
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    ensure_space(out, sum(p.stat().st_size for p in folder.glob("*.safetensors")))
    with staged(out) as tmp:
        w = gguf.GGUFWriter(tmp, arch=arch)
        w.add_name(config.get("_name_or_path") or config.get("_model_name_or_path") or folder.name)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_block_count(n_layers)
        w.add_context_length(config["max_position_embeddings"])
        w.add_embedding_length(config["hidden_size"])
        w.add_feed_forward_length(config["intermediate_size"])
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_layer_norm_rms_eps(config["rms_norm_eps"])
        w.add_rope_freq_base(_rope(config)["rope_theta"])
        if arch == "llama":
            w.add_vocab_size(config["vocab_size"])
            w.add_rope_dimension_count(head_dim)
        else:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
            if config.get("sliding_window"):
                w.add_sliding_window(config["sliding_window"])
                w.add_rope_freq_base_swa(_rope(config, "sliding_attention")["rope_theta"])
                if config.get("layer_types"):  # explicit per-layer types: llama.cpp honours the array
                    w.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])
            if config.get("final_logit_softcapping"):
                w.add_float32(f"{arch}.final_logit_softcapping", config["final_logit_softcapping"])
        _add_tokenizer(w, folder, config, arch)
        tied = config.get("tie_word_embeddings", True)
        for name, data in _tensors(folder):
            new = _gguf_name(name, arch)
            if new is None:
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                raise UnsupportedArchitectureError(f"{folder}: tensor {name!r} has no GGUF equivalent here")
            if new == "output.weight" and tied:
                continue
            if arch == "llama" and new.endswith(("attn_q.weight", "attn_k.weight")):
                data = _rope_permute(data, n_head if new.endswith("attn_q.weight") else n_head_kv)
            if arch == "gemma3" and new.endswith("norm.weight"):
                data = data + 1.0  # Gemma's RMSNorm scales by (1 + w); llama.cpp by w
            w.add_tensor(new, data.astype(np.float16 if data.ndim > 1 else np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return out


def convert_cached(folder: Path) -> Path:
    """The F16 GGUF of ``folder``, converted once and kept in the cache (keyed by the folder's files)."""
    read_config(folder)
    h = hashlib.sha256(str(folder.resolve()).encode())
    for p in sorted(folder.iterdir()):
        if p.is_file():
            h.update(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}".encode())
    out = home_dir("hf-gguf") / f"{folder.name}-{h.hexdigest()[:12]}-f16.gguf"
    return out if out.exists() else convert(folder, out)
