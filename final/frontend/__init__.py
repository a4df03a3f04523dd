"""The frontend side of the engine: tokenizer and chat template, incremental detokenizer with
stop strings, per-request output assembly, clients that talk to the engine process, and the
server's watch over that process (engine_monitor.py). The server, the shell and the offline LLM
are built on it. The server's own path (issue 27): detokenizer_process.py, the process between
the API and the engine that turns each step into text (step_text.py: a whole step at once), and
mailbox.py, how the API process hands each request its share of a step with one wake-up."""
