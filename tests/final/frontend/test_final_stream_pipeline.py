"""The server's token path piece by piece (issue 27): a step's outputs as arrays on the wire, a whole
step detokenized at once, and a request's mailbox that wakes it once per step."""

from __future__ import annotations

import asyncio
import random

import pytest

from final.engine.messages import EngineStats, RequestDelta
from final.engine.wire import FINISH_CODE, Extra, StepColumns, columns_of, decode, encode, encode_object
from final.frontend.detokenizer import TextStream
from final.frontend.mailbox import Mailbox, TokenUpdate
from final.frontend.step_text import StepDetokenizer
from final.frontend.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    return Tokenizer(tiny_tokenizer_dir)


# ---------------------------------------------------------------------------------------------
# The wire


def test_a_step_survives_the_wire():
    deltas = [
        RequestDelta(rid=7, token_ids=[11], cached_tokens=3),
        RequestDelta(rid=2**40, token_ids=[5, 6, 7], finish_reason="length"),
        RequestDelta(
            rid=9, token_ids=[1], logprobs=[{"token_logprob": -0.5, "top_ids": [1], "top_logprobs": [-0.5]}]
        ),
        RequestDelta(rid=3, token_ids=[], finish_reason="error", error="no", error_code="invalid_request"),
    ]
    step = decode([bytes(memoryview(f)) for f in encode(columns_of(deltas, tokens_at=12.5))])
    assert isinstance(step, StepColumns) and step.tokens_at == 12.5 and step.texts is None
    assert step.deltas() == deltas
    text = StepColumns([1, 2], [1, 1], [4, 5], [0, FINISH_CODE["stop"]], [0, 0], 1.0, 2.0, {}, ["é🙂", ""])
    back = decode([bytes(memoryview(f)) for f in encode(text)])
    assert back == text
    for kind in (True, False):  # whether the step computed prompt tokens, for the burst metrics
        assert decode(encode(columns_of(deltas, 1.0, decode_only=kind))).decode_only is kind


def test_other_messages_are_objects():
    stats = EngineStats(query_id=4, num_running=2)
    assert decode(encode_object(stats)) == stats


# ---------------------------------------------------------------------------------------------
# A whole step at once


def sequential(
    tok: Tokenizer, prompt: list[int], steps: list[list[int]], stop: list[str]
) -> list[tuple[str, bool]]:
    """What TextStream gives one token at a time: the reference for a batch's rows."""
    stream = TextStream(tok, prompt, stop)
    return [stream.push(tokens) for tokens in steps]


def test_a_batch_gives_each_request_what_it_would_get_alone(tok):
    """Eight requests of different texts (multi-byte characters, stop strings among them),
    detokenized one step at a time together, equal each request's own TextStream."""
    texts = ["café 🙂 日本 and more", "numbers 1234 and 12345 more", "plain words here", "ünïcödé ✓ done"]
    rng = random.Random(0)
    requests = {}
    for rid in range(8):
        ids = tok.encode(texts[rid % len(texts)])
        stop = ["12345"] if rid % 4 == 1 else ["zzz", "ü"] if rid % 4 == 3 else []  # hits in 1, 3 and 5, 7
        requests[rid] = (tok.encode("prompt")[-4:], ids, stop)
    detok = StepDetokenizer(tok)
    for rid, (prompt, _, stop) in requests.items():
        detok.add(rid, prompt, stop)
    got: dict[int, list[str]] = {rid: [] for rid in requests}
    stopped: dict[int, bool] = {}
    for step_no in range(max(len(ids) for _, ids, _ in requests.values())):
        live = [rid for rid, (_, ids, _) in requests.items() if step_no < len(ids) and rid not in stopped]
        rng.shuffle(live)  # rows in any order
        deltas = [RequestDelta(rid=rid, token_ids=[requests[rid][1][step_no]]) for rid in live]
        out, aborts = detok.step(columns_of(deltas))
        assert out.rids == live and out.counts == [1] * len(live)
        for rid, text, finish in zip(out.rids, out.texts or [], out.finish, strict=True):
            got[rid].append(text)
            if finish == FINISH_CODE["stop"]:
                stopped[rid] = True
        assert sorted(aborts) == sorted(r for r in live if stopped.get(r))  # ended here, not there
    for rid, (prompt, ids, stop) in requests.items():
        alone = sequential(tok, prompt, [[i] for i in ids], stop)
        if rid in stopped:
            alone = alone[: next(n for n, (_, hit) in enumerate(alone) if hit) + 1]
        assert got[rid] == [text for text, _ in alone], rid
    assert not detok.streams or set(detok.streams) == {r for r in requests if r not in stopped}


def test_last_step_releases_what_was_held_back_and_forgets_the_request(tok):
    emoji = tok.encode("🙂")
    detok = StepDetokenizer(tok)
    detok.add(1, [], [])
    first, _ = detok.step(columns_of([RequestDelta(rid=1, token_ids=emoji[:-1])]))
    assert first.texts == [""]  # half a character: held back
    last, aborts = detok.step(columns_of([RequestDelta(rid=1, token_ids=emoji[-1:], finish_reason="length")]))
    assert last.texts == ["🙂"] and last.finish == [FINISH_CODE["length"]] and aborts == []
    assert 1 not in detok.streams
    # A row of a request no longer followed (aborted by its client) is left out.
    gone, _ = detok.step(columns_of([RequestDelta(rid=1, token_ids=[5])]))
    assert len(gone) == 0


def test_errors_pass_through_and_logprobs_are_cut_with_their_tokens(tok):
    detok = StepDetokenizer(tok)
    detok.add(1, [], ["b"])
    detok.add(2, [], [])
    ids = tok.encode("a b c")
    entries = [{"token_logprob": -float(i), "top_ids": [], "top_logprobs": []} for i in range(len(ids))]
    deltas = [
        RequestDelta(rid=1, token_ids=ids, logprobs=entries),
        RequestDelta(rid=2, token_ids=[], finish_reason="error", error="boom"),
    ]
    out, aborts = detok.step(columns_of(deltas))
    cut = out.counts[0]
    assert out.finish == [FINISH_CODE["stop"], FINISH_CODE["error"]] and aborts == [1]
    assert out.tokens[:cut] == ids[:cut] and cut < len(ids)
    assert out.extras[0] == Extra(logprobs=entries[:cut]) and out.extras[1].error == "boom"
    assert not detok.streams


def test_one_step_decodes_requests_that_keep_their_special_tokens_apart(tok):
    """The step's batch decode groups its rows by what they do with special tokens: a request with
    skip_special_tokens=False gets them in its text, the others beside it in the same step do not."""
    special = tok.hf.all_special_ids[0]
    detok = StepDetokenizer(tok)
    detok.add(1, [5, 6], [])
    detok.add(2, [5, 6], [], skip_special_tokens=False)
    texts: dict[int, str] = {1: "", 2: ""}
    for token in tok.encode("hi", add_special_tokens=False) + [
        special,
        *tok.encode(" there", add_special_tokens=False),
    ]:
        out, _ = detok.step(StepColumns([1, 2], [1, 1], [token, token], [0, 0], [0, 0]))
        for rid, text in zip(out.rids, out.texts or [], strict=True):
            texts[rid] += text
    name = tok.hf.convert_ids_to_tokens(special)
    assert name not in texts[1] and name in texts[2]
    assert texts[2].replace(name, "") == texts[1]


# ---------------------------------------------------------------------------------------------
# One wake-up per step


def test_mailbox_hands_over_every_step_apart_and_wakes_once():
    async def scenario() -> tuple[list[list[str]], int]:
        box = Mailbox()
        got: list[list[str]] = []
        wakes = 0

        async def reader() -> None:
            nonlocal wakes
            while len(got) < 2:
                updates = await box.get()
                wakes += 1
                got.append([u.text for u in updates])

        task = asyncio.create_task(reader())
        await asyncio.sleep(0)  # the reader waits
        box.put(TokenUpdate([1], "a"))
        box.put(TokenUpdate([2], "b"))  # a second step before the reader ran: kept apart
        await asyncio.sleep(0)
        box.nudge()  # nothing new: an empty wake-up (the client's disconnect check)
        await asyncio.sleep(0)
        box.put(TokenUpdate([3], "c"))
        await task
        return got, wakes

    got, wakes = asyncio.run(scenario())
    assert got == [["a", "b"], []]
    assert wakes == 2


# ---------------------------------------------------------------------------------------------
# A chunk serialized once


@pytest.mark.parametrize(
    "text", ["", " hello", 'quote " and \\ slash', "line\nbreak\t", "é🙂日本", "\u2028\x00\x7f"]
)
def test_a_text_frame_is_json_dumps_of_its_chunk(text):
    import json

    from final.server.formatting import TextFrame, with_field

    def chunk(t: str) -> dict:
        return {
            "id": "x",
            "usage": None,
            "choices": [{"index": 2, "delta": {"content": t}, "finish_reason": None}],
        }

    frame = TextFrame(chunk)
    assert frame.json(text) == json.dumps(chunk(text), ensure_ascii=False)
    stamps = {"engine": 1.5, "sent": 2.25}
    assert with_field(frame.json(text), "timing", stamps) == json.dumps(
        {**chunk(text), "timing": stamps}, ensure_ascii=False
    )
