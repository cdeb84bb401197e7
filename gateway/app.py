"""aiohttp application: GET / (the page), GET /static/*, GET /ws (the protocol), /healthz,
and the portrait rig the page draws with WebGL (GET /portrait/info, /portrait/rig.json,
/portrait/photo.png; `--portrait DIR`).

aiohttp because the project already depends on it (tritonclient's asyncio HTTP client), it
serves HTTP, WebSockets and static files in one small library, and its asyncio loop is the
one the asyncio gRPC client of tritonclient runs on: one thread, no bridging.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import WSMsgType, web

from avatar.live_protocol import ProtocolError
from gateway.hearing import PassBudget
from gateway.options import SessionOptions
from gateway.session import LiveSession
from gateway.triton_client import TritonClient

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
MAX_MESSAGE_BYTES = 1 << 20
TRITON = web.AppKey("triton", TritonClient)
OPTIONS = web.AppKey("options", SessionOptions)
PASSES = web.AppKey("passes", PassBudget)  # the ASR passes of all its sessions
PORTRAIT = web.AppKey("portrait", object)  # Path | None: the rig folder
PORTRAIT_FILES = {"rig.json": "application/json", "photo.png": "image/png"}


async def page(_request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def healthz(request: web.Request) -> web.Response:
    """200 when Triton answers and `vad` and `avatar` are ready, else 503 with the reason."""
    try:
        missing = await request.app[TRITON].not_ready()
    except Exception as error:  # Triton unreachable
        return web.json_response({"ready": False, "error": str(error)}, status=503)
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


async def websocket(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=20.0)
    await ws.prepare(request)
    app = request.app
    session = LiveSession(
        app[TRITON], ws.send_json, ws.send_bytes, app[OPTIONS], budget=app[PASSES]
    )
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


def create_app(
    triton_url: str, options: SessionOptions | None = None, portrait: Path | None = None
) -> web.Application:
    """`portrait`: a rig folder (rig.json + photo.png, export/portrait) for the page's
    WebGL portrait; None: the page draws its cartoon face."""
    import tritonclient.grpc.aio as grpcclient

    app = web.Application(client_max_size=MAX_MESSAGE_BYTES)
    app[OPTIONS] = options = options or SessionOptions()
    app[PASSES] = PassBudget(options.partial_limit, options.pause_first)
    app[PORTRAIT] = Path(portrait) if portrait is not None else None

    async def lifespan(app: web.Application):
        client = grpcclient.InferenceServerClient(triton_url)
        app[TRITON] = TritonClient(client, avatar_model=options.model, asr_model=options.asr_model)
        yield
        await client.close()

    app.cleanup_ctx.append(lifespan)
    app.router.add_get("/", page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/ws", websocket)
    app.router.add_get("/portrait/info", portrait_info)
    app.router.add_get(r"/portrait/{name:rig\.json|photo\.png}", portrait_file)
    app.router.add_static("/static/", STATIC)
    return app


def run(
    triton_url: str,
    options: SessionOptions,
    host: str = "0.0.0.0",
    port: int = 8080,
    *,
    portrait: Path | None = None,
) -> None:
    log.info("gateway on http://%s:%d -> Triton %s", host, port, triton_url)
    if portrait is not None:
        missing = missing_rig_files(portrait)
        if missing:  # served anyway: /portrait/info says unavailable, the page draws a cartoon
            log.warning("portrait %s lacks %s: the page will draw its cartoon", portrait, missing)
        else:
            log.info("portrait rig: %s", portrait)
    app = create_app(triton_url, options, portrait)
    web.run_app(app, host=host, port=port)
