"""The scheduler: policy only. Which requests run in the next step, and how many tokens each:
continuous batching, chunked prefill under a token budget, prefix-cache admission, preemption
when the KV pool runs dry. The KV cache manager decides which pages; the engine runs the step."""

from .request import Request, ScheduledBatch, Status
from .scheduler import NeedsDrain, Scheduler

__all__ = ["NeedsDrain", "Request", "ScheduledBatch", "Scheduler", "Status"]
