"""`python -m final --shell` driven through a pseudo-terminal, as a person would: a question with
the default settings, Ctrl-C in the middle of an answer, /reset, an unknown command, /exit; then
the sampling flags and /set."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from tests import ROOT

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]|\x1b\][^\x07]*\x07|\r")


class Terminal:
    """A child process on a pty, with expect(): wait until its output contains a pattern."""

    def __init__(self, argv: list[str], env: dict[str, str], sigint_ignored: bool = False):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal, so Ctrl-C becomes SIGINT
            os.chdir(ROOT)
            if sigint_ignored:  # as a background job of a script starts it: exec keeps it ignored
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            os.execvpe(argv[0], argv, env)
        self.raw = b""
        self.seen = 0  # how much of the output expect() has consumed

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", errors="replace"))

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                self.raw += os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal (it exited)
                time.sleep(timeout)

    def expect(self, pattern: str, timeout: float = 120) -> str:
        """Output since the last expect(), up to and including the first match of `pattern`."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.compile(pattern).search(self.text, self.seen)
            if m:
                out, self.seen = self.text[self.seen : m.end()], m.end()
                return out
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern!r} within {timeout} s; output so far:\n{self.text[-3000:]}"
                )
            self._read(0.1)

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            self._read(0.1)
        self.kill()
        raise AssertionError(f"the shell did not exit; output:\n{self.text[-3000:]}")

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def start_shell(model_dir: Path, *flags: str, sigint_ignored: bool = False) -> Terminal:
    env = {**os.environ, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    argv = [
        sys.executable,
        "-m",
        "final",
        "--shell",
        "--model",
        str(model_dir),
        "--num-pages",
        "4096",
        *flags,
    ]
    return Terminal(argv, env, sigint_ignored)


@pytest.fixture
def shell(default_model_dir):
    term = start_shell(default_model_dir)  # no sampling flags: the defaults must answer sensibly
    yield term
    term.kill()


PROMPT = r"(?m)^>[ \x08]*$"  # a fresh prompt: a line that is only ">" (the typed line is "> text")


def test_shell_session(shell):
    shell.expect(r"Chatting with SmolLM2-135M-Instruct", timeout=240)
    shell.expect(PROMPT)

    shell.send("What is the capital of France?\r")
    answer = shell.expect(PROMPT)
    assert "Paris" in answer

    shell.send("/help\r")
    out = shell.expect(PROMPT)
    assert "/reset" in out and "/set NAME VALUE" in out and "temperature" in out

    # Ctrl-C stops an answer being written, and the shell carries on.
    shell.send("Write a very long story about a cat who travels around the world.\r")
    # Wait for the answer's first words (a line right after the echoed question, starting with a
    # letter): Ctrl-C typed while the line editor still owns the terminal is a key, not a signal.
    shell.expect(r"travels around the world\.\n[A-Za-z]\S* \S+ \S+ ")
    shell.send("\x03")
    assert "[stopped]" in shell.expect(PROMPT, timeout=60)

    shell.send("/reset\r")
    assert "(new conversation)" in shell.expect(PROMPT)

    shell.send("/frobnicate\r")
    out = shell.expect(PROMPT)
    assert "unknown command /frobnicate" in out and "/exit" in out

    shell.send("What is the capital of France?\r")
    assert "Paris" in shell.expect(PROMPT)

    shell.send("/exit\r")
    assert shell.wait() == 0


def answer_to(question: str, out: str) -> str:
    """The answer in `out`: after the echoed question, up to the shell's "[cut at" note."""
    return out.rsplit(question + "\n", 1)[1].split("[cut at")[0]  # the last echo: prompt_toolkit may redraw


def test_shell_sampling_flags_and_set(default_model_dir):
    term = start_shell(default_model_dir, "--temperature", "0", "--top-k", "5", "--max-tokens", "6")
    try:
        term.expect(r"Chatting with SmolLM2-135M-Instruct", timeout=240)
        assert "max_tokens 6 (--max-tokens)" in term.expect(PROMPT)

        term.send("/set\r")
        out = term.expect(PROMPT)
        for line in ("temperature = 0.0  (--temperature)", "top_k = 5  (--top-k)", "max_tokens = 6  (--max-tokens)",
                     "top_p = 1.0  (built-in)"):  # fmt: skip
            assert line in out, out

        term.send("Write a long story about a cat.\r")
        out = term.expect(PROMPT)
        assert "[cut at 6 tokens" in out
        assert 1 <= len(answer_to("about a cat.", out).split()) <= 6

        term.send("/set max_tokens 2\r")
        assert "(max_tokens = 2)" in term.expect(PROMPT)
        term.send("Write a long story about a dog.\r")
        out = term.expect(PROMPT)
        assert "[cut at 2 tokens" in out
        assert 1 <= len(answer_to("about a dog.", out).split()) <= 2

        term.send("/set temperature -1\r")
        assert "temperature must be a finite number >= 0" in term.expect(PROMPT)
        term.send("/set\r")
        out = term.expect(PROMPT)
        assert "temperature = 0.0  (--temperature)" in out and "max_tokens = 2  (/set)" in out

        term.send("/exit\r")
        assert term.wait() == 0
    finally:
        term.kill()


def test_ctrl_c_stops_an_answer_even_when_the_shell_started_with_sigint_ignored(default_model_dir):
    # A POSIX shell starts `cmd &` of a non-interactive script with SIGINT ignored, and Python
    # then never raises KeyboardInterrupt: the shell must take Ctrl-C back for its terminal.
    term = start_shell(default_model_dir, sigint_ignored=True)
    try:
        term.expect(r"Chatting with SmolLM2-135M-Instruct", timeout=240)
        term.expect(PROMPT)
        term.send("Write a very long story about a dog who sails around the world.\r")
        term.expect(r"sails around the world\.\n[A-Za-z]\S* \S+ \S+ ")  # its first words
        term.send("\x03")
        assert "[stopped]" in term.expect(PROMPT, timeout=60)
        term.send("/exit\r")
        assert term.wait() == 0
    finally:
        term.kill()
