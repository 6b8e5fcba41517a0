"""Which request keys edgespec knows, and what each of the others gets: never silently ignored.

A key of a request body (or of a chat message) is one of:

- a parameter edgespec implements (``COMMON``, ``CHAT``, ``COMPLETION``, ``MESSAGE``): parsed in openai_api,
  where other servers' names for the same thing are mapped too (``n_predict``, ``num_predict`` → ``max_tokens``);
- a parameter of OpenAI's API or of another server (llama.cpp's, Ollama's, vLLM's) that edgespec does not
  implement (``UNSUPPORTED``): accepted at the values that change nothing (what clients send by default), else a
  400 naming it and saying why (code ``unsupported``);
- a field that changes no output (``INERT``: ``user``, ``metadata``; a penalty's window, which does nothing
  while the penalty is off, and a penalty that is on is refused): accepted;
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
                    "speculative"})
CHAT = COMMON | {"messages"}
COMPLETION = COMMON | {"prompt"}
MESSAGE = frozenset({"role", "content"})

_PENALTY = ("penalties and biases change the target's distribution, so speculative verification would have to "
            "apply them too; not implemented")
_CONSTRAINED = "constrained decoding (JSON mode, grammars, schemas, regexes, choices) is not implemented"
_SAMPLER = "edgespec samples with temperature, top_k, top_p and min_p only"
_TOOLS = "tool and function calling is not implemented"
_LOGPROBS = "log probabilities are not returned"
_REASONING = "edgespec's models have no reasoning setting"

# key → (the values that change nothing, why any other value is refused)
UNSUPPORTED: dict[str, tuple[tuple[object, ...], str]] = {
    # OpenAI
    "response_format": (({"type": "text"},), _CONSTRAINED),
    "tools": (([],), _TOOLS), "tool_choice": (("none",), _TOOLS),
    "functions": (([],), _TOOLS), "function_call": (("none",), _TOOLS), "parallel_tool_calls": ((True, False), _TOOLS),
    "frequency_penalty": ((0,), _PENALTY), "presence_penalty": ((0,), _PENALTY), "logit_bias": (({},), _PENALTY),
    "logprobs": ((False, 0), _LOGPROBS), "top_logprobs": ((0,), _LOGPROBS),
    "best_of": ((1,), "one completion per request: send several requests"),
    "echo": ((False,), "echoing the prompt is not implemented"),
    "suffix": (("",), "completing text before a suffix is not implemented"),
    "audio": ((), "audio is not implemented"), "modalities": ((["text"],), "edgespec's models write text only"),
    "reasoning_effort": ((), _REASONING), "verbosity": ((), _REASONING),
    "prediction": ((), "predicted outputs are not implemented (edgespec drafts from the prompt by itself: n-gram "
                       "lookup)"),
    "web_search_options": ((), "web search is not implemented"),
    # llama.cpp's server
    "repeat_penalty": ((1,), _PENALTY), "dry_multiplier": ((0,), _PENALTY),
    "grammar": (("",), _CONSTRAINED), "json_schema": (({},), _CONSTRAINED),
    "mirostat": ((0,), _SAMPLER), "typical_p": ((1,), _SAMPLER), "tfs_z": ((1,), _SAMPLER),
    "xtc_probability": ((0,), _SAMPLER), "top_n_sigma": ((-1,), _SAMPLER), "dynatemp_range": ((0,), _SAMPLER),
    "min_keep": ((0,), _SAMPLER), "n_probs": ((0,), _LOGPROBS),
    "ignore_eos": ((False,), "generation always ends at the end of the text"),
    # vLLM, Hugging Face TGI
    "repetition_penalty": ((1,), _PENALTY), "guided_json": ((), _CONSTRAINED), "guided_regex": ((), _CONSTRAINED),
    "guided_choice": ((), _CONSTRAINED), "guided_grammar": ((), _CONSTRAINED),
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
    "repeat_last_n", "penalty_last_n", "mirostat_tau", "mirostat_eta", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "dry_sequence_breakers", "xtc_threshold", "dynatemp_exponent", "penalize_newline"})
# Chat message fields: what OpenAI's and Ollama's clients send back with an assistant's earlier reply.
MESSAGE_UNSUPPORTED: dict[str, tuple[tuple[object, ...], str]] = {
    "name": (("",), "a participant's name has no place in the model's chat template"),
    "tool_calls": (([],), _TOOLS), "tool_call_id": ((), _TOOLS), "function_call": ((), _TOOLS),
    "refusal": (("",), "an assistant's refusal is not implemented: send it as content"),
    "audio": ((), "audio is not implemented"), "annotations": (([],), "annotations are not implemented"),
    # Ollama's message fields
    "images": (([],), "edgespec's models read text only"), "thinking": (("",), _REASONING),
    "tool_name": (("",), _TOOLS),
}


# Ollama's native API. Top-level keys: the prompt, how to answer, and ``options``.
OLLAMA_CHAT = frozenset({"model", "messages", "stream", "options"})
OLLAMA_GENERATE = frozenset({"model", "prompt", "system", "raw", "stream", "options"})
OLLAMA_INERT = frozenset({"keep_alive"})  # how long a model stays loaded: here, until the server stops
OLLAMA_UNSUPPORTED: dict[str, tuple[tuple[object, ...], str]] = {
    # Refused here even once the OpenAI endpoints take them: each needs its own Ollama request and reply fields.
    "format": (("",), _CONSTRAINED), "tools": (([],), _TOOLS), "think": ((False,), _REASONING),
    "logprobs": ((False,), _LOGPROBS), "top_logprobs": ((0,), _LOGPROBS),
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
