"""final/core: the pieces every layer shares."""
