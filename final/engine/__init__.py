"""The engine: the model runner (model + KV pool + attention backend: a step in, logits out), the
sampler (logits in, tokens out), EngineCore (the step loop: schedule -> launch -> collect) and the
engine process that serves it to the frontend over ZMQ (lifeline.py: it never outlives the
frontend, nor blocks on it; heartbeat.py: the frontend can tell it is alive and stepping)."""

from .core import EngineCore, StepHandle, validate_early
from .messages import EngineInfo, EngineStats, RequestDelta
from .runner import ModelRunner
from .sampler import SampleOutput, make_generator, sample

__all__ = [
    "EngineCore",
    "EngineInfo",
    "EngineStats",
    "ModelRunner",
    "RequestDelta",
    "SampleOutput",
    "StepHandle",
    "make_generator",
    "sample",
    "validate_early",
]
