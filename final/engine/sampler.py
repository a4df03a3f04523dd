"""The sampler: from a batch of logits to a batch of next tokens, each row under its own params.

Order of operations (the same as vLLM and SGLang): apply the penalties (penalties.py), mask what
a request's grammar forbids (structured.py), divide by the temperature, keep the top-k
logits, keep the smallest set of tokens whose probability reaches top-p, drop tokens whose
probability is below min-p times the largest, then draw. Temperature 0 is greedy. An all-greedy
batch (the common serving case) is one argmax, with no sort and no softmax.

Every running request's parameters live in device tensors indexed by its page-table row, written
once when the request gets its row (`Sampler.write_rows`, from `bind`); a step gathers them by the
sampled rows. So a step builds no tensor from Python lists (which would wait for the GPU to catch
up), and the one device-to-host copy of a step is its sampled tokens. The sampler keeps that
per-row state itself: which request each row's parameters are for, and the private random stream
of each seeded request.

On a GPU a batch drawn with the temperature alone runs one Triton kernel (the Gumbel-max trick,
kernels/sampling.py), and one with top-k, top-p or min-p FlashInfer's sampling kernels, which
sort nothing; the torch code below is the reference, and what runs on the CPU and for requests
with their own seed. The logits arrive in the model's dtype: argmax and log_softmax read bf16 as
it is, and only the reference draw makes a float32 copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.errors import UserError
from ..core.sampling_params import INT32_MAX, SamplingParams
from ..kernels import sampling as sampling_kernels
from ..scheduler.request import Request
from .logprobs import TopLogprobs, logprobs_of
from .penalties import Penalties
from .sampling_reference import draw, min_p_mask, top_k_mask, top_p_mask
from .structured import Matcher, StructuredOutputs, apply_bitmask, grammar_bitmask

# A row's values: its top-k, then (temperature, top-p, min-p, greedy as 0 or 1).
RowValues = tuple[int, tuple[float, float, float, float]]

# Below this temperature a draw is an argmax in all but name, and dividing by it overflows the
# logits: such requests are sampled greedily.
MIN_TEMPERATURE = 1e-5


def is_greedy(params: SamplingParams) -> bool:
    return params.greedy or params.temperature < MIN_TEMPERATURE


def has_filter(params: SamplingParams) -> bool:
    """Whether a top-k, top-p or min-p filter applies: without one, a draw needs the temperature alone."""
    return params.top_k > 1 or params.top_p < 1 or params.min_p > 0


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A private random stream for a seeded request, so its output does not depend on what else
    is in the batch; unseeded requests share the global stream."""
    if params.seed is None or is_greedy(params):
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed)
    return gen


@dataclass
class SampleOutput:
    tokens: torch.Tensor  # [batch] int64, on the logits' device
    logprobs: TopLogprobs | None  # None when no request of the batch asked for logprobs


class Sampler:
    """Per-row sampling parameters on the device, and the batched draw."""

    def __init__(
        self,
        num_rows: int,
        device: torch.device,
        vocab_size: int,
        structured: StructuredOutputs | None = None,
    ):
        self.device, self.vocab_size = device, vocab_size
        self.penalties = Penalties(num_rows, vocab_size, device)
        self.structured = structured
        self.matchers: dict[int, Matcher] = {}  # constrained requests' grammars (structured.py)
        self.temperature = torch.ones(num_rows, device=device)
        # No top-k is stored as INT32_MAX: at or above the vocabulary, which keeps every token
        # in the reference and in FlashInfer's kernels alike.
        self.top_k = torch.full((num_rows,), INT32_MAX, dtype=torch.int32, device=device)
        self.top_p = torch.ones(num_rows, device=device)
        self.min_p = torch.zeros(num_rows, device=device)
        self.greedy = torch.zeros(num_rows, dtype=torch.bool, device=device)
        self.row_index = torch.arange(num_rows, device=device)  # int64: FlashInfer's output dtype
        self.row_owner: dict[int, Request] = {}  # row -> the request whose parameters it holds
        self.generators: dict[int, torch.Generator] = {}  # seeded requests' private random streams

    def add(self, rid: int, params: SamplingParams) -> None:
        """A request arrived: give it its private random stream if it is seeded, and its grammar's
        matcher if it has one (a UserError when that cannot be: nothing is kept then)."""
        if params.structured_outputs is not None:
            if self.structured is None:
                raise UserError("this engine has no structured outputs")
            self.matchers[rid] = self.structured.matcher(params.structured_outputs)
        generator = make_generator(params, self.device)
        if generator is not None:
            self.generators[rid] = generator

    def forget(self, rid: int) -> None:
        """A request left (finished, aborted, failed)."""
        self.generators.pop(rid, None)
        self.matchers.pop(rid, None)

    def accept(self, rid: int, tokens: list[int], reason: str | None) -> str | None:
        """Feed a constrained request's new tokens to its grammar: its finish reason becomes "stop"
        once the grammar is complete (or a token falls outside it, which the mask rules out but
        for the stop token of an `ignore_eos` request). Other requests keep `reason`."""
        matcher = self.matchers.get(rid)
        if matcher is not None:
            for token in tokens:
                if not matcher.accept(token) or matcher.terminated:
                    return "stop"
        return reason

    def bind(self, requests: Sequence[Request]) -> list[tuple[Request, Exception]]:
        """Write the parameters of the requests new to their row (admitted, or readmitted after a
        preemption) into the device tables; the requests whose parameters cannot be stored, and why."""
        failed: list[tuple[Request, Exception]] = []
        rows: list[int] = []
        values: list[RowValues] = []
        for req in requests:
            row = req.kv.row
            if self.row_owner.get(row) is req:
                continue
            try:
                row_values = self.row_values(req.params)
                self.penalties.admit(row, req.params, req.prompt_ids, req.output_ids)
            except Exception as err:
                failed.append((req, err))
                continue
            rows.append(row)
            values.append(row_values)
            self.row_owner[row] = req
        if rows:
            self.write_rows(rows, values)
        return failed

    def sample_requests(
        self, logits: torch.Tensor, rows: torch.Tensor, requests: list[Request]
    ) -> SampleOutput:
        """`sample` for these requests (request i sits in page-table row rows[i])."""
        generators, matchers = self.generators, self.matchers
        streams = [generators.get(r.rid) for r in requests] if generators else [None] * len(requests)
        bitmask = None
        if matchers and any(r.rid in matchers for r in requests):
            host = grammar_bitmask([matchers.get(r.rid) for r in requests], self.vocab_size)
            bitmask = (
                host.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else host
            )
        return self.sample(logits, rows, [r.params for r in requests], streams, bitmask)

    @staticmethod
    def check(params: SamplingParams) -> None:
        """Raise UserError unless `admit` can store these values (called when the request arrives,
        so a value the device tensors cannot hold fails that request alone, never a step)."""
        try:
            torch.tensor(
                [params.temperature, params.top_p, params.min_p, params.presence_penalty,
                 params.frequency_penalty, params.repetition_penalty],
                dtype=torch.float32,
            )  # fmt: skip
            torch.tensor([params.top_k], dtype=torch.int32)
        except (OverflowError, RuntimeError, TypeError, ValueError) as err:
            raise UserError(f"a sampling parameter is out of range: {err}") from None

    def admit(self, row: int, params: SamplingParams) -> None:
        """One request's parameters into its row."""
        self.write_rows([row], [self.row_values(params)])

    @staticmethod
    def row_values(params: SamplingParams) -> RowValues:
        """What a request's row holds: its top-k (INT32_MAX for none), then its temperature (1 when
        greedy), top-p, min-p and whether it is greedy, as floats."""
        greedy = is_greedy(params)
        top_k = int(params.top_k) if params.top_k > 0 else INT32_MAX
        floats = (1.0 if greedy else float(params.temperature), float(params.top_p), float(params.min_p))
        return top_k, (*floats, float(greedy))

    def write_rows(self, rows: Sequence[int], values: Sequence[RowValues]) -> None:
        """Write rows' values into the tables: one pinned copy and one `index_copy_` per table,
        however many requests a step admits. Never `table[row] = value`: PyTorch writes a Python
        number into one element of a GPU tensor by a copy from pageable memory, which waits for
        everything queued on the stream, under overlap the step in flight (an H100 profile of a
        32-request prefill step showed 160 such copies, five per request; pytorch/pytorch#188267)."""
        n = len(rows)
        # One int32 transfer: the rows, the top-k values, then the float columns' bits.
        bits = torch.tensor([v[1] for v in values], dtype=torch.float32).view(torch.int32).flatten()
        host = torch.cat([torch.tensor([*rows, *(v[0] for v in values)], dtype=torch.int32), bits])
        on_gpu = self.device.type == "cuda"
        packed = host.pin_memory().to(self.device, non_blocking=True) if on_gpu else host
        index = packed[:n].long()
        columns = packed[2 * n :].view(torch.float32).view(n, 4)
        self.top_k.index_copy_(0, index, packed[n : 2 * n])
        self.temperature.index_copy_(0, index, columns[:, 0])
        self.top_p.index_copy_(0, index, columns[:, 1])
        self.min_p.index_copy_(0, index, columns[:, 2])
        self.greedy.index_copy_(0, index, columns[:, 3] != 0)

    def sample(
        self,
        logits: torch.Tensor,
        rows: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        bitmask: torch.Tensor | None = None,
    ) -> SampleOutput:
        """The next token of every row of `logits` [S, vocab]; request i sits in page-table row
        rows[i] and has `params[i]` (read on the host only to choose which filters run); `bitmask`
        [S, words] on the device: the tokens each row's grammar allows (structured.py)."""
        penalized = self.penalties.needed(params)  # False: not one kernel more than without them
        scores = self.penalties.apply(logits, rows, params) if penalized else logits
        if bitmask is not None:
            scores = apply_bitmask(scores, bitmask)
        greedy = [is_greedy(p) for p in params]
        kernels = sampling_kernels.gumbel_available(scores)
        unseeded = all(g is None for g in generators)
        if all(greedy):
            tokens = sampling_kernels.triton_argmax(scores) if kernels else scores.argmax(dim=-1)
        elif unseeded and kernels and not any(has_filter(p) for p in params):
            # The Gumbel-max kernel reads each row's temperature and greedy flag from the tables
            # itself: a greedy row is its argmax there, with no gather and no second argmax here.
            seed = sampling_kernels.draw_seed(scores.device)
            tokens = sampling_kernels.triton_sample(scores, rows, self.temperature, self.greedy, seed)
        else:
            if unseeded and sampling_kernels.available(scores):
                drawn = self._flashinfer_draw(scores, rows, params)
            else:
                drawn = self._reference_draw(scores.float(), rows, params, generators)
            # argmax only when some row is greedy: a batch of sampled rows skips it
            if any(greedy):
                drawn = torch.where(torch.index_select(self.greedy, 0, rows), scores.argmax(dim=-1), drawn)
            tokens = drawn
        if penalized:
            self.penalties.record(rows, tokens)
        return SampleOutput(tokens=tokens, logprobs=logprobs_of(logits, tokens, params))

    def _reference_draw(
        self,
        logits: torch.Tensor,
        rows: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> torch.Tensor:
        scaled = logits / self.temperature[rows].unsqueeze(-1)
        ks = [p.top_k for p in params]
        if any(k > 1 for k in ks):
            max_k = None if any(k <= 0 for k in ks) else max(ks)  # a row without top-k needs all
            scaled = top_k_mask(scaled, self.top_k[rows], max_k)
        if any(p.top_p < 1 for p in params):
            scaled = top_p_mask(scaled, self.top_p[rows])
        if any(p.min_p > 0 for p in params):
            scaled = min_p_mask(scaled, self.min_p[rows])
        return draw(scaled.softmax(dim=-1), generators)

    def _flashinfer_draw(
        self, logits: torch.Tensor, rows: torch.Tensor, params: list[SamplingParams]
    ) -> torch.Tensor:
        def gather(table: torch.Tensor, wanted: bool) -> torch.Tensor | None:
            return torch.index_select(table, 0, rows) if wanted else None  # int32 rows, no cast

        return sampling_kernels.flashinfer_sample(
            logits,
            torch.index_select(self.temperature, 0, rows),
            top_k=gather(self.top_k, any(p.top_k > 1 for p in params)),
            top_p=gather(self.top_p, any(p.top_p < 1 for p in params)),
            min_p=gather(self.min_p, any(p.min_p > 0 for p in params)),
            row_index=self.row_index[: logits.shape[0]],
        )


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None] | None = None
) -> SampleOutput:
    """The sampler without a device table: rows 0..S-1 of a throwaway one (tests, one-off use)."""
    sampler = Sampler(len(params), logits.device, logits.shape[-1])
    sampler.write_rows(range(len(params)), [sampler.row_values(p) for p in params])
    rows = torch.arange(len(params), device=logits.device)
    return sampler.sample(logits, rows, params, generators or [None] * len(params))
