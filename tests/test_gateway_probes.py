"""The probes of the edge issues against a real gateway (the aiohttp app on a loopback
socket, a fake Triton client): each one got through before its fix. Issue 42: DNS
rebinding, silent sockets filling the gateway, unhandled controls and JSON, an idle timeout
that pongs kept from firing, handshakes that leaked a slot, `serve --web` dropping the
gateway's flags, a session secret Triton does not share. Issue 41: an honest client refused
because the gateway read it late, and the capacity's `busy` answer."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import numpy as np
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient
from gateway_harness import GatewayThread
from test_gateway_edge import PAGE, UPGRADE, _edge, _json, _refused, _token, serve
from test_gateway_turns import FakeTriton

from avatar import live_protocol
from gateway import metrics as prometheus
from gateway.access import AccessTokens, Hosts
from gateway.app import Edge, create_app
from gateway.limits import Limits
from gateway.options import SessionOptions
from gateway.triton_client import SESSION_REJECTED_MESSAGE, TurnCall, TurnError

CHUNK = 512  # 32 ms at 16 kHz, as the page sends


def _frame(seconds: float = CHUNK / 16_000) -> bytes:
    return live_protocol.mic_message(np.zeros(round(seconds * 16_000), np.float32))


async def _raw(client: TestClient, head: bytes) -> bytes:
    """A request written byte by byte (headers aiohttp's client would not send); the
    answer's first bytes."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(head)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(4096), 5)
    writer.close()
    return answer


# -- 1. DNS rebinding ------------------------------------------------------------------


def test_a_host_name_the_gateway_does_not_serve_gets_nothing() -> None:
    """A page from the attacker's domain re-bound to the gateway's address: no page, no
    token, no WebSocket, and no slot taken; the gateway's own names still work."""
    rebound = "rebind.attacker.example"

    async def scenario(client: TestClient, edge: Edge):
        host = {"Host": f"{rebound}:{client.port}"}
        origin = {"Origin": f"http://{rebound}:{client.port}"}
        page = await client.get("/", headers=host)
        token = await client.post("/access-token", headers={**host, **origin})
        ws = await client.get("/ws", headers={**UPGRADE, **host, **origin})
        answers = [(r.status, (await r.json())["code"]) for r in (page, token, ws)]
        held = edge.caps.open
        ours = await client.get("/", headers={"Host": f"localhost:{client.port}"})
        return answers, held, ours.status, await _token(client)

    answers, held, ours, protocols = serve(scenario)
    assert answers == [(421, "forbidden_host")] * 3 and held == 0
    assert ours == 200 and protocols[0] == "avatar.v1"


def test_allowed_hosts_are_names_suffixes_localhost_and_ip_literals() -> None:
    hosts = Hosts.of("avatar.example.com,.corp.example", ("https://page.example.net",))
    for good in ("avatar.example.com:443", "AVATAR.example.com.", "a.corp.example",
                 "corp.example", "page.example.net", "localhost:8080", "x.localhost",
                 "127.0.0.1:8080", "10.1.2.3", "[::1]:8080", None):  # fmt: skip
        assert hosts.allows(good), good
    for bad in ("evil.example", "avatar.example.com.evil.example", "xcorp.example",
                "example.com", "", "host:1:2", "h\u00e9.example", "a@b", "[::1"):  # fmt: skip
        assert not hosts.allows(bad), bad
    assert Hosts(("*",)).allows("anything.example")


# -- 2. silent sockets -----------------------------------------------------------------


async def _connect_from(client: TestClient, address: str) -> tuple[aiohttp.ClientSession, object]:
    """A WebSocket from the loopback address `address` (127.0.0.0/8 is all local)."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0)))
    ws = await session.ws_connect(client.make_url("/ws"))
    return session, ws


def test_silent_sockets_cannot_fill_the_gateway_or_keep_a_new_user_out() -> None:
    """8 silent sockets from two addresses hold every quiet slot; a new user from a third
    address still gets in (the oldest silent socket of the address holding the most is
    closed for it) and is answered; silent ones are closed after first_message_s."""
    limits = Limits(max_connections=10, max_per_address=4, quiet_share=0.4, first_message_s=2.0)

    async def scenario(client: TestClient, edge: Edge):
        held = [await _connect_from(client, f"127.0.0.{2 + i // 4}") for i in range(8)]
        for _session, ws in held:
            assert (await _json(ws))["type"] == "ready"
        quiet_full = edge.caps.quiet
        user_session, user = await _connect_from(client, "127.0.0.9")
        assert (await _json(user))["type"] == "ready"
        await user.send_json({"type": "ping", "t": 7})
        pong = await _json(user)
        evicted = [ws for _s, ws in held if ws.closed or (await _closing(ws))]
        waited = time.monotonic()
        late = [await _refused(ws) for _s, ws in held if not ws.closed]
        waited = time.monotonic() - waited
        for session, ws in [*held, (user_session, user)]:
            await ws.close()
            await session.close()
        return quiet_full, pong, evicted, late, waited

    quiet_full, pong, evicted, late, waited = serve(scenario, _edge(limits))
    assert quiet_full == 4  # max(max_per_address, 10 x 0.4)
    assert pong == {"type": "pong", "t": 7}
    assert len(evicted) >= 1  # made room for the user
    assert all(error["code"] == "idle_timeout" and code == 4408 for error, code in late)
    assert waited < 3.0  # closed at first_message_s, not at the 180-s idle timeout


async def _closing(ws, wait_s: float = 0.3) -> bool:
    """Whether the server is closing `ws` (its error and close arrive within wait_s)."""
    try:
        message = await ws.receive(timeout=wait_s)
    except asyncio.TimeoutError:
        return False
    if message.type == WSMsgType.TEXT and json.loads(message.data)["code"] == "idle_timeout":
        await ws.receive(timeout=2)
        return True
    return message.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)


# -- 3. unhandled errors -----------------------------------------------------------------


BAD_MESSAGES = [
    ({"type": "controls", "controls": {"seed": 1e999}}, "seed"),
    ({"type": "controls", "controls": {"max_tokens": 1e999}}, "max_tokens"),
    ({"type": "controls", "controls": {"persona_preset": []}}, "persona_preset"),
    ({"type": "controls", "controls": {"fps": "fast"}}, "fps"),
    ({"type": "controls", "controls": {"seed": True}}, "seed"),
    ({"type": "controls", "controls": {"emotion": 3}}, "emotion"),
    ({"type": "controls", "controls": {"intensity": 7}}, "intensity"),
    ({"type": "controls", "controls": {"alpha": 10**400}}, "alpha"),  # the fuzzer's
    ({"type": "controls", "controls": {"end_silence_s": 10**400}}, "end_silence_s"),
]


def test_bad_controls_and_deep_json_are_bad_requests_that_count() -> None:
    limits = Limits(bad_messages=len(BAD_MESSAGES) + 1)

    async def scenario(client: TestClient, edge: Edge):
        async with client.ws_connect("/ws") as ws:
            await _json(ws)
            answers = []
            for message, _field in BAD_MESSAGES:
                await ws.send_str(json.dumps(message).replace("Infinity", "1e999"))
                answers.append(await _json(ws))
            await ws.send_str('{"type": "ping", "t": ' + "[" * 50_000 + "]" * 50_000 + "}")
            answers.append(await _json(ws))
            await ws.send_str('{"type": "ping", "t": NaN}')  # one more than the limit
            answers.append(await _json(ws))
            closed = await ws.receive()
            return answers, closed.type, ws.close_code

    answers, closed, code = serve(scenario, _edge(limits))
    for (message, field), answer in zip(BAD_MESSAGES, answers, strict=False):
        assert answer["code"] == "bad_request" and field in answer["message"], (message, answer)
    assert answers[len(BAD_MESSAGES)]["code"] == "bad_request"
    assert "nests deeper" in answers[len(BAD_MESSAGES)]["message"]
    assert answers[-1] == {
        "type": "error",
        "code": "bad_request",
        "message": "too many bad messages",
    }
    assert closed in (WSMsgType.CLOSE, WSMsgType.CLOSED) and code == 4400


class FailingTriton(FakeTriton):
    """A vad call that fails as no one foresaw: the gateway's `internal`."""

    async def speech_prob(self, stream, chunk, *, session: str = "") -> float:
        raise ZeroDivisionError("a bug")


def test_messages_the_gateway_fails_on_count_toward_the_bad_message_limit() -> None:
    async def scenario(client: TestClient, edge: Edge):
        async with client.ws_connect("/ws") as ws:
            await _json(ws)
            codes = []
            for _ in range(3):
                await ws.send_bytes(_frame())
                codes.append((await _json(ws))["code"])
            await ws.receive()
            return codes, ws.close_code

    codes, close = serve(scenario, _edge(Limits(bad_messages=2)), triton=FailingTriton())
    assert codes == ["internal", "internal", "bad_request"] and close == 4400


# -- 4. the idle timeout -----------------------------------------------------------------


def test_the_idle_timeout_fires_while_the_client_answers_pings() -> None:
    """A client that answers the heartbeat (as every browser does) but sends no message is
    closed at the idle timeout: pongs are not messages."""
    limits = Limits(idle_timeout_s=0.8, heartbeat_s=0.1)

    async def scenario(client: TestClient, edge: Edge):
        async with client.ws_connect("/ws", autoping=True) as ws:
            await _json(ws)
            await ws.send_json({"type": "ping", "t": 1})
            await _json(ws)
            started = time.monotonic()
            error, code = await _refused(ws)  # the client's reader answers the pings meanwhile
            return error, code, time.monotonic() - started

    error, code, waited = serve(scenario, _edge(limits))
    assert (error["code"], code) == ("idle_timeout", 4408)
    assert 0.6 < waited < 3.0, waited


# -- 5. handshakes that leaked a slot ------------------------------------------------------


def test_malformed_handshakes_are_refused_and_give_their_slot_back() -> None:
    """Each answered with a documented refusal (never 500), the slot given back: more of
    them than the per-address cap leave the address able to connect."""
    tokens = AccessTokens(b"k" * 32)
    good = tokens.mint(PAGE)
    version, expiry, nonce, mac = good.split(".")
    bad_tokens = [
        f"{version}.{expiry}.{nonce}.{mac[:-1]}\u00e9",  # a non-ASCII MAC
        f"{version}.\u00b9\u00b2\u00b3.{nonce}.{mac}",  # superscript digits
        f"{version}.{expiry}..",
        f"{version}.{'9' * 40}.{nonce}.{mac}",
    ]

    async def scenario(client: TestClient, edge: Edge):
        port = client.port
        heads = [
            "Origin: http://[\r\n",
            "Origin: http://\xff\xfe.example\r\n",
            "Authorization: Bearer \xe9\xe9\r\n",
            "Sec-WebSocket-Protocol: avatar.v1, access.\xf0\x9f\x98\x80\r\n",
        ] + [
            f"Origin: {PAGE}\r\nSec-WebSocket-Protocol: avatar.v1, access.{t}\r\n"
            for t in bad_tokens
        ]
        answers = []
        for head in heads * 2:  # 16 > the 8 per address
            request = (
                f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\n"
                "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Key: {UPGRADE['Sec-WebSocket-Key']}\r\n{head}\r\n"
            )
            answers.append(await _raw(client, request.encode("latin-1", "replace")))
        await asyncio.sleep(0.3)
        held = edge.caps.open
        async with client.ws_connect("/ws") as ws:  # the address is not locked out
            ready = await _json(ws)
        return answers, held, ready

    limits = Limits(connect_burst=40)
    edge = _edge(limits)
    edge.access.tokens = tokens
    answers, held, ready = serve(scenario, edge)
    for answer in answers:
        status = answer.split(b"\r\n", 1)[0]
        assert b" 500 " not in status, answer[:200]
        if b" 101 " in status:  # upgraded to say why, with a documented code; or (no
            # Origin, no operator key configured: a script) admitted
            codes = (b'"code": "unauthorized"', b'"code": "forbidden_origin"', b'"type": "ready"')
            assert any(code in answer for code in codes), answer[-300:]
    assert held == 0 and ready["type"] == "ready"


# -- 6. serve --web forwards the gateway's settings; a secret Triton does not share -------


def test_serve_web_forwards_the_gateways_own_flags(monkeypatch: pytest.MonkeyPatch, tmp_path):
    from serving import cli

    seen: list = []
    monkeypatch.setattr(cli, "_serve", lambda args: seen.append(args) or 0)
    personas = tmp_path / "personas.json"
    personas.write_text('{"guide": "You are a guide."}')
    argv = ["serve", "--web", "--personas", str(personas), "--origins", "https://a.example",
            "--allowed-hosts", "avatar.example", "--max-sessions", "6",
            "--audio-burst-s", "3", "--no-partials"]  # fmt: skip
    assert cli.main(argv) == 0
    forwarded = seen[0].gateway_argv
    assert forwarded == [
        "--allowed-hosts", "avatar.example", "--origins", "https://a.example",
        "--personas", str(personas), "--max-sessions", "6", "--audio-burst-s", "3.0",
        "--no-partials",
    ]  # fmt: skip
    assert cli.main(["serve", "--web"]) == 0 and seen[1].gateway_argv == []
    assert seen[1].models_nice > 0  # the models yield the CPU to the gateway


def test_the_models_of_serve_web_run_niced_below_the_gateway() -> None:
    """The server's child (and so its model stubs) starts at ServerOptions.niceness."""
    import os
    import subprocess

    from serving.server import WEB_NICENESS, _child_setup

    out = subprocess.run(
        ["nice"], preexec_fn=_child_setup(WEB_NICENESS), capture_output=True, text=True, check=True
    )
    assert int(out.stdout) == min(19, os.nice(0) + WEB_NICENESS)


class RejectingStream:
    """A gRPC stream on which the `avatar` model refused the session token."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        return None, "session_id is not a session this server made (its signature is wrong)"

    def cancel(self) -> None:
        pass


def test_a_turn_triton_refuses_for_its_session_says_so_with_its_own_code() -> None:
    async def scenario():
        with pytest.raises(TurnError) as refused:
            async for _event in TurnCall(RejectingStream(), "avatar").events(5.0):
                pass
        return refused.value

    error = asyncio.run(scenario())
    assert error.code == "session_rejected" and str(error) == SESSION_REJECTED_MESSAGE


# -- issue 41: honest clients read late, floods, many sessions, capacity ------------------


def _paced(url: str, seconds: float, out: dict, protocols=None) -> None:
    """A client in a thread of its own: real-time 32-ms MIC frames for `seconds`; what came
    back (errors and the close code) in `out`."""

    async def run():
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(url, protocols=protocols or ()) as ws,
        ):
            start, sent, errors = time.monotonic(), 0, []

            async def read():
                async for message in ws:
                    if message.type == WSMsgType.TEXT:
                        body = json.loads(message.data)
                        if body["type"] == "error":
                            errors.append(body["code"])

            reader = asyncio.create_task(read())
            while sent * CHUNK / 16_000 < seconds and not ws.closed:
                await ws.send_bytes(_frame())
                sent += 1
                await asyncio.sleep(max(0.0, start + sent * CHUNK / 16_000 - time.monotonic()))
            await ws.close()
            await reader
            out.update(errors=errors, close=ws.close_code, sent_s=sent * CHUNK / 16_000)

    asyncio.run(run())


def _gateway(limits: Limits, triton: FakeTriton | None = None):
    edge = _edge(limits)
    options = SessionOptions(partial_every_s=None, speculate_after_s=None)
    app = lambda: create_app("unused:1", options, edge=edge, triton=triton or FakeTriton())  # noqa: E731
    return GatewayThread(app), edge


def test_a_paced_client_is_not_refused_while_the_gateways_loop_is_blocked_for_5_s() -> None:
    gateway, edge = _gateway(Limits())
    with gateway:
        out: dict = {}
        client = threading.Thread(target=_paced, args=(gateway.url("/ws", "ws"), 9.0, out))
        client.start()
        time.sleep(1.5)
        gateway.block(5.0).result()  # the backlog of 5 s of audio is read at once
        client.join(30)
        lag_max = gateway.call(lambda: edge.metrics.lag.max_s)
    assert out["errors"] == [] and out["close"] == 1000 and out["sent_s"] > 8.9, out
    assert lag_max >= 4.5  # the stall was real, and /metrics saw it


def test_a_flood_of_30_s_of_audio_is_cut_within_a_few_seconds() -> None:
    async def scenario(client: TestClient, edge: Edge):
        async with client.ws_connect("/ws") as ws:
            await _json(ws)
            started, sent = time.monotonic(), 0.0
            try:
                while sent < 30.0 and not ws.closed:
                    await ws.send_bytes(_frame(0.25))
                    sent += 0.25
                    await asyncio.sleep(0.01)  # 25x real time
            except ConnectionError:
                pass
            error, code = await _refused(ws)
            return error, code, sent, time.monotonic() - started

    error, code, sent, took = serve(scenario, _edge(Limits()))
    # 1006 when the close handshake raced the client's own sends (the close timeout is short)
    assert error["code"] == "rate_limited" and code in (4429, 1006)
    assert sent < 30.0 and took < 3.0, (sent, took)  # cut long before the flood ended


def test_eight_paced_sessions_from_one_address_are_never_refused() -> None:
    gateway, edge = _gateway(Limits(max_sessions=8))
    with gateway:
        outs = [{} for _ in range(8)]
        clients = [
            threading.Thread(target=_paced, args=(gateway.url("/ws", "ws"), 6.0, out))
            for out in outs
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(60)
        refusals = gateway.call(lambda: dict(edge.metrics.refusals))
    assert all(out["errors"] == [] and out["close"] == 1000 for out in outs), outs
    assert refusals == {}


def test_beyond_capacity_a_session_is_told_busy_and_an_admitted_one_is_never_cut() -> None:
    limits = Limits(max_sessions=2, retry_after_s=7.0)

    async def scenario(client: TestClient, edge: Edge):
        first, second = client.ws_connect("/ws"), client.ws_connect("/ws")
        first, second = await first, await second
        for ws in (first, second):
            await _json(ws)
            await ws.send_json({"type": "ping", "t": 0})
            await _json(ws)
        async with client.ws_connect("/ws") as third:  # connects; told at its first message
            await _json(third)
            quiet = edge.caps.sessions
            await third.send_bytes(_frame())
            busy, code = await _refused(third)
        for t in range(1, 4):  # the admitted ones go on
            await first.send_json({"type": "ping", "t": t})
            assert (await _json(first))["t"] == t
        await second.close()
        await asyncio.sleep(0.1)
        async with client.ws_connect("/ws") as fourth:  # room again
            await _json(fourth)
            await fourth.send_json({"type": "ping", "t": 9})
            again = await _json(fourth)
        gauge = prometheus.parse(await (await client.get("/metrics")).text())
        await first.close()
        return quiet, busy, code, again, gauge

    quiet, busy, code, again, gauge = serve(scenario, _edge(limits))
    assert quiet == 2  # a connection that has not said a word holds no session
    assert (busy["code"], code, busy["retry_after_s"]) == ("busy", 1013, 7.0)
    assert again == {"type": "pong", "t": 9}
    assert gauge["avatar_gateway_capacity"] == 2
    assert gauge['avatar_gateway_refusals_total{code="busy"}'] == 1
