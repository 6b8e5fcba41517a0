"""Which request keys edgespec knows, and what each of the others gets: never silently ignored.

A key of a request body (or of a chat message) is one of:

- a parameter edgespec implements (``COMMON``, ``CHAT``, ``COMPLETION``, ``MESSAGE``): parsed in openai_api,
  where other servers' names for the same thing are mapped too (``n_predict``, ``num_predict`` → ``max_tokens``);
- a parameter of OpenAI's API or of another server (llama.cpp's, Ollama's, vLLM's) that edgespec does not
  implement (``UNSUPPORTED``): accepted at the values that change nothing (what clients send by default), else a
  400 naming it and saying why (code ``unsupported``);
- a field that changes no output (``INERT``: ``user``, ``metadata``; a refused sampler's rate or window, which
  does nothing while that sampler is off): accepted;
- anything else: a 400 naming it (code ``unknown_parameter``), as OpenAI's API answers an unrecognized argument,
  since a misspelt parameter that is ignored gives output the client did not ask for.

A null value is the same as the key left out (OpenAI's convention), checked before any of this.

Ollama's native API (``/api/chat``, ``/api/generate``: ollama_api) has its own top-level keys (``OLLAMA_CHAT``,
``OLLAMA_GENERATE``, ``OLLAMA_UNSUPPORTED``, ``OLLAMA_INERT``) and puts the sampling parameters in ``options``:
those named in ``OLLAMA_OPTIONS`` are passed on as the request keys of the same names, so that they get exactly the
answers above (a penalty, say, is refused unless neutral until the OpenAI endpoints take it, and from then on taken
by both); ``num_ctx`` is ollama_api's own; the runtime settings in ``OLLAMA_RUNTIME`` change no output.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

COMMON = frozenset({"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n_predict",
                    "num_predict", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "cache_prompt",
                    "speculative",
                    # constraints (edgespec/engine/constraints.py), under OpenAI's, llama.cpp's and vLLM's names
                    "response_format", "grammar", "json_schema", "guided_json", "guided_regex", "guided_choice",
                    "guided_grammar",
                    # penalties (edgespec/engine/rules.py), OpenAI's, vLLM's and llama.cpp's
                    "presence_penalty", "frequency_penalty", "repetition_penalty", "repeat_penalty", "repeat_last_n",
                    "penalty_last_n",
                    # log-probabilities: OpenAI's (completions: logprobs is the number of top ones), llama.cpp's
                    "logprobs", "top_logprobs", "n_probs"})
CHAT = COMMON | {"messages", "tools", "tool_choice", "parallel_tool_calls"}  # tools: edgespec/engine/tools.py
COMPLETION = COMMON | {"prompt"}
# An assistant's tool calls, a tool result's call (OpenAI's) or tool (Ollama's).
MESSAGE = frozenset({"role", "content", "tool_calls", "tool_call_id", "tool_name"})

_PENALTY = "this sampler is not implemented (edgespec has presence, frequency and repetition penalties)"
_CONSTRAINED = ("'format' is Ollama's name (/api/chat and /api/generate): here send response_format, json_schema, "
                "grammar or guided_* (vLLM's names)")
_OLLAMA_ONLY_ON_V1 = "not yet on Ollama's endpoints: the /v1 endpoints take it (logprobs)"
_SAMPLER = "edgespec samples with temperature, top_k, top_p and min_p only"
_TOOLS = "tools are taken by chat requests (/v1/chat/completions, /api/chat); 'functions' and 'function_call' are " \
         "the deprecated forms of 'tools' and 'tool_choice'"
_REASONING = "edgespec's models have no reasoning setting"

# key → (the values that change nothing, why any other value is refused)
UNSUPPORTED: dict[str, tuple[tuple[object, ...], str]] = {
    # OpenAI
    "tools": (([],), _TOOLS), "tool_choice": (("none",), _TOOLS),
    "functions": (([],), _TOOLS), "function_call": (("none",), _TOOLS), "parallel_tool_calls": ((True, False), _TOOLS),
    "logit_bias": (({},), "logit biases are not implemented"),
    "best_of": ((1,), "one completion per request: send several requests"),
    "echo": ((False,), "echoing the prompt is not implemented"),
    "suffix": (("",), "completing text before a suffix is not implemented"),
    "audio": ((), "audio is not implemented"), "modalities": ((["text"],), "edgespec's models write text only"),
    "reasoning_effort": ((), _REASONING), "verbosity": ((), _REASONING),
    "prediction": ((), "predicted outputs are not implemented (edgespec drafts from the prompt by itself: n-gram "
                       "lookup)"),
    "web_search_options": ((), "web search is not implemented"),
    # llama.cpp's server
    "dry_multiplier": ((0,), _PENALTY),
    "mirostat": ((0,), _SAMPLER), "typical_p": ((1,), _SAMPLER), "tfs_z": ((1,), _SAMPLER),
    "xtc_probability": ((0,), _SAMPLER), "top_n_sigma": ((-1,), _SAMPLER), "dynatemp_range": ((0,), _SAMPLER),
    "min_keep": ((0,), _SAMPLER),
    "ignore_eos": ((False,), "generation always ends at the end of the text"),
    # vLLM, Hugging Face TGI
    "use_beam_search": ((False,), "beam search is not implemented"),
    "length_penalty": ((1,), "beam search is not implemented"),
    "min_tokens": ((0,), "a minimum length is not implemented"),
    "stop_token_ids": (([],), "stop tokens by id are not implemented; use 'stop' strings"),
    "skip_special_tokens": ((True,), "special tokens are always left out of the text"),
    "include_stop_str_in_output": ((False,), "a stop string is always left out of the text"),
    # Ollama
    "format": (("",), _CONSTRAINED), "think": ((False,), _REASONING),
    "options": ((), "'options' is Ollama's native API: send its fields at the top level (max_tokens, temperature, "
                    "top_k, top_p, min_p, seed, stop)"),
}
INERT = frozenset({
    "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "keep_alive", "id_slot",
    # The windows and rates of samplers refused above unless off: they do nothing while those are off.
    "mirostat_tau", "mirostat_eta", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "dry_sequence_breakers", "xtc_threshold", "dynatemp_exponent", "penalize_newline"})
# Chat message fields: what OpenAI's and Ollama's clients send back with an assistant's earlier reply.
MESSAGE_UNSUPPORTED: dict[str, tuple[tuple[object, ...], str]] = {
    "name": (("",), "a participant's name has no place in the model's chat template"),
    "function_call": ((), _TOOLS),
    "refusal": (("",), "an assistant's refusal is not implemented: send it as content"),
    "audio": ((), "audio is not implemented"), "annotations": (([],), "annotations are not implemented"),
    # Ollama's message fields
    "images": (([],), "edgespec's models read text only"), "thinking": (("",), _REASONING),
}


# Ollama's native API. Top-level keys: the prompt, how to answer, and ``options``.
OLLAMA_CHAT = frozenset({"model", "messages", "stream", "options", "format", "tools"})
OLLAMA_GENERATE = frozenset({"model", "prompt", "system", "raw", "stream", "options", "format"})
OLLAMA_INERT = frozenset({"keep_alive"})  # how long a model stays loaded: here, until the server stops
OLLAMA_UNSUPPORTED: dict[str, tuple[tuple[object, ...], str]] = {
    # Refused here even once the OpenAI endpoints take them: each needs its own Ollama request and reply fields.
    "think": ((False,), _REASONING),
    "logprobs": ((False,), _OLLAMA_ONLY_ON_V1), "top_logprobs": ((0,), _OLLAMA_ONLY_ON_V1),
    "template": (("",), "only the model's own chat template is applied (its Jinja template, not a Go template)"),
    "context": (([],), "token context from an earlier reply is not kept: send the conversation as messages to "
                       "/api/chat"),
    "images": (([],), "edgespec's models read text only"),
    "suffix": (("",), "completing text before a suffix is not implemented"),
    "truncate": ((False,), "a prompt longer than the context is refused, never truncated"),
    "shift": ((False,), "generation ends when the context is full; the context is never shifted"),
    "width": ((), "image generation is not implemented"), "height": ((), "image generation is not implemented"),
    "steps": ((), "image generation is not implemented"),
}
# ``options`` keys passed on as the request keys of the same name (COMMON, UNSUPPORTED or INERT decide).
OLLAMA_OPTIONS = frozenset({
    "num_predict", "temperature", "top_k", "top_p", "min_p", "seed", "stop",
    "repeat_penalty", "presence_penalty", "frequency_penalty", "repeat_last_n", "penalize_newline",
    "typical_p", "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta"})
# ``options`` keys that say how the model runs, not what it writes.
OLLAMA_RUNTIME = frozenset({"numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
                            "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread",
                            "num_keep"})  # num_keep: tokens kept when the context shifts, which it never does


def refused_key(body: Mapping[str, Any], known: Collection[str], where: str = "",
                unsupported: Mapping[str, tuple[tuple[object, ...], str]] = UNSUPPORTED,
                inert: Collection[str] = INERT) -> tuple[str, str, str] | None:
    """The first key of ``body`` (nulls already dropped) that is neither ``known``, nor ``inert``, nor an
    ``unsupported`` one at a value that changes nothing, as (its name, the error code, a message); None if none.
    ``where`` prefixes the key's name (``messages[0].``)."""
    for key, value in body.items():
        if key in known or key in inert:
            continue
        name = f"{where}{key}"
        if key not in unsupported:
            return name, "unknown_parameter", (f"'{name[:80]}' is not a parameter edgespec knows; it is refused rather "
                                               "than ignored (a misspelling?)")
        neutral, why = unsupported[key]
        if not any(_same(value, n) for n in neutral):
            return name, "unsupported", f"'{name}' is not supported by edgespec: {why}; it is refused rather than " \
                                        "ignored"
    return None


def _same(value: object, neutral: object) -> bool:
    """Equal, with booleans apart from numbers (``false`` is not ``0``)."""
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)
