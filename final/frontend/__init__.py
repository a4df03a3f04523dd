"""The frontend side of the engine: tokenizer and chat template, incremental detokenizer with
stop strings, per-request output assembly, clients that talk to the engine process, and the
server's watch over that process (engine_monitor.py). The server, the shell and the offline LLM
are built on it."""
