"""final/scheduler: what runs next, pages never leaked, the prefill budget."""
