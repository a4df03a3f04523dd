"""Property-based fuzz of both completion endpoints against the server's own /openapi.json.

Hypothesis draws bodies from the published request schemas, and mutates some (a field set to any
JSON value: huge integers, NaN, lone surrogates, wrong types, nesting; an unknown field; a
required one gone; a body that is not an object). For every body:

- never a 5xx, and every error is OpenAI's error object;
- a body the schema rejects is a 400: the schema promises no more than the server accepts;
- a body the schema accepts is served (200, with one choice per sequence, a stream ending in
  [DONE]), or refused only by a rule a schema cannot state (a prompt too long for the context,
  token ids past the vocabulary, best_of != n, a conversation the chat template refuses, an
  unknown model name);
- /health answers 200 afterwards.

Bounded for CI: a 64-token context keeps every generation short, and a fixed number of examples
per endpoint (derandomized, so a failure reproduces).
"""

from __future__ import annotations

import json
import math
from typing import Any

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.live_server import serving
from tests.fixtures.schema_strategies import SchemaStrategies, any_json

jsonschema = pytest.importorskip("jsonschema", reason="the fuzz needs jsonschema (the test extra)")

EXAMPLES = 90  # per endpoint
ENDPOINTS = {"/v1/chat/completions": "ChatCompletionRequest", "/v1/completions": "CompletionRequest"}
LOOKALIKES = ["yes", "true", "8", "0.5", "", "text", 1, 0, 8.0, 0.5, True, False, 2**70, -(2**70), [], {},
             ["x"], [1], {"type": "text"}, "\ud800", float("nan"), float("inf")]  # fmt: skip
SEMANTIC_400 = (  # what a JSON Schema cannot say; each is documented in docs/serving/api.md
    "context",  # the prompt is longer than the context (tokens or characters)
    "the prompt is empty",
    "prompt token ids must be in",
    "best_of is not supported",
    "the chat template rejected",
    "cannot be compiled",  # a response_format json_schema the grammar engine cannot follow
    "xgrammar",  # response_format json_object / json_schema on a host without the grammar engine
    "tool_choice needs tools",
    "not among the tools",
    "names must be unique",  # the tools' function names
    "takes no tools",  # tools for a chat template that never shows them
    "give one",  # response_format beside a tool_choice that forces a call
)


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    yield from serving(tiny_qwen3_dir, tmp_path_factory.mktemp("fuzz"), "--max-seq-len-override", "64",
               "--served-model-name", "tiny", "--log-level", "warning")  # fmt: skip


@pytest.fixture(scope="module")
def schema(server) -> dict[str, Any]:
    return httpx.get(f"{server.url}/openapi.json", timeout=30).json()


def strict_validator(schema: dict[str, Any], model: str) -> Any:
    """JSON Schema validation as the server does it: an integer is a JSON integer (not 8.0)."""
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool)
    )
    validator = jsonschema.validators.extend(base, type_checker=checker)
    return validator({"$ref": f"#/components/schemas/{model}", "components": schema["components"]})


def is_clean(value: Any) -> bool:
    """Finite numbers and valid Unicode only: what JSON text can carry."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list):
        return all(is_clean(v) for v in value)
    if isinstance(value, dict):
        return all(is_clean(k) and is_clean(v) for k, v in value.items())
    return True


def bodies(schema: dict[str, Any], model: str) -> st.SearchStrategy[tuple[Any, str]]:
    """(body, how it was made): schema instances, and mutations of them."""
    strategies = SchemaStrategies(schema["components"]["schemas"])
    drawn = strategies.valid({"$ref": f"#/components/schemas/{model}"})

    @st.composite
    def valid(draw: st.DrawFn) -> dict[str, Any]:
        body = draw(drawn)
        if "model" in body and draw(st.booleans()):  # mostly a name the server serves
            body["model"] = "tiny"
        return body

    fields = list(schema["components"]["schemas"][model]["properties"])

    @st.composite
    def mutated(draw: st.DrawFn) -> tuple[Any, str]:
        body = dict(draw(valid()))
        how = draw(st.sampled_from(["set", "confuse", "confuse", "nested", "unknown", "drop", "whole"]))
        if how == "set":
            body[draw(st.sampled_from(fields))] = draw(any_json())
        elif how == "confuse":  # a value of another type that a lax parser would coerce
            body[draw(st.sampled_from(fields))] = draw(st.sampled_from(LOOKALIKES))
        elif how == "nested":
            value = draw(st.sampled_from(LOOKALIKES))
            if "messages" in body:
                key = draw(st.sampled_from(["role", "content"]))
                body["messages"] = [{**body["messages"][0], key: value}, *body["messages"][1:]]
            else:
                body["prompt"] = draw(st.sampled_from([[value], [[value]], [1, value], ["x", value]]))
        elif how == "unknown":
            body[draw(st.sampled_from(["tools", "functions", "extra", "Model", ""]))] = draw(any_json())
        elif how == "drop":
            body.pop("messages" if "messages" in fields else "prompt", None)
        else:
            return draw(any_json()), how
        return body, how

    return st.one_of(valid().map(lambda b: (b, "valid")), mutated())


def check_served(path: str, body: dict[str, Any], response: httpx.Response) -> None:
    prompts = 1
    if path == "/v1/completions" and isinstance(body["prompt"], list):
        prompts = 1 if all(isinstance(x, int) for x in body["prompt"]) else len(body["prompt"])
    choices = prompts * (body.get("n") or 1)
    if body.get("stream"):
        frames = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert frames[-1] == "[DONE]", frames[-3:]
        events = [json.loads(f) for f in frames[:-1]]
        assert not any("error" in e for e in events), events
        assert {c["index"] for e in events for c in e["choices"]} == set(range(choices))
    else:
        out = response.json()
        assert [c["index"] for c in out["choices"]] == list(range(choices))
        assert all(c["finish_reason"] in ("stop", "length") for c in out["choices"])


@pytest.mark.parametrize("path", list(ENDPOINTS))
def test_fuzz_against_the_published_schema(server, schema, path):
    model = ENDPOINTS[path]
    validator = strict_validator(schema, model)
    client = httpx.Client(base_url=server.url, timeout=120)
    seen: dict[str, int] = {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(bodies(schema, model))
    def one(case: tuple[Any, str]) -> None:
        body, how = case
        content = json.dumps(body)  # lone surrogates become \\udXXX escapes, NaN becomes NaN
        response = client.post(path, content=content, headers={"Content-Type": "application/json"})
        status = response.status_code
        key = f"{how}:{status}"
        seen[key] = seen.get(key, 0) + 1
        assert status < 500, (body, response.text)
        valid = isinstance(body, dict) and is_clean(body) and validator.is_valid(body)
        if status != 200:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, error
            assert isinstance(error["message"], str) and error["message"]
            if valid:  # the schema accepted it: only a rule it cannot state may refuse it
                known = status == 404 and error["code"] == "model_not_found"
                known = known or (status == 400 and any(s in error["message"] for s in SEMANTIC_400))
                assert known, f"schema-valid body refused: {body} -> {error}"
            else:
                assert status == 400, (body, error)
        else:
            assert valid, f"served a body the schema rejects: {body}"
            check_served(path, body, response)
        assert client.get("/health").json() == {"status": "ok"}

    try:
        one()
    finally:
        client.close()
    print(path, dict(sorted(seen.items())))
    assert any(k.startswith("valid:200") for k in seen), seen  # the fuzz reached the engine
    server.wait_for_idle_pool()
