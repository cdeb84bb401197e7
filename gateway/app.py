"""aiohttp application: GET / (the page), GET /static/*, GET /ws (the protocol), /healthz,
and the portrait rig the page draws with WebGL (GET /portrait/info, /portrait/rig.json,
/portrait/photo.png; `--portrait DIR`).

aiohttp because the project already depends on it (tritonclient's asyncio HTTP client), it
serves HTTP, WebSockets and static files in one small library, and its asyncio loop is the
one the asyncio gRPC client of tritonclient runs on: one thread, no bridging.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import WSMsgType, web
from aiohttp.http_exceptions import HttpProcessingError

from avatar.conversation_tokens import ConversationTokens
from avatar.credentials import read_secret
from avatar.live_protocol import INPUT_RATE, ProtocolError
from gateway import protocol
from gateway.access import (
    KEY_ENV,
    SUBPROTOCOL,
    TOKEN_PROTOCOL_PREFIX,
    TOKEN_TTL_S,
    Access,
    AccessTokens,
    Admission,
    Hosts,
    Origins,
    offered_protocols,
)
from gateway.connection import Connection
from gateway.hearing import PassBudget
from gateway.limits import ConnectionCaps, ConnectionLimits, Limits, Slot
from gateway.metrics import CONTENT_TYPE, Metrics
from gateway.options import SessionOptions
from gateway.protocol import RefusalError
from gateway.triton_client import TritonAccess, TritonClient

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
MAX_MESSAGE_BYTES = 1 << 20
CLOSE_TIMEOUT_S = 0.25
TRITON = web.AppKey("triton", TritonClient)
OPTIONS = web.AppKey("options", SessionOptions)
PASSES = web.AppKey("passes", PassBudget)  # the ASR passes of all its sessions
PORTRAIT = web.AppKey("portrait", object)  # Path | None: the rig folder
PORTRAIT_FILES = {"rig.json": "application/json", "photo.png": "image/png"}


@dataclasses.dataclass
class Edge:
    """What the gateway checks at its edge (one per app): the host names it answers to, who
    may connect, how much each may take, the session tokens it mints, and the counters of
    /metrics."""

    access: Access
    limits: Limits
    tokens: ConversationTokens
    caps: ConnectionCaps
    metrics: Metrics
    hosts: Hosts = dataclasses.field(default_factory=Hosts)

    @classmethod
    def from_environment(
        cls,
        limits: Limits | None = None,
        origins: Origins | None = None,
        env=None,
        hosts: Hosts | None = None,
    ) -> Edge:
        """The operator key ($AVATAR_GATEWAY_KEY / _FILE) and the session secret
        ($AVATAR_SESSION_SECRET / _FILE) from the environment; `hosts`: default, the
        hosts of the allowed origins (and localhost, IP literals)."""
        limits, origins = limits or Limits(), origins or Origins()
        key = read_secret(KEY_ENV, env) or None
        tokens = ConversationTokens.from_environment(env)
        if tokens is None:
            log.warning(
                "no AVATAR_SESSION_SECRET: session tokens use a random secret of this process, "
                "and verify only on a Triton started with the same secret"
            )
            tokens = ConversationTokens(secrets.token_hex(32))
        access = Access(key, AccessTokens.from_environment(env), origins)
        caps = ConnectionCaps(limits)
        metrics = Metrics()
        metrics.capacity = caps.capacity
        hosts = hosts or Hosts.of("", origins.allowed)
        return cls(access, limits, tokens, caps, metrics, hosts)


EDGE = web.AppKey("edge", Edge)


class _ParserRefusals(logging.Filter):
    """aiohttp logs every request its HTTP parser refuses (400: a header with a control
    character, a broken request line) as an ERROR with a traceback, before any code of the
    gateway runs: a stranger could fill the log with them. Kept at DEBUG, one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and error.code == 400:
            log.debug("refused a request aiohttp could not parse: %s", error.message)
            return False
        return True


_PARSER_REFUSALS = _ParserRefusals()


@web.middleware
async def allowed_host(request: web.Request, handler):
    """Every request names a host the gateway serves (Hosts), before anything else runs."""
    edge = request.app[EDGE]
    if not edge.hosts.allows(request.headers.get("Host")):
        edge.metrics.refused("forbidden_host")
        body = protocol.error(
            "forbidden_host", "this gateway does not serve that host name (its --allowed-hosts)"
        )
        return web.json_response(body, status=421)
    return await handler(request)


async def page(_request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def healthz(request: web.Request) -> web.Response:
    """200 when Triton answers and `vad` and `avatar` are ready, else 503 with the reason."""
    try:
        missing = await request.app[TRITON].not_ready()
    except Exception as error:  # Triton unreachable: the details stay in the log
        log.warning("healthz: %r", error)
        return web.json_response({"ready": False, "error": "Triton unreachable"}, status=503)
    if missing:
        return web.json_response({"ready": False, "not_ready": missing}, status=503)
    return web.json_response({"ready": True})


def missing_rig_files(folder: Path) -> list[str]:
    """The files of PORTRAIT_FILES a rig folder lacks ([] when the page can draw it)."""
    return [name for name in PORTRAIT_FILES if not (Path(folder) / name).is_file()]


async def portrait_info(request: web.Request) -> web.Response:
    """Whether the page can draw the photo portrait, and where its two files are."""
    folder = request.app[PORTRAIT]
    available = folder is not None and not missing_rig_files(folder)
    body: dict = {"available": available}
    if available:
        body.update({name.split(".")[0]: f"/portrait/{name}" for name in PORTRAIT_FILES})
    return web.json_response(body)


async def portrait_file(request: web.Request) -> web.StreamResponse:
    """rig.json or photo.png of the `--portrait` folder; 404 says why when there is none."""
    name, folder = request.match_info["name"], request.app[PORTRAIT]
    if folder is None:
        raise web.HTTPNotFound(text="no portrait: the gateway was started without --portrait")
    path = folder / name
    if not path.is_file():
        raise web.HTTPNotFound(text=f"no portrait {name}: {path} is missing")
    if name == "rig.json":  # ~400 kB of numbers: gzip when the browser accepts it (~4x less)
        response = web.Response(body=path.read_bytes(), content_type=PORTRAIT_FILES[name])
        response.enable_compression()
        return response
    return web.FileResponse(path, headers={"Content-Type": PORTRAIT_FILES[name]})


def _client_error(error: Exception) -> RefusalError:
    """An unexpected failure while serving a message -> what the client may read (the
    details are logged)."""
    from tritonclient.utils import InferenceServerException

    if isinstance(error, (InferenceServerException, ConnectionError)):
        return RefusalError("server_unavailable", "the speech service is unavailable; try again")
    return RefusalError("internal", "the gateway failed on this message")


async def _refuse(ws: web.WebSocketResponse, refusal: RefusalError, metrics: Metrics) -> None:
    """Say why, and end the connection when the refusal does."""
    metrics.refused(refusal.code)
    with contextlib.suppress(ConnectionError, RuntimeError):  # the client already left
        await ws.send_json(protocol.refusal(refusal))
        if refusal.close:
            await ws.close(code=refusal.close_code, message=refusal.message.encode()[:120])


async def _refuse_upgraded(
    ws: web.WebSocketResponse, request: web.Request, refusal: RefusalError, edge: Edge
) -> web.WebSocketResponse:
    """A refusal after the handshake was read: upgraded, so that a browser sees the close
    code and why (a failed handshake shows a page nothing)."""
    await ws.prepare(request)
    await _refuse(ws, refusal, edge.metrics)
    # DEBUG: a flood of refusals must not flood the log too (/metrics counts them)
    log.debug("refused %s from %s: %s", refusal.code, request.remote, refusal.message)
    return ws


async def websocket(request: web.Request) -> web.WebSocketResponse:
    edge = request.app[EDGE]
    # timeout: how long a close waits for the client's answer, reading (and dropping) what
    # it still sends; aiohttp's 10 s let a flooding client keep its slot and the CPU busy.
    # The client has the close code by then (RFC 6455: the first Close frame's).
    ws = web.WebSocketResponse(
        max_msg_size=MAX_MESSAGE_BYTES,
        heartbeat=edge.limits.heartbeat_s,
        protocols=(SUBPROTOCOL,),
        timeout=CLOSE_TIMEOUT_S,
    )
    address = request.remote or "unknown"
    try:
        slot = edge.caps.acquire(address)
    except RefusalError as refusal:  # before the upgrade: no frame of a flood is ever read
        edge.metrics.refused(refusal.code)
        log.debug("refused %s from %s: %s", refusal.code, address, refusal.message)
        body = protocol.refusal(refusal)
        return web.json_response(body, status=429, headers={"Retry-After": "1"})
    # From here on every way out releases the slot (a handshake that raises included)
    try:
        try:
            offered = offered_protocols(request.headers.get("Sec-WebSocket-Protocol", ""))
            admission = edge.access.admit(request.headers, offered)
        except RefusalError as refusal:
            return await _refuse_upgraded(ws, request, refusal, edge)
        except Exception:  # a header no check foresaw: refused, logged once, slot released
            log.exception("handshake from %s", address)
            refusal = RefusalError("bad_request", "the handshake could not be read", close=True)
            return await _refuse_upgraded(ws, request, refusal, edge)
        edge.metrics.accepted += 1
        edge.metrics.connections += 1
        try:
            await _session(ws, request, admission, slot)
        finally:
            edge.metrics.connections -= 1
    finally:
        edge.caps.release(slot)
        edge.metrics.sessions = edge.caps.sessions
    return ws


async def _evict(ws: web.WebSocketResponse, metrics: Metrics, waited_s: float) -> None:
    """A quiet connection closed to make room for a new one (ConnectionCaps)."""
    refusal = RefusalError(
        "idle_timeout",
        f"no message {waited_s:g} s after connecting: closed for a new one",
        close=True,
    )
    await _refuse(ws, refusal, metrics)


async def _session(
    ws: web.WebSocketResponse, request: web.Request, admission: Admission, slot: Slot
) -> None:
    """An admitted connection's session, from the handshake to its close."""
    app = request.app
    edge = app[EDGE]
    await ws.prepare(request)
    opened = asyncio.get_running_loop().time()
    tasks: set[asyncio.Task] = set()

    def evict() -> None:
        waited = asyncio.get_running_loop().time() - opened
        task = asyncio.get_running_loop().create_task(_evict(ws, edge.metrics, round(waited, 1)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    slot.evict = evict
    session = Connection(
        app[TRITON],
        ws.send_json,
        ws.send_bytes,
        app[OPTIONS],
        budget=app[PASSES],
        tokens=edge.tokens,
        trusted=admission.trusted,
        turn_ended=lambda outcome: edge.metrics.turns.update([outcome or "completed"]),
    )
    limits = ConnectionLimits(edge.limits, shared_audio=edge.caps.of(slot.address).audio)
    session.turn_gate = limits.turn
    log.info("session %s connected (%s)", session.turns.affinity, admission.how)
    await session.hello()

    def talked() -> None:
        """The first message: no longer a quiet socket, and a session of the machine's
        capacity from now on, or told `busy` (RefusalError) when it is full. Counted at the
        first message, not at the handshake, so that silent sockets hold no session."""
        edge.caps.talked(slot)
        edge.caps.admit_session(slot)
        edge.metrics.sessions = edge.caps.sessions

    try:
        await _serve(ws, session, limits, edge.metrics, talked)
    finally:
        await session.close()
        log.info("session %s closed", session.turns.affinity)


async def _serve(
    ws: web.WebSocketResponse,
    session: Connection,
    limits: ConnectionLimits,
    metrics: Metrics,
    talked: Callable[[], None] = lambda: None,
) -> None:
    """The connection's messages until it closes, is idle too long or passes a limit.
    Idleness is measured on application messages: the WebSocket pongs every browser
    answers the heartbeat with do not keep a silent connection open."""
    loop = asyncio.get_running_loop()
    settings = limits.limits
    deadline = loop.time() + settings.first_message_s  # until its first message
    first = True
    while True:
        try:  # not receive(timeout=): aiohttp restarts that at every pong
            async with asyncio.timeout_at(deadline):
                message = await ws.receive()
        except TimeoutError:
            if not first and session.turns.busy():  # the user listens to a reply
                deadline = loop.time() + settings.idle_timeout_s
                continue
            waited = settings.first_message_s if first else settings.idle_timeout_s
            what = "no message since it connected" if first else "no message"
            refusal = RefusalError("idle_timeout", f"{what} for {waited:g} s", close=True)
            await _refuse(ws, refusal, metrics)
            return
        if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return  # closed, or a broken connection
        deadline = loop.time() + settings.idle_timeout_s
        refusal = None
        try:
            if first:
                first = False
                talked()
            limits.message()
            if message.type == WSMsgType.TEXT:
                await session.on_text(message.data)
            else:
                limits.audio_seconds(max(len(message.data) - 1, 0) / 2 / INPUT_RATE)
                await session.on_binary(message.data)
        except ProtocolError as error:  # the client's mistake: say so, keep serving
            refusal = _counted(RefusalError("bad_request", str(error)), limits)
        except RefusalError as error:
            refusal = error
        except Exception as error:  # Triton down, a model failing: say so, keep serving
            log.exception("session %s", session.turns.affinity)
            refusal = _client_error(error)
            if refusal.code == "internal":  # a message the gateway could not serve
                refusal = _counted(refusal, limits)
        if refusal is not None:
            await _refuse(ws, refusal, metrics)
            if refusal.close:
                return


def _counted(refusal: RefusalError, limits: ConnectionLimits) -> RefusalError:
    """A bad message's refusal, or the closing one when the connection made too many."""
    try:
        limits.bad_message()
    except RefusalError as too_many:
        return too_many
    return refusal


async def access_token(request: web.Request) -> web.Response:
    """POST /access-token: a short-lived token for a page of an allowed origin."""
    edge = request.app[EDGE]
    try:
        token = edge.access.mint(request.headers)
    except RefusalError as refusal:
        edge.metrics.refused(refusal.code)
        return web.json_response(protocol.error(refusal.code, refusal.message), status=403)
    headers = {
        "Cache-Control": "no-store",
        "Vary": "Origin",
        "Access-Control-Allow-Origin": request.headers["Origin"],  # allowed: checked above
    }
    body = {
        "token": token,
        "protocols": [SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + token],
        "expires_in_s": TOKEN_TTL_S,
    }
    return web.json_response(body, headers=headers)


async def metrics(request: web.Request) -> web.Response:
    text = request.app[EDGE].metrics.render()
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


def create_app(
    triton_url: str,
    options: SessionOptions | None = None,
    portrait: Path | None = None,
    *,
    edge: Edge | None = None,
    triton_access: TritonAccess | None = None,
    triton: TritonClient | None = None,
) -> web.Application:
    """`portrait`: a rig folder (rig.json + photo.png, export/portrait) for the page's
    WebGL portrait; None: the page draws its cartoon face. `edge`: access and limits
    (default: from the environment); `triton_access`: the key and TLS to Triton; `triton`:
    a client to use instead of connecting to `triton_url` (tests)."""
    logging.getLogger("aiohttp.server").addFilter(_PARSER_REFUSALS)  # once: a set
    app = web.Application(client_max_size=MAX_MESSAGE_BYTES, middlewares=[allowed_host])
    app[OPTIONS] = options = options or SessionOptions()
    app[PASSES] = PassBudget(
        options.partial_limit, options.pause_first, options.partial_max_answering
    )
    app[PORTRAIT] = Path(portrait) if portrait is not None else None
    app[EDGE] = edge or Edge.from_environment()
    access = triton_access or TritonAccess()

    async def lifespan(app: web.Application):
        lag = app[EDGE].metrics.lag
        lag.start()
        if triton is not None:
            app[TRITON] = triton
            yield
            lag.stop()
            return
        client = access.client(triton_url)
        app[TRITON] = TritonClient(
            client, avatar_model=options.model, asr_model=options.asr_model, headers=access.headers
        )
        check = asyncio.create_task(check_sessions(app[TRITON], app[EDGE].tokens))
        yield
        check.cancel()
        lag.stop()
        await client.close()

    app.cleanup_ctx.append(lifespan)
    app.router.add_get("/", page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/access-token", access_token)
    app.router.add_get("/ws", websocket)
    app.router.add_get("/portrait/info", portrait_info)
    app.router.add_get(r"/portrait/{name:rig\.json|photo\.png}", portrait_file)
    app.router.add_static("/static/", STATIC)
    return app


async def check_sessions(triton: TritonClient, tokens: ConversationTokens) -> None:
    """At start, once Triton's `avatar` model is ready: whether it accepts the sessions this
    gateway signs (the two need the same AVATAR_SESSION_SECRET); an error in the log when
    not, and every turn then ends with `session_rejected`."""
    while True:
        try:
            if await triton.model_ready(triton.avatar_model):
                break
        except Exception:  # not reachable yet
            pass
        await asyncio.sleep(2.0)
    try:
        accepted = await triton.sessions_accepted(tokens.mint())
    except Exception as error:  # the check is advice: the turns say the rest
        log.warning("could not check that Triton accepts this gateway's sessions: %r", error)
        return
    if not accepted:
        log.error(
            "Triton does not accept the sessions this gateway signs: give the gateway the "
            "server's session secret ($AVATAR_SESSION_SECRET or $AVATAR_SESSION_SECRET_FILE); "
            "until then every turn ends with session_rejected"
        )
    else:
        log.info("Triton accepts this gateway's sessions")


def ssl_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The gateway's TLS (--tls-cert/--tls-key, PEM); None without a certificate."""
    if cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def run(
    triton_url: str,
    options: SessionOptions,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    portrait: Path | None = None,
    edge: Edge | None = None,
    triton_access: TritonAccess | None = None,
    tls: ssl.SSLContext | None = None,
) -> None:
    edge = edge or Edge.from_environment()
    scheme = "https" if tls else "http"
    log.info("gateway on %s://%s:%d -> Triton %s", scheme, host, port, triton_url)
    if not edge.access.has_key:
        log.warning(
            "no operator key ($%s): clients without an Origin (scripts, services) connect "
            "unauthenticated; browsers still need an access token",
            KEY_ENV,
        )
    if portrait is not None:
        missing = missing_rig_files(portrait)
        if missing:  # served anyway: /portrait/info says unavailable, the page draws a cartoon
            log.warning("portrait %s lacks %s: the page will draw its cartoon", portrait, missing)
        else:
            log.info("portrait rig: %s", portrait)
    app = create_app(triton_url, options, portrait, edge=edge, triton_access=triton_access)
    web.run_app(app, host=host, port=port, ssl_context=tls)
