"""/tokenize and /detokenize (final/server/tokenize_api.py), vLLM's shapes, on a live server: the
ids a prompt or a conversation becomes are the ones the generation endpoints use, and back."""

from __future__ import annotations

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]
import pytest

from final.frontend.tokenizer import Tokenizer
from tests.fixtures.live_server import Server, serving

USER = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    yield from serving(tiny_qwen3_dir, tmp_path_factory.mktemp("tokenize"), "--served-model-name", "tiny",
               "--log-level", "warning")  # fmt: skip


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def test_a_prompt_and_a_conversation_tokenize_as_the_endpoints_see_them(server, tiny_qwen3_dir):
    tokenizer = Tokenizer(tiny_qwen3_dir)
    out = post(server, "/tokenize", {"prompt": "Once upon a time", "return_token_strs": True}).json()
    assert out["tokens"] == tokenizer.encode("Once upon a time") and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 256 and "".join(out["token_strs"]) == "Once upon a time"
    chat = post(server, "/tokenize", {"model": "tiny", "messages": USER}).json()
    assert chat["tokens"] == tokenizer.encode_chat(USER) and chat["token_strs"] is None
    answer = server.client().chat.completions.create(model="tiny", messages=USER, max_tokens=1)
    assert answer.usage.prompt_tokens == chat["count"]  # what the chat endpoint counted
    back = post(server, "/detokenize", {"tokens": chat["tokens"]}).json()
    assert back == {"prompt": tokenizer.render_chat(USER)}  # special tokens written out


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/tokenize", {"prompt": "hi", "messages": USER}, 400, "one of them"),
        ("/tokenize", {}, 400, "one of them"),
        ("/tokenize", {"prompt": "hi", "add_generation_prompt": False}, 400, "add_generation_prompt"),
        ("/tokenize", {"prompt": "hi", "model": "other"}, 404, "other"),
        ("/detokenize", {"tokens": [10**6]}, 400, "token ids must be in"),
        ("/detokenize", {"tokens": [1] * 257}, 400, "at most 256"),
    ],
)
def test_bad_bodies_get_their_status(server, path, body, status, needle):
    response = post(server, path, body)
    assert response.status_code == status, response.text
    assert needle in response.json()["error"]["message"]
    assert post(server, "/tokenize", {"prompt": "still here"}).status_code == 200
