"""final/kernels: the Triton kernels, interpreted on the CPU and compiled on a GPU."""
