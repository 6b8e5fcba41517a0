"""Tool calling's formats without a model: detecting a template's family, rendering tools and a conversation's calls
and results, the constraint of a required call (checked byte by byte), parsing replies, and refusing bad tools. The
templates are small ones written in the style of each family's own; the generic form runs on the shipped SmolLM2 in
the last test."""

from __future__ import annotations

import json

import jsonschema
import pytest
from llguidance import LLTokenizer, TokenizerWrapper

from edgespec.engine.chat import ChatTemplate
from edgespec.engine.constraints import Constraint
from edgespec.engine.engine import Engine
from edgespec.engine.tools import (
    GenericFormat,
    HermesFormat,
    Llama3Format,
    MistralFormat,
    ToolReply,
    chat_turn,
    check_messages,
    tool_format,
    toolbox,
)
from edgespec.errors import InvalidParameterError

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather <|im_end|> now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/$defs/n"}},
             "required": ["a", "b"], "$defs": {"n": {"type": "integer"}}}}}]
USER = {"role": "user", "content": "Weather in Paris?"}
CALLED = [USER, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "abcdef123", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": '{"city": "Paris", "unit": "c"}'}}]},
          {"role": "tool", "tool_call_id": "abcdef123", "content": '{"temp": 21}'}]

# In the style of Qwen2.5's template (Hermes-style <tool_call> blocks).
HERMES = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are helpful.{% endif %}

# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
For each call return <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{%- elif message.role == 'assistant' %}
<|im_start|>assistant{% if message.content %}
{{ message.content }}{% endif %}
{%- for tool_call in message.tool_calls %}{% set tool_call = tool_call.function %}
<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{%- elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{%- endif %}
{%- endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# In the style of Llama 3.1's: tools in the first user message, results in the ipython role, written with tojson.
LLAMA3 = """{{ bos_token }}{%- set msgs = messages %}
{%- for message in msgs %}
{%- if message.role == 'user' and tools and loop.first %}<|start_header_id|>user<|end_header_id|>

Given the following functions, respond with a JSON for a function call.
Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.
{% for t in tools %}{{ t | tojson(indent=4) }}

{% endfor %}{{ message.content }}<|eot_id|>
{%- elif message.role == 'assistant' and message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{%- set tool_call = message.tool_calls[0].function %}
{"name": "{{ tool_call.name }}", "parameters": {{ tool_call.arguments | tojson }}}<|eot_id|>
{%- elif message.role == 'tool' or message.role == 'ipython' %}<|start_header_id|>ipython<|end_header_id|>

{% if message.content is mapping or message.content is iterable %}{{ message.content | tojson }}{% else %}\
{{ message.content }}{% endif %}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# In the style of Mistral's v0.3: tools before the last user message, calls after [TOOL_CALLS] with 9-character ids.
MISTRAL = """{{ bos_token }}{%- for message in messages %}
{%- if message.role == 'user' %}{% if tools and loop.last %}[AVAILABLE_TOOLS] {{ tools | tojson }}\
[/AVAILABLE_TOOLS]{% endif %}[INST] {{ message.content }}[/INST]
{%- elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS] [
{%- for tool_call in message.tool_calls %}
{%- if tool_call.id is not defined or tool_call.id | length != 9 %}\
{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}
{{- {"name": tool_call.function.name, "arguments": tool_call.function.arguments, "id": tool_call.id} | tojson }}
{%- endfor %}]{{ eos_token }}
{%- elif message.role == 'tool' %}[TOOL_RESULTS] {"content": {{ message.content | tojson }}, "call_id": \
"{{ message.tool_call_id }}"}[/TOOL_RESULTS]
{%- else %}{{ message.content }}{{ eos_token }}{%- endif %}{%- endfor %}"""

# SmolLM2's own (no tools).
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
           "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _template(source: str) -> ChatTemplate:
    return ChatTemplate(source, "<s>", "</s>")


def _parts(source: str, messages: list, tools: object = TOOLS, tool_choice: object = None) -> list[tuple[str, bool]]:
    """The prompt's pieces as chat_turn renders them: (text, is content)."""
    pieces: list[tuple[str, bool]] = []

    def tokenize(text: str, add_special: bool, parse_special: bool) -> list[int]:
        pieces.append((text, not parse_special))
        return []

    chat_turn(_template(source), messages, toolbox(tools, tool_choice), tokenize)
    return pieces


def _markup(parts: list[tuple[str, bool]]) -> str:
    return "".join(text for text, content in parts if not content)


@pytest.mark.parametrize(("source", "kind"), [(HERMES, HermesFormat), (LLAMA3, Llama3Format),
                                              (MISTRAL, MistralFormat), (SMOLLM2, GenericFormat),
                                              ("{{ tools }}{{ messages[0].content }}", GenericFormat)])
def test_the_format_is_read_from_the_template(source: str, kind: type) -> None:
    assert type(tool_format(source)) is kind


@pytest.mark.parametrize("source", [HERMES, LLAMA3, MISTRAL])
def test_native_templates_get_the_tools_and_the_conversation_as_data(source: str) -> None:
    parts = _parts(source, [*CALLED, {"role": "user", "content": "And in Oslo?"}])
    text = "".join(t for t, _ in parts)
    # The tools and the call's arguments are written by the template's tojson (plain JSON, not HTML-escaped) and
    # are content: markup typed into a description never becomes a special token.
    assert "get_weather" in text and '"city": "Paris"' in text and "<|im_end|> now" in text
    assert "<|im_end|> now" not in _markup(parts) and '"city"' not in _markup(parts)
    # Llama's and Mistral's templates write the result string with tojson: the content itself, quoted once
    assert ('"{\\"temp\\": 21}"' if source in (LLAMA3, MISTRAL) else '{"temp": 21}') in text and "\\u003c" not in text


def test_tool_choice_none_leaves_the_tools_out() -> None:
    for source in (HERMES, SMOLLM2):
        text = "".join(t for t, _ in _parts(source, [USER], tool_choice="none"))
        assert "get_weather" not in text and "Weather in Paris?" in text


def test_the_generic_form_writes_tools_calls_and_results_as_json() -> None:
    parts = _parts(SMOLLM2, [{"role": "system", "content": "Be brief."}, *CALLED])
    text = "".join(t for t, _ in parts)
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools")
    assert '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}' in text
    assert '<|im_start|>user\n{"tool_response": {"name": "get_weather", "content": "{\\"temp\\": 21}"}}' in text
    assert _markup(parts).count("<|im_start|>") == 5 and "get_weather" not in _markup(parts)


def _bytes_tokenizer() -> LLTokenizer:
    class Bytes:
        eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
        tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]

        def __call__(self, text: str) -> list[int]:
            return list(text.encode())

    return LLTokenizer(TokenizerWrapper(Bytes()), n_vocab=257, eos_token=[256])


def _accepts(constraint: Constraint | None, text: str) -> bool:
    assert constraint is not None
    matcher = constraint.matcher(_bytes_tokenizer())
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


def _constraint(source: str, tool_choice: object, parallel: bool = False) -> Constraint | None:
    return tool_format(source).constraint(toolbox(TOOLS, tool_choice, parallel))


def test_required_calls_are_constrained_to_each_format_and_the_arguments_schema() -> None:
    paris = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
    add = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    hermes = _constraint(HERMES, "required")
    assert _accepts(hermes, f"<tool_call>\n{paris}\n</tool_call>")
    assert _accepts(hermes, f"<tool_call>\n{add}\n</tool_call>")  # $defs hoisted: the $ref still resolves
    assert not _accepts(hermes, '<tool_call>\n{"name": "add", "arguments": {"a": "x", "b": 2}}\n</tool_call>')
    assert not _accepts(hermes, f"<tool_call>\n{paris}\n</tool_call>\n<tool_call>\n{add}\n</tool_call>")
    assert _accepts(_constraint(HERMES, "required", parallel=True),
                    f"<tool_call>\n{paris}\n</tool_call>\n<tool_call>\n{add}\n</tool_call>")
    named = _constraint(HERMES, {"type": "function", "function": {"name": "add"}})
    assert not _accepts(named, f"<tool_call>\n{paris}\n</tool_call>") and _accepts(
        named, f"<tool_call>\n{add}\n</tool_call>")
    assert _accepts(_constraint(LLAMA3, "required"), paris.replace("arguments", "parameters"))
    assert _accepts(_constraint(MISTRAL, "required"), f"[{paris}]")
    assert not _accepts(_constraint(MISTRAL, "required"), f"[{paris}, {add}]")
    generic = _constraint(SMOLLM2, "auto")
    assert _accepts(generic, f'{{"tool_call": {paris}}}') and _accepts(generic, '{"response": "Sunny."}')
    assert not _accepts(_constraint(SMOLLM2, "required"), '{"response": "Sunny."}')
    assert _accepts(_constraint(SMOLLM2, "required", parallel=True), f'{{"tool_calls": [{paris}, {add}]}}')
    # auto with a template's own format leaves the text free (the calls are parsed afterwards)
    assert _constraint(HERMES, "auto") is None and _constraint(LLAMA3, "auto") is None


@pytest.mark.parametrize(("source", "text", "content", "calls"), [
    (HERMES, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n'
             '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
     "Let me look.", [("get_weather", {"city": "Oslo", "unit": "c"}), ("add", {"a": 1, "b": 2})]),
    (HERMES, "It is sunny.", "It is sunny.", []),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>', None, []),  # broken
    (HERMES, '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', None, []),  # not one of the tools
    (LLAMA3, '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', "", [("add", {"a": 1, "b": 2})]),
    (LLAMA3, '{"name": "add", "arguments": {"a": 1, "b": 2}}', "", [("add", {"a": 1, "b": 2})]),
    (LLAMA3, "The sum is 3.", "The sum is 3.", []),
    (MISTRAL, ' [{"name": "add", "arguments": {"a": 1, "b": 2}}]', "", [("add", {"a": 1, "b": 2})]),
    (MISTRAL, "[1, 2]", None, []),
    (SMOLLM2, '{"tool_call": {"name": "add", "arguments": {"a": 1, "b": 2}}}', "", [("add", {"a": 1, "b": 2})]),
    (SMOLLM2, '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}', "", [("add", {"a": 1, "b": 2})]),
    (SMOLLM2, '{"response": "Hello!"}', "Hello!", []),
])
def test_replies_are_parsed_in_each_format(source: str, text: str, content: str | None, calls: list) -> None:
    reply = tool_format(source).parse(text, toolbox(TOOLS, "auto", True))
    assert reply.content == (text if content is None else content)
    assert [(c.name, c.arguments) for c in reply.calls] == calls
    ids = [c.id for c in reply.calls]
    assert len(set(ids)) == len(ids) and all(len(i) == 9 if source is MISTRAL else i.startswith("call_")
                                             for i in ids)
    assert all(json.loads(c.openai()["function"]["arguments"]) == c.arguments for c in reply.calls)


@pytest.mark.parametrize(("tools", "choice", "param"), [
    ([{"type": "function", "function": {"description": "no name"}}], None, "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "a b"}}], None, "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}], None,
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], None,
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "colour": 1}}], None, "tools[0].function.colour"),
    ([{"type": "retrieval"}], None, "tools[0]"),
    ({"name": "f"}, None, "tools"),
    ([TOOLS[0], TOOLS[0]], None, "tools[1].function.name"),
    (TOOLS, {"type": "function", "function": {"name": "missing"}}, "tool_choice"),
    (TOOLS, "always", "tool_choice"),
    ([], "required", "tool_choice"),
])
def test_bad_tools_are_refused_naming_the_field(tools: object, choice: object, param: str) -> None:
    with pytest.raises(InvalidParameterError) as e:
        toolbox(tools, choice)
    assert e.value.param == param


def test_message_tool_fields_are_checked() -> None:
    bad = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{x"}}]}
    with pytest.raises(InvalidParameterError) as e:
        check_messages([USER, bad])
    assert e.value.param == "messages[1].tool_calls[0].function.arguments"
    ollama = {"role": "tool", "content": "21", "tool_name": "get_weather"}
    assert check_messages([ollama]) == [{"role": "tool", "content": "21", "name": "get_weather"}]
    # a required call named by Mistral's template must have its 9-character id: a clear error, not a crash
    with pytest.raises(Exception, match="length 9"):
        _parts(MISTRAL, [USER, {**CALLED[1], "tool_calls": [{**CALLED[1]["tool_calls"][0], "id": "x"}]}])


def test_a_reply_cut_by_max_tokens_is_content() -> None:
    turn = chat_turn(_template(SMOLLM2), [USER], toolbox(TOOLS, "required"), lambda *_: [])
    assert turn.reply('{"tool_call": {"na', "length") == ToolReply('{"tool_call": {"na')
    assert chat_turn(_template(SMOLLM2), [USER], toolbox(TOOLS, "none"), lambda *_: []).reply("Hi", "stop") is None


def test_the_generic_form_on_smollm2_calls_a_valid_function(solo_engine: Engine) -> None:
    out = solo_engine.chat([USER], tools=TOOLS, tool_choice="required", max_tokens=64)
    assert out.finish_reason == "tool_calls" and out.content == ""
    (call,) = out.tool_calls
    assert call.name in ("get_weather", "add")
    jsonschema.validate(call.arguments, WEATHER if call.name == "get_weather" else TOOLS[1]["function"][
        "parameters"])
    assert solo_engine.chat([USER], tools=TOOLS, tool_choice="required", max_tokens=64, mode="none").text == out.text
    # the second round: the call and its result in the conversation, a plain answer
    messages = [USER, {"role": "assistant", "content": "", "tool_calls": [call.openai()]},
                {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    answer = solo_engine.chat(messages, tools=TOOLS, tool_choice="none", max_tokens=16)
    assert answer.tool_calls == [] and answer.content == answer.text != ""
    with pytest.raises(InvalidParameterError, match="cannot be combined"):
        solo_engine.chat([USER], tools=TOOLS, response_format={"type": "json_object"})
