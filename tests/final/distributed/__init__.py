"""final/distributed: tensor parallelism, over gloo on the CPU and NCCL on GPUs."""
