"""Reference client of the live WebSocket protocol (docs/protocol.md): speaks a WAV to the
avatar as a microphone would and collects the reply. The example for engine integrations.

    python -m clients.live question.wav --url ws://127.0.0.1:8080/ws --out reply.wav

The WAV (any rate, mono or stereo) is resampled to 16 kHz and sent in 32-ms MIC frames at
real-time pace, then silence until the turn ends, as a live microphone keeps sending. The
reply's audio is placed on the turn clock (each AUDIO frame's start_s) and its ARKit-52
frames are kept with their times.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np

from avatar.credentials import gateway_key_headers
from avatar.live_protocol import INPUT_RATE, Audio, Frames, mic_message, parse_server_binary

log = logging.getLogger("clients.live")
CHUNK_S = 0.032


@dataclasses.dataclass
class LiveReply:
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    audio: list[Audio] = dataclasses.field(default_factory=list)
    audio_arrived: list[float] = dataclasses.field(default_factory=list)  # perf_counter
    frames: list[Frames] = dataclasses.field(default_factory=list)
    # client clock (perf_counter) of events: "speech_sent_end", "interrupt", "first_audio"...
    # Per-turn keys count the turns in the order they answered ("first_audio_turn1" is the
    # first answered turn's): a discarded speculative turn leaves a gap in turn numbers.
    at: dict[str, float] = dataclasses.field(default_factory=dict)
    turn_order: dict[int, int] = dataclasses.field(default_factory=dict)  # number -> 1, 2...

    def ordinal(self, turn: int) -> int:
        return self.turn_order.setdefault(turn, len(self.turn_order) + 1)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == kind]

    def reply_audio(self, turn: int | None = None) -> tuple[np.ndarray, int]:
        chunks = [a for a in self.audio if turn is None or a.turn == turn]
        if not chunks:
            return np.zeros(0, np.float32), 22050
        rate = chunks[0].sample_rate
        end = max(round(a.start_s * rate) + len(a.pcm) for a in chunks)
        out = np.zeros(end, np.float32)
        for a in chunks:
            at = round(a.start_s * rate)
            out[at : at + len(a.pcm)] += a.pcm
        return out, rate


def read_wav(path: Path) -> np.ndarray:
    """Any PCM WAV -> float32 mono at 16 kHz."""
    from scipy.signal import resample_poly

    with wave.open(str(path)) as w:
        rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
        raw = w.readframes(w.getnframes())
    if width != 2:
        raise ValueError(f"{path}: {8 * width}-bit samples; expected 16-bit PCM")
    audio = np.frombuffer(raw, "<i2").astype(np.float32).reshape(-1, channels).mean(axis=1)
    audio /= 32768.0
    if rate != INPUT_RATE:
        audio = resample_poly(audio, INPUT_RATE, rate).astype(np.float32)
    return audio


async def _play(ws, audio: np.ndarray, realtime: bool, reply: LiveReply, tag: str) -> None:
    step = round(CHUNK_S * INPUT_RATE)
    started = time.perf_counter()
    for i in range(0, len(audio), step):
        if realtime:
            due = started + (i + step) / INPUT_RATE
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await ws.send_bytes(mic_message(audio[i : i + step]))
        if i == 0:
            reply.at[f"{tag}_first_sent"] = time.perf_counter()
    reply.at[f"{tag}_sent_end"] = time.perf_counter()


async def converse(
    url: str,
    audio: np.ndarray,
    *,
    realtime: bool = True,
    controls: dict[str, Any] | None = None,
    barge_in: np.ndarray | None = None,
    timeout_s: float = 120.0,
) -> LiveReply:
    """Speak `audio`, then silence until the turn ends. With `barge_in`, speak it over the
    reply as soon as its first audio arrives, and wait for the second turn's end."""
    import aiohttp

    reply = LiveReply()
    turns_wanted = 1 if barge_in is None else 2
    silence = np.zeros(round(CHUNK_S * INPUT_RATE), np.float32)
    headers = gateway_key_headers()  # a service's access: the operator key, when one is set
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url, max_msg_size=1 << 24, headers=headers) as ws,
    ):

        async def receive() -> None:
            async for message in ws:
                now = time.perf_counter()
                if message.type == aiohttp.WSMsgType.BINARY:
                    item = parse_server_binary(message.data)
                    if isinstance(item, Audio):
                        reply.audio.append(item)
                        reply.audio_arrived.append(now)
                        reply.at.setdefault(f"first_audio_turn{reply.ordinal(item.turn)}", now)
                    else:
                        reply.frames.append(item)
                        reply.at.setdefault(f"first_frames_turn{reply.ordinal(item.turn)}", now)
                    continue
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                data = json.loads(message.data)
                reply.messages.append(data)
                kind = data["type"]
                if kind == "turn_start":
                    reply.ordinal(data["turn"])
                reply.at.setdefault(kind, now)
                if kind == "partial_transcript" and data.get("at_pause"):
                    reply.at["partial_at_pause"] = now  # the last pause's: the utterance's end
                if kind == "speech_end":
                    reply.at.setdefault(f"speech_end{len(reply.of('speech_end'))}", now)
                if kind == "turn_end" and len(reply.of("turn_end")) >= turns_wanted:
                    return

        listener = asyncio.create_task(receive())
        if controls:
            await ws.send_json({"type": "controls", "controls": controls})
        await _play(ws, audio, realtime, reply, "speech")
        barged = barge_in is None
        deadline = time.perf_counter() + timeout_s
        while not listener.done():
            if time.perf_counter() > deadline:
                listener.cancel()
                raise TimeoutError(f"no turn_end within {timeout_s:g} s")
            if not barged and "first_audio_turn1" in reply.at:
                barged = True
                await _play(ws, barge_in, realtime, reply, "barge_in")
                continue
            await ws.send_bytes(mic_message(silence))  # a live microphone keeps sending
            await asyncio.sleep(CHUNK_S if realtime else 0.002)
        await listener
    return reply


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clients.live", description=__doc__)
    parser.add_argument("wav", type=Path)
    parser.add_argument("--url", default="ws://127.0.0.1:8080/ws")
    parser.add_argument("--out", type=Path, help="write the reply audio here")
    parser.add_argument("--fast", action="store_true", help="send faster than real time")
    parser.add_argument("--controls", default="{}", help='JSON, e.g. {"emotion": "happy"}')
    parser.add_argument(
        "--barge-in",
        type=Path,
        help="speak this WAV over the reply once its audio starts (prints the time to the stop)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    reply = asyncio.run(
        converse(
            args.url,
            read_wav(args.wav),
            realtime=not args.fast,
            controls=json.loads(args.controls),
            barge_in=read_wav(args.barge_in) if args.barge_in else None,
        )
    )
    for m in reply.of("partial_transcript"):
        print(f"(hearing, {m['audio_s']:.1f} s): {m['text']}")
    for m in reply.of("transcript"):
        print(f"you: {m['text']}")
    for m in reply.of("sentence"):
        print(f"avatar ({m['emotion']}): {m['text']}")
    for m in reply.of("error"):
        print(f"error: {m['message']}")
    ended = reply.at.get("speech_end1")
    if ended is not None:
        for key in ("transcript", "first_audio_turn1", "turn_end"):
            if key in reply.at:
                print(f"end of speech -> {key}: {(reply.at[key] - ended) * 1000:.0f} ms")
    if "interrupt" in reply.at and "barge_in_first_sent" in reply.at:
        stop_ms = (reply.at["interrupt"] - reply.at["barge_in_first_sent"]) * 1000
        print(f"first speech frame over the reply -> interrupt (stop playback): {stop_ms:.0f} ms")
    if args.out:
        audio, rate = reply.reply_audio()
        with wave.open(str(args.out), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
        print(f"reply audio: {args.out} ({len(audio) / rate:.1f} s)")
    return 0 if reply.of("turn_end") and not reply.of("error") else 1


if __name__ == "__main__":
    sys.exit(main())
