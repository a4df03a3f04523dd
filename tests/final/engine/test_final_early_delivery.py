"""Early delivery (final/engine/delivery.py), on the CPU: with a `publish` sink, the step in flight
is collected and published between the layers of an eager launch, not after it.

- the tokens are the same as plain overlap's, token for token (greedy and seeded, EOS mid-batch,
  prompts arriving while others decode), and the pool is whole after every step;
- a step in flight goes out before the eager step being launched has queued its last layer;
- a request that finishes at the published step keeps its pages until the next collect (the step
  being launched may hold it): core.py's invariant 3.

On the CPU a step is done when its launch returns, so the first layer's callback finds it ready;
on a GPU the callback asks the step's event, never waits (delivery.py).
"""

from __future__ import annotations

import random

import final
from final.core.sampling_params import SamplingParams
from tests.fixtures.tiny_models import sample_prompts


def workload(model_dir, seed: int):
    rng = random.Random(seed)
    prompts = sample_prompts(model_dir, n=12, seed=seed)
    params = []
    for i in range(len(prompts)):
        if i % 3 == 0:
            params.append(SamplingParams(temperature=0, max_tokens=rng.randint(4, 16), ignore_eos=True))
        elif i % 3 == 1:
            params.append(
                SamplingParams(temperature=0.9, seed=seed * 100 + i, max_tokens=12, ignore_eos=True)
            )
        else:  # finishes on a token the model emits now and then: mid-batch, the next step holding it
            params.append(SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[5, 9, 11, 14]))
    arrivals = [0, 0, 0] + [rng.randint(1, 25) for _ in prompts[3:]]  # prefills while others decode
    return prompts, params, arrivals


def run(model_dir, seed: int, publish: bool, events: list | None = None):
    """Drive the engine core by hand; every request's tokens and finish reason, and how many deltas
    went out early."""
    llm = final.LLM(str(model_dir), device="cpu", dtype="float32", overlap="on")
    core = llm.core
    prompts, params, arrivals = workload(model_dir, seed)
    tokens: dict[int, list[int]] = {}
    reasons: dict[int, str | None] = {}
    early = []

    def take(deltas, out):
        for d in deltas:
            tokens.setdefault(d.rid, []).extend(d.token_ids)
            reasons[d.rid] = d.finish_reason
            out.append(d)

    if publish:

        def sink(deltas):
            for d in deltas:
                if d.finish_reason:  # its pages wait for the step being launched (invariant 3)
                    assert any(r.rid == d.rid for r in core.scheduler.retiring), "pages released mid-launch"
            if events is not None:
                events.append(("published",))
            take(deltas, early)

        core.publish = sink
    if events is not None:
        for index, layer in enumerate(core.executor.runner.model.model.layers):
            layer.register_forward_hook(lambda *_, index=index: events.append(("layer", index)))
    step = 0
    while len(reasons) < len(prompts) or core.has_work():
        for i, at in enumerate(arrivals):
            if at == step:
                core.add_request(i, prompts[i], params[i])
        take(core.step(), [])
        core.check_integrity()
        step += 1
        assert step < 500, "no progress"
    llm.close()
    return tokens, reasons, len(early)


def test_early_delivery_gives_the_same_tokens_as_plain_overlap(tiny_qwen3_dir):
    for seed in (0, 1):
        plain_tokens, plain_reasons, none_early = run(tiny_qwen3_dir, seed, publish=False)
        tokens, reasons, early = run(tiny_qwen3_dir, seed, publish=True)
        assert none_early == 0
        assert early > 0, "no step was delivered during an eager launch"
        assert tokens == plain_tokens
        assert reasons == plain_reasons


def test_the_step_in_flight_goes_out_between_the_layers_of_an_eager_launch(tiny_qwen3_dir):
    events: list[tuple] = []
    _, _, early = run(tiny_qwen3_dir, 0, publish=True, events=events)
    assert early > 0
    published = [i for i, e in enumerate(events) if e == ("published",)]
    assert published
    # On the CPU the step in flight is done once its launch returned, so the first callback (after
    # the eager step's first layer is queued) finds it ready: out before the second layer.
    for i in published:
        assert events[i - 1] == ("layer", 0) and events[i + 1] == ("layer", 1), events[i - 2 : i + 3]
