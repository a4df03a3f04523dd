"""The engine: the model runner (model + KV pool + attention backend: a batch in, logits out) and
the sampler (logits in, tokens out). CUDA graphs and the overlap of CPU scheduling with GPU
compute slot in here when they are ported: both wrap `ModelRunner.forward`."""

from .runner import ModelRunner
from .sampler import SampleOutput, make_generator, sample

__all__ = ["ModelRunner", "SampleOutput", "make_generator", "sample"]
