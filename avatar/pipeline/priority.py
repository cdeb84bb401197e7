"""Which work goes first when sessions share the machine: Triton's dynamic-batcher
priority levels, as the gateway's ASR passes carry them, and what each pass is.

Triton (2.51) orders a model's queue by priority level (1 is served first; 0 or a level
the model does not have means its `default_priority_level`). Only requests from outside
the server carry one: tritonclient's gRPC `infer`/`async_infer`/`stream_infer` send
`priority` as the request parameter "priority" (uint64, only when not 0), which the gRPC
frontend turns into the request's priority (server r24.10 src/grpc/infer_handler.cc).
A BLS request cannot: `pb_utils.InferenceRequest` has no priority argument in
python_backend r24.10 (src/pb_stub.cc; none up to r25.12 either), and the core sets
every request it does not hear one for to the callee's default level
(core r24.10 src/infer_request.cc `SetPriority`). So a model that both the gateway and a
BLS caller use sets its default level to what its BLS callers need (the `avatar` model's
pass over a turn's audio is on the first audio's path: level 1), and the gateway asks for
a later level where it is not in a hurry (captions while the user speaks).

The pass kind also travels as the request parameter "pass" (`PASS_PARAMETER`), so that
the `asr` model can count its time per kind (`python -m perf turn-cost`).
"""

from __future__ import annotations

import contextvars
import enum

PASS_PARAMETER = "pass"


class AsrPass(str, enum.Enum):
    """An ASR pass, by what it is for."""

    CAPTION = "caption"  # the speech so far while the user speaks: live captions
    PAUSE = "pause"  # the utterance at its first pause: the transcript the turn starts from
    FINAL = "final"  # the `avatar` model's own pass over a turn's audio


# model_repository/asr/config.pbtxt: priority_levels 2, default_priority_level 1
FIRST_AUDIO = 1  # on the path to a turn's first audio
CAPTIONS = 2  # live captions: served when nothing on that path waits
LEVELS = 2

PRIORITY: dict[AsrPass, int] = {
    AsrPass.CAPTION: CAPTIONS,
    AsrPass.PAUSE: FIRST_AUDIO,
    AsrPass.FINAL: FIRST_AUDIO,
}

# the kind of the ASR pass the current asyncio task makes (each pass runs in its own
# task, so setting it there marks only that task's calls); PAUSE when unset
current_pass: contextvars.ContextVar[AsrPass] = contextvars.ContextVar(
    "current_asr_pass", default=AsrPass.PAUSE
)


def pass_of(parameters: dict) -> AsrPass:
    """The pass a request's parameters name; FINAL when they name none or an unknown
    one (a BLS caller, or a client that does not say)."""
    try:
        return AsrPass(str(parameters.get(PASS_PARAMETER, "")))
    except ValueError:
        return AsrPass.FINAL


def shares(total: float, weights: list[float]) -> list[float]:
    """`total` (a batch's seconds) split in proportion to `weights` (each request's audio
    seconds), equally when they are all 0."""
    whole = sum(weights)
    if whole <= 0:
        return [total / len(weights)] * len(weights) if weights else []
    return [total * w / whole for w in weights]
