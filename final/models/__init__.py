"""Models: what --model names (source.py, default_model.py), the registry of architectures
(registry.py), the Llama-family decoder and its layers (llama.py, layers.py, rope.py, fused.py),
and loading a checkpoint into it, sharded under tensor parallelism (loader.py, weights.py)."""
