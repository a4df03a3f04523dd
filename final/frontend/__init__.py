"""The frontend side of the engine: tokenizer and chat template, incremental detokenizer with
stop strings, per-request output assembly, and clients that talk to the engine process. The
server, the shell and the offline LLM are built on it."""
