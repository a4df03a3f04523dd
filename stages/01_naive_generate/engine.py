"""The generate loop: one request at a time, prefill once, then decode token by token."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from stages.common.devices import pick_device, pick_dtype
from stages.common.limits import finish_reason, max_new_tokens
from stages.common.model_config import load_model_config
from stages.common.model_source import resolve_model
from stages.common.outputs import RequestOutput
from stages.common.sampling import SamplingParams, sample
from stages.common.tokenizer import TextStream, Tokenizer

from .kv_cache import ContiguousKVCache
from .model import load_model

Prompt = str | Sequence[int]


class LLM:
    """Offline API: `LLM(model).generate(prompts, SamplingParams(...))`."""

    def __init__(self, model: str | None = None, device: str = "auto", dtype: str = "auto", max_context=None):
        folder = resolve_model(model)
        self.config = load_model_config(folder, max_context)
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.config.dtype, self.device)
        self.tokenizer = Tokenizer(folder)
        self.model = load_model(folder, self.config, self.device, self.dtype)
        self.eos_ids = set(self.config.eos_token_ids)

    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        params = params or SamplingParams()
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        return [self.generate_one(self._ids(p), sp) for p, sp in zip(prompts, per_prompt, strict=True)]

    def _ids(self, prompt: Prompt) -> list[int]:
        return self.tokenizer.encode_prompt(prompt, chat=False) if isinstance(prompt, str) else list(prompt)

    # --8<-- [start:generate]
    def generate_one(
        self, prompt_ids: list[int], params: SamplingParams, on_text: Callable[[str], None] | None = None
    ) -> RequestOutput:
        params.validate()
        max_new = max_new_tokens(prompt_ids, params, self.config.max_context, self.config.vocab_size)
        cache = ContiguousKVCache(self.config, len(prompt_ids) + max_new, self.device, self.dtype)
        stream = TextStream(self.tokenizer, prompt_ids, params.stop)
        generator = params.make_generator(self.device)
        out = RequestOutput(prompt_ids=list(prompt_ids))
        start = time.perf_counter()
        # Prefill: the whole prompt in one forward pass; then decode: one token per pass.
        input_ids = torch.tensor(prompt_ids, device=self.device)
        positions = torch.arange(len(prompt_ids), device=self.device)
        while True:
            logits = self.model(input_ids, positions, cache)
            sampled = sample(logits, [params], [generator])
            token = int(sampled.tokens[0])  # waits for the GPU: this token decides the next step
            out.token_ids.append(token)
            if sampled.logprobs[0] is not None:
                out.logprobs.append(sampled.logprobs[0])
            out.token_times.append(time.perf_counter() - start)
            if len(out.token_ids) == 1:
                out.ttft_s = out.token_times[0]
            text, hit_stop = stream.push([token])
            out.finish_reason = finish_reason(
                token, params, self.eos_ids, len(out.token_ids), max_new, hit_stop
            )
            if out.finish_reason and not hit_stop:
                text += stream.finish()  # release text held back in case it began a stop string
            if on_text and text:
                on_text(text)
            if out.finish_reason:
                break
            input_ids = torch.tensor([token], device=self.device)
            positions = torch.tensor([cache.length], device=self.device)
        out.latency_s = time.perf_counter() - start
        out.text = stream.text
        return out

    # --8<-- [end:generate]
