"""The broadcast's local web server: the HLS preview of what goes on air (the output's
playlist and segments, remuxed from the same packets), the operator's chat input
(broadcast.chat.web: the operator key) and `/health` with the show's and the output's
figures.

    GET /                      a page that plays the preview (hls.js is not bundled: Safari
                               plays HLS natively; elsewhere open /preview/index.m3u8 in VLC
                               or ffplay)
    GET /preview/index.m3u8    the playlist; /preview/segment_NNNNN.ts its segments
    GET /health                200 {"on_air": true, ...} while ticks are written, else 503
    /chat/...                  the chat input (broadcast/chat/web.py)
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from broadcast.chat.queue import ChatQueue
from broadcast.chat.web import add_chat_routes

log = logging.getLogger(__name__)

PREVIEW_FILES = r"{name:(index\.m3u8|segment_\d{1,9}\.ts)}"
STALL_S = 5.0  # no tick written for this long: /health says the broadcast is down
_PAGE = """<!doctype html><meta charset="utf-8"><title>On air: preview</title>
<style>body{background:#111;color:#ddd;font:15px sans-serif;margin:2em}</style>
<h1>On air</h1><video src="preview/index.m3u8" controls autoplay muted width="512"></video>
<p>The stream as it goes on air, a few seconds behind (HLS). Where the browser does not play
HLS, open <a href="preview/index.m3u8">preview/index.m3u8</a> in VLC or
<code>ffplay</code>.</p>"""


def _finite(values: dict[str, Any]) -> dict[str, Any]:
    """JSON cannot carry NaN: figures with no data yet become null."""
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()
    }


def broadcast_app(
    queue: ChatQueue,
    operator_key: str | None,
    *,
    preview_dir: Path | None,
    status: Callable[[], dict[str, Any]],
    host: str = "127.0.0.1",
) -> web.Application:
    """The app; `status()` returns the show's figures, with "ticks" and "last_tick_at"
    (monotonic) among them."""
    app = web.Application(client_max_size=64 * 1024)
    add_chat_routes(app, queue, operator_key, host=host)

    async def page(_request: web.Request) -> web.StreamResponse:
        return web.Response(text=_PAGE, content_type="text/html")

    async def preview(request: web.Request) -> web.StreamResponse:
        if preview_dir is None:
            raise web.HTTPNotFound(text="this broadcast has no preview (--no-preview)")
        path = preview_dir / request.match_info["name"]
        if not path.is_file():  # a segment already rotated out of the playlist
            raise web.HTTPNotFound(text="no such preview file (yet)")
        content_type = "application/vnd.apple.mpegurl" if path.suffix == ".m3u8" else "video/mp2t"
        headers = {"Cache-Control": "no-cache"} if path.suffix == ".m3u8" else {}
        return web.Response(body=path.read_bytes(), content_type=content_type, headers=headers)

    async def health(_request: web.Request) -> web.StreamResponse:
        figures = status()
        last = figures.get("last_tick_at")
        on_air = last is not None and time.monotonic() - last < STALL_S
        body = _finite({"on_air": on_air, **figures})
        return web.json_response(body, status=200 if on_air else 503)

    app.add_routes(
        [
            web.get("/", page),
            web.get(f"/preview/{PREVIEW_FILES}", preview),
            web.get("/health", health),
        ]
    )
    return app


def stats_json(stats: Any) -> dict[str, Any]:
    """A stats dataclass (PacedStats, OutputStats) as JSON-safe numbers."""
    return _finite(dataclasses.asdict(stats))
