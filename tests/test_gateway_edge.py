"""The gateway's edge (gateway/access.py, limits.py, metrics.py, app.py) served by aiohttp's
test server with a fake Triton client: who may connect, each limit and refusal with its
close code and error code, /metrics, personas, resume. No Triton."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable

import aiohttp
import numpy as np
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient, TestServer
from test_gateway_connection import _mic, _of, _session
from test_gateway_turns import TOKENS, FakeTriton, Socket

from avatar import live_protocol
from gateway import metrics as prometheus
from gateway.access import AccessTokens, Origins
from gateway.app import Edge, create_app
from gateway.limits import Limits, TokenBucket
from gateway.options import SessionOptions
from gateway.protocol import CLOSE_CODES, ERROR_CODES, RefusalError

PAGE = "http://localhost:8080"
UPGRADE = {  # a WebSocket handshake by hand, to read the HTTP answer of a refusal
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}
SECRET = {"AVATAR_SESSION_SECRET": "a test secret of enough bytes"}
KEY = "operator key 123"


def _edge(limits: Limits | None = None, key: str | None = None, **origins) -> Edge:
    env = {**SECRET, **({"AVATAR_GATEWAY_KEY": key} if key else {})}
    return Edge.from_environment(limits or Limits(), Origins(**origins), env)


def serve(
    scenario: Callable[[TestClient, Edge], Awaitable],
    edge: Edge | None = None,
    options: SessionOptions | None = None,
    triton: FakeTriton | None = None,
):
    """Run `scenario(client, edge)` against a gateway app on a test server."""
    edge = edge or _edge()
    options = options or SessionOptions(partial_every_s=None)

    async def run():
        app = create_app("unused:1", options, edge=edge, triton=triton or FakeTriton())
        async with TestClient(TestServer(app)) as client:
            return await scenario(client, edge)

    return asyncio.run(run())


async def _token(client: TestClient, origin: str = PAGE) -> list[str]:
    response = await client.post("/access-token", headers={"Origin": origin})
    assert response.status == 200, await response.text()
    assert response.headers["Access-Control-Allow-Origin"] == origin
    return (await response.json())["protocols"]


async def _refused(ws) -> tuple[dict, int]:
    """The error message and the close code of a refused connection."""
    error = json.loads((await ws.receive()).data)
    closing = await ws.receive()
    assert closing.type in (WSMsgType.CLOSE, WSMsgType.CLOSED), closing
    return error, ws.close_code


async def _json(ws) -> dict:
    while True:
        message = await ws.receive(timeout=5)
        if message.type == WSMsgType.TEXT:
            return json.loads(message.data)


async def _drain(ws, quiet_s: float = 0.5) -> list[dict]:
    """The JSON messages until none came for `quiet_s`."""
    got = []
    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
        while True:
            message = await ws.receive(timeout=quiet_s)
            if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                break  # closed
            if message.type == WSMsgType.TEXT:
                got.append(json.loads(message.data))
    return got


def test_the_page_gets_a_token_and_connects_with_it() -> None:
    async def scenario(client: TestClient, edge: Edge):
        protocols = await _token(client)
        async with client.ws_connect("/ws", headers={"Origin": PAGE}, protocols=protocols) as ws:
            ready = await _json(ws)
            chosen = ws.protocol
        return ready, chosen

    ready, chosen = serve(scenario)
    assert ready["type"] == "ready" and chosen == "avatar.v1"
    assert TOKENS.verify(ready["session_token"]) == ready["session_id"]


@pytest.mark.parametrize(
    ("case", "code", "close"),
    [
        ("foreign origin", "forbidden_origin", 4403),
        ("no token", "unauthorized", 4401),
        ("token of another origin", "unauthorized", 4401),
        ("forged token", "unauthorized", 4401),
        ("expired token", "unauthorized", 4401),
    ],
)
def test_browsers_without_a_valid_token_of_their_origin_are_refused(case, code, close) -> None:
    now = [1000.0]
    edge = _edge()
    edge.access.tokens = AccessTokens(b"k" * 32, clock=lambda: now[0])

    async def scenario(client: TestClient, edge: Edge):
        origin, protocols = PAGE, await _token(client)
        if case == "foreign origin":
            origin = "http://evil.example"
            response = await client.post("/access-token", headers={"Origin": origin})
            assert response.status == 403 and (await response.json())["code"] == code
        elif case == "no token":
            protocols = ["avatar.v1"]
        elif case == "token of another origin":
            protocols = await _token(client, "http://127.0.0.1:3000")
        elif case == "forged token":
            protocols = [protocols[0], protocols[1][:-4] + "AAAA"]
        else:
            now[0] += 301
        async with client.ws_connect("/ws", headers={"Origin": origin}, protocols=protocols) as ws:
            return await _refused(ws)

    error, close_code = serve(scenario, edge)
    assert (error["code"], close_code) == (code, close), error


def test_the_operator_key_admits_services_and_a_wrong_or_missing_one_is_refused() -> None:
    async def scenario(client: TestClient, edge: Edge):
        results = {}
        for name, headers in [
            ("key", {"Authorization": f"Bearer {KEY}"}),
            ("wrong", {"Authorization": "Bearer guess"}),
            ("none", {}),
        ]:
            async with client.ws_connect("/ws", headers=headers) as ws:
                first = await _json(ws)
                if first["type"] == "ready":  # trusted: free persona text
                    await ws.send_json({"type": "controls", "controls": {"persona": "A pirate."}})
                    results[name] = (first["persona_text"], (await _json(ws))["type"])
                else:
                    await ws.receive()
                    results[name] = (first["code"], ws.close_code)
        return results

    results = serve(scenario, _edge(key=KEY))
    assert results == {
        "key": (True, "controls"),
        "wrong": ("unauthorized", 4401),
        "none": ("unauthorized", 4401),
    }


def test_connection_caps_in_all_and_per_address() -> None:
    async def scenario(client: TestClient, edge: Edge):
        open_ = [await client.ws_connect("/ws") for _ in range(2)]
        for ws in open_:  # talking connections (a quiet one would make room: test_probes)
            await _json(ws)
            await ws.send_json({"type": "ping", "t": 1})
            assert (await _json(ws))["type"] == "pong"
        # refused before the upgrade: HTTP 429, nothing of the client's is read
        third = await client.get("/ws", headers=UPGRADE)
        refused = (await third.json(), third.status)
        gauge = prometheus.parse(await (await client.get("/metrics")).text())
        for ws in open_:
            await ws.close()
        return refused, gauge

    for limits in (Limits(max_per_address=2), Limits(max_connections=2)):
        (error, status), gauge = serve(scenario, _edge(limits))
        assert (error["code"], status) == ("too_many_connections", 429)
        assert gauge["avatar_gateway_connections"] == 2
        assert gauge['avatar_gateway_refusals_total{code="too_many_connections"}'] == 1


def test_message_rate_audio_rate_bad_frames_and_idle_connections_are_closed() -> None:
    # the last connection sends nothing: refused after first_message_s (the default 10 s
    # made this test wait 10 s)
    limits = Limits(
        messages_per_s=5, message_burst=5, idle_timeout_s=0.3, first_message_s=1.0, bad_messages=3
    )

    async def scenario(client: TestClient, edge: Edge):
        results = {}
        async with client.ws_connect("/ws") as ws:
            await _json(ws)
            for t in range(8):
                await ws.send_json({"type": "ping", "t": t})
            results["messages"] = [m for m in [await _json(ws) for _ in range(6)]][-1]
            await ws.receive()
            results["messages_close"] = ws.close_code
        async with client.ws_connect("/ws") as ws:
            await _json(ws)
            second = live_protocol.mic_message(np.zeros(16_000, np.float32))
            for _ in range(4):  # 4 s of audio at once: beyond the 2-s burst
                await ws.send_bytes(second)
            results["audio"] = await _refused(ws)
        async with client.ws_connect("/ws") as ws:
            await _json(ws)
            for _ in range(4):
                await ws.send_bytes(b"\x07junk")
            codes = [(await _json(ws))["code"] for _ in range(4)]
            await ws.receive()
            results["bad"] = (codes, ws.close_code)
        async with client.ws_connect("/ws") as ws:
            await _json(ws)
            results["idle"] = await _refused(ws)
        results["metrics"] = prometheus.parse(await (await client.get("/metrics")).text())
        return results

    results = serve(scenario, _edge(limits))
    assert results["messages"]["code"] == "rate_limited" and results["messages_close"] == 4429
    error, close = results["audio"]
    assert (error["code"], close) == ("rate_limited", 4429) and "real time" in error["message"]
    assert results["bad"] == (["bad_request"] * 4, 4400)
    assert (results["idle"][0]["code"], results["idle"][1]) == ("idle_timeout", 4408)
    counted = results["metrics"]
    assert counted['avatar_gateway_refusals_total{code="rate_limited"}'] == 2
    assert counted['avatar_gateway_refusals_total{code="idle_timeout"}'] == 1
    assert counted["avatar_gateway_connections"] == 0


def test_audio_at_real_time_passes_the_audio_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(1.2, 2.0, clock=lambda: now[0])
    for _ in range(100):  # 100 s of 1-s messages at real time
        assert bucket.take(1.0)
        now[0] += 1.0
    assert bucket.take(2.0) and not bucket.take(1.0)  # a burst, then the limit


def test_an_address_cannot_refill_its_audio_or_connect_faster_by_reconnecting() -> None:
    limits = Limits(max_per_address=1, connects_per_s=0.01, connect_burst=3)

    async def scenario(client: TestClient, edge: Edge):
        second = live_protocol.mic_message(np.zeros(16_000, np.float32))
        closes = []
        for _ in range(3):  # each connection 1.5 s: within its own 2-s burst
            async with client.ws_connect("/ws") as ws:
                await _json(ws)
                await ws.send_bytes(second)
                await ws.send_bytes(second[: 1 + 16_000])  # + 0.5 s
                got = await _drain(ws, 0.3)
                closes.append((got[-1].get("code") if got else None, ws.close_code))
        with pytest.raises(aiohttp.WSServerHandshakeError) as fourth:
            await client.ws_connect("/ws")
        return closes, fourth.value

    closes, refused = serve(scenario, _edge(limits))
    # the address's bucket holds 2 s x 1 connection: the second connection passes it
    assert closes[0][0] is None, closes  # no error
    assert closes[1:] == [("rate_limited", 4429)] * 2, closes
    assert refused.status == 429  # new connections too fast: before the upgrade


def test_typed_turns_beyond_their_rate_are_dropped_with_an_error() -> None:
    limits = Limits(turns_per_s=0.1, turn_burst=2)

    async def scenario(client: TestClient, edge: Edge):
        async with client.ws_connect("/ws") as ws:
            await _json(ws)
            for _ in range(3):
                await ws.send_json({"type": "text", "text": "Hi"})
            return await _drain(ws)

    got = serve(scenario, _edge(limits))
    errors = [m for m in got if m["type"] == "error"]
    assert [e["code"] for e in errors] == ["rate_limited"]
    assert max(m.get("turn", 0) for m in got) == 2  # the third never became a turn


def test_an_utterance_longer_than_the_maximum_is_not_answered() -> None:
    options = SessionOptions(partial_every_s=None, speculate_after_s=None, max_utterance_s=1.0)

    async def scenario():
        triton, socket = FakeTriton(probs=[0.9] * 40), Socket()
        session = _session(triton, socket, options)
        with pytest.raises(RefusalError) as refused:
            await _mic(session, 40)
        return triton, socket, refused.value

    triton, socket, refusal = asyncio.run(scenario())
    assert refusal.code == "too_long" and not refusal.close
    assert not triton.turns and _of(socket, "speech_end") == [
        {"type": "speech_end", "utterance_s": 0.0}
    ]


def test_personas_are_the_operators_presets_and_free_text_needs_permission() -> None:
    personas = {"guide": "You are a museum guide.", "chef": "You are a chef."}
    options = SessionOptions(partial_every_s=None, personas=personas)

    async def scenario(options, trusted=False):
        triton, socket = FakeTriton(), Socket()
        session = _session(triton, socket, options, trusted=trusted)
        await session.hello()
        await session.set_controls({"persona_preset": "guide"})
        await (await session.turns.start(text="Hi")).task
        refused = None
        try:
            await session.set_controls({"persona": "You are a rude pirate."})
        except RefusalError as error:
            refused = error.code
        return triton, socket, refused

    triton, socket, refused = asyncio.run(scenario(options))
    assert _of(socket, "ready")[0]["personas"] == ["chef", "guide"]
    assert triton.turns[0]["controls"]["persona"] == "You are a museum guide."
    assert _of(socket, "controls")[0]["controls"] == {
        "persona_preset": "guide",
        "end_silence_s": 0.7,
    }
    assert refused == "not_allowed"
    for allowed in (dataclasses.replace(options, allow_persona_text=True), None):
        _, socket, refused = asyncio.run(scenario(allowed or options, trusted=allowed is None))
        assert refused is None
        assert _of(socket, "controls")[-1]["controls"]["persona"] == "You are a rude pirate."


def test_unknown_persona_preset_is_a_bad_request() -> None:
    async def scenario():
        session = _session(FakeTriton(), Socket(), SessionOptions(personas={"guide": "x"}))
        with pytest.raises(live_protocol.ProtocolError, match="expected one of \\['guide'\\]"):
            await session.set_controls({"persona_preset": "pirate"})

    asyncio.run(scenario())


def test_a_reconnecting_page_resumes_with_its_token_and_a_forged_one_is_refused() -> None:
    async def scenario(client: TestClient, edge: Edge):
        async with client.ws_connect("/ws") as ws:
            first = await _json(ws)
        async with client.ws_connect("/ws") as ws:
            await _json(ws)
            await ws.send_json({"type": "resume", "session_token": first["session_token"]})
            resumed = await _json(ws)
            await ws.send_json({"type": "text", "text": "Do you remember me?"})
            await _json(ws)
            forged = first["session_token"][:-4] + "AAAA"
            await ws.send_json({"type": "resume", "session_token": forged})
            refused = [m for m in await _drain(ws) if m["type"] == "error"]
        return first, resumed, refused

    triton = FakeTriton()
    first, resumed, refused = serve(scenario, triton=triton)
    assert resumed == {"type": "session", "session_id": first["session_id"],
                       "session_token": first["session_token"]}  # fmt: skip
    assert triton.turns[0]["session_id"] == first["session_token"]
    assert ("avatar", first["session_id"]) in triton.affinity
    assert refused[0]["code"] == "unauthorized" and "s1." not in refused[0]["message"]


def test_vad_and_asr_calls_carry_the_sessions_affinity_header() -> None:
    options = SessionOptions(partial_every_s=None)

    async def scenario():
        triton = FakeTriton(probs=[0.0] * 10 + [0.9] * 40 + [0.0] * 22)
        session = _session(triton, Socket(), options)
        await _mic(session, 72)
        await session.turns.current.task
        return triton, session

    triton, session = asyncio.run(scenario())
    ids = {session.turns.affinity}
    assert {model for model, _ in triton.affinity} == {"vad", "asr", "avatar"}
    assert {header for _, header in triton.affinity} == ids and TOKENS.verify(session.session_id)


def test_every_error_and_close_code_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "protocol.md").read_text()
    for code in ERROR_CODES:
        assert f"`{code}`" in doc, code
    for close in CLOSE_CODES.values():
        assert str(close) in doc, close
