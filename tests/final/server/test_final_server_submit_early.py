"""A streamed request reaches the engine before its response starts (issue 27: the way in).

Sending the headers and starting the response's task took the API process a millisecond or more
on a loaded event loop; the engine can prefill meanwhile. So the handler submits the jobs, then
returns the stream; a response that never starts (the client left before its first byte) aborts
them in the engine, which the frames' generator, never started, cannot do."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from starlette.requests import ClientDisconnect

from final.core.sampling_params import SamplingParams
from final.frontend.mailbox import Mailbox
from final.server.admission import Admission
from final.server.generation import Job
from final.server.metrics import Metrics
from final.server.openai_api import _event_stream


class RecordingClient:
    """The engine client's two calls a stream makes, recorded in order."""

    def __init__(self):
        self.events: list[tuple] = []
        self.next_rid = 0

    def submit(self, prompt_ids, params):
        self.next_rid += 1
        self.events.append(("submit", self.next_rid))
        return self.next_rid, Mailbox()

    def release(self, rid, abort):
        self.events.append(("release", rid, abort))


def make(n_jobs: int):
    client = RecordingClient()
    state = SimpleNamespace(client=client, metrics=Metrics())
    admission = Admission(8)
    ticket = admission.reserve(n_jobs)
    jobs = [Job(i, [1, 2, 3], SamplingParams(max_tokens=4)) for i in range(n_jobs)]
    http = SimpleNamespace(is_disconnected=lambda: asyncio.sleep(0, result=False))
    response = _event_stream(state, jobs, http, ticket, lambda i, out: [], [], None, False)
    return client, admission, response


def test_the_jobs_are_submitted_before_the_response_runs():
    client, _, _ = make(2)
    assert client.events == [("submit", 1), ("submit", 2)]


def test_a_response_that_never_starts_aborts_its_jobs_and_frees_its_places():
    client, admission, response = make(2)

    async def client_gone(message):
        raise OSError("the client closed the connection")

    async def receive():
        await asyncio.sleep(3600)  # no disconnect message: the send fails first

    async def serve():
        try:
            await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, client_gone)
        except ClientDisconnect:  # Starlette's word for the failed send
            pass

    asyncio.run(serve())
    assert ("release", 1, True) in client.events and ("release", 2, True) in client.events
    assert admission.in_use == 0
    # Each job released once: a second close changes nothing.
    response.on_close()
    assert len([e for e in client.events if e[0] == "release"]) == 2
