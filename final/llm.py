"""The offline API: batch generation from Python, with the engine in this process.

    from final import LLM, SamplingParams
    llm = LLM()                                   # the default model; LLM("Qwen/Qwen3-0.6B", attn="fi")
    llm = LLM("Qwen/Qwen3-8B", tp=2)              # sharded over 2 GPUs (ranks 1.. in processes of their own)
    outs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=32))
    outs = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                    SamplingParams(temperature=0, max_tokens=32))

`chat` wraps each conversation in the model's chat template, as the server's
/v1/chat/completions does; `generate` sends text as it is. Without `params`, both use the model's
generation_config.json where it sets a value (`generation_config="none"` ignores it), else
SamplingParams' own defaults (frontend/sampling_defaults.py).

`add_request` / `step` / `has_unfinished` drive the same engine one step at a time, for callers
that add requests while others run.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import Any

from tqdm import tqdm

from .core.config import EngineConfig
from .core.errors import UserError
from .core.model_config import ModelConfig
from .core.outputs import RequestOutput
from .core.sampling_params import SamplingParams
from .frontend.request_state import RequestState
from .frontend.sampling_defaults import resolve_sampling_defaults
from .frontend.tokenizer import Message, Tokenizer
from .runtime.build import build_engine

Prompt = str | Sequence[int]
Conversation = Sequence[Message]


class LLM:
    def __init__(
        self,
        model: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        generation_config: str = "auto",
        **engine_kwargs: Any,
    ):
        self.engine_config = EngineConfig.from_kwargs(
            model=model, device=device, dtype=dtype, **engine_kwargs
        )
        self.core = build_engine(self.engine_config)  # the config stays as given: see self.core.config
        self.tokenizer = Tokenizer(self.core.model_dir)
        self.sampling_defaults = resolve_sampling_defaults(self.core.model_dir, generation_config)
        self.requests: dict[int, RequestState] = {}
        self.next_rid = 0

    def close(self) -> None:
        """Stop the engine's other processes (the tensor-parallel ranks under tp > 1); dropping the
        LLM, or the interpreter's exit, does it too. `with LLM(...) as llm:` closes at the end."""
        self.core.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def config(self) -> ModelConfig:
        return self.core.model_config

    @property
    def device(self):
        return self.core.device

    @property
    def dtype(self):
        return self.core.dtype

    def get_default_sampling_params(self) -> SamplingParams:
        """What a call without `params` uses: the model's generation_config.json, else the built-in
        defaults (vLLM's method of the same name)."""
        return self.sampling_defaults.params()

    def add_request(self, prompt: Prompt, params: Any = None) -> int:
        """Queue a prompt (text, tokenized without a chat template, or token ids); return its id.
        `params` is a SamplingParams, or any object with the same attribute names. A UserError
        says why it cannot be served; nothing is queued then."""
        return self._queue(*self._prepare(prompt, params))

    def _prepare(self, prompt: Prompt, params: Any) -> tuple[list[int], SamplingParams]:
        """The prompt's ids and its params, checked as the engine will check them (queues nothing)."""
        sampling = self.get_default_sampling_params() if params is None else SamplingParams.coerce(params)
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt) if isinstance(prompt, Iterable) else []
            if not ids or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
                raise UserError(f"a prompt is a string or a non-empty list of token ids, got {prompt!r:.80}")
        self.core.check_request(ids, sampling)
        return ids, sampling

    def _queue(self, ids: list[int], sampling: SamplingParams) -> int:
        rid = self.next_rid
        self.next_rid += 1  # never reused, even when the engine refuses the request
        self.core.add_request(rid, ids, sampling)
        # The offline API hands out text only with a finished output: decode it once, at the end.
        self.requests[rid] = RequestState(rid, ids, sampling, self.tokenizer, text_at_end=True)
        return rid

    def _drop(self, rids: Sequence[int]) -> None:
        """Abort these requests in the engine and forget them (their pages go back to the pool)."""
        for rid in rids:
            if self.requests.pop(rid, None) is not None:
                self.core.abort(rid)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[tuple[int, RequestOutput]]:
        """Run one engine step; return the requests that finished in it."""
        finished = []
        for delta in self.core.step():
            state = self.requests.get(delta.rid)
            if state is None:  # dropped by a failed generate() while its last step was in flight
                continue
            state.apply(delta)
            if state.needs_abort:  # a stop string matched: the engine would go on otherwise
                self.core.abort(delta.rid)
            if state.finished:
                finished.append((delta.rid, state.output))
                del self.requests[delta.rid]
        return finished

    def generate(
        self, prompts: Sequence[Prompt], params: Any = None, progress: bool = True
    ) -> list[RequestOutput]:
        """Generate for every prompt, batched continuously; outputs in the prompts' order.
        `params` is one SamplingParams for all prompts, or a list with one per prompt."""
        if params is None or not isinstance(params, (list, tuple)):
            per_prompt = [params] * len(prompts)
        else:
            per_prompt = list(params)
        if len(per_prompt) != len(prompts):
            raise UserError(
                f"{len(per_prompt)} sampling params for {len(prompts)} prompts: give one, or one per prompt"
            )
        # Every prompt is checked before any is queued: a bad one fails the call and leaves nothing
        # behind to run silently in the next call.
        prepared = [self._prepare(p, sp) for p, sp in zip(prompts, per_prompt, strict=True)]
        order: dict[int, int] = {}
        results: list[RequestOutput | None] = [None] * len(prompts)
        remaining = len(prompts)  # counted, not searched for among the results at every step
        try:
            for i, (ids, sampling) in enumerate(prepared):
                order[self._queue(ids, sampling)] = i
            # disable=None: a bar on a terminal, nothing in logs and pipes.
            with tqdm(
                total=len(prompts), disable=None if progress else True, desc="generate", unit="req"
            ) as bar:
                while remaining:
                    for rid, out in self.step():
                        if rid in order:
                            results[order[rid]] = out
                            remaining -= 1
                            bar.update(1)
        except BaseException:  # an error, or Ctrl-C: this call's requests must not linger in the engine
            self._drop(list(order))
            raise
        return results  # type: ignore[return-value]

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        params: Any = None,
        progress: bool = True,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"} messages) or several (a list of
        such lists): each goes through the model's chat template, the server's own encode_chat,
        and the answer follows the assistant's turn. One output per conversation."""
        if not messages:
            raise UserError("chat() needs at least one message")
        one = isinstance(messages[0], dict)
        conversations: list[Conversation] = [messages] if one else list(messages)  # type: ignore[list-item]
        prompts = [self.tokenizer.encode_chat(list(c)) for c in conversations]
        return self.generate(prompts, params, progress)
