"""The stages of the book: each folder is a complete, runnable engine (see docs/stages.md)."""
