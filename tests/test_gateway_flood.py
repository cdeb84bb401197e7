"""`python -m perf flood` against a gateway on a test server with a fake Triton client:
the flood is refused (caps, audio, bad frames), the normal session's typed turns are
answered in both phases, the figures come back. No Triton."""

from __future__ import annotations

import argparse
import asyncio

from aiohttp.test_utils import TestServer
from test_gateway_edge import _edge
from test_gateway_turns import FakeTriton

from gateway.app import create_app
from gateway.options import SessionOptions
from perf import flood


def test_the_flood_is_refused_and_the_normal_session_is_answered() -> None:
    async def scenario():
        app = create_app("unused:1", SessionOptions(partial_every_s=None), edge=_edge(),
                         triton=FakeTriton())  # fmt: skip
        async with TestServer(app, host="127.0.0.1") as server:
            args = argparse.Namespace(
                url=str(server.make_url("/")).rstrip("/"), turns=2, spoken=0, sockets=20,
                connect_rate=50.0, fast_audio=2, bad_frames=2,
            )  # fmt: skip
            return await flood.run(args)

    result = asyncio.run(scenario())
    assert len(result["alone_ms"]) == len(result["flooded_ms"]) == 2
    refused = result["refusals"]
    assert refused.get("too_many_connections", 0) > 0, result
    assert refused.get("rate_limited", 0) + refused.get("bad_request", 0) > 0, result
