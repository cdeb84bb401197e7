"""`avatar`: decoupled BLS model, one conversation turn per request (a thin adapter).

All logic is in avatar/pipeline (unit-tested with fake stages). This file parses the
config, binds the stages to BLS calls on asr, llm, tts (and renderer when served), runs
each turn in its own thread, and maps pipeline events to responses.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.animation.emotion_classifier import EmotionClassifier
from avatar.pipeline import (
    FinalEvent,
    PipelineConfig,
    SentenceEvent,
    SessionTurns,
    Speech,
    Stages,
    TranscriptEvent,
    TurnEvent,
    TurnRequest,
    parse_turn,
    run_turn,
)
from avatar.triton import bls
from avatar.triton.metrics import Counter, Gauge
from avatar.triton.params import ModelParameters

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
LLM_OUTPUTS = ["text", "sentence", "finish_reason", "stats"]
TTS_OUTPUTS = ["audio", "sample_rate", "sentence", "phonemes", "phoneme_starts", "phoneme_ends"]


def _bytes(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=object)


def _str(array: np.ndarray) -> str:
    value = array.reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = ModelParameters(json.loads(args["model_config"]))
        self.asr_model = params.str("asr_model", "asr")
        self.llm_model = params.str("llm_model", "llm")
        self.tts_model = params.str("tts_model", "tts")
        renderer = params.str("renderer_model", "renderer")
        served = Path(args["model_repository"]).parent / renderer / "config.pbtxt"
        self.renderer = renderer if served.is_file() else ""
        self.render_batch = _max_batch(served) if self.renderer else 1
        self.max_tokens = params.int("max_tokens", 96)
        self.temperature = params.float("temperature", 0.7)
        self.tts_timeout_us = int(params.float("tts_timeout_s", 30.0) * 1e6)
        self.max_audio_s = params.float("max_audio_seconds", 60.0)
        # a superseding turn waits this long for the old one to end (memory settled)
        self.settle_timeout_s = params.float("settle_timeout_s", 2.0)
        self.config = PipelineConfig(
            llm_timeout_s=params.float("llm_timeout_s", PipelineConfig.llm_timeout_s),
            fallback_reply=params.str("fallback_reply", PipelineConfig.fallback_reply),
        )
        self.turns = SessionTurns()
        self.threads: set[threading.Thread] = set()
        self.lock = threading.Lock()
        # admission: a turn beyond this many running ones is refused at once ("busy")
        self.max_active_turns = params.int("max_active_turns", 8)
        self.active, self.sessions = Gauge("avatar", "turns"), Gauge("avatar", "sessions")
        self.refused = Counter("avatar", "busy")
        self.emotions = EmotionClassifier.load()
        self.stages = Stages(
            self._transcribe,
            self._chat,
            self._speak,
            self._render if self.renderer else None,
            feel=self._feel,
            cut=self._cut,
        )
        video = f"video via {renderer}" if self.renderer else f"no video ({renderer} not served)"
        pb_utils.Logger.log_info(
            f"avatar: {self.asr_model} -> {self.llm_model} -> {self.tts_model}; {video}"
        )

    # ------------------------------------------------------------------ stages (BLS)
    def _feel(self, text: str) -> tuple[str, float]:
        emotion = self.emotions.predict(text)
        return emotion.label, emotion.intensity

    def _transcribe(self, audio: np.ndarray) -> str:
        out = bls.infer(self.asr_model, {"audio": audio.reshape(1, -1)}, ["text"])
        return _str(out["text"])

    def _chat(self, text: str, request: TurnRequest, stop: Callable[[], bool]):
        controls = request.controls
        messages = [{"role": "system", "content": controls.persona}] if controls.persona else []
        messages.append({"role": "user", "content": text})
        sampling = {
            "max_tokens": controls.max_tokens or self.max_tokens,
            "temperature": self.temperature,
            "seed": controls.seed,
        }
        inputs = {
            "messages": _bytes(json.dumps(messages)),
            "sampling": _bytes(json.dumps(sampling)),
        }
        if request.session_id:
            inputs["session_id"] = _bytes(request.session_id)
        pending, stats = "", {}
        replies = bls.stream(
            self.llm_model, inputs, LLM_OUTPUTS, request_id=request.turn_id, stop=stop
        )
        for out in replies:
            pending += _str(out["text"])
            sentence = _str(out["sentence"]).strip()
            if sentence:
                yield sentence
                pending = ""
            if _str(out["finish_reason"]):
                stats = json.loads(_str(out["stats"]) or "{}")
        if pending.strip() and not stop():
            yield pending.strip()
        return stats

    def _cut(self, request: TurnRequest, spoken: str) -> None:
        """Barge-in: end the turn's LLM generation and keep only what was spoken."""
        inputs = {"stop": np.array([True]), "spoken": _bytes(spoken)}
        if request.session_id:
            inputs["session_id"] = _bytes(request.session_id)
        for out in bls.stream(self.llm_model, inputs, ["stats"], request_id=request.turn_id):
            outcome = json.loads(_str(out["stats"]) or "{}").get("stop", "")
            pb_utils.Logger.log_info(f"avatar: llm generation {request.turn_id}: {outcome}")

    def _speak(self, text: str, request: TurnRequest) -> Iterator[Speech]:
        inputs = {"text": _bytes(text), "seed": np.array([request.controls.seed], np.int64)}
        for out in bls.stream(self.tts_model, inputs, TTS_OUTPUTS, self.tts_timeout_us):
            yield Speech(
                audio=out["audio"].reshape(-1),
                sample_rate=int(out["sample_rate"].reshape(-1)[0]),
                phonemes=[p.decode("utf-8") for p in out["phonemes"].reshape(-1)],
                starts=out["phoneme_starts"].reshape(-1),
                ends=out["phoneme_ends"].reshape(-1),
                text=_str(out["sentence"]),
            )

    def _render(self, blendshapes: np.ndarray, head_pose: np.ndarray) -> np.ndarray:
        """Frames [T, H, W, 3], in requests of at most the renderer's max_batch_size."""
        frames = []
        for at in range(0, len(blendshapes), self.render_batch):
            inputs = {
                "blendshapes": blendshapes[at : at + self.render_batch],
                "head_pose": head_pose[at : at + self.render_batch],
            }
            frames.append(bls.infer(self.renderer, inputs, ["frames"])["frames"])
        return np.concatenate(frames)

    # ------------------------------------------------------------------ requests
    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                turn = parse_turn(
                    bls.input_array(request, "audio", optional=True),
                    _optional_text(request, "text"),
                    _optional_text(request, "session_id") or "",
                    _optional_text(request, "controls") or "",
                    self.max_audio_s,
                )
            except Exception as error:  # this request fails; the model keeps serving
                pb_utils.Logger.log_warn(f"avatar: {type(error).__name__}: {error}")
                sender.send(bls.error_response(error), flags=FINAL)
                continue
            thread = threading.Thread(
                target=self._run, args=(turn, request, sender), name="avatar-turn", daemon=True
            )
            with self.lock:
                busy = len(self.threads) >= self.max_active_turns
                if not busy:
                    self.threads.add(thread)
                    self.active.set(len(self.threads))
            if busy:
                self.refused.increment()
                sender.send(_busy(self.max_active_turns), flags=FINAL)
                continue
            thread.start()

    def _run(self, turn: TurnRequest, request, sender) -> None:
        token = self.turns.begin(turn.session_id)
        self.sessions.set(self.turns.active())
        ended, lock = threading.Event(), threading.Lock()

        def cancelled() -> str:
            # A drained llm stream may still ask after the final response: never touch the
            # request once its stream is closed.
            with lock:
                if ended.is_set():
                    return "ended"
                if request.is_cancelled():
                    return "client"
            return "superseded" if token.superseded else ""

        def close(response) -> None:
            self._release()  # the slot is free before the client learns the turn ended
            with lock:
                ended.set()
                sender.send(response, flags=FINAL)

        def emit(event: TurnEvent) -> None:
            try:
                if isinstance(event, FinalEvent):
                    close(self._response(event))
                else:
                    sender.send(self._response(event))
            except Exception as error:  # e.g. the client went away; the turn still ends
                pb_utils.Logger.log_warn(f"avatar: could not send a response: {error}")

        try:
            final = run_turn(
                turn,
                self.stages,
                emit,
                cancelled,
                self.config,
                settled=lambda: token.wait_previous(self.settle_timeout_s),
            )
            if final.cancelled:
                pb_utils.Logger.log_info(f"avatar: turn {token.number} {final.cancelled}")
        except Exception as error:  # the turn fails as a whole (e.g. ASR); stream closed
            pb_utils.Logger.log_warn(f"avatar: turn failed: {type(error).__name__}: {error}")
            try:
                close(bls.error_response(error))
            except Exception as send_error:
                pb_utils.Logger.log_warn(f"avatar: could not send the error: {send_error}")
        finally:
            self.turns.end(token)
            self._release()
            self.sessions.set(self.turns.active())

    def _release(self) -> None:
        """This turn no longer counts against max_active_turns (idempotent)."""
        with self.lock:
            self.threads.discard(threading.current_thread())
            self.active.set(len(self.threads))

    def _response(self, event: TurnEvent):
        if isinstance(event, TranscriptEvent):
            tensors = {"kind": _bytes("transcript"), "text": _bytes(event.text)}
        elif isinstance(event, SentenceEvent):
            tensors = _sentence_tensors(event)
        else:
            timings = dict(event.timings, cancelled=event.cancelled)
            timings["video"] = self.renderer or "none: no renderer model served"
            tensors = {
                "kind": _bytes("final"),
                "text": _bytes(event.reply),
                "error": _bytes(json.dumps(event.errors)),
                "timings": _bytes(json.dumps(timings)),
            }
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, value) for name, value in tensors.items()]
        )

    def finalize(self) -> None:
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=10.0)
        pb_utils.Logger.log_info("avatar: finalized")


def _sentence_tensors(event: SentenceEvent) -> dict[str, np.ndarray]:
    tensors = {
        "kind": _bytes("sentence"),
        "text": _bytes(event.text),
        "sentence_index": np.array([event.index], np.int32),
        "emotion": _bytes(event.emotion),
        "start_time": np.array([event.start], np.float32),
        "audio": event.audio.astype(np.float32),
        "sample_rate": np.array([event.sample_rate], np.int32),
        "fps": np.array([event.fps], np.float32),
        "blendshapes": np.ascontiguousarray(event.blendshapes, np.float32),
        "head_pose": np.ascontiguousarray(event.head_pose, np.float32),
        "animation": _bytes(json.dumps(event.animation)),
        "error": _bytes(event.error),
    }
    if event.frames is not None:
        tensors["video"] = np.ascontiguousarray(event.frames, np.uint8)
    return tensors


def _max_batch(config: Path) -> int:
    """The renderer's max_batch_size from its config (1 when it does not batch)."""
    from avatar.repository import parse_config

    return max(1, int(parse_config(config).max_batch_size))


def _busy(limit: int):
    """The refusal of a turn beyond the admission limit (gRPC status UNAVAILABLE)."""
    message = f"server busy: {limit} turns are running (max_active_turns); retry in a moment"
    code = getattr(pb_utils.TritonError, "UNAVAILABLE", None)
    error = (
        pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
    )
    return pb_utils.InferenceResponse(error=error)


def _optional_text(request, name: str) -> str | None:
    return bls.input_text(request, name, optional=True)  # RequestError on invalid UTF-8
