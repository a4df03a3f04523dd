"""Errors a user can cause, and the one place that turns them into a message and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable


class UserError(Exception):
    """Bad input from the user: a wrong model path, an empty prompt, an invalid sampling value.

    Command-line entry points print it as one line and exit with status 2 (no traceback);
    the server turns it into an HTTP 400.
    """


class ContextLengthError(UserError):
    """A request longer than the model's context or the KV pool can hold: the API's
    `context_length_exceeded`."""


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a command-line entry point: user errors become one clear line and exit status 2."""
    try:
        code = main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
