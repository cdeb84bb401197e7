"""The live protocol's JSON messages (docs/protocol.md): the checks on what a client sends
and the server's messages built from the turn's typed events. The binary frames (MIC,
AUDIO, FRAMES) are avatar.live_protocol, shared with the clients."""

from __future__ import annotations

import json
from typing import Any

from avatar.animation.tables import ARKIT_NAMES
from avatar.live_protocol import INPUT_RATE, MIC, WIDTH, ProtocolError
from avatar.pipeline.events import FinalEvent, SentenceEvent
from avatar.pipeline.request import MAX_TEXT_CHARS

END_SILENCE_RANGE = (0.2, 2.0)  # seconds of silence that end an utterance (a control)
CLIENT_TYPES = ("text", "controls", "interrupt", "ping")


def parse_message(raw: str) -> dict[str, Any]:
    """A client's text frame -> its JSON object, whose "type" is one the server knows."""
    try:
        message = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ProtocolError(f"text message is not JSON ({error.msg})") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError('text message must be a JSON object with a "type"')
    if message["type"] not in CLIENT_TYPES:
        raise ProtocolError(
            f"unknown message type {message['type']!r}: expected text, controls, interrupt or ping"
        )
    return message


def typed_text(message: dict[str, Any]) -> str:
    """The question of a `text` message, stripped."""
    text = message.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ProtocolError('"text" needs a non-empty string field "text"')
    if len(text) > MAX_TEXT_CHARS:
        raise ProtocolError(f"text of {len(text)} characters: at most {MAX_TEXT_CHARS}")
    return text.strip()


def end_silence(value: Any) -> float:
    """The gateway's own control `end_silence_s`, checked."""
    low, high = END_SILENCE_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"end_silence_s={value!r}: expected seconds")
    if not low <= value <= high:
        raise ProtocolError(f"end_silence_s={value:g}: expected {low:g} to {high:g} seconds")
    return float(value)


def ready(session_id: str, end_silence_s: float) -> dict[str, Any]:
    """The first message of every connection."""
    return {
        "type": "ready",
        "session_id": session_id,
        "input": {"sample_rate": INPUT_RATE, "format": "pcm_s16le", "kind": MIC},
        "frames": {"width": WIDTH, "names": [*ARKIT_NAMES, "headYaw", "headPitch", "headRoll"]},
        "end_silence_s": end_silence_s,
    }


def sentence(turn: int, event: SentenceEvent, since_turn_start_ms: float) -> dict[str, Any]:
    """A reply sentence; its AUDIO and FRAMES follow."""
    return {
        "type": "sentence",
        "turn": turn,
        "index": event.index,
        "text": event.text,
        "emotion": event.emotion,
        "start_s": round(event.start, 4),
        "duration_s": round(event.duration, 4),
        "fps": event.fps,
        "animation": event.animation,
        "error": event.error,
        "since_turn_start_ms": round(since_turn_start_ms, 1),
    }


def turn_end(turn: int, final: FinalEvent | None, cancelled: str) -> dict[str, Any]:
    """The end of a turn: its reply, errors and timings, or (cut short) only the reason."""
    if final is None:
        return {"type": "turn_end", "turn": turn, "cancelled": cancelled}
    return {
        "type": "turn_end",
        "turn": turn,
        "reply": final.reply,
        "errors": final.errors,
        "timings": final.timings,
        "cancelled": cancelled,
    }
