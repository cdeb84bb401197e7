"""One turn on the `avatar` model over a gRPC stream, shared by `say`, `chat` and tests.

`stream_turn` sends audio or text, collects every response as a plain dict, measures the
client-side time to the first audio, the first blendshape frame and the first rendered video
frame, and can cancel the stream (barge-in).
It never waits without bound: a stream silent for `silence_s` (a server that lost the turn,
e.g. a stub that died) or longer than `timeout_s` in all is cancelled and the turn returns
with an error saying so.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from avatar.conversation_tokens import affinity_headers
from avatar.credentials import API_KEY_ENV, grpc_key_headers, read_secret
from avatar.pipeline import schema


@dataclasses.dataclass
class TurnResult:
    transcript: str = ""
    sentences: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    videos: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # frames responses
    final: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str = ""  # the stream's error (a rejected request, a failed or abandoned turn)
    # client side, from sending the request: a sentence's audio, its blendshapes (the face a
    # client draws itself) and the server's rendered pixels, which follow the sentence
    first_audio_s: float | None = None
    first_frame_s: float | None = None
    first_video_s: float | None = None
    total_s: float = 0.0

    @property
    def timings(self) -> dict[str, Any]:
        return self.final.get("timings", {})

    @property
    def session_id(self) -> str:
        """The session's token from the final response: what the next turn sends ("" when
        the turn had no session)."""
        return self.final.get("session_id", "")

    @property
    def errors(self) -> list[str]:
        """The final response's list of what went wrong in the turn."""
        return self.final.get("error", [])

    def audio(self) -> tuple[np.ndarray, int]:
        """The reply's audio placed at each sentence's start time (one clock)."""
        spoken = [s for s in self.sentences if s["audio"].size]
        if not spoken:
            return np.zeros(0, np.float32), 22050
        rate = int(spoken[0]["sample_rate"])
        end = max(round(s["start_time"] * rate) + s["audio"].size for s in spoken)
        out = np.zeros(end, np.float32)
        for s in spoken:
            at = round(s["start_time"] * rate)
            out[at : at + s["audio"].size] = s["audio"]
        return out, rate

    def blendshapes(self) -> tuple[np.ndarray, np.ndarray, float]:
        """All frames [T, 52] and head poses [T, 3] at the reply's fps, in clock order."""
        spoken = [s for s in self.sentences if s["blendshapes"].size]
        if not spoken:
            return np.zeros((0, 52), np.float32), np.zeros((0, 3), np.float32), 30.0
        fps = float(spoken[0]["fps"])
        total = max(round(s["start_time"] * fps) + len(s["blendshapes"]) for s in spoken)
        shapes, poses = np.zeros((total, 52), np.float32), np.zeros((total, 3), np.float32)
        for s in spoken:
            at = round(s["start_time"] * fps)
            shapes[at : at + len(s["blendshapes"])] = s["blendshapes"]
            poses[at : at + len(s["head_pose"])] = s["head_pose"]
        return shapes, poses, fps


def _input(name: str, array: np.ndarray):
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(name, list(array.shape), schema.INPUTS[name].dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def decode_response(result) -> dict[str, Any]:
    """One `avatar` response -> its outputs by name, decoded as avatar.pipeline.schema says
    (strings, numbers, the JSON values, arrays); {} for the stream's empty final."""
    names = [tensor.name for tensor in result.get_response().outputs]
    return schema.decode_outputs({name: result.as_numpy(name) for name in names})


def stream_turn(
    url: str,
    *,
    audio: np.ndarray | None = None,
    text: str | None = None,
    session_id: str = "",
    parent_session_id: str = "",
    controls: dict[str, Any] | None = None,
    on_response: Callable[[dict[str, Any]], None] | None = None,
    cancel_when: Callable[[dict[str, Any]], bool] | None = None,
    timeout_s: float = 300.0,
    silence_s: float = 60.0,
    model: str = "avatar",
    headers: dict[str, str] | None = None,
) -> TurnResult:
    """Run one turn; `cancel_when(response)` True closes the stream with cancel_requests.
    `session_id`: "new" starts a conversation, the token a turn returned (`session_id` of
    the result) continues it, "" answers without memory. `headers`: e.g. the API key.

    The turn is abandoned (stream cancelled, `error` set) when no response came for
    `silence_s` or the turn ran longer than `timeout_s`. The server's own stage limits
    (llm_timeout_s, tts_timeout_s: 30 s) keep a healthy turn's gaps well below 60 s."""
    import tritonclient.grpc as grpcclient

    tensors = schema.encode_request(
        audio=audio,
        text=text,
        session_id=session_id,
        parent_session_id=parent_session_id,
        controls=controls,
    )
    inputs = [_input(name, array) for name, array in tensors.items()]

    results: queue.Queue = queue.Queue()
    turn = TurnResult()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(
        callback=lambda result, error: results.put((result, error)),
        headers={**affinity_headers(session_id), **(headers or {})} or None,
    )
    started = time.perf_counter()
    ended = False  # the server closed the stream (final response or error)
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            left = timeout_s - (time.perf_counter() - started)
            try:
                result, error = results.get(timeout=max(0.0, min(silence_s, left)))
            except queue.Empty:
                turn.error = _abandoned(model, silence_s, timeout_s, left)
                break
            if error is not None:
                turn.error, ended = str(error), True
                break
            response = decode_response(result)
            _collect(turn, response, time.perf_counter() - started)
            if on_response is not None and response:
                on_response(response)
            if cancel_when is not None and response and cancel_when(response):
                break
            if result.get_response().parameters["triton_final_response"].bool_param:
                ended = True
                break
    finally:
        turn.total_s = time.perf_counter() - started
        # closing a stream the server has not ended waits for its end: cancel it instead
        client.stop_stream(cancel_requests=not ended)
        client.close()
    return turn


def api_key_headers() -> dict[str, str]:
    """Triton's API key from $AVATAR_API_KEY (or the file $AVATAR_API_KEY_FILE names)."""
    return grpc_key_headers(read_secret(API_KEY_ENV))


def _abandoned(model: str, silence_s: float, timeout_s: float, left: float) -> str:
    if left <= silence_s:
        return f"{model}: the turn took longer than {timeout_s:g} s; stream cancelled"
    return (
        f"{model}: no response for {silence_s:g} s (the server may have lost the turn, "
        "e.g. its model restarted); stream cancelled"
    )


def _collect(turn: TurnResult, response: dict[str, Any], elapsed: float) -> None:
    kind = response.get("kind")
    if kind == "transcript":
        turn.transcript = response["text"]
    elif kind == "sentence":
        turn.sentences.append(response)
        if turn.first_audio_s is None and response["audio"].size:
            turn.first_audio_s = elapsed
        if turn.first_frame_s is None and response["blendshapes"].size:
            turn.first_frame_s = elapsed
    elif kind == "frames":
        turn.videos.append(response)
        if turn.first_video_s is None and "video" in response:
            turn.first_video_s = elapsed
    elif kind == "final":
        turn.final = response
