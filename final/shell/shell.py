"""The interactive chat: a prompt_toolkit line editor (plain input() when stdin is not a
terminal), the engine in its own process, answers streamed token by token.

The whole conversation is sent again every turn, so the prefix cache (--cache radix, the default)
reuses the KV of everything said so far. Ctrl-C stops the current answer and keeps the shell;
Ctrl-D or /exit leaves. Sampling comes from FINAL_SHELL_TEMPERATURE (0.6), FINAL_SHELL_TOP_P
(0.95), FINAL_SHELL_TOP_K (-1) and FINAL_SHELL_MAX_TOKENS (1024).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable

from ..core.config import EngineConfig
from ..core.errors import UserError
from ..core.limits import max_new_tokens
from ..core.sampling_params import SamplingParams
from ..engine.messages import EngineInfo
from ..frontend.client import SyncEngineClient
from ..frontend.request_state import RequestState
from ..frontend.startup import start_frontend
from ..frontend.tokenizer import Message, Tokenizer

HELP = """commands:
  /reset   forget the conversation and start a new one
  /help    show this help
  /exit    leave (Ctrl-D works too)
Ctrl-C stops the answer being written; Enter sends a message."""


def shell_params() -> SamplingParams:
    env = os.environ.get
    try:
        return SamplingParams(
            temperature=float(env("FINAL_SHELL_TEMPERATURE", "0.6")),
            top_p=float(env("FINAL_SHELL_TOP_P", "0.95")),
            top_k=int(env("FINAL_SHELL_TOP_K", "-1")),
            max_tokens=int(env("FINAL_SHELL_MAX_TOKENS", "1024")),
        )
    except ValueError as err:
        raise UserError(f"bad FINAL_SHELL_* setting: {err}") from err


def make_reader() -> Callable[[str], str]:
    """prompt_toolkit on a terminal (history, line editing); input() on a pipe."""
    if not sys.stdin.isatty():
        return input
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import WordCompleter
    from prompt_toolkit.history import InMemoryHistory

    session: PromptSession[str] = PromptSession(
        history=InMemoryHistory(), completer=WordCompleter(["/reset", "/help", "/exit"], sentence=True)
    )
    return session.prompt


class Shell:
    def __init__(
        self, client: SyncEngineClient, tokenizer: Tokenizer, info: EngineInfo, params: SamplingParams
    ):
        self.client, self.tokenizer, self.info, self.params = client, tokenizer, info, params
        self.history: list[Message] = []

    def command(self, line: str) -> bool:
        """Run a /command; False means leave."""
        name = line.split()[0]
        if name in ("/exit", "/quit"):
            return False
        if name == "/reset":
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
            cap = max_new_tokens(prompt_ids, None, info.max_context, info.vocab_size, info.kv_capacity)
        except UserError:
            print(f"[the conversation ({len(prompt_ids)} tokens) fills the context; /reset]")
            return
        params = dataclasses.replace(self.params, max_tokens=min(self.params.max_tokens or cap, cap))
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


def run_shell(args: argparse.Namespace, config: EngineConfig) -> int:
    params = shell_params()
    frontend = start_frontend(
        config,
        args.log_level or "warning",
        require_chat_template=True,
        on_loading=lambda model_dir: print(f"Loading {model_dir.name}...", flush=True),
    )
    engine = frontend.engine
    client = SyncEngineClient(engine)
    try:
        print(
            f"Chatting with {frontend.model_dir.name} on {engine.info.device}. /help for commands, /exit or Ctrl-D to leave."
        )
        Shell(client, frontend.tokenizer, engine.info, params).run(make_reader())
    finally:
        client.close()
        frontend.close()
    return 0
