"""The interactive chat: a prompt_toolkit line editor (plain input() when stdin is not a
terminal), the engine in its own process, answers streamed token by token.

The whole conversation is sent again every turn, so the prefix cache (--cache radix, the default)
reuses the KV of everything said so far. Ctrl-C stops the current answer and keeps the shell;
Ctrl-D or /exit leaves. Sampling starts from the command line's --temperature, --top-p, --top-k,
--min-p and --max-tokens, then the model's generation_config.json, then greedy decoding with
answers of at most 256 tokens (frontend/sampling_defaults.py); `/set NAME VALUE` changes a value
for the rest of the session.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections.abc import Callable
from typing import Any

from ..core.config import EngineConfig
from ..core.errors import UserError
from ..core.limits import max_new_tokens
from ..core.sampling_params import SamplingParams
from ..engine.messages import EngineInfo
from ..frontend.client import SyncEngineClient
from ..frontend.options import ServeOptions
from ..frontend.request_state import RequestState
from ..frontend.sampling_defaults import (
    SHELL_FALLBACK,
    SamplingDefaults,
    fit_default_max_tokens,
    sampling_flags,
)
from ..frontend.startup import start_frontend
from ..frontend.tokenizer import Message, Tokenizer

# What /set may change, and how its value is read. max_tokens 0: no cap (the room the context leaves).
SETTINGS: dict[str, Callable[[str], Any]] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "max_tokens": int,
    "seed": int,
}

HELP = """commands:
  /set NAME VALUE  change a sampling setting for this session: temperature (0 is greedy), top_p,
                   top_k (-1: all), min_p, max_tokens (0: no cap) or seed; e.g. /set temperature 0.7
  /set             show the settings and where each comes from
  /reset           forget the conversation and start a new one
  /help            show this help
  /exit            leave (Ctrl-D works too)
Ctrl-C stops the answer being written; Enter sends a message.
The settings start from --temperature, --top-p, --top-k, --min-p, --max-tokens (python -m final --help)."""


def make_reader() -> Callable[[str], str]:
    """prompt_toolkit on a terminal (history, line editing); input() on a pipe."""
    if not sys.stdin.isatty():
        return input
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import WordCompleter
    from prompt_toolkit.history import InMemoryHistory

    session: PromptSession[str] = PromptSession(
        history=InMemoryHistory(),
        completer=WordCompleter(["/set", "/reset", "/help", "/exit"], sentence=True),
    )
    return session.prompt


class Shell:
    def __init__(
        self, client: SyncEngineClient, tokenizer: Tokenizer, info: EngineInfo, defaults: SamplingDefaults
    ):
        self.client, self.tokenizer, self.info, self.defaults = client, tokenizer, info, defaults
        self.settings: dict[str, Any] = {}  # what /set changed
        self.history: list[Message] = []

    def params(self, settings: dict[str, Any] | None = None) -> SamplingParams:
        """The defaults, with what /set changed (max_tokens 0: no cap)."""
        settings = self.settings if settings is None else settings
        no_cap = settings.get("max_tokens") == 0
        params = self.defaults.params(
            **{k: v for k, v in settings.items() if not (no_cap and k == "max_tokens")}
        )
        return dataclasses.replace(params, max_tokens=None) if no_cap else params

    def set(self, args: list[str]) -> None:
        """/set NAME VALUE, or /set alone: show the settings and where each comes from."""
        if not args:
            params = self.params()
            for name in SETTINGS:
                value = getattr(params, name)
                source = "/set" if name in self.settings else self.defaults.sources.get(name, "built-in")
                if value is None:
                    value = "no cap" if name == "max_tokens" else "none"
                print(f"  {name} = {value}  ({source})")
            return
        if len(args) != 2 or args[0] not in SETTINGS:
            print(f"[usage: /set NAME VALUE, with NAME one of {', '.join(SETTINGS)}]")
            return
        name, text = args
        try:
            settings = {**self.settings, name: SETTINGS[name](text)}
            self.params(settings)  # a bad value is refused here, and the old one kept
        except ValueError:
            print(f"[{name} takes a number, got {text!r}]")
            return
        except UserError as err:
            print(f"[{err}]")
            return
        self.settings = settings
        print(f"({name} = {settings[name]})")

    def command(self, line: str) -> bool:
        """Run a /command; False means leave."""
        name = line.split()[0]
        if name in ("/exit", "/quit"):
            return False
        if name == "/set":
            self.set(line.split()[1:])
        elif name == "/reset":
            self.history.clear()
            print("(new conversation)")
        elif name == "/help":
            print(HELP)
        else:
            print(f"unknown command {name}")
            print(HELP)
        return True

    def answer(self, text: str) -> None:
        """One turn: send the conversation, stream the reply; keep the turn only if it completed."""
        messages = [*self.history, {"role": "user", "content": text}]
        try:
            prompt_ids = self.tokenizer.encode_chat(messages)
        except UserError as err:
            print(f"[{err}]")
            return
        info = self.info
        try:  # the engine's own rule: the answer is capped by the context and the KV pool
            max_new_tokens(prompt_ids, None, info.max_context, info.vocab_size, info.kv_capacity)
        except UserError:
            print(f"[the conversation ({len(prompt_ids)} tokens) fills the context; /reset]")
            return
        params = fit_default_max_tokens(
            self.params(), prompt_ids, info.max_context, info.vocab_size, info.kv_capacity
        )
        state = RequestState(0, prompt_ids, params, self.tokenizer)
        stream = self.client.generate(prompt_ids, params)
        try:
            for delta in stream:
                out = state.apply(delta)
                if out is not None and out.text:
                    print(out.text, end="", flush=True)
                if state.finished:
                    break
        except KeyboardInterrupt:
            print("\n[stopped]", flush=True)
            return  # the unfinished turn is not kept
        finally:
            stream.close()  # aborts the request in the engine if it is still running
        print(flush=True)
        if state.error:
            print(f"[error: {state.error}]")
            return
        if state.output.finish_reason == "length":
            print(f"[cut at {params.max_tokens} tokens; /set max_tokens N for longer answers]")
        self.history += [
            {"role": "user", "content": text},
            {"role": "assistant", "content": state.output.text},
        ]

    def run(self, read: Callable[[str], str]) -> None:
        while True:
            try:
                line = read("> ").strip()
            except KeyboardInterrupt:
                continue  # Ctrl-C at the prompt clears the line
            except EOFError:
                print()
                return
            if not line:
                continue
            if line.startswith("/"):
                if not self.command(line):
                    return
                continue
            self.answer(line)


def run_shell(args: ServeOptions, config: EngineConfig) -> int:
    # Ctrl-C stops an answer (Shell.answer catches KeyboardInterrupt). Python raises it only if
    # SIGINT was not ignored when the process started, and a shell started from a background job
    # of a non-interactive script inherits SIGINT ignored (POSIX shells do that to `cmd &`): the
    # terminal's Ctrl-C then did nothing. A chat shell on a terminal takes Ctrl-C itself. (The
    # engine process it starts ignores SIGINT on its own: the shell owns the keyboard.)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    frontend = start_frontend(
        config,
        args.log_level or "warning",
        require_chat_template=True,
        on_loading=lambda model_dir: print(f"Loading {model_dir.name}...", flush=True),
        generation_config=args.generation_config,
        sampling_flags=sampling_flags(args),
        sampling_fallback=SHELL_FALLBACK,
        chat_template=args.chat_template,
    )
    engine = frontend.engine
    client = SyncEngineClient(engine)
    try:
        print(
            f"Chatting with {frontend.model_dir.name} on {engine.info.device}. /help for commands, /exit or Ctrl-D to leave."
        )
        print(f"Sampling: {frontend.sampling_defaults.describe()}; /set changes them.")
        Shell(client, frontend.tokenizer, engine.info, frontend.sampling_defaults).run(make_reader())
    finally:
        client.close()
        frontend.close()
    return 0
