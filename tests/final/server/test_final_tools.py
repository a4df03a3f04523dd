"""Tool calling (final/server/tools.py): the answer read for calls, whole and streamed at every
split; the request's rules; and a live server with a tool-aware chat template, where a forced
tool_choice makes even a random tiny model answer with a well-formed call."""

from __future__ import annotations

import json

import openai
import pytest

from final.core.errors import UserError
from final.frontend.tokenizer import Tokenizer
from final.server import tool_formats, tools
from final.server.errors import APIError
from final.server.protocol import ChatCompletionRequest
from tests.fixtures.live_server import Server, serving

NAMES = {"get_weather", "add"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ADD = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
ANSWERS = [
    "Plain text, no call.",
    "  Let me look.\n\n" + CALL,
    CALL + "\n" + ADD,
    "Before " + CALL + " between " + ADD + " after.  ",
    "<tool_call>not json</tool_call> and " + CALL,
    '<tool_call>{"name": "unknown_tool", "arguments": {}}</tool_call>',
    'An unclosed <tool_call>{"name": "add"',
    "A lone < sign and <tool_ca",
    "\n\n   \n",
]


def test_a_whole_answer_gives_its_calls_and_the_text_around_them():
    content, calls = tools.parse("  Let me look.\n\n" + CALL + "\n", NAMES)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0].id.startswith("call_")
    content, calls = tools.parse(CALL + ADD, NAMES)
    assert content is None and [c.name for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[1].arguments) == {"a": 1}  # arguments given as JSON text stay that text
    content, calls = tools.parse(CALL + ADD, NAMES, parallel=False)
    assert content is None and [c.name for c in calls] == ["get_weather"]
    # Not a call: bad JSON, a tool the request did not declare, an unclosed block: all text.
    for text in ANSWERS[5:7] + ["<tool_call>[1, 2]</tool_call>"]:
        assert tools.parse(text, NAMES) == (text.strip(), [])


def test_nothing_that_may_start_a_tag_is_sent_as_text_too_early():
    stream = tools.CallStream(NAMES)
    assert stream.feed("Hello <tool") == ("Hello", [])
    assert stream.feed("_c") == ("", [])
    content, calls = stream.feed('all>{"name": "add", "arguments": {}}</tool_call>')
    assert content == "" and [c.name for c in calls] == ["add"]


LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris; France"}}'
LLAMA_ANSWERS = [
    "Plain text, no call.",
    "  " + LLAMA_CALL + "\n",
    "<|python_tag|>" + LLAMA_CALL,
    LLAMA_CALL + "; " + '{"name": "add", "arguments": {"a": 1}}',
    '{"name": "unknown_tool", "parameters": {}}',  # not a declared tool: text
    LLAMA_CALL + " and some words after",  # not wholly calls: text
    '{"answer": 42}',  # JSON, but no call
    LLAMA_CALL[:-5],  # cut off before it closed
    "<|python_ta",
    "<|python_tag|>",
    "\n\n   \n",
]


def test_every_tool_call_parser_name_has_a_reader():
    """--tool-call-parser's names (frontend/options.py, which imports nothing of the server) and the
    readers (server/tool_formats.py) are two tables: each name must lead to a reader, and each
    reader must have a name."""
    from final.frontend.options import TOOL_CALL_PARSERS

    assert set(TOOL_CALL_PARSERS.values()) == set(tool_formats.FORMATS)


def test_a_llama3_json_answer_is_its_calls_or_else_text():
    llama = tool_formats.FORMATS["llama3_json"]
    content, calls = llama.parse("<|python_tag|>" + LLAMA_CALL, NAMES)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris; France"})  # a ";" inside a string does not split it
    ]
    content, calls = llama.parse(LLAMA_ANSWERS[3], NAMES)
    assert content is None and [c.name for c in calls] == ["get_weather", "add"]
    assert [c.name for c in llama.parse(LLAMA_ANSWERS[3], NAMES, parallel=False)[1]] == ["get_weather"]
    for text in LLAMA_ANSWERS[4:8] + ["Plain text, no call."]:
        assert llama.parse(text, NAMES) == (text.strip(), [])


def test_a_llama3_stream_sends_text_at_once_and_holds_what_may_be_a_call():
    stream = tool_formats.FORMATS["llama3_json"].stream(NAMES)
    assert stream.feed("Sure") == ("Sure", [])  # not a call: text as it comes
    held = tool_formats.FORMATS["llama3_json"].stream(NAMES)
    assert held.feed("<|python") == ("", []) and held.feed("_tag|>" + LLAMA_CALL) == ("", [])
    content, calls = held.finish()
    assert content == "" and [c.name for c in calls] == ["get_weather"]


PYTHONIC_CALL = '[get_weather(city="Paris, [France]")]'  # brackets and a comma inside a string
PYTHONIC_ANSWERS = [
    PYTHONIC_CALL,
    "  <|python_start|>" + PYTHONIC_CALL + "<|python_end|>\n",
    '[get_weather(city="Rome"), add(a=1, b=[2.5, None], c={"k": True})]',
    "[1] is a footnote, not a call.",
    "[get_weather()",  # cut off
    '[get_weather(city="Rome"), unknown_tool()]',
    '[get_weather("Rome")]',  # positional: which parameter is unknown
    "[add(a={1, 2})]",  # a set is no JSON value
    '[add(a=__import__("os").getcwd())]',  # not a literal: never run
    "[add(**{'a': 1})]",
    "[]",
    "Plain text, no call.",
    "<|python_sta",
    "\n\n   \n",
]


def test_a_pythonic_answer_is_its_calls_or_else_text():
    pythonic = tool_formats.FORMATS["pythonic"]
    content, calls = pythonic.parse(PYTHONIC_ANSWERS[1], NAMES)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris, [France]"})
    ]
    content, calls = pythonic.parse(PYTHONIC_ANSWERS[2], NAMES)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Rome"}),
        ("add", {"a": 1, "b": [2.5, None], "c": {"k": True}}),
    ]
    assert [c.name for c in pythonic.parse(PYTHONIC_ANSWERS[2], NAMES, parallel=False)[1]] == ["get_weather"]
    for text in PYTHONIC_ANSWERS[3:]:
        assert pythonic.parse(text, NAMES) == (text.strip(), []), text


# Every format's test answers, for the test below: (the --tool-call-parser format, an answer).
STREAMED = (
    [("hermes", text) for text in ANSWERS]
    + [("llama3_json", text) for text in LLAMA_ANSWERS]
    + [("pythonic", text) for text in PYTHONIC_ANSWERS]
)


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize(("name", "text"), STREAMED)
def test_a_streamed_answer_split_anywhere_gives_the_whole_answers_content_and_calls(name, text, parallel):
    reader = tool_formats.FORMATS[name]
    want_content, want_calls = reader.parse(text, NAMES, parallel)
    for cut in range(len(text) + 1):
        for pieces in ([text[:cut], text[cut:]], [text[:cut], *text[cut:]]):  # then one character at a time
            stream = reader.stream(NAMES, parallel)
            content, calls = "", []
            for piece in pieces:
                more, new = stream.feed(piece)
                content, calls = content + more, calls + new
            more, new = stream.finish()
            content, calls = content + more, calls + new
            assert content == (want_content or ""), (cut, pieces)
            assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in want_calls]


def test_a_pythonic_stream_sends_text_at_once_and_holds_what_may_be_a_call():
    stream = tool_formats.FORMATS["pythonic"].stream(NAMES)
    assert stream.feed("Sure") == ("Sure", [])
    held = tool_formats.FORMATS["pythonic"].stream(NAMES)
    assert held.feed("[get_") == ("", []) and held.feed('weather(city="Oslo")]') == ("", [])
    content, calls = held.finish()
    assert content == "" and [c.name for c in calls] == ["get_weather"]


def test_a_forced_call_schema_compiles_and_its_answer_becomes_calls():
    xgrammar = pytest.importorskip("xgrammar", reason="forced calls need xgrammar")
    declared = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            },
        },  # fmt: skip
        {"type": "function", "function": {"name": "now"}},  # no parameters: any object
    ]
    named = {"type": "function", "function": {"name": "add"}}
    assert tools.forced_schema(declared, named, True) == declared[0]["function"]["parameters"]
    required = tools.forced_schema(declared, "required", False)
    assert required["maxItems"] == 1 and "maxItems" not in tools.forced_schema(declared, "required", True)
    for schema in (required, tools.forced_schema(declared, named, True)):
        xgrammar.Grammar.from_json_schema(json.dumps(schema))
    calls = tools.forced_calls(
        '[{"name": "add", "arguments": {"a": 2}}, {"name": "now", "arguments": {}}]', "required"
    )
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 2}), ("now", {})]
    assert [(c.name, c.arguments) for c in tools.forced_calls('{"a":3}', named)] == [("add", '{"a": 3}')]
    # A control character the model wrote inside a string: read, and sent on escaped.
    (odd,) = tools.forced_calls('{"s":"a\x05b"}', named)
    assert json.loads(odd.arguments) == {"s": "a\x05b"}
    assert tools.forced_calls('[{"name": "add", "argu', "required") == []  # cut by max_tokens


def chat(**body) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **body})


TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"tool_choice": "auto"}, "tool_choice needs tools"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "sub"}}},
            "not among the tools",
        ),
        ({"tools": [TOOL, TOOL]}, "unique"),
        (
            {"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "give one",
        ),
    ],
)
def test_what_the_schema_cannot_say_about_tools_is_a_400(body, needle):
    with pytest.raises(APIError, match=needle):
        chat(**body).check_tools()


def test_tool_choice_defaults_and_what_the_template_is_shown():
    assert chat().effective_tool_choice() == "none" and chat().template_tools() is None
    auto = chat(tools=[TOOL])
    assert auto.effective_tool_choice() == "auto" and auto.template_tools() == [TOOL]
    assert chat(tools=[TOOL], tool_choice="none").template_tools() is None  # none: the model never sees them
    assert chat(tools=[TOOL], tool_choice="required").forced_tool_choice() == "required"
    auto.check_tools()  # no complaint


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user"},  # content is required but for an assistant
        {"role": "user", "content": "x", "tool_calls": []},  # calls are an assistant's
        {"role": "tool", "content": "42"},  # a tool message answers a call: its id
        {"role": "user", "content": "x", "tool_call_id": "call_1"},
    ],
)
def test_each_role_has_its_fields(message):
    with pytest.raises(ValueError):
        ChatCompletionRequest.model_validate({"messages": [message]})


# Hermes-style, as Qwen's templates are, but showing each tool by name and description only: the
# tiny model's context is 256 tokens, and its tokenizer spends about a token a character on JSON.
TEMPLATE = """{%- if tools %}<|im_start|>system
<tools>{% for tool in tools %}{{ tool.function.name }}: {{ tool.function.description }}
{% endfor %}</tools><|im_end|>
{% endif %}{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls %}<tool_call>
{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{%- endfor %}<|im_start|>assistant
"""
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
COUNT = {"type": "function", "function": {"name": "count", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}}}  # fmt: skip
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "tools.jinja"
    path.write_text(TEMPLATE)
    return path


def test_a_template_without_tools_refuses_them_and_one_with_them_shows_them(tiny_qwen3_dir, template_file):
    plain = Tokenizer(tiny_qwen3_dir)
    with pytest.raises(UserError, match="takes no tools"):
        plain.render_chat(USER, tools=[WEATHER])
    aware = Tokenizer(tiny_qwen3_dir, chat_template=str(template_file))
    history = ChatCompletionRequest.model_validate({"messages": [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ], "tools": [WEATHER]})  # fmt: skip
    text = aware.render_chat([m.for_template() for m in history.messages], tools=history.template_tools())
    assert "get_weather: The weather in a city" in text  # the tool, shown
    assert '"arguments": {"city": "Paris"}' in text  # the earlier call, its arguments as an object
    assert "<tool_response>sunny, 21 C</tool_response>" in text


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, template_file, tmp_path_factory):
    pytest.importorskip("xgrammar", reason="forced tool calls need xgrammar")
    yield from serving(tiny_qwen3_dir, tmp_path_factory.mktemp("tools"), "--served-model-name", "tiny",
               "--chat-template", str(template_file), "--log-level", "warning")  # fmt: skip


def streamed_calls(client: openai.OpenAI, **kw) -> tuple[str, list[tuple[str, str]], str | None]:
    content, calls, finish = "", [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            assert call.index == len(calls) and call.id.startswith("call_") and call.type == "function"
            calls.append((call.function.name, call.function.arguments))
        finish = chunk.choices[0].finish_reason or finish
    return content, calls, finish


def test_a_named_tool_choice_answers_with_that_call_streamed_or_not(server):
    client = server.client()
    kw = {"model": "tiny", "messages": USER, "tools": [WEATHER, COUNT], "max_tokens": 64, "temperature": 0,
          "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}  # fmt: skip
    out = client.chat.completions.create(**kw)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str) and len(arguments["city"]) <= 8
    assert streamed_calls(client, **kw) == ("", [("get_weather", call.function.arguments)], "tool_calls")


def test_required_answers_with_calls_to_declared_tools_and_one_without_parallel_calls(server):
    client = server.client()
    kw = {
        "model": "tiny",
        "messages": USER,
        "tools": [WEATHER, COUNT],
        "max_tokens": 128,
        "tool_choice": "required",
    }
    whole = 0
    for seed in range(4):
        out = client.chat.completions.create(seed=seed, temperature=1.0, **kw)
        if out.choices[0].finish_reason == "length":
            assert out.choices[0].message.tool_calls is None  # cut JSON: text, no half call
            continue  # a random model may wander in whitespace past max_tokens
        whole += 1
        calls = out.choices[0].message.tool_calls
        assert calls and out.choices[0].finish_reason == "tool_calls"
        for call in calls:
            arguments = json.loads(call.function.arguments)
            assert call.function.name in ("get_weather", "count")
            assert set(arguments) == ({"city"} if call.function.name == "get_weather" else {"n"})
    assert whole >= 2, "too few answers ended within max_tokens to check"
    for seed in range(4):
        single = client.chat.completions.create(parallel_tool_calls=False, seed=seed, temperature=1.0, **kw)
        assert len(single.choices[0].message.tool_calls or [None]) == 1


def test_auto_shows_the_model_the_tools_and_none_does_not(server):
    client = server.client()
    kw = {"model": "tiny", "messages": USER, "max_tokens": 4, "temperature": 0}
    bare = client.chat.completions.create(**kw).usage.prompt_tokens
    auto = client.chat.completions.create(tools=[WEATHER], **kw)
    none = client.chat.completions.create(tools=[WEATHER], tool_choice="none", **kw)
    assert auto.usage.prompt_tokens > bare == none.usage.prompt_tokens
    assert isinstance(auto.choices[0].message.content, str)  # random weights write no call
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}, **kw)  # fmt: skip
    assert client.chat.completions.create(**kw).choices  # and it serves on


def test_the_offline_chat_shows_the_tools_to_the_model(tiny_qwen3_dir, template_file):
    """LLM.chat(tools=...), as vLLM's: the template renders them into the prompt."""
    import final

    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    try:
        params = final.SamplingParams(temperature=0, max_tokens=1)
        (out,) = llm.chat(USER, params, use_tqdm=False, chat_template=TEMPLATE, tools=[WEATHER])
        assert "get_weather: The weather in a city" in out.prompt
        with pytest.raises(UserError, match="takes no tools"):
            llm.chat(USER, params, use_tqdm=False, tools=[WEATHER])  # the tiny model's own template
    finally:
        llm.close()


KWARGS_TEMPLATE = "{%- for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}"


def test_chat_template_kwargs_reach_the_template_but_not_the_names_the_server_sets(tiny_qwen3_dir):
    """vLLM's and SGLang's chat_template_kwargs (Qwen3's enable_thinking), offline and in a request."""
    tokenizer = Tokenizer(tiny_qwen3_dir, chat_template=KWARGS_TEMPLATE)
    assert tokenizer.render_chat(USER, template_kwargs={"enable_thinking": False}).endswith("<no-think>")
    assert not tokenizer.render_chat(USER).endswith("<no-think>")
    with pytest.raises(UserError, match="may not set add_generation_prompt, messages"):
        tokenizer.render_chat(USER, template_kwargs={"messages": [], "add_generation_prompt": False})
    with pytest.raises(ValueError, match="may not set tools"):
        chat(chat_template_kwargs={"tools": []})
    assert chat(chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs == {
        "enable_thinking": False
    }


def test_each_choice_streams_its_own_calls_with_logprobs(server):
    """n = 2 with logprobs, streamed: every choice ends with its own call (index 0 in each), the
    logprobs ride on content chunks, and the two calls equal the unstreamed answer's (seeded)."""
    client = server.client()
    kw = {"model": "tiny", "messages": USER, "tools": [WEATHER], "max_tokens": 64, "n": 2, "seed": 3,
          "temperature": 1.0, "logprobs": True, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}  # fmt: skip
    whole = client.chat.completions.create(**kw)
    want = {
        c.index: [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
        for c in whole.choices
    }
    calls: dict[int, list[tuple[str, str]]] = {0: [], 1: []}
    finishes, logprob_tokens = {}, 0
    for chunk in client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                assert call.index == len(calls[choice.index])
                calls[choice.index].append((call.function.name, call.function.arguments))
            if choice.logprobs is not None:
                logprob_tokens += len(choice.logprobs.content or [])
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert calls == want and all(want.values())
    assert finishes == {0: "tool_calls", 1: "tool_calls"}
    assert logprob_tokens == whole.usage.completion_tokens


ECHO_TEMPLATE = "{% if tools %}{% endif %}{{ messages[-1].content }}"  # the prompt: the user's text


@pytest.fixture(scope="module")
def llama_server(tiny_qwen3_dir, tmp_path_factory):
    """The server on the stand-in engine (tests/fixtures/ticking_engine.py), which answers with its
    prompt's tokens again: the answer is whatever the user wrote."""
    folder = tmp_path_factory.mktemp("llama3")
    template = folder / "echo.jinja"
    template.write_text(ECHO_TEMPLATE)
    server = Server(tiny_qwen3_dir, folder / "server.log", "--served-model-name", "tiny", "--chat-template",
                    str(template), "--tool-call-parser", "llama3", "--log-level", "warning",
                    module="tests.fixtures.ticking_server")  # fmt: skip
    yield server
    server.stop()


def test_a_llama3_server_reads_an_answer_that_is_a_json_call(llama_server, tiny_qwen3_dir):
    """--tool-call-parser llama3 (SGLang's name for llama3_json) reaches the chat answers: an
    answer that is {"name": ..., "parameters": ...} is the call, streamed or not, no content."""
    client = llama_server.client()
    text = "<|python_tag|>" + LLAMA_CALL
    length = len(Tokenizer(tiny_qwen3_dir).encode(text, add_special_tokens=False))
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "tools": [WEATHER],
            "max_tokens": length}  # fmt: skip
    out = client.chat.completions.create(**body).choices[0]
    assert out.message.content is None, out
    (call,) = out.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris; France"},
    )
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**body, stream=True) if c.choices]
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [(tc.function.name, tc.function.arguments) for tc in streamed] == [
        ("get_weather", call.function.arguments)
    ]
    assert not "".join(d.content or "" for d in deltas)
