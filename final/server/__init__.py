"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) in front of the engine process.

launch.py       python -m final: start the engine process, then uvicorn; a bounded shutdown
app.py          routes: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics
openai_api.py   the two generation endpoints, streamed (SSE) or not
chat_answer.py  a chat answer's text into its message or chunks: reasoning, content, tool calls
tools.py        tool calling: tools into the template, <tool_call> blocks out, forced calls
reasoning.py    --reasoning-parser: the <think> block into reasoning_content;  trimmed.py  ends trimmed
tokenize_api.py /tokenize and /detokenize (vLLM's), off the engine
body.py         reading a body: JSON only, size cap, read timeout, valid Unicode
request_body.py a body to a request: list sizes counted first, large ones parsed off the loop
timeouts.py     slow clients: a request's headers must arrive within --read-timeout
hosts.py        the Host header must name this server (DNS rebinding)
protocol.py     request bodies: strict types and ranges, the unsupported fields refused (400)
chat_messages.py  a chat's messages and tools;  strict_model.py  the models' base
prompts.py      prompt token ids: over-long text refused early, tokenizing off the event loop
admission.py    sequences in flight: atomic, 503 when full, 400 past one request's share
generation.py   limits, one request's round trip, abort
security.py     the API key, CORS, the warning for open binds;  openapi.py  /openapi.json
formatting.py   usage, logprobs and SSE frames;  errors.py  OpenAI error bodies
metrics.py      Prometheus text format;  state.py  what the handlers share
"""

from ..core.config import EngineConfig
from ..frontend.options import ServeOptions


def serve(args: ServeOptions, config: EngineConfig) -> int:
    """Run the server until Ctrl-C (imported lazily: `import final.server` pulls in no web stack)."""
    from .launch import serve as _serve

    return _serve(args, config)
