"""Triton-free orchestration of one conversation turn: audio or text in -> transcript ->
reply sentences, each with audio and animation, then (optionally) its video frames, on one clock ->
a final summary with per-stage timings. Stages are plain callables, so tests drive the
whole turn with fakes; `model_repository/avatar` wires them to BLS calls."""

from avatar.pipeline.barge_in import SessionTurns
from avatar.pipeline.events import (
    FinalEvent,
    FramesEvent,
    SentenceEvent,
    TranscriptEvent,
    TurnEvent,
)
from avatar.pipeline.request import Controls, TurnRequest, parse_turn
from avatar.pipeline.turn import Heard, PipelineConfig, Speech, Stages, run_turn

__all__ = [
    "Controls",
    "FinalEvent",
    "FramesEvent",
    "Heard",
    "PipelineConfig",
    "SentenceEvent",
    "SessionTurns",
    "Speech",
    "Stages",
    "TranscriptEvent",
    "TurnEvent",
    "TurnRequest",
    "parse_turn",
    "run_turn",
]
