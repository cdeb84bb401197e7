"""The live protocol's JSON messages (docs/protocol.md): the checks on what a client sends
and the server's messages built from the turn's typed events. The binary frames (MIC,
AUDIO, FRAMES) are avatar.live_protocol, shared with the clients."""

from __future__ import annotations

import json
import math
from typing import Any

from avatar.animation.tables import ARKIT_NAMES
from avatar.conversation_tokens import session_of
from avatar.live_protocol import INPUT_RATE, MIC, WIDTH, ProtocolError
from avatar.pipeline.events import FinalEvent, SentenceEvent
from avatar.pipeline.request import MAX_TEXT_CHARS

END_SILENCE_RANGE = (0.2, 2.0)  # seconds of silence that end an utterance (a control)
CLIENT_TYPES = ("text", "controls", "interrupt", "ping", "resume")

# The `code` of every `error` message, and the WebSocket close code of the refusals that end
# the connection (docs/protocol.md keeps the same table).
ERROR_CODES = {
    "bad_request": "a message broke the protocol (the connection stays open)",
    "unauthorized": "no access token or operator key, or one that is wrong or expired",
    "forbidden_origin": "the page's Origin is not on the gateway's allow-list",
    "forbidden_host": "the request's Host is not a name the gateway serves (DNS rebinding)",
    "not_allowed": "a control this client may not set (free persona text)",
    "too_many_connections": "the gateway's or this address's connection cap is reached",
    "busy": "the machine answers as many sessions as it can: retry after retry_after_s",
    "rate_limited": "messages, audio or turns faster than the gateway allows",
    "too_long": "an utterance longer than the gateway's maximum",
    "idle_timeout": "nothing received for the idle timeout",
    "turn_failed": "the turn failed on the server",
    "session_rejected": "Triton does not accept this gateway's sessions (different secrets)",
    "turn_timeout": "the avatar sent nothing for too long; the turn was abandoned",
    "server_unavailable": "Triton is unreachable or not ready",
    "internal": "an unexpected error in the gateway",
}
CLOSE_CODES = {
    "bad_request": 4400,  # too many bad messages
    "unauthorized": 4401,
    "forbidden_origin": 4403,
    "forbidden_host": 4403,  # answered as HTTP 421 before any upgrade (gateway/app.py)
    "idle_timeout": 4408,
    "too_many_connections": 4429,  # sent as HTTP 429 before the upgrade (gateway/app.py)
    "rate_limited": 4429,
    "busy": 1013,  # RFC 6455's "Try Again Later"
}


class RefusalError(Exception):
    """What the gateway refuses, with its `code` (ERROR_CODES); `close`: the connection
    ends with CLOSE_CODES[code], else only an `error` message is sent. The message is
    for the client: never an address, a traceback or a secret."""

    def __init__(
        self, code: str, message: str, *, close: bool = False, retry_after_s: float | None = None
    ) -> None:
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code, self.message, self.close = code, message, close
        self.retry_after_s = retry_after_s

    @property
    def close_code(self) -> int:
        return CLOSE_CODES[self.code]


def error(
    code: str, message: str, turn: int | None = None, retry_after_s: float | None = None
) -> dict[str, Any]:
    """An `error` message (ERROR_CODES)."""
    assert code in ERROR_CODES, code
    body: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if turn is not None:
        body["turn"] = turn
    if retry_after_s is not None:
        body["retry_after_s"] = retry_after_s
    return body


def refusal(refused: RefusalError) -> dict[str, Any]:
    """The `error` message of a refusal."""
    return error(refused.code, refused.message, retry_after_s=refused.retry_after_s)


MAX_DEPTH = 8  # of a client's JSON (the deepest message, controls, is 2)


def _checked(value: Any) -> str | None:
    """Where a parsed JSON value breaks the gateway's rules, as "path: why" (None if not):
    nesting beyond MAX_DEPTH, or a number beyond a float's range (1e999 parses as
    infinity, which no control takes and no answer may echo)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                return f"{path or 'the message'}: nests deeper than {MAX_DEPTH} levels"
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, f"{path}.{k}" if path else str(k), depth + 1) for k, v in pairs)
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{path}: a number beyond a float's range; expected a finite number"
    return None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_message(raw: str) -> dict[str, Any]:
    """A client's text frame -> its JSON object, whose "type" is one the server knows.
    Strict JSON: no NaN or Infinity, nesting at most MAX_DEPTH."""
    try:
        message = json.loads(raw, parse_constant=_reject_constant)
    except json.JSONDecodeError as error:
        raise ProtocolError(f"text message is not JSON ({error.msg})") from None
    except RecursionError:  # the C parser's own guard: tens of thousands of brackets
        raise ProtocolError(f"text message nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:  # NaN, Infinity
        raise ProtocolError(f"text message is not JSON ({error})") from None
    broken = _checked(message)
    if broken:
        raise ProtocolError(f"text message: {broken}")
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError('text message must be a JSON object with a "type"')
    if message["type"] not in CLIENT_TYPES:
        raise ProtocolError(
            f"unknown message type {message['type']!r}: expected "
            "text, controls, interrupt, ping or resume"
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
    if not low <= value <= high:  # (not {value:g}: an integer of 400 digits overflows it)
        shown = str(value) if len(str(value)) <= 20 else str(value)[:20] + "..."
        raise ProtocolError(f"end_silence_s={shown}: expected {low:g} to {high:g} seconds")
    return float(value)


def session(token: str) -> dict[str, Any]:
    """The conversation's token (a client that reconnects sends it back in `resume`) and
    its id; sent on `resume` and when a confirmed speculative turn forks the session."""
    return {"type": "session", "session_id": session_of(token), "session_token": token}


def ready(
    token: str, end_silence_s: float, personas: list[str], persona_text: bool
) -> dict[str, Any]:
    """The first message of every connection; `personas`: the operator's preset names,
    `persona_text`: whether this client may send free persona text."""
    return {
        "type": "ready",
        "session_id": session_of(token),
        "session_token": token,
        "personas": personas,
        "persona_text": persona_text,
        "input": {"sample_rate": INPUT_RATE, "format": "pcm_s16le", "kind": MIC},
        "frames": {"width": WIDTH, "names": [*ARKIT_NAMES, "headYaw", "headPitch", "headRoll"]},
        "end_silence_s": end_silence_s,
    }


def pong(t: Any) -> dict[str, Any]:
    """The answer to a `ping`, echoing its `t` (the client's clock: a round trip)."""
    return {"type": "pong", "t": t}


def controls(merged: dict[str, Any]) -> dict[str, Any]:
    """The settings in force after a `controls` message (earlier ones merged)."""
    return {"type": "controls", "controls": merged}


def speech_start() -> dict[str, Any]:
    """The user began speaking (a reply being played is interrupted: barge-in)."""
    return {"type": "speech_start"}


def speech_end(utterance_s: float, ended_by: str | None = None) -> dict[str, Any]:
    """The end of speech is confirmed: `utterance_s` of it and what ended the turn
    (`audio`, `words`, `silence`); `utterance_s` 0 without `ended_by`: too short (a cough),
    or too long, no turn."""
    message: dict[str, Any] = {"type": "speech_end", "utterance_s": utterance_s}
    if ended_by is not None:
        message["ended_by"] = ended_by
    return message


def partial_transcript(text: str, at_pause: bool, audio_s: float) -> dict[str, Any]:
    """A live caption of the utterance being spoken: what a pass over its first `audio_s`
    seconds heard (`at_pause`: the pass at the first pause, the text its turn starts from)."""
    return {"type": "partial_transcript", "text": text, "at_pause": at_pause, "audio_s": audio_s}


def turn_start(
    turn: int, spoken: bool, speculative_asr: bool, speculative_turn: bool, prefix_tokens: int
) -> dict[str, Any]:
    """A turn began from speech (`input` audio) or typed text."""
    return {
        "type": "turn_start",
        "turn": turn,
        "input": "audio" if spoken else "text",
        "speculative_asr": speculative_asr,
        "speculative_turn": speculative_turn,
        "asr_prefix_tokens": prefix_tokens,
    }


def transcript(turn: int, text: str) -> dict[str, Any]:
    """What the turn heard (or was typed): the text its reply answers."""
    return {"type": "transcript", "turn": turn, "text": text, "final": True}


def interrupt(turn: int, reason: str) -> dict[str, Any]:
    """The turn's reply stops here (`barge-in`, `interrupt`, ...); its `turn_end` follows."""
    return {"type": "interrupt", "turn": turn, "reason": reason}


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


# The turn's timings a client of the gateway receives (docs/protocol.md, `turn_end`): how
# long it took, not what the server holds. The prompt's length and the cached part of it
# (llm_stats) would tell a stranger whether a conversation has memory and how long it is,
# the knowledge summary what the operator's documents hold; gRPC callers (services with
# Triton's key) get the model's full timings.
PUBLIC_TIMINGS = ("since_request_ms", "stage_ms", "sentences", "audio_s", "language", "paced_ms")
PUBLIC_LLM_STATS = ("ttft_ms", "total_ms", "completion_tokens", "sentence_budget")


def public_timings(timings: dict[str, Any]) -> dict[str, Any]:
    """The documented fields of a turn's timings (PUBLIC_TIMINGS, PUBLIC_LLM_STATS)."""
    public = {key: timings[key] for key in PUBLIC_TIMINGS if key in timings}
    stats = timings.get("llm_stats")
    if isinstance(stats, dict):
        public["llm_stats"] = {k: stats[k] for k in PUBLIC_LLM_STATS if k in stats}
    return public


def turn_end(turn: int, final: FinalEvent | None, cancelled: str) -> dict[str, Any]:
    """The end of a turn: its reply, errors and timings, or (cut short) only the reason."""
    if final is None:
        return {"type": "turn_end", "turn": turn, "cancelled": cancelled}
    return {
        "type": "turn_end",
        "turn": turn,
        "reply": final.reply,
        "errors": final.errors,
        "timings": public_timings(final.timings),
        "cancelled": cancelled,
    }


def persona_choice(values: dict[str, Any], personas: dict[str, str], free_text: bool) -> str | None:
    """The client's persona controls checked and mapped in place: `persona_preset` (an
    operator's preset by name; "" for none) becomes the preset's `persona` text; free
    `persona` text only where `free_text`. The chosen preset, or None when not sent."""
    preset = values.pop("persona_preset", None)
    if "persona" in values and not free_text:
        raise RefusalError(
            "not_allowed",
            "free persona text is off on this gateway: choose a persona_preset of "
            f"{sorted(personas)}",
        )
    if preset is not None:
        if not isinstance(preset, str):
            raise ProtocolError(f"persona_preset: expected a name, one of {sorted(personas)}")
        if preset != "" and preset not in personas:
            raise ProtocolError(f"persona_preset {preset!r}: expected one of {sorted(personas)}")
        values["persona"] = personas.get(preset, "")
    return preset
