"""`python -m final` as a live server on loopback, driven by the official openai client: both
endpoints streamed and not, usage, stop strings, seeds, n > 1, logprobs, 32 concurrent streams,
every bad input with its status code, overload, and a client that goes away mid-stream."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]
import openai
import pytest

from final.frontend.tokenizer import Tokenizer
from scripts.render_results import parse_result
from tests.fixtures.live_server import ROOT, Server, serving


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    yield from serving(tiny_qwen3_dir, tmp_path_factory.mktemp("server"), "--served-model-name", "tiny_qwen3",
               "--log-level", "warning")  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir):
    return Tokenizer(tiny_qwen3_dir)


GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
USER = [{"role": "user", "content": "What is the capital of France?"}]


# ---------------------------------------------------------------------------------------------
# The basics


def test_models_health_and_default_bind(server, tiny_qwen3_dir):
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny_qwen3"]
    # The served name only: the folder's path answered too, and so told where the model lives
    with pytest.raises(openai.NotFoundError):
        server.client().completions.create(model=str(tiny_qwen3_dir), prompt="The", max_tokens=1)
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/no/such/route").json()["error"]["type"] == "not_found"


def test_chat_usage_and_length(server, tokenizer):
    client = server.client()
    out = client.chat.completions.create(model="tiny_qwen3", messages=USER, max_tokens=8, **GREEDY)
    choice = out.choices[0]
    assert out.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(tokenizer.encode_chat(USER))
    assert out.usage.completion_tokens == 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8
    # max_completion_tokens is the newer name of max_tokens
    newer = client.chat.completions.create(
        model="tiny_qwen3", messages=USER, max_completion_tokens=3, **GREEDY
    )
    assert newer.usage.completion_tokens == 3
    assert choice.message.content.startswith(newer.choices[0].message.content)


def test_multi_turn_chat_reuses_its_history(server, tokenizer):
    """The radix cache (the default) keeps each turn's KV: every next turn finds more of its prompt
    cached, and usage reports it as OpenAI does (prompt_tokens_details.cached_tokens)."""
    client = server.client()
    messages = [{"role": "user", "content": "Tell me a story about seven purple lighthouses."}]
    cached: list[int] = []
    for follow_up in ["Go on.", "And then?", "How does it end?"]:
        out = client.chat.completions.create(model="tiny_qwen3", messages=messages, max_tokens=6, **GREEDY)
        details = out.usage.prompt_tokens_details
        assert details is not None and 0 <= details.cached_tokens < out.usage.prompt_tokens
        cached.append(details.cached_tokens)
        messages += [
            {"role": "assistant", "content": out.choices[0].message.content},
            {"role": "user", "content": follow_up},
        ]
    first_prompt = len(tokenizer.encode_chat(messages[:1]))
    assert cached[1] >= first_prompt - 1, f"turn 2 should reuse all of turn 1's prompt: {cached}"
    assert cached[0] < cached[1] < cached[2], f"cached tokens should grow turn by turn: {cached}"
    m = server.wait_for_idle_pool()
    assert m["final_kv_pages_cached"] > 0 and 0 < m["final_prefix_cache_hit_ratio"] < 1


def test_streamed_chat_equals_non_streamed(server):
    client = server.client()
    whole = client.chat.completions.create(model="tiny_qwen3", messages=USER, max_tokens=16, **GREEDY)
    chunks = list(
        client.chat.completions.create(
            model="tiny_qwen3",
            messages=USER,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_completion_equals_non_streamed(server, tokenizer):
    client = server.client()
    prompt = "The cat reads the first page"
    whole = client.completions.create(model="tiny_qwen3", prompt=prompt, max_tokens=12, **GREEDY)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == len(tokenizer.encode(prompt)) and whole.usage.completion_tokens == 12
    chunks = list(
        client.completions.create(model="tiny_qwen3", prompt=prompt, max_tokens=12, stream=True, **GREEDY)
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    # token ids work as a prompt too, and give the same answer
    by_ids = client.completions.create(
        model="tiny_qwen3", prompt=tokenizer.encode(prompt), max_tokens=12, **GREEDY
    )
    assert by_ids.choices[0].text == whole.choices[0].text


def test_default_max_tokens(server):
    """Completions default to 16 tokens (as OpenAI's API); chat to the room left in the context."""
    client = server.client()
    out = client.completions.create(model="tiny_qwen3", prompt="The river", **GREEDY)
    assert out.usage.completion_tokens == 16
    chat = client.chat.completions.create(model="tiny_qwen3", messages=USER, **GREEDY)
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 256  # the tiny model's context
    assert chat.choices[0].finish_reason == "length"


# ---------------------------------------------------------------------------------------------
# Stop strings, seeds, n, logprobs


def _stop_across_tokens(client: openai.OpenAI, prompt: str) -> tuple[str, str]:
    """A greedy answer and a stop string that spans two of its tokens."""
    out = client.completions.create(model="tiny_qwen3", prompt=prompt, max_tokens=24, logprobs=0, **GREEDY)
    tokens = out.choices[0].logprobs.tokens
    k = next(
        i
        for i in range(3, len(tokens) - 1)
        if tokens[i].strip() and tokens[i + 1].strip() and "\ufffd" not in tokens[i] + tokens[i + 1]
    )
    return out.choices[0].text, tokens[k][-1] + tokens[k + 1][0]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_across_tokens(server, stream):
    client = server.client()
    prompt = "A small robot computes three numbers"
    text, stop = _stop_across_tokens(client, prompt)
    expected = text[: text.find(stop)]
    kwargs = {
        "model": "tiny_qwen3",
        "prompt": prompt,
        "max_tokens": 24,
        "stop": [stop, "never-seen-stop"],
        **GREEDY,
    }
    if stream:
        chunks = list(
            client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
        )
        got = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = chunks[-1].usage
    else:
        out = client.completions.create(**kwargs)
        got, finish, usage = out.choices[0].text, [out.choices[0].finish_reason], out.usage
    assert got == expected and stop not in got
    assert finish == ["stop"]
    assert usage.completion_tokens < 24
    server.wait_for_idle_pool()  # the engine dropped the request when the stop string hit


def test_same_seed_same_text_and_n_choices(server):
    client = server.client()
    kw = {
        "model": "tiny_qwen3",
        "messages": USER,
        "max_tokens": 12,
        "temperature": 1.0,
        "extra_body": {"ignore_eos": True},
    }
    a = client.chat.completions.create(seed=7, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=7, **kw).choices[0].message.content
    c = client.chat.completions.create(seed=8, **kw).choices[0].message.content
    assert a == b and a != c
    many = client.chat.completions.create(seed=7, n=3, **kw)
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    texts = [ch.message.content for ch in many.choices]
    assert texts[0] == a and len(set(texts)) == 3  # choice i samples with seed + i
    assert many.usage.completion_tokens == 36
    streamed = list(client.chat.completions.create(seed=7, n=3, stream=True, **kw))
    by_index = {
        i: "".join(c.choices[0].delta.content or "" for c in streamed if c.choices[0].index == i)
        for i in range(3)
    }
    assert [by_index[i] for i in range(3)] == texts


def test_completions_n_and_several_prompts(server):
    out = server.client().completions.create(
        model="tiny_qwen3", prompt=["The cat", "The GPU builds"], n=2, max_tokens=5, temperature=1.0, seed=3
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason in ("stop", "length") for c in out.choices)


def test_logprobs(server):
    client = server.client()
    chat = client.chat.completions.create(
        model="tiny_qwen3", messages=USER, max_tokens=4, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy took the top one
        assert entry.top_logprobs[0].token == entry.token
    comp = client.completions.create(model="tiny_qwen3", prompt="The cat", max_tokens=4, logprobs=2, **GREEDY)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == comp.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]


def test_penalties_give_the_offline_apis_answer(server, tiny_qwen3_dir):
    """presence, frequency and repetition penalties through the server: the offline API's tokens
    for the same prompt and parameters (which tests/final/engine/test_final_penalties.py checks against HF), and
    not the unpenalized ones."""
    import final

    prompt = [7, 7, 7, 12, 7, 7, 30, 7]
    penalties = {"presence_penalty": 1.0, "frequency_penalty": 0.5}
    offline = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    answers = []
    for extra in [penalties, {"repetition_penalty": 1.6}]:
        params = final.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **extra)
        want = offline.generate([prompt], params, use_tqdm=False)[0]
        body = {
            "ignore_eos": True,
            **({"repetition_penalty": extra["repetition_penalty"]} if "repetition_penalty" in extra else {}),
        }
        kwargs = {k: v for k, v in extra.items() if k != "repetition_penalty"}
        got = server.client().completions.create(
            model="tiny_qwen3", prompt=prompt, max_tokens=12, temperature=0, extra_body=body, **kwargs
        )
        assert got.choices[0].text == want.text
        answers.append(want.text)
    plain = offline.generate([prompt], final.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert plain.text not in answers


def test_response_format_json_schema_and_json_object(server):
    """OpenAI's structured outputs: the answer parses and follows the schema (a random tiny model
    obeys only because the grammar masks everything else); a schema the grammar engine cannot
    compile is a 400, and the server serves on."""
    pytest.importorskip("xgrammar", reason="structured outputs need xgrammar")
    client = server.client()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    out = client.chat.completions.create(
        model="tiny_qwen3", messages=USER, max_tokens=64, temperature=1.0, seed=0,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    value = json.loads(out.choices[0].message.content)
    assert set(value) == {"ok"} and isinstance(value["ok"], bool)
    loose = client.chat.completions.create(
        model="tiny_qwen3",
        messages=USER,
        max_tokens=8,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert loose.choices[0].message.content.lstrip().startswith("{")
    with pytest.raises(openai.BadRequestError, match="cannot be compiled"):
        client.chat.completions.create(
            model="tiny_qwen3", messages=USER, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}},
        )  # fmt: skip
    assert client.chat.completions.create(model="tiny_qwen3", messages=USER, max_tokens=2).choices


# ---------------------------------------------------------------------------------------------
# Concurrency


def test_32_concurrent_streams_equal_their_sequential_answers(server):
    prompts = [f"The {w} computes {i} numbers" for i, w in enumerate(["cat", "GPU", "river", "robot"] * 8)]
    kw = {"model": "tiny_qwen3", "max_tokens": 20, "temperature": 0, "extra_body": {"ignore_eos": True}}
    client = server.client()
    sequential = [client.completions.create(prompt=p, **kw).choices[0].text for p in prompts]

    async def one(aclient: openai.AsyncOpenAI, prompt: str) -> tuple[str, str | None]:
        text, finish = "", None
        async for chunk in await aclient.completions.create(prompt=prompt, stream=True, **kw):
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def all_at_once() -> list[tuple[str, str | None]]:
        aclient = server.async_client()
        try:
            return await asyncio.gather(*(one(aclient, p) for p in prompts))
        finally:
            await aclient.close()

    concurrent = asyncio.run(all_at_once())
    assert [t for t, _ in concurrent] == sequential
    assert all(f == "length" for _, f in concurrent)
    m = server.wait_for_idle_pool()
    assert m["final_engine_steps_total"] > 0


# ---------------------------------------------------------------------------------------------
# Bad input: each gets its status code and an OpenAI error body, and the server keeps serving

LONG = "word " * 400  # far beyond the tiny model's 256-token context

BAD_REQUESTS = [
    ("chat", b"{not json", 400, "malformed JSON"),
    ("chat", b"[1, 2]", 400, "JSON object"),
    ("chat", {"model": "gpt-4", "messages": USER}, 404, "does not exist"),
    ("chat", {"messages": []}, 400, "messages"),
    ("chat", {"messages": [{"role": "function", "content": "x"}]}, 400, "messages[0].role"),
    ("chat", {"messages": [{"role": "tool", "content": "x"}]}, 400, "needs tool_call_id"),
    ("chat", {"messages": USER, "tool_choice": "auto"}, 400, "tool_choice needs tools"),
    ("chat", {"messages": USER, "tools": [{}] * 129}, 400, "tools: at most 128 items"),
    ("chat", {"messages": USER, "chat_template_kwargs": {str(i): 1 for i in range(33)}}, 400, "at most 32"),
    (
        "chat",
        {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]},
        400,
        "takes no tools",
    ),
    (
        "chat",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "only text",
    ),
    ("chat", {"messages": USER, "tools": [{"type": "function"}]}, 400, "tools[0].function"),
    ("chat", {"messages": USER, "temperature": -1}, 400, "temperature"),
    ("chat", {"messages": USER, "top_p": 0}, 400, "top_p"),
    ("chat", {"messages": USER, "max_tokens": 0}, 400, "max_tokens"),
    ("chat", {"messages": USER, "n": 100}, 400, "n"),
    ("chat", {"messages": USER, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("completions", {"prompt": "hi", "frequency_penalty": -3}, 400, "frequency_penalty"),
    ("chat", {"messages": USER, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("chat", {"messages": USER, "logit_bias": {"5": 1}}, 400, "logit_bias"),
    ("chat", {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat", {"messages": USER, "response_format": {"type": "json_schema"}}, 400, "json_schema"),
    ("chat", {"messages": USER, "response_format": {"type": "xml"}}, 400, "response_format"),
    ("chat", {"messages": [{"role": "user", "content": LONG}]}, 400, "context holds 256"),
    ("completions", {"prompt": LONG}, 400, "context holds 256"),
    ("completions", {"prompt": "hi", "echo": True}, 400, "echo"),
    ("completions", {"prompt": "hi", "stop": [1]}, 400, "stop"),
    ("completions", {"prompt": [99999]}, 400, "token ids"),
]


@pytest.mark.parametrize(
    ("endpoint", "body", "status", "needle"),
    BAD_REQUESTS,
    ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_REQUESTS)],
)
def test_bad_input_gets_its_status_code(server, endpoint, body, status, needle):
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(
        f"{server.url}{path}", content=content, headers={"Content-Type": "application/json"}, timeout=30
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert needle in error["message"] or needle == error["param"], error


def test_server_keeps_serving_after_bad_input(server):
    client = server.client()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=USER)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny_qwen3", prompt=LONG)
    assert err.value.code == "context_length_exceeded"
    out = client.chat.completions.create(model="tiny_qwen3", messages=USER, max_tokens=4, **GREEDY)
    assert out.usage.completion_tokens == 4
    m = server.wait_for_idle_pool()
    assert m['final_requests_rejected_total{reason="bad_request"}'] >= 1


# ---------------------------------------------------------------------------------------------
# A client that goes away mid-stream


def test_client_disconnect_aborts_and_frees_pages(server):
    before = server.wait_for_idle_pool()
    body = {
        "model": "tiny_qwen3",
        "prompt": "The old engine",
        "max_tokens": 240,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{server.url}/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line.startswith("data:")]
        assert received
    # The connection is closed: the server must abort the request and free its pages.
    after = server.wait_for_idle_pool()
    steps = after["final_engine_steps_total"] - before["final_engine_steps_total"]
    assert steps < 200, f"the engine ran {steps} steps: the request was not aborted"
    key = 'final_requests_total{finish_reason="abort"}'
    assert after.get(key, 0) == before.get(key, 0) + 1


def test_metrics_are_prometheus_text(server):
    text = httpx.get(f"{server.url}/metrics").text
    for name in ["requests_total", "prompt_tokens_total", "generation_tokens_total", "requests_waiting",
                 "kv_usage_ratio", "prefix_cache_hit_ratio", "time_to_first_token_seconds",
                 "inter_token_latency_seconds"]:  # fmt: skip
        assert f"# TYPE final_{name} " in text
    m = server.metrics()
    assert (
        m['final_time_to_first_token_seconds_bucket{le="+Inf"}']
        == m["final_time_to_first_token_seconds_count"]
        > 0
    )
    assert m["final_inter_token_latency_seconds_count"] > 0
    assert 0 <= m["final_kv_usage_ratio"] <= 1


# ---------------------------------------------------------------------------------------------
# Overload: a full server answers 503 and recovers


def test_overloaded_server_answers_503_and_recovers(tiny_llama_dir, tmp_path):
    s = Server(tiny_llama_dir, tmp_path / "server.log", "--max-running-requests", "1", "--max-waiting-requests", "0",
               "--num-pages", "230", "--served-model-name", "tiny_llama", "--log-level", "warning")  # fmt: skip
    try:
        client = s.client()
        # A request whose prompt and max_tokens cannot fit the (small) KV pool is refused, with the sizes.
        with pytest.raises(openai.BadRequestError, match="pool holds 230"):
            client.completions.create(model="tiny_llama", prompt="The cat", max_tokens=250)
        body = {
            "model": "tiny_llama",
            "prompt": "The cat",
            "max_tokens": 200,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        with (
            httpx.Client(timeout=60) as http,
            http.stream("POST", f"{s.url}/v1/completions", json=body) as first,
        ):
            assert first.status_code == 200
            lines = first.iter_lines()  # keep it: a dropped iterator closes the connection
            next(line for line in lines if line.startswith("data:"))  # the first request is running
            with pytest.raises(openai.APIStatusError) as err:
                client.completions.create(model="tiny_llama", prompt="The GPU", max_tokens=4)
            assert err.value.status_code == 503 and err.value.code == "server_overloaded"
            assert err.value.response.headers["retry-after"] == "1"
            rest = [line for line in lines if line.startswith("data:")]
            assert rest[-1] == "data: [DONE]"
        out = client.completions.create(model="tiny_llama", prompt="The GPU", max_tokens=4, temperature=0)
        assert out.choices[0].text
        assert s.metrics()['final_requests_rejected_total{reason="overloaded"}'] == 1
    finally:
        s.stop()


# ---------------------------------------------------------------------------------------------
# The default model gives a coherent answer; the online benchmark runs against a server


@pytest.fixture(scope="module")
def default_server(default_model_dir, tmp_path_factory):
    s = Server(default_model_dir, tmp_path_factory.mktemp("default") / "server.log", "--num-pages", "4096",
               "--log-level", "warning")  # fmt: skip
    yield s
    s.stop()


def test_default_model_answers_streamed_and_not(default_server):
    client = default_server.client()
    kw = {"model": "SmolLM2-135M-Instruct", "messages": USER, "max_tokens": 24, "temperature": 0}
    whole = client.chat.completions.create(**kw).choices[0].message.content
    assert "Paris" in whole
    streamed = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
    )
    assert streamed == whole


def test_bench_online_smoke(server, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.bench_online", "--url", server.url, "--rates", "20,inf", "--scale", "0.01",
         "--num-requests", "6", "--out-dir", str(tmp_path), "--name", "final_online_test", "--client-procs", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = sorted(tmp_path.glob("*.json"))
    assert [p.name for p in results] == ["final_online_test_rate20.json", "final_online_test_rateinf.json"]
    for path in results:
        record = parse_result(json.loads(path.read_text()), path.name)  # the schema render_results reads
        assert record.group == "final" and record.stage == "final" and record.workload == "online"
        assert record.metrics["completed"] == 6 and record.metrics["failed"] == 0  # both processes' requests
        assert record.config["client_procs"] == 2
        assert 0 < record.metrics["ttft_ms_p50"] <= record.metrics["e2e_ms_p99"]
        assert record.metrics["output_tok_per_s"] > 0
