"""`python -m perf flood --url http://127.0.0.1:8080`: flood a running gateway while one
normal session keeps talking, and say whether its turns kept their latency.

The normal session (one WebSocket, opened first, as a user who was already there) asks
typed and spoken questions (the spoken ones streamed in real time) and times each turn's
first `sentence`: from the `text` message, or from `speech_end` for a spoken one. It does
this once alone and once while the flood runs:

- `sockets`: connections opened in a loop and held (the caps refuse them: HTTP 429);
- `fast audio`: noise sent as fast as the socket takes it (the audio bucket closes them:
  4429 once the 2-s burst is spent), reconnecting;
- `bad frames`: junk binary and text frames (4400 after 20, or 4429 on the message rate).

Prints median and p95 of the normal session's time to first sentence, alone and flooded,
the flood's refusals by close code and the gateway's /metrics refusal counters.
Operator key: $AVATAR_GATEWAY_KEY (sent by every connection when set).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import multiprocessing
import os
import time

import numpy as np

from avatar.credentials import gateway_key_headers
from avatar.live_protocol import INPUT_RATE, mic_message
from avatar.vad import CHUNK
from gateway import metrics as prometheus

log = logging.getLogger(__name__)
QUESTIONS = ("What time does the museum open?", "Tell me one fun fact about owls.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway's base URL")
    parser.add_argument("--turns", type=int, default=6, help="normal turns per phase")
    parser.add_argument("--spoken", type=int, default=2, help="of which spoken (real time)")
    parser.add_argument("--sockets", type=int, default=100, help="connections the flood holds")
    parser.add_argument(
        "--connect-rate",
        type=float,
        default=0.0,
        help="connection attempts a second of the sockets attacker (0: as fast as it can; "
        "e.g. what an ingress in front lets through)",
    )
    parser.add_argument("--fast-audio", type=int, default=4, help="fast-audio connections")
    parser.add_argument("--bad-frames", type=int, default=4, help="bad-frame connections")
    parser.set_defaults(func=main)


def _ws(url: str) -> str:
    return url.replace("http", "ws", 1).rstrip("/") + "/ws"


class Normal:
    """The normal session: one connection, its turns' times to first sentence (ms)."""

    def __init__(self, ws, spoken_audio: list[np.ndarray]) -> None:
        self.ws, self.spoken_audio = ws, spoken_audio
        self.events: asyncio.Queue = asyncio.Queue()

    async def listen(self) -> None:
        import aiohttp

        async for message in self.ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                await self.events.put((time.perf_counter(), json.loads(message.data)))

    async def _until(self, kind: str, timeout_s: float = 180.0) -> float:
        while True:
            at, message = await asyncio.wait_for(self.events.get(), timeout_s)
            if message["type"] == "error":
                log.warning("normal session: %s", message)
            if message["type"] == kind:
                return at

    async def turn(self, number: int, spoken: bool) -> float:
        if spoken:
            audio = self.spoken_audio[number % len(self.spoken_audio)]
            silence = np.zeros(int(1.2 * INPUT_RATE), np.float32)
            signal = np.concatenate([audio, silence])
            step = 4 * CHUNK  # 128 ms a message, in real time
            started = time.perf_counter()
            for i in range(0, len(signal), step):
                await self.ws.send_bytes(mic_message(signal[i : i + step]))
                await asyncio.sleep(
                    max(0.0, started + (i + step) / INPUT_RATE - time.perf_counter())
                )
            began = await self._until("speech_end")
        else:
            began = time.perf_counter()
            await self.ws.send_json({"type": "text", "text": QUESTIONS[number % len(QUESTIONS)]})
        first = await self._until("sentence")
        await self._until("turn_end")
        return (first - began) * 1000

    async def phase(self, turns: int, spoken: int) -> list[float]:
        times = []
        for number in range(turns):
            times.append(await self.turn(number, spoken=number < spoken))
            await asyncio.sleep(0.5)
        return times


class Flood:
    """The attackers; `closes` counts how the gateway ended their connections."""

    def __init__(self, url: str, http) -> None:
        self.url, self.http = _ws(url), http
        self.closes: collections.Counter[str] = collections.Counter()
        self.held: list = []

    async def _connect(self):
        import aiohttp

        try:
            return await self.http.ws_connect(self.url, headers=gateway_key_headers())
        except aiohttp.WSServerHandshakeError as error:  # refused before the upgrade
            self.closes[f"HTTP {error.status}"] += 1
        except aiohttp.ClientError:
            self.closes["connect failed"] += 1
        return None

    async def _ended(self, ws) -> None:
        await ws.close()
        self.closes[str(ws.close_code)] += 1

    async def sockets(self, count: int, rate: float = 0.0) -> None:
        import aiohttp

        while True:
            if rate:
                await asyncio.sleep(1 / rate)
            ws = await self._connect()
            if ws is None:
                continue
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.TEXT and '"ready"' in message.data:
                self.held.append(ws)
            else:  # the error, then the close
                await ws.receive()
                await self._ended(ws)
            while len(self.held) >= count:
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.02)

    async def fast_audio(self) -> None:
        noise = np.random.default_rng(0).uniform(-0.8, 0.8, 16_000).astype(np.float32)
        frame = mic_message(noise)  # 1 s of loud noise a message
        await self._pound([frame], pause_s=0.0)

    async def bad_frames(self) -> None:
        await self._pound([b"\x07garbage", "{not json"], pause_s=0.01)

    async def _pound(self, messages: list[bytes | str], pause_s: float) -> None:
        """Connect, send `messages` over and over until the gateway closes, again."""
        while True:
            ws = await self._connect()
            if ws is None:
                await asyncio.sleep(0.1)
                continue
            try:
                while not ws.closed:
                    for message in messages:
                        send = ws.send_bytes if isinstance(message, bytes) else ws.send_str
                        await send(message)
                    await asyncio.sleep(pause_s)
            except (ConnectionError, RuntimeError):
                pass
            await self._ended(ws)
            await asyncio.sleep(0.1)


def _attack(args: argparse.Namespace, stop, results) -> None:
    """The flood, in its own process at the lowest priority: on this machine the attacker
    shares the server's cores, and an attacker elsewhere would not take them."""
    import aiohttp

    os.nice(19)

    async def flood() -> None:
        async with aiohttp.ClientSession() as http:
            attack = Flood(args.url, http)
            tasks = [asyncio.create_task(attack.fast_audio()) for _ in range(args.fast_audio)]
            tasks += [asyncio.create_task(attack.bad_frames()) for _ in range(args.bad_frames)]
            await asyncio.sleep(0.5)  # they connect first; the held sockets take what is left
            tasks.append(asyncio.create_task(attack.sockets(args.sockets, args.connect_rate)))
            while not stop.is_set():
                await asyncio.sleep(0.2)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            held = len(attack.held)
            for ws in attack.held:
                await ws.close()
            results.put((dict(attack.closes), held))

    asyncio.run(flood())


async def _metrics(http, url: str) -> dict[str, float]:
    async with http.get(url.rstrip("/") + "/metrics", headers=gateway_key_headers()) as response:
        return prometheus.parse(await response.text())


def _figures(times: list[float]) -> str:
    return (
        f"median {np.median(times):.0f} ms, p95 {np.percentile(times, 95):.0f} ms (n={len(times)})"
    )


async def run(args: argparse.Namespace) -> dict:
    import aiohttp

    from evals.clips import clips

    spoken_audio = [clip.audio for clip in clips(2)] if args.spoken else []
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(
            _ws(args.url), headers=gateway_key_headers(), max_msg_size=1 << 24
        )
        normal = Normal(ws, spoken_audio)
        listener = asyncio.create_task(normal.listen())
        await normal._until("ready")
        alone = await normal.phase(args.turns, args.spoken)
        before = await _metrics(http, args.url)
        stop, results = multiprocessing.Event(), multiprocessing.Queue()
        attacker = multiprocessing.Process(target=_attack, args=(args, stop, results))
        attacker.start()
        await asyncio.sleep(3.0)  # the flood is on
        flooded = await normal.phase(args.turns, args.spoken)
        stop.set()
        closes, held = await asyncio.to_thread(results.get, timeout=60)
        await asyncio.to_thread(attacker.join, 30)
        after = await _metrics(http, args.url)
        listener.cancel()
        await ws.close()
    refusals = {
        name.split('"')[1]: after[name] - before.get(name, 0.0)
        for name in after
        if name.startswith("avatar_gateway_refusals_total")
    }
    return {
        "alone_ms": alone,
        "flooded_ms": flooded,
        "closes": closes,
        "held": held,
        "refusals": {k: v for k, v in refusals.items() if v},
    }


def main(args: argparse.Namespace) -> int:
    result = asyncio.run(run(args))
    print(f"normal session, time to first sentence, alone:   {_figures(result['alone_ms'])}")
    print(f"normal session, time to first sentence, flooded: {_figures(result['flooded_ms'])}")
    print(
        f"flood sockets admitted: {result['held']}; connections ended by code: {result['closes']}"
    )
    print(f"gateway refusals during the flood (/metrics): {result['refusals']}")
    print(json.dumps(result))
    return 0
