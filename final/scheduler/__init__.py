"""The scheduler layer: request state, continuous batching with preemption, the in-process
EngineCore (used by the offline LLM), and the engine process with its messages (used by the
server and the shell)."""

from .engine_core import EngineCore, validate_early
from .messages import EngineInfo, EngineStats, RequestDelta
from .scheduler import Scheduler

__all__ = ["EngineCore", "EngineInfo", "EngineStats", "RequestDelta", "Scheduler", "validate_early"]
