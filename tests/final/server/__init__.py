"""final/server: the OpenAI-compatible server, live on loopback."""
