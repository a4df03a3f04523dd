"""final/attention: the backends, on stand-ins on the CPU and with their kernels on a GPU."""
