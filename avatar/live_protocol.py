"""The live WebSocket protocol's binary frames (docs/protocol.md is the reference), in the
core so that the gateway (server side) and clients/live.py (client side) share one format.

Text frames are JSON objects with a "type". Bulk data travels in binary frames whose first
byte says what they carry; every number is little-endian:

    client -> server
      0x01 MIC      u8 kind | int16 PCM, 16 kHz mono (any length; 20-40 ms is usual)
    server -> client
      0x02 AUDIO    u8 kind | u16 sentence | u32 turn | f32 start_s | u32 sample_rate |
                    int16 PCM mono
      0x03 FRAMES   u8 kind | u16 sentence | u32 turn | f32 start_s | f32 fps |
                    u16 frames | u16 width (55) | f32 [frames, width]: 52 ARKit weights
                    (ARKIT_NAMES order) then head yaw, pitch, roll (radians)

`start_s` is on the turn clock: 0 is the reply's first sample, and frame i of a FRAMES
message shows start_s + i / fps, so audio and face stay on one clock.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from avatar.vad import SAMPLE_RATE

MIC, AUDIO, FRAMES = 0x01, 0x02, 0x03
INPUT_RATE = SAMPLE_RATE  # the microphone's, what the `vad` and `asr` models take
ARKIT = 52
POSE = 3
WIDTH = ARKIT + POSE
_AUDIO = struct.Struct("<BHIfI")
_FRAMES = struct.Struct("<BHIffHH")
MAX_MIC_BYTES = 2 * INPUT_RATE  # one second per message at most


class ProtocolError(ValueError):
    """A client message that breaks the protocol; the message says what was expected."""


def pcm16(audio: np.ndarray) -> bytes:
    """float32 [-1, 1] -> int16 little-endian bytes (clipped)."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def mic_message(audio: np.ndarray) -> bytes:
    """A client's MIC frame from float32 16-kHz samples."""
    return bytes([MIC]) + pcm16(audio)


def parse_mic(data: bytes) -> np.ndarray:
    """A MIC frame -> float32 samples; ProtocolError for anything else."""
    if not data:
        raise ProtocolError("empty binary message: expected 0x01 followed by int16 PCM")
    if data[0] != MIC:
        raise ProtocolError(
            f"binary message kind 0x{data[0]:02x}: a client sends only 0x01 (microphone "
            "PCM, int16 little-endian, 16 kHz mono)"
        )
    body = data[1:]
    if len(body) % 2:
        raise ProtocolError(f"microphone PCM of {len(body)} bytes: int16 needs an even count")
    if len(body) > MAX_MIC_BYTES:
        raise ProtocolError(
            f"microphone message of {len(body) // 2} samples: at most {INPUT_RATE} (1 s)"
        )
    return np.frombuffer(body, "<i2").astype(np.float32) / 32768.0


def audio_message(sentence: int, turn: int, start_s: float, rate: int, audio: np.ndarray) -> bytes:
    return _AUDIO.pack(AUDIO, sentence, turn, start_s, rate) + pcm16(audio)


def frames_message(
    sentence: int, turn: int, start_s: float, fps: float, *, weights: np.ndarray, pose: np.ndarray
) -> bytes:
    rows = np.concatenate([weights, pose], axis=1).astype("<f4")
    return _FRAMES.pack(FRAMES, sentence, turn, start_s, fps, len(rows), WIDTH) + rows.tobytes()


@dataclasses.dataclass(frozen=True)
class Audio:
    sentence: int
    turn: int
    start_s: float
    sample_rate: int
    pcm: np.ndarray  # float32


@dataclasses.dataclass(frozen=True)
class Frames:
    sentence: int
    turn: int
    start_s: float
    fps: float
    weights: np.ndarray  # [frames, 52]
    pose: np.ndarray  # [frames, 3]


def parse_server_binary(data: bytes) -> Audio | Frames:
    """A server's AUDIO or FRAMES frame (reference clients, tests)."""
    if data[:1] == bytes([AUDIO]):
        _, sentence, turn, start, rate = _AUDIO.unpack_from(data)
        pcm = np.frombuffer(data[_AUDIO.size :], "<i2").astype(np.float32) / 32768.0
        return Audio(sentence, turn, start, rate, pcm)
    if data[:1] == bytes([FRAMES]):
        _, sentence, turn, start, fps, count, width = _FRAMES.unpack_from(data)
        rows = np.frombuffer(data[_FRAMES.size :], "<f4").reshape(count, width)
        return Frames(sentence, turn, start, fps, rows[:, :ARKIT], rows[:, ARKIT:])
    raise ProtocolError(f"unknown server binary kind {data[:1]!r}")
