"""The scheduler: policy only. Which requests run in the next step, and how many tokens each:
continuous batching, chunked prefill under a token budget, prefix-cache admission, preemption
when the KV pool runs dry (scheduler.py); how prefill and decodes share a step (policy.py); a
request's state and the batch one step computes (request.py). The KV cache manager decides which
pages; the engine runs the step."""
