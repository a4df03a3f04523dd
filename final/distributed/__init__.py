"""Tensor parallelism's plumbing: which rank this process is and the collectives a sharded decoder
needs (tp.py), where the ranks meet and their process groups (group.py), and the channel rank 0
sends each step over (step_channel.py). The processes themselves are final/runtime's."""
