"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) in front of the engine process.

launch.py       python -m final: start the engine process, then uvicorn
app.py          routes: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics
openai_api.py   the two generation endpoints, streamed (SSE) or not
protocol.py     request bodies: every field declared, the unsupported ones refused (400)
generation.py   limits, admission (503 when overloaded), one request's round trip, abort
formatting.py   usage, logprobs and SSE frames;  errors.py  OpenAI error bodies
metrics.py      Prometheus text format;  state.py  what the handlers share
"""

import argparse

from ..core.config import EngineConfig


def serve(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run the server until Ctrl-C (imported lazily: `import final.server` pulls in no web stack)."""
    from .launch import serve as _serve

    return _serve(args, config)
