"""Everything a request handler needs, built once when the server starts."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.messages import EngineInfo
from ..frontend.client import AsyncEngineClient
from ..frontend.sampling_defaults import SamplingDefaults
from ..frontend.tokenizer import Tokenizer
from .admission import Admission
from .metrics import Metrics


@dataclass
class ServerState:
    tokenizer: Tokenizer
    client: AsyncEngineClient
    info: EngineInfo
    served_model_name: str
    accepted_model_names: set[str]  # what `model` may say: the served name, the --model value
    max_in_flight: int  # --max-running-requests + --max-waiting-requests, in sequences
    max_request_bytes: int  # --max-request-bytes
    max_per_request: int  # the most sequences one request may hold: --max-running-requests
    read_timeout: float  # --read-timeout: how long a request's body may take to arrive
    metrics: Metrics = field(default_factory=Metrics)
    # what a request gets for the sampling parameters it leaves out (frontend/sampling_defaults.py)
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    # --reasoning-parser: how a <think> block is told apart (reasoning.py); None: not at all
    reasoning_parser: str | None = None
    # --tool-call-parser: how a model writes its tool calls (tool_formats.py)
    tool_call_parser: str = "hermes"
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.max_in_flight, self.max_per_request)

    @property
    def max_prompt_chars(self) -> int:
        """No text longer than this can fit the context, whatever its tokens (see Tokenizer)."""
        return self.info.max_context * self.tokenizer.max_token_chars
