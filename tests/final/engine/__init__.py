"""final/engine: the step loop, overlap, CUDA graphs, penalties, structured outputs."""
