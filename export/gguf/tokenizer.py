"""tokenizer.json and tokenizer_config.json from a GGUF's ``tokenizer.ggml.*`` metadata, written with the
``tokenizers`` library so that the ONNX backend (``edgespec.backends.onnx.tokenizer``) tokenizes as llama.cpp does.

llama.cpp's byte-level BPE ("gpt2" vocabularies): the text is split by the pre-tokenizer's regular expressions
in turn (chosen by ``tokenizer.ggml.pre``), each piece spelled in GPT-2's printable bytes, then merged by rank.
llama.cpp's SentencePiece vocabularies ("llama": Gemma, Phi-3, Mistral, Llama 2): spaces spelled ``▁`` (and one put
before each stretch of text that starts the text or follows a token, where ``tokenizer.ggml.add_space_prefix``
says so), the stretch cut into characters, and the adjacent pair whose concatenation is the highest-scoring piece
merged until none is a piece; a character no piece holds becomes its UTF-8 bytes' ``<0xAB>`` tokens. As a
``tokenizers`` BPE: every such pair is a merge, ranked by the merged piece's score, with byte fallback.
Control tokens (type 3) are recognised in text only when special tokens are parsed; user-defined ones (type 4)
always — as a ``tokenizers`` added token that is special / not special.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgespec.errors import ModelLoadError

from .. import UnsupportedArchitectureError, require
from .ggufio import field

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Llama 3's and Qwen2's expressions as llama.cpp writes them (their tokenizer.json's (?i:'s|…) spelled out); they
# differ in the digits: runs of up to three, or one at a time
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# llama.cpp's (the version llama-cpp-python 0.3.36 pins) regular expressions per pre-tokenizer name (a file
# without one gets llama.cpp's "default" set, not written here)
_LLAMA3_NAMES = ("llama3", "llama-v3", "llama-bpe")
PRE_TOKENIZERS = {
    "gpt-2": (_GPT2,),
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell"), (r"\p{N}", _GPT2)),
    **dict.fromkeys(_LLAMA3_NAMES, (_LLAMA3,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), (_QWEN2,)),
}
# Llama 3: a piece found whole in the vocabulary is that token, merges or not; a BOS unless the file says otherwise
IGNORE_MERGES = _LLAMA3_NAMES
ADD_BOS_BY_DEFAULT = _LLAMA3_NAMES
_CONTROL, _USER_DEFINED = 3, 4
SENTENCEPIECE = "llama"  # tokenizer.ggml.model of SentencePiece vocabularies


def write_tokenizer(r: Any, out: Path) -> dict[str, Any]:
    """Write tokenizer.json and tokenizer_config.json for the GGUF reader ``r`` into ``out``; returns the config."""
    tokenizers = require("tokenizers", "onnx")
    kind = field(r, "tokenizer.ggml.model")
    pre = field(r, "tokenizer.ggml.pre", "default")
    if kind not in ("gpt2", SENTENCEPIECE) or (kind == "gpt2" and pre not in PRE_TOKENIZERS):
        raise UnsupportedArchitectureError(f"the GGUF's tokenizer ({kind!r}, pre-tokenizer {pre!r}) cannot be "
                                           f"written yet (supported: SentencePiece, and byte-level BPE with "
                                           f"{', '.join(PRE_TOKENIZERS)})")
    tokens: list[str] = field(r, "tokenizer.ggml.tokens")
    types: list[int] = _per_token(r, "token_type", tokens, 1)
    if kind == SENTENCEPIECE:
        tok = _sentencepiece(tokenizers, r, tokens)
    else:
        merges = [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges") or []]
        model = tokenizers.models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False,
                                      ignore_merges=pre in IGNORE_MERGES)
        tok = tokenizers.Tokenizer(model)
        pt = tokenizers.pre_tokenizers
        tok.pre_tokenizer = pt.Sequence([pt.Split(tokenizers.Regex(expr), "isolated")
                                         for expr in PRE_TOKENIZERS[pre]]
                                        + [pt.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_tokens([tokenizers.AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
                    for i in range(len(tokens)) if types[i] in (_CONTROL, _USER_DEFINED)])

    def special(name: str) -> str | None:
        token_id = field(r, f"tokenizer.ggml.{name}_token_id")
        return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None

    bos, eos = special("bos"), special("eos")
    bos_by_default = pre in ADD_BOS_BY_DEFAULT or kind == SENTENCEPIECE  # llama.cpp's default for SentencePiece
    add_bos = bool(field(r, "tokenizer.ggml.add_bos_token", bos_by_default)) and bos is not None
    add_eos = bool(field(r, "tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        template = " ".join([*(["$bos"] if add_bos else []), "$A", *(["$eos"] if add_eos else [])])
        template = template.replace("$bos", bos or "").replace("$eos", eos or "")
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single=template, special_tokens=[(t, tokens.index(t)) for t in {bos, eos} if t and t in template])
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "add_bos_token": add_bos, "add_eos_token": add_eos, "model_max_length": 1 << 30,
              "chat_template": field(r, "tokenizer.chat_template")}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return config


def _per_token(r: Any, key: str, tokens: list[str], default: Any) -> list[Any]:
    """The file's ``tokenizer.ggml.KEY`` array, one value a token (``default`` for each where there is none); a
    damaged file whose array is another length is a clear error, not a stray index."""
    values = field(r, f"tokenizer.ggml.{key}") or [default] * len(tokens)
    if len(values) != len(tokens):
        raise ModelLoadError(f"the GGUF's tokenizer.ggml.{key} holds {len(values)} values for {len(tokens)} tokens")
    return values


def _sentencepiece(tokenizers: Any, r: Any, tokens: list[str]) -> Any:
    """llama.cpp's SentencePiece tokenizer (the module docstring) as a ``tokenizers`` BPE."""
    scores: list[float] = _per_token(r, "scores", tokens, 0.0)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for token, score in zip(tokens, scores, strict=True):
        for cut in range(1, len(token)):
            if token[:cut] in vocab and token[cut:] in vocab:
                merges.append((-score, vocab[token], cut, token[:cut], token[cut:]))
    merges.sort()  # the highest-scoring piece first (a piece made two ways: both merges side by side)
    unk = field(r, "tokenizer.ggml.unknown_token_id")
    model = tokenizers.models.BPE(vocab, [(left, right) for *_, left, right in merges], byte_fallback=True,
                                  unk_token=tokens[unk] if unk is not None and 0 <= unk < len(tokens) else None,
                                  fuse_unk=True)
    tok = tokenizers.Tokenizer(model)
    prefix = bool(field(r, "tokenizer.ggml.add_space_prefix", True))  # llama.cpp's default
    nm, dc = tokenizers.normalizers, tokenizers.decoders
    tok.normalizer = nm.Sequence([*([nm.Prepend("▁")] if prefix else []), nm.Replace(" ", "▁")])
    tok.decoder = dc.Sequence([dc.Replace("▁", " "), dc.ByteFallback(), dc.Fuse(),
                               *([dc.Strip(" ", 1, 0)] if prefix else [])])
    return tok
