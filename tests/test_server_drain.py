"""A server stopped right after a client cancelled its turn stops at once.

`EmbeddedServer.stop` lets the work in flight end before it sends SIGTERM (serving/server.py,
`drain`). Without that, the cancelled turn's llm generation could not send the END step of
its `llm_decoder` sequence to an exiting Triton (it refuses new requests: "Server not
ready"), and Triton waited for that open sequence past the 15-s grace, until it was killed.
"""

from __future__ import annotations

import time

import pytest
from grpc_calls import call, strings

from serving.server import EmbeddedServer, ServerOptions

pytestmark = pytest.mark.server

# what a text turn calls (no audio: no asr; no renderer: no video)
MODELS = ["avatar", "llm", "llm_decoder", "tts", "tts_vits", "emotion_encoder"]
TURN = {
    "text": strings("Please tell me a very long story about a dragon and a knight."),
    "session_id": strings("stopped-mid-turn"),
    "controls": strings('{"max_tokens": 300, "seed": 3}'),
}


def test_a_server_stopped_right_after_a_cancelled_turn_stops_at_once(embedded_repository):
    server = EmbeddedServer(ServerOptions(embedded_repository, models=MODELS))
    with server:
        reply = call(server.grpc_url, "avatar", TURN, cancel_after=2)  # transcript, a sentence
        assert reply.error is None and len(reply.responses) == 2, reply.error
        in_flight = server.work_in_flight()
        started = time.monotonic()
        server.stop()
        took = time.monotonic() - started
    # the turn was still winding down when the stop began (else this shows nothing)
    assert in_flight, "no work in flight at the stop"
    assert took < 10.0, f"the stop took {took:.1f} s (grace 15 s):\n{server.log_tail(30)}"
    assert not server.is_running()
