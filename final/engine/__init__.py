"""The engine's step, without I/O or processes (those are final/runtime's), file by file;
runtime/build.py puts the parts together:

    resolve.py   every choice of an engine made once: a frozen ResolvedConfig
    core.py      EngineCore: the schedule -> launch -> collect loop (overlap: a variant of it)
    handle.py    a launched step: what collect needs once the device is done
    executor.py  the model runner and its decode graphs, and the step every rank runs
    runner.py    the model, the KV pool and the attention backend: a step in, logits out
    graph.py     decode steps captured in CUDA graphs and replayed
    sampler.py   logits in, tokens out, each request under its own parameters
    peers.py     what a step needs of the other tensor-parallel ranks (nothing at --tp 1)
    stats.py     the engine's counters
    messages.py  what the engine and the frontend say to each other
    wire.py      a step's outputs as a few flat arrays on the wire, with when they reached the host
"""
