"""aiohttp application: GET / (the page), GET /static/*, GET /ws (the protocol), /healthz.

aiohttp because the project already depends on it (tritonclient's asyncio HTTP client), it
serves HTTP, WebSockets and static files in one small library, and its asyncio loop is the
one the asyncio gRPC client of tritonclient runs on: one thread, no bridging.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import WSMsgType, web

from gateway.protocol import ProtocolError
from gateway.session import LiveSession, SessionOptions

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
MAX_MESSAGE_BYTES = 1 << 20
TRITON = web.AppKey("triton", object)
OPTIONS = web.AppKey("options", SessionOptions)


async def page(_request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def healthz(request: web.Request) -> web.Response:
    """200 when Triton answers and `vad` and `avatar` are ready, else 503 with the reason."""
    client = request.app[TRITON]
    try:
        missing = [
            m for m in ("vad", request.app[OPTIONS].model) if not await client.is_model_ready(m)
        ]
    except Exception as error:  # Triton unreachable
        return web.json_response({"ready": False, "error": str(error)}, status=503)
    if missing:
        return web.json_response({"ready": False, "not_ready": missing}, status=503)
    return web.json_response({"ready": True})


async def websocket(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=20.0)
    await ws.prepare(request)
    session = LiveSession(request.app[TRITON], ws.send_json, ws.send_bytes, request.app[OPTIONS])
    log.info("session %s connected from %s", session.session_id, request.remote)
    await session.hello()
    try:
        async for message in ws:
            try:
                if message.type == WSMsgType.TEXT:
                    await session.on_text(message.data)
                elif message.type == WSMsgType.BINARY:
                    await session.on_binary(message.data)
                elif message.type == WSMsgType.ERROR:
                    break
            except ProtocolError as error:  # the client's mistake: say so, keep serving
                await ws.send_json({"type": "error", "message": str(error)})
            except Exception as error:  # Triton down, a model failing: say so, keep serving
                log.exception("session %s", session.session_id)
                await ws.send_json({"type": "error", "message": f"server: {error}"})
    finally:
        await session.close()
        log.info("session %s closed", session.session_id)
    return ws


def create_app(triton_url: str, options: SessionOptions | None = None) -> web.Application:
    import tritonclient.grpc.aio as grpcclient

    app = web.Application(client_max_size=MAX_MESSAGE_BYTES)
    app[OPTIONS] = options or SessionOptions()

    async def lifespan(app: web.Application):
        app[TRITON] = grpcclient.InferenceServerClient(triton_url)
        yield
        await app[TRITON].close()

    app.cleanup_ctx.append(lifespan)
    app.router.add_get("/", page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/ws", websocket)
    app.router.add_static("/static/", STATIC)
    return app


def run(triton_url: str, host: str = "0.0.0.0", port: int = 8080, **options) -> None:
    log.info("gateway on http://%s:%d -> Triton %s", host, port, triton_url)
    web.run_app(create_app(triton_url, SessionOptions(**options)), host=host, port=port)
