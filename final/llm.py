"""The offline API: batch generation from Python, with the engine in this process. It takes what
vLLM's `LLM` takes, so a vLLM script runs here with its import changed:

    from final import LLM, SamplingParams
    llm = LLM()                                   # the default model; LLM("Qwen/Qwen3-0.6B", attn="fi")
    llm = LLM("Qwen/Qwen3-8B", tensor_parallel_size=2)  # or tp=2: ranks 1.. in processes of their own
    outs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)                # vLLM's shape; outs[0].text is the same answer
    outs = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                    SamplingParams(temperature=0, max_tokens=32))

A prompt is a string, a list of token ids, or a dict ({"prompt": text} or {"prompt_token_ids":
ids}); `generate` takes one prompt or a list of them (frontend/prompts.py). `chat` wraps each
conversation in the model's chat template (or `chat_template=`), as the server's
/v1/chat/completions does; `generate` sends text as it is. Without sampling parameters, both use
the model's generation_config.json where it sets a value (`generation_config="none"` ignores it),
else SamplingParams' own defaults (frontend/sampling_defaults.py). `SamplingParams(n=4)` gives
each prompt four answers (`out.outputs`), each its own request in the engine.

`add_request` / `step` / `has_unfinished` drive the same engine one step at a time, for callers
that add requests while others run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from .core.config import EngineConfig
from .core.errors import UserError
from .core.heap import heap_frozen
from .core.model_config import ModelConfig
from .core.outputs import RequestOutput
from .core.sampling_params import SamplingParams
from .frontend.prompts import PromptInput, as_prompt_list, read_prompt
from .frontend.request_state import RequestState
from .frontend.sampling_defaults import resolve_sampling_defaults
from .frontend.tokenizer import Message, Tokenizer
from .runtime.build import build_engine

Conversation = Sequence[Message]


@dataclass
class _Prepared:
    """A prompt read and checked, not yet queued: its text (None for token ids), ids, parameters,
    and those of each of its n answers."""

    text: str | None
    ids: list[int]
    sampling: SamplingParams
    choices: list[SamplingParams]


@dataclass
class _Group:
    """The n engine requests of one prompt (SamplingParams.n), and their outputs as they finish."""

    prompt: str | None
    params: SamplingParams
    rids: list[int]
    done: dict[int, RequestOutput] = field(default_factory=dict)


class LLM:
    def __init__(
        self,
        model: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        generation_config: str = "auto",
        **engine_kwargs: Any,
    ):
        """`engine_kwargs` are the engine's flags with underscores (`attn`, `tp`, ...), under the
        project's names or vLLM's and SGLang's (`tensor_parallel_size`, `max_model_len`,
        `gpu_memory_utilization`, `enforce_eager`, ...: core/config.py)."""
        self.engine_config = EngineConfig.from_kwargs(
            model=model, device=device, dtype=dtype, **engine_kwargs
        )
        self.core = build_engine(self.engine_config)  # the config stays as given: see self.core.config
        self.tokenizer = Tokenizer(self.core.model_dir)
        self.sampling_defaults = resolve_sampling_defaults(self.core.model_dir, generation_config)
        self.requests: dict[int, RequestState] = {}  # engine request id -> its state
        self.groups: dict[int, _Group] = {}  # request id (its first engine request's) -> its group
        self.group_of: dict[int, int] = {}  # engine request id -> request id
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

    def get_tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (vLLM's method of the same name)."""
        return self.tokenizer.hf

    def get_default_sampling_params(self) -> SamplingParams:
        """What a call without sampling parameters uses: the model's generation_config.json, else
        the built-in defaults (vLLM's method of the same name)."""
        return self.sampling_defaults.params()

    def add_request(self, prompt: PromptInput, params: Any = None) -> int:
        """Queue one prompt (text, tokenized without a chat template; token ids; or a dict, as
        `generate` takes); return its request id. `params` is a SamplingParams, or any object with
        the same attribute names. A UserError says why it cannot be served: nothing is queued then."""
        return self._queue(self._prepare(prompt, params))

    def _prepare(self, prompt: PromptInput, params: Any) -> _Prepared:
        """The prompt read and every answer's parameters checked as the engine will check them;
        nothing queued (generate checks all its prompts before it queues any)."""
        sampling = self.get_default_sampling_params() if params is None else SamplingParams.coerce(params)
        text, ids = read_prompt(prompt, self.tokenizer)
        choices = [sampling.for_choice(i) for i in range(sampling.n)]
        for choice in choices:  # seed + i may leave the seed's range
            self.core.check_request(ids, choice)
        return _Prepared(text, ids, sampling, choices)

    def _queue(self, prepared: _Prepared) -> int:
        request_id = self.next_rid
        added: list[int] = []
        try:
            for choice in prepared.choices:
                rid = self.next_rid
                self.next_rid += 1  # never reused, even when the engine refuses the request
                self.core.add_request(rid, prepared.ids, choice)
                added.append(rid)
                # The offline API hands out text only with a finished output: decode it once, at the end.
                self.requests[rid] = RequestState(rid, prepared.ids, choice, self.tokenizer, text_at_end=True)
                self.group_of[rid] = request_id
        except BaseException:
            for rid in added:
                self.abort(rid)
            raise
        self.groups[request_id] = _Group(prepared.text, prepared.sampling, added)
        return request_id

    def abort(self, request_id: int) -> None:
        """Drop a request (all n of its answers) wherever it is."""
        group = self.groups.pop(request_id, None)
        for rid in group.rids if group else [request_id]:
            self.core.abort(rid)
            self.requests.pop(rid, None)
            self.group_of.pop(rid, None)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[tuple[int, RequestOutput]]:
        """Run one engine step; return the requests whose every answer finished in it or before."""
        finished = []
        for delta in self.core.step():
            state = self.requests.get(delta.rid)
            if state is None:
                continue  # dropped by the caller while a step held it
            state.apply(delta)
            if state.needs_abort:  # a stop string matched: the engine would go on otherwise
                self.core.abort(delta.rid)
            if state.finished:
                del self.requests[delta.rid]
                request_id = self.group_of.pop(delta.rid, delta.rid)
                done = self._answer_finished(request_id, delta.rid, state.output)
                if done is not None:
                    finished.append((request_id, done))
        return finished

    def _answer_finished(self, request_id: int, rid: int, output: RequestOutput) -> RequestOutput | None:
        """Record one answer; the request's output once all n are in (answer 0 carries the fields
        of the stages' RequestOutput, every answer is in `outputs`)."""
        group = self.groups.get(request_id)
        if group is None:  # queued by hand through self.core
            return output
        group.done[rid] = output
        if len(group.done) < len(group.rids):
            return None
        del self.groups[request_id]
        stops = list(group.params.stop_token_ids)
        first = group.done[group.rids[0]]
        first.prompt, first.request_id = group.prompt, str(request_id)
        first.outputs = [
            group.done[rid].completion(i, stops, self.tokenizer.token_text)
            for i, rid in enumerate(group.rids)
        ]
        return first

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: Any = None,
        use_tqdm: bool | Callable[..., Any] = True,
        *,
        params: Any = None,
        progress: bool | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt, batched continuously; one output per prompt, in order.
        `sampling_params` (or `params`) is one SamplingParams for all prompts, or a list with one
        per prompt; `use_tqdm` (or `progress`) shows a progress bar on a terminal."""
        sampling_params = _one_of("sampling_params", sampling_params, "params", params)
        use_tqdm = _one_of("use_tqdm", use_tqdm, "progress", progress, default=True)
        batch = as_prompt_list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(batch):
                raise UserError(f"{len(batch)} prompts but {len(sampling_params)} sampling parameters")
            per_prompt = list(sampling_params)
        else:
            per_prompt = [sampling_params] * len(batch)
        # Every prompt is checked before any is queued: a bad one fails the call and leaves nothing
        # behind to run silently in the next call.
        prepared = [self._prepare(prompt, sp) for prompt, sp in zip(batch, per_prompt, strict=True)]
        order: dict[int, int] = {}
        results: list[RequestOutput | None] = [None] * len(batch)
        remaining = len(batch)  # counted, not searched for among the results at every step
        bar_class = use_tqdm if callable(use_tqdm) else tqdm
        # What exists when the run starts (the model, its graphs, the caller's objects) is left out
        # of full garbage collections until it ends: such a collection walks every object alive and
        # stops the step loop while it does (core/heap.py).
        with heap_frozen():
            try:
                for i, one in enumerate(prepared):
                    order[self._queue(one)] = i
                # disable=None: a bar on a terminal, nothing in logs and pipes.
                with bar_class(
                    total=len(batch), disable=None if use_tqdm else True, desc="generate", unit="req"
                ) as bar:
                    while remaining:
                        for request_id, out in self.step():
                            if request_id in order:
                                results[order[request_id]] = out
                                remaining -= 1
                                bar.update(1)
            except BaseException:  # an error, or Ctrl-C: this call's requests must not linger in the engine
                for request_id in order:
                    self.abort(request_id)
                raise
        return results  # type: ignore[return-value]

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: Any = None,
        use_tqdm: bool | Callable[..., Any] = True,
        *,
        chat_template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        params: Any = None,
        progress: bool | None = None,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"} messages) or several (a list of
        such lists): each goes through the model's chat template, or `chat_template` (a Jinja
        template), as the server's encode_chat does, and the answer follows the assistant's turn.
        `tools` (OpenAI's function definitions) are shown to the model by the template, as vLLM's
        `chat(tools=...)` does; the answer is the model's text (the server reads calls out of it:
        final/server/tools.py); `chat_template_kwargs` more variables for the template (vLLM's:
        Qwen3's `enable_thinking`). One output per conversation; its `prompt` is the templated text."""
        if not messages:
            raise UserError("chat() needs at least one message")
        one = isinstance(messages[0], dict)
        conversations: list[Conversation] = [messages] if one else list(messages)  # type: ignore[list-item]
        prompts = []
        for conversation in conversations:
            text = self.tokenizer.render_chat(list(conversation), chat_template, tools, chat_template_kwargs)
            # The template wrote any BOS token itself: encoding must not add another.
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm, params=params, progress=progress)


def _one_of(name: str, value: Any, alias: str, alias_value: Any, default: Any = None) -> Any:
    """A parameter given under its vLLM name or the project's older one (not both)."""
    if alias_value is None:
        return value
    if value is not None and value != default:
        raise UserError(f"give {name} or {alias}, not both")
    return alias_value
