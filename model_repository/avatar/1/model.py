"""`avatar`: decoupled BLS model, one conversation turn per request (a thin adapter).

All logic is Triton-free and unit-tested: the turn in avatar/pipeline/turn.py, admission,
threads, barge-in and the output tensors in avatar/pipeline/runner.py. This file parses
the config, binds the stages to BLS calls on asr, llm, tts (and the renderer when Triton
says it is ready), and wraps each request's response sender as a `TurnStream`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.animation.emotion_classifier import EmotionClassifier, SentenceTokenizer
from avatar.conversation_tokens import ConversationTokens
from avatar.knowledge import KNOWLEDGE_DIR_ENV, KnowledgeBase, KnowledgeConfig
from avatar.languages import speech_language
from avatar.model_io import ASR, EMOTION_ENCODER, LLM, RENDERERS, TTS
from avatar.model_parameters import ModelParameters
from avatar.pipeline import Heard, PipelineConfig, Speech, Stages, TurnRequest, parse_turn
from avatar.pipeline.prompt import KNOWLEDGE_SAMPLING, llm_messages, llm_sampling
from avatar.pipeline.runner import RunnerConfig, Tensors, TurnRunner
from avatar.pipeline.speech import TTS_OUTPUTS, speech_from_tts
from avatar.triton import bls
from avatar.triton.diagnostics import enable_crash_reports
from avatar.triton.metrics import Counter, Gauge

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
RENDERER_CHECK_S = 10.0  # how long an answer of is_model_ready(renderer) is trusted


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        enable_crash_reports("avatar")
        params = ModelParameters(json.loads(args["model_config"]))
        self.asr_model = params.str("asr_model", "asr")
        self.llm_model = params.str("llm_model", "llm")
        self.tts_model = params.str("tts_model", "tts")
        # the languages the tts model has voices for (its `voices` + espeak-ng's fallback):
        # a reply sentence in another one is spoken by the English voice
        self.voice_languages = params.str("voice_languages", "en,zh").replace(" ", "").split(",")
        self.renderers = {
            "portrait": params.str("portrait_renderer_model", "portrait_renderer"),
            "cartoon": params.str("cartoon_renderer_model", "renderer"),
        }
        self.face = params.str("face", "portrait")
        if self.face not in self.renderers:
            raise ValueError(
                f"avatar: face {self.face!r}: expected one of {sorted(self.renderers)}"
            )
        self.render_batch = params.int("render_batch", 16)
        self._renderer_ready: dict[str, tuple[bool, float]] = {}
        self.max_tokens = params.int("max_tokens", 96)
        # also the longest silence of a tts stream before the sentence goes without audio
        self.tts_timeout_s = params.float("tts_timeout_s", 30.0)
        self.max_audio_s = params.float("max_audio_seconds", 60.0)
        # session ids are tokens signed with $AVATAR_SESSION_SECRET (None: trusted as sent)
        self.tokens = ConversationTokens.from_environment()
        pipeline = PipelineConfig(
            llm_timeout_s=params.float("llm_timeout_s", PipelineConfig.llm_timeout_s),
            fallback_reply=params.str("fallback_reply", PipelineConfig.fallback_reply),
            speak_ahead_s=params.float("speak_ahead_s", PipelineConfig.speak_ahead_s),
        )
        config = RunnerConfig(
            max_active_turns=params.int("max_active_turns", RunnerConfig.max_active_turns),
            settle_timeout_s=params.float("settle_timeout_s", RunnerConfig.settle_timeout_s),
            pipeline=pipeline,
        )
        self.llm_timeout_s = pipeline.llm_timeout_s
        # reply sentence -> tokens here -> embedding from the served encoder -> numpy head
        self.emotion_model = params.str("emotion_model", "emotion_encoder")
        self.tokenize = SentenceTokenizer()
        self.emotions = EmotionClassifier.load(encoder=self._embed)
        self.knowledge = self._knowledge(params)
        self.knowledge_sampling = json.loads(
            params.str("knowledge_sampling", json.dumps(KNOWLEDGE_SAMPLING))
        )
        if not isinstance(self.knowledge_sampling, dict):
            raise ValueError("avatar: knowledge_sampling must be a JSON object of llm sampling")
        stages = Stages(
            self._transcribe,
            self._chat,
            self._speak,
            self._render,
            feel=self._feel,
            cut=self._cut,
            recall=self.knowledge.recall if self.knowledge is not None else None,
        )
        turns, sessions = Gauge("avatar", "turns"), Gauge("avatar", "sessions")
        self.refused = Counter("avatar", "busy")
        self.runner = TurnRunner(
            stages,
            config,
            video=self._renderer,
            on_change=lambda active, open_sessions: (
                turns.set(active),
                sessions.set(open_sessions),
            ),
        )
        pb_utils.Logger.log_info(
            f"avatar: {self.asr_model} -> {self.llm_model} -> {self.tts_model}; video of the "
            f"{self.face} face by default, from {self.renderers} while they are ready"
        )

    def _knowledge(self, params: ModelParameters) -> KnowledgeBase | None:
        """The operator's documents (`knowledge_dir`, else $AVATAR_KNOWLEDGE_DIR; "" = none),
        embedded by the emotion encoder at the first turn (it may load after this model)."""
        folder = params.str("knowledge_dir", "") or os.environ.get(KNOWLEDGE_DIR_ENV, "")
        if not folder:
            return None
        defaults = KnowledgeConfig()
        config = KnowledgeConfig(
            passages=params.int("knowledge_passages", defaults.passages),
            tokens=params.int("knowledge_tokens", defaults.tokens),
            min_score=params.float("knowledge_min_score", defaults.min_score),
            check_s=params.float("knowledge_check_s", defaults.check_s),
        )
        base = KnowledgeBase(folder, self._embed, config)  # KnowledgeError: a bad folder
        pb_utils.Logger.log_info(
            f"avatar: knowledge from {folder}: up to {config.passages} passages, "
            f"{config.tokens} tokens per turn"
        )
        return base

    # ------------------------------------------------------------------ stages (BLS)
    def _renderer(self, face: str) -> str:
        """The model that draws `face` ("" = the default), or "" while it is not served.
        Readiness is asked of Triton at most every RENDERER_CHECK_S (it may load later)."""
        model = self.renderers[face or self.face]
        ready, asked = self._renderer_ready.get(model, (False, float("-inf")))
        if model and time.monotonic() - asked > RENDERER_CHECK_S:
            try:
                ready = bool(pb_utils.is_model_ready(model))
            except Exception as error:  # e.g. not in the repository: no video
                pb_utils.Logger.log_verbose(f"avatar: {model}: {error}")
                ready = False
            self._renderer_ready[model] = (ready, time.monotonic())
        return model if ready else ""

    def _embed(self, sentences) -> np.ndarray:
        inputs = EMOTION_ENCODER.rows(**self.tokenize(sentences))
        out = bls.infer(self.emotion_model, inputs, list(EMOTION_ENCODER.outputs))
        return EMOTION_ENCODER.read_rows(out)["embedding"]

    def _feel(self, text: str) -> tuple[str, float]:
        emotion = self.emotions.predict(text)
        return emotion.label, emotion.intensity

    def _transcribe(self, audio: np.ndarray) -> Heard:
        outputs = ["text", "detected_language"]
        out = ASR.read_response(bls.infer(self.asr_model, ASR.request(audio=audio), outputs))
        return Heard(out["text"], out["detected_language"])

    def _chat(self, text: str, request: TurnRequest, stop: Callable[[], bool]):
        inputs = LLM.request(
            messages=llm_messages(text, request),
            sampling=llm_sampling(request, self.max_tokens, self.knowledge_sampling),
            session_id=request.session_id or None,
            parent_session_id=request.parent_session_id or None,
            context=request.context or None,
        )
        pending, stats = "", {}
        replies = bls.stream(
            self.llm_model,
            inputs,
            list(LLM.outputs),
            request_id=request.turn_id,
            stop=stop,
            idle_timeout_s=self.llm_timeout_s,
        )
        for out in map(LLM.read_response, replies):
            pending += out["text"]
            sentence = out["sentence"].strip()
            if sentence:
                yield sentence
                pending = ""
            if out["finish_reason"]:
                stats = out["stats"]
        if pending.strip() and not stop():
            yield pending.strip()
        return stats

    def _cut(self, request: TurnRequest, spoken: str) -> None:
        """Barge-in: end the turn's LLM generation and keep only what was spoken."""
        inputs = LLM.request(stop=True, spoken=spoken, session_id=request.session_id or None)
        replies = bls.stream(
            self.llm_model, inputs, ["stats"], request_id=request.turn_id, idle_timeout_s=10.0
        )
        for out in map(LLM.read_response, replies):
            outcome = out["stats"].get("stop", "")
            pb_utils.Logger.log_info(f"avatar: llm generation {request.turn_id}: {outcome}")

    def _speak(self, text: str, request: TurnRequest) -> Iterator[Speech]:
        inputs = TTS.request(
            text=text,
            seed=request.controls.seed,
            language=speech_language(text, request.language, self.voice_languages),
        )
        replies = bls.stream(
            self.tts_model,
            inputs,
            TTS_OUTPUTS,
            int(self.tts_timeout_s * 1e6),
            idle_timeout_s=self.tts_timeout_s,
        )
        for out in replies:
            yield speech_from_tts(out)

    def _render(
        self, blendshapes: np.ndarray, head_pose: np.ndarray, face: str
    ) -> np.ndarray | None:
        """Frames [T, H, W, 3] of `face` in requests of at most render_batch frames (the
        renderer's max_batch_size); None while its renderer is not served."""
        model = self._renderer(face)
        if not model:
            return None
        io, frames = RENDERERS[face or self.face], []
        for at in range(0, len(blendshapes), self.render_batch):
            inputs = io.rows(
                blendshapes=blendshapes[at : at + self.render_batch],
                head_pose=head_pose[at : at + self.render_batch],
            )
            frames.append(io.read_rows(bls.infer(model, inputs, list(io.outputs)))["frames"])
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
                    parent_session_id=_optional_text(request, "parent_session_id") or "",
                    tokens=self.tokens,
                )
            except Exception as error:  # this request fails; the model keeps serving
                pb_utils.Logger.log_warn(f"avatar: {type(error).__name__}: {error}")
                sender.send(bls.error_response(error), flags=FINAL)
                continue
            if not self.runner.submit(turn, _Stream(request, sender)):
                self.refused.increment()
                sender.send(_busy(self.runner.config.max_active_turns), flags=FINAL)

    def finalize(self) -> None:
        for stack in self.runner.join(timeout_s=10.0):  # a turn that outlived its client
            pb_utils.Logger.log_warn(f"avatar: a turn still runs at unload: {stack}")
        pb_utils.Logger.log_info("avatar: finalized")


class _Stream:
    """A request's response sender as the runner's `TurnStream`."""

    def __init__(self, request, sender) -> None:
        self.request, self.sender = request, sender
        self.requested = bls.requested_outputs(request)

    def is_cancelled(self) -> bool:
        return bls.is_cancelled(self.request)

    def send(self, tensors: Tensors, final: bool = False) -> None:
        response = bls.response(tensors, self.requested)
        if final:
            self.sender.send(response, flags=FINAL)
        else:
            self.sender.send(response)

    def fail(self, error: Exception) -> None:
        self.sender.send(bls.error_response(error), flags=FINAL)


def _busy(limit: int):
    """The refusal of a turn beyond the admission limit (gRPC status UNAVAILABLE)."""
    message = f"server busy: {limit} turns are running (max_active_turns); retry in a moment"
    return bls.coded_error_response(message, "UNAVAILABLE")


def _optional_text(request, name: str) -> str | None:
    return bls.input_text(request, name, optional=True)  # RequestError on invalid UTF-8
