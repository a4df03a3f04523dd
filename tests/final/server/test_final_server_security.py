"""The API key and CORS (issue 15, finding 10), against a live server on loopback.

The key comes from FINAL_API_KEY (as a deployment would pass it, out of `ps`); /health stays
public, /metrics is made private with --public-paths; one origin may call from a browser.
"""

from __future__ import annotations

import json

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]
import openai
import pytest

from final.server.security import is_loopback
from tests.fixtures.live_server import Server, serving

KEY = "sk-test-9f2c4e"
GOOD_ORIGIN = "http://good.example"


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    yield from serving(tiny_qwen3_dir, tmp_path_factory.mktemp("security"), "--public-paths", "/health",
               "--allowed-origins", GOOD_ORIGIN, "--served-model-name", "tiny", env={"FINAL_API_KEY": KEY})  # fmt: skip


def get(server: Server, path: str, key: str | None = None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.get(f"{server.url}{path}", headers=headers, timeout=30)


@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/openapi.json", "/docs", "/no/such/path"])
def test_every_path_but_the_public_ones_needs_the_key(server, path):
    for key in [None, "sk-wrong", KEY[:-1], KEY + "x", KEY.upper()]:
        response = get(server, path, key)
        assert response.status_code == 401, (path, key, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_api_key" and "--api-key" in error["message"]
        assert response.headers["www-authenticate"] == "Bearer"
    assert get(server, path, KEY).status_code == (404 if path.startswith("/no") else 200)
    assert get(server, "/health").json() == {"status": "ok"}  # public


def test_generation_needs_the_key(server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0).completions.create(
            model="tiny", prompt="The", max_tokens=2
        )
    raw = httpx.post(f"{server.url}/v1/completions", json={"prompt": "The", "max_tokens": 2})
    assert raw.status_code == 401
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model="tiny", prompt="The", max_tokens=2).usage.completion_tokens == 2


def test_cors_answers_the_allowed_origin_only(server):
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    ok = httpx.options(f"{server.url}/v1/chat/completions", headers={"Origin": GOOD_ORIGIN, **preflight})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == GOOD_ORIGIN
    evil = httpx.options(
        f"{server.url}/v1/chat/completions", headers={"Origin": "http://evil.example", **preflight}
    )
    assert "access-control-allow-origin" not in evil.headers
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    for origin in [GOOD_ORIGIN, "http://evil.example"]:
        response = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers={
            "Origin": origin, "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})  # fmt: skip
        assert response.status_code == 200
        assert response.headers.get("access-control-allow-origin") == (
            origin if origin == GOOD_ORIGIN else None
        )


def test_the_key_is_not_logged_and_a_keyed_loopback_bind_does_not_warn(server):
    log = server.log_path.read_text()
    assert KEY not in log and "without an API key" not in log


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("192.168.1.4", False), ("myhost.example", False)],
)  # fmt: skip
def test_which_binds_are_loopback(host, loopback):
    assert is_loopback(host) is loopback
