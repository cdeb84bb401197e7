"""The `avatar` model's turn on the wire, defined once: its inputs and outputs (name, Triton
dtype, dims) and, per response kind, which outputs it carries and how each value travels.

Everything that touches the turn's tensors is derived from here: the runner's outputs
(`event_outputs`), the gRPC clients' decoder (`decode_outputs`), the gateway's typed events
(`outputs_event`), the requests both clients send (`encode_request`) and the check of
model_repository/avatar/config.pbtxt (tests/test_turn_schema.py).

Value kinds and `TensorSpec`: avatar/model_io.py, where the other models' calls are
defined.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from avatar.model_io import ARRAY, JSON, SCALAR, TEXT, TensorSpec
from avatar.pipeline.events import (
    FinalEvent,
    FramesEvent,
    SentenceEvent,
    TranscriptEvent,
    TurnEvent,
)

# config.pbtxt's order
INPUTS = {
    t.name: t
    for t in (
        TensorSpec("audio", "FP32", (-1,), optional=True),  # 16 kHz mono
        TensorSpec("text", "BYTES", (1,), optional=True),
        TensorSpec("session_id", "BYTES", (1,), optional=True),
        TensorSpec("parent_session_id", "BYTES", (1,), optional=True),
        TensorSpec("controls", "BYTES", (1,), optional=True),  # avatar.pipeline.Controls
    )
}
# how each input's value travels
REQUEST = {
    "audio": ARRAY,
    "text": TEXT,
    "session_id": TEXT,
    "parent_session_id": TEXT,
    "controls": JSON,
}

OUTPUTS = {
    t.name: t
    for t in (
        TensorSpec("kind", "BYTES", (1,)),
        TensorSpec("text", "BYTES", (1,)),
        TensorSpec("sentence_index", "INT32", (1,)),
        TensorSpec("emotion", "BYTES", (1,)),
        TensorSpec("start_time", "FP32", (1,)),
        TensorSpec("audio", "FP32", (-1,)),
        TensorSpec("sample_rate", "INT32", (1,)),
        TensorSpec("fps", "FP32", (1,)),
        TensorSpec("blendshapes", "FP32", (-1, 52)),
        TensorSpec("head_pose", "FP32", (-1, 3)),
        TensorSpec("animation", "BYTES", (1,)),
        TensorSpec("video", "UINT8", (-1, -1, -1, 3)),
        TensorSpec("error", "BYTES", (1,)),
        TensorSpec("timings", "BYTES", (1,)),
        TensorSpec("session_id", "BYTES", (1,)),
    )
}

# What each response kind carries: output -> (event field, value kind). Every response also
# carries `kind`. A sentence's rendered frames follow it in a response of their own, so that
# the voice never waits for pixels.
RESPONSES: dict[str, dict[str, tuple[str, str]]] = {
    "transcript": {"text": ("text", TEXT)},
    "sentence": {
        "text": ("text", TEXT),
        "sentence_index": ("index", SCALAR),
        "emotion": ("emotion", TEXT),
        "start_time": ("start", SCALAR),
        "audio": ("audio", ARRAY),
        "sample_rate": ("sample_rate", SCALAR),
        "fps": ("fps", SCALAR),
        "blendshapes": ("blendshapes", ARRAY),
        "head_pose": ("head_pose", ARRAY),
        "animation": ("animation", JSON),  # visemes, gestures, blinks (sentence clock)
        "error": ("error", TEXT),  # "" or why the sentence has no audio
    },
    "frames": {
        "sentence_index": ("index", SCALAR),
        "start_time": ("start", SCALAR),
        "fps": ("fps", SCALAR),
        "video": ("frames", ARRAY),
    },
    # the final response does not repeat the transcript; `cancelled` is in its timings
    "final": {
        "text": ("reply", TEXT),
        "error": ("errors", JSON),
        "timings": ("timings", JSON),
        "session_id": ("session_id", TEXT),  # the token the next turns send
    },
}
EVENTS: dict[type, str] = {
    TranscriptEvent: "transcript",
    SentenceEvent: "sentence",
    FramesEvent: "frames",
    FinalEvent: "final",
}


def encode_request(
    *,
    audio: np.ndarray | None = None,
    text: str | None = None,
    session_id: str = "",
    parent_session_id: str = "",
    controls: Mapping[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """The inputs of one turn (absent values are not sent)."""
    values = {
        "audio": None if audio is None else np.asarray(audio, np.float32).reshape(-1),
        "text": text,
        "session_id": session_id or None,
        "parent_session_id": parent_session_id or None,
        "controls": dict(controls) if controls else None,
    }
    return {
        name: INPUTS[name].encode(value, REQUEST[name])
        for name, value in values.items()
        if value is not None
    }


def event_outputs(event: TurnEvent) -> dict[str, np.ndarray]:
    """The outputs of one response for `event`."""
    kind = EVENTS[type(event)]
    tensors = {"kind": OUTPUTS["kind"].encode(kind, TEXT)}
    for name, (field, value_kind) in RESPONSES[kind].items():
        value = getattr(event, field)
        if value is not None:
            tensors[name] = OUTPUTS[name].encode(value, value_kind)
    return tensors


def decode_outputs(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """One response's outputs by name, each decoded as its response kind says (strings,
    numbers, JSON values, arrays); {} for an empty response (a stream's empty final)."""
    if "kind" not in arrays:
        return {}
    kind = OUTPUTS["kind"].decode(arrays["kind"], TEXT)
    if kind not in RESPONSES:
        raise ValueError(f"avatar response of kind {kind!r}: expected one of {sorted(RESPONSES)}")
    out: dict[str, Any] = {"kind": kind}
    for name, (_, value_kind) in RESPONSES[kind].items():
        if name in arrays:
            out[name] = OUTPUTS[name].decode(arrays[name], value_kind)
    return out


def outputs_event(arrays: Mapping[str, np.ndarray]) -> TurnEvent | None:
    """One response as the event the runner sent (None for an empty response). Outputs the
    caller did not request are absent: a frames event then has `frames` None."""
    values = decode_outputs(arrays)
    if not values:
        return None
    kind = values.pop("kind")
    fields = {RESPONSES[kind][name][0]: value for name, value in values.items()}
    if kind == "transcript":
        return TranscriptEvent(**fields)
    if kind == "sentence":
        return SentenceEvent(**fields)
    if kind == "frames":
        return FramesEvent(**fields)
    cancelled = fields["timings"].get("cancelled", "")
    return FinalEvent(transcript="", cancelled=cancelled, **fields)
