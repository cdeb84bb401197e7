"""Going on air: the pieces of one broadcast put together and run until stopped. The output
(PyAV to an RTMP/SRT URL, paced at real time, with its HLS preview), the show (the served
`avatar` turns, `avatar_say` and the renderer, through Triton with the operator's access),
the chat queue fed by the operator's HTTP/WebSocket input and an IRC channel, and the local
server (preview, chat, /health).

Secrets never travel in argv (`ps` shows it): the platform's stream key is
$AVATAR_STREAM_KEY or the file $AVATAR_STREAM_KEY_FILE names, appended to the URL as its last
path part; the IRC password $AVATAR_IRC_PASSWORD(_FILE); the operator key
$AVATAR_GATEWAY_KEY(_FILE); Triton's key $AVATAR_API_KEY(_FILE).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from avatar.credentials import read_secret
from broadcast.anchor import RENDERERS, Anchor
from broadcast.chat.irc import PASSWORD_ENV, IrcChat, IrcSettings
from broadcast.chat.queue import ChatQueue
from broadcast.chat.web import operator_key_from_environment
from broadcast.output import (
    AVOutput,
    OutputError,
    PacedOutput,
    StreamFormat,
    container_format,
    redact,
)
from broadcast.server import broadcast_app, stats_json
from broadcast.show import RENDER_TICKS, QuestionRecord, Show, mark_of
from gateway.triton_client import TritonAccess

log = logging.getLogger(__name__)

STREAM_KEY_ENV = "AVATAR_STREAM_KEY"  # or the file $AVATAR_STREAM_KEY_FILE names
STATUS_EVERY_S = 30.0


class BroadcastError(Exception):
    """Why the broadcast cannot start or stopped, in words for the operator."""


@dataclasses.dataclass(frozen=True)
class BroadcastSettings:
    url: str  # rtmp://host/app/stream (the key may come from $AVATAR_STREAM_KEY)
    face: str = "portrait"
    fps: int = 25
    irc: str = ""  # irc://host:port/#channel
    irc_nick: str = "anchor"
    host: str = "127.0.0.1"  # the local server's address (preview, chat, /health)
    preview_port: int = 8090  # 0: no local server
    max_tokens: int = 0  # 0: the avatar model's default reply length
    seed: int = 0
    # how far the show renders ahead of the air: what absorbs the CPU burst of a question
    # (the LLM's first sentence and the voices start while frames render); on 2 shared
    # cores 8 ticks (0.32 s) underflowed at each question, 25 did not (docs/broadcast.md)
    ahead_s: float = 1.0


def add_broadcast_arguments(parser: argparse.ArgumentParser) -> None:
    """The broadcast's flags, on `avatar broadcast` and `python -m broadcast`."""
    defaults = BroadcastSettings("")
    parser.add_argument(
        "--url",
        default="",
        help="where to push: rtmp://host[:port]/app[/stream] (FLV), srt:// or udp:// "
        f"(MPEG-TS), or a .flv/.ts file; a platform's stream key goes in ${STREAM_KEY_ENV} "
        f"or the file ${STREAM_KEY_ENV}_FILE names (appended as the URL's last part)",
    )
    parser.add_argument("--face", choices=sorted(RENDERERS), default=defaults.face)
    parser.add_argument("--fps", type=int, choices=(25, 30), default=defaults.fps)
    parser.add_argument(
        "--irc",
        default="",
        metavar="URL",
        help="also take questions from an IRC channel: irc://host:port/#channel (ircs:// for "
        f"TLS; Twitch: ircs://irc.chat.twitch.tv:6697/#name, token in ${PASSWORD_ENV})",
    )
    parser.add_argument("--irc-nick", default=defaults.irc_nick, help="the anchor's IRC nick")
    parser.add_argument(
        "--preview-port",
        type=int,
        default=defaults.preview_port,
        help="the local server: HLS preview, the chat input, /health (0: none)",
    )
    parser.add_argument(
        "--preview-host",
        default=defaults.host,
        help="its address (not loopback: the chat input needs $AVATAR_GATEWAY_KEY)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=0, help="reply length (0: the model's default)"
    )
    parser.add_argument(
        "--ahead-s",
        type=float,
        default=defaults.ahead_s,
        help="how far frames are rendered ahead of the air: more absorbs CPU bursts, less "
        "answers sooner",
    )
    parser.add_argument("--seed", type=int, default=0)


def settings_from_args(args: argparse.Namespace) -> BroadcastSettings:
    return BroadcastSettings(
        url=args.url,
        face=args.face,
        fps=args.fps,
        irc=args.irc,
        irc_nick=args.irc_nick,
        host=args.preview_host,
        preview_port=args.preview_port,
        max_tokens=args.max_tokens,
        seed=args.seed,
        ahead_s=args.ahead_s,
    )


def output_url(url: str, env: dict[str, str] | None = None) -> str:
    """`url` checked (BroadcastError says what is expected), with the stream key of the
    environment appended for RTMP."""
    try:
        container_format(url)
    except ValueError as error:
        raise BroadcastError(str(error)) from None
    parts = urlsplit(url)
    if parts.scheme in ("rtmp", "rtmps"):
        if not parts.hostname:
            raise BroadcastError(f"{url!r} names no host: expected rtmp://host[:port]/app/stream")
        if parts.path.strip("/") == "":
            raise BroadcastError(f"{url!r} names no application: rtmp://host/app/stream")
    try:
        key = read_secret(STREAM_KEY_ENV, env)
    except ValueError as error:
        raise BroadcastError(str(error)) from None
    if key and parts.scheme in ("rtmp", "rtmps"):
        return f"{url.rstrip('/')}/{key}"
    return url


def check_irc(settings: BroadcastSettings) -> IrcSettings | None:
    if not settings.irc:
        return None
    try:
        return IrcSettings.from_url(settings.irc, settings.irc_nick)
    except ValueError as error:
        raise BroadcastError(str(error)) from None


class Broadcast:
    """One broadcast's parts, open between `start` and `close`."""

    def __init__(self, settings: BroadcastSettings, triton_url: str, access: TritonAccess):
        self.settings, self.triton_url, self.access = settings, triton_url, access
        self.url = output_url(settings.url)
        self.irc = check_irc(settings)
        self.format = StreamFormat(fps=settings.fps)
        self.queue = ChatQueue()
        self.started_at = 0.0
        self._stack = contextlib.AsyncExitStack()
        self.show: Show | None = None
        self.paced: PacedOutput | None = None
        self.port = 0  # the local server's, once started

    async def start(self) -> None:
        stack = self._stack
        client = self.access.client(self.triton_url)
        stack.push_async_callback(client.close)
        controls: dict[str, Any] = {"fps": float(self.settings.fps), "seed": self.settings.seed}
        if self.settings.max_tokens:
            controls["max_tokens"] = self.settings.max_tokens
        anchor = Anchor(
            client, headers=self.access.headers, face=self.settings.face, controls=controls
        )
        try:
            missing = await anchor.ready()
        except Exception as error:
            raise BroadcastError(f"Triton at {self.triton_url} is unreachable ({error})") from None
        if missing:
            raise BroadcastError(f"Triton at {self.triton_url} does not serve {missing} (ready)")
        preview_dir = None
        if self.settings.preview_port:
            preview_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="onair-")))
        try:
            output = await asyncio.to_thread(AVOutput, self.url, self.format, preview_dir)
        except OutputError as error:
            raise BroadcastError(
                f"{error}: is the RTMP/SRT server running and the URL (and stream key) right?"
            ) from None
        ahead = max(RENDER_TICKS, round(self.settings.ahead_s * self.format.fps))
        self.paced = PacedOutput(output, queue_ticks=ahead)
        stack.push_async_callback(asyncio.to_thread, _close_output, self.paced)
        self.show = Show(
            anchor,
            self.queue,
            self.paced,
            fps=self.format.fps,
            width=self.format.width,
            height=self.format.height,
            sample_rate=self.format.sample_rate,
            seed=self.settings.seed,
            prefill_ticks=ahead // RENDER_TICKS * RENDER_TICKS // 2 or RENDER_TICKS,
            # thinned as soon as the renderer falls a batch short of the full queue, so a
            # slow CPU keeps its queue near full between questions, not near half
            low_water_ticks=ahead - RENDER_TICKS,
        )
        if self.settings.preview_port:
            await self._serve(preview_dir)
        if self.irc is not None:
            try:
                password = read_secret(PASSWORD_ENV)
            except ValueError as error:  # the file $AVATAR_IRC_PASSWORD_FILE names is unreadable
                raise BroadcastError(str(error)) from None
            chat = IrcChat(self.irc, password)
            reading = chat.run(self.queue.offer, self.queue.withdraw_viewer)
            task = asyncio.create_task(reading, name="irc")
            stack.callback(task.cancel)
        self.started_at = time.monotonic()

    async def _serve(self, preview_dir: Path | None) -> None:
        try:  # without an operator key the chat input serves only a loopback address
            app = broadcast_app(
                self.queue,
                operator_key_from_environment(),
                preview_dir=preview_dir,
                status=self.status,
                host=self.settings.host,
            )
        except ValueError as error:
            raise BroadcastError(str(error)) from None
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, self.settings.host, self.settings.preview_port)
        try:
            await site.start()
        except OSError as error:
            raise BroadcastError(
                f"the preview server cannot listen on {self.settings.host}:"
                f"{self.settings.preview_port} ({error.strerror}): pick --preview-port"
            ) from None
        self.port = runner.addresses[0][1]

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ticks": 0, "last_tick_at": None}
        if self.show is not None:
            out.update(self.show.stats())
            out["records"] = [self._record_json(r) for r in list(self.show.records)[-20:]]
        if self.paced is not None:
            paced = stats_json(self.paced.stats)
            out["output"] = paced
            out["encoder"] = stats_json(self.paced.output.stats)
            written = self.paced.output.times(self.paced.output.tick - 1)
            out["last_tick_at"] = written.written if written else None
        out["pending_questions"] = len(self.queue.pending())
        return out

    def _record_json(self, record: QuestionRecord) -> dict[str, Any]:
        """A question's record with the output's times of its first ticks (when each was
        written to the encoder and its packets came out: monotonic, like the record's)."""
        out = record.to_json()
        for kind in ("attribution", "answer"):
            times = self.paced.mark_times(mark_of(record.id, kind)) if self.paced else None
            out[f"{kind}_output"] = dataclasses.asdict(times) if times else None
        return out

    async def run(self, stop: asyncio.Event) -> None:
        """The show until `stop` is set; BroadcastError when the output fails for good."""
        assert self.show is not None
        show = asyncio.create_task(self.show.run(), name="show")
        stopped = asyncio.create_task(stop.wait())
        reporting = asyncio.create_task(self._report())
        try:
            await asyncio.wait({show, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (show, stopped, reporting):
                task.cancel()
            results = await asyncio.gather(show, stopped, reporting, return_exceptions=True)
        if isinstance(results[0], OutputError):
            raise BroadcastError(str(results[0]))
        if isinstance(results[0], BaseException) and not isinstance(
            results[0], asyncio.CancelledError
        ):
            raise results[0]

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(STATUS_EVERY_S)
            figures = self.status()
            log.info(
                "on air %.0f s: %d ticks, %s underflows, %d questions answered, %d pending",
                time.monotonic() - self.started_at,
                figures["ticks"],
                figures.get("output", {}).get("underflows"),
                figures.get("questions", 0),
                figures["pending_questions"],
            )

    async def close(self) -> None:
        await self._stack.aclose()


def _close_output(paced: PacedOutput) -> None:
    """Finish the stream: what is queued is written (a started output), the encoders flushed."""
    if paced.clock.started:
        paced.close()
    else:  # it failed before its first ticks: nothing to drain
        paced.output.close()


async def on_air(
    settings: BroadcastSettings, triton_url: str, access: TritonAccess, stop: asyncio.Event
) -> None:
    """Broadcast until `stop` is set; BroadcastError says why it could not."""
    broadcast = Broadcast(settings, triton_url, access)
    try:
        await broadcast.start()
        log.info(
            "on air: %s (%s, %d fps)%s",
            redact(broadcast.url),
            settings.face,
            settings.fps,
            f"; preview and chat on http://{settings.host}:{broadcast.port}/"
            if broadcast.port
            else "",
        )
        await broadcast.run(stop)
    finally:
        await broadcast.close()
