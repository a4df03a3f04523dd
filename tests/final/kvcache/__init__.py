"""final/kvcache: the prefix cache and the FP8 KV cache."""
