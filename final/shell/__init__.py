"""`python -m final --shell`: chat with the model in the terminal, answers streamed as they come."""

from .shell import run_shell

__all__ = ["run_shell"]
