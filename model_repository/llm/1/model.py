"""`llm`: decoupled BLS model, chat messages -> streamed reply (a thin adapter).

All logic is in avatar/llm (unit-tested without a server). This file parses the config,
builds the chosen backend (avatar/llm/settings.py: the `backend` parameter or
$AVATAR_LLM_BACKEND / $AVATAR_LLM_URL) and maps its events to responses. `execute` returns
at once: the backend's threads produce every active stream.

- decoder (default): `llm_decoder` wrapped as an `avatar.llm.sequences.SequenceDecoder`
  through avatar.triton.bls; a background scheduler thread runs the decode steps of every
  stream together. `llm_decoder` keeps the KV caches (sequence batching with implicit
  state): a step sends each stream's new token as one request of its sequence, all at
  once, and the sequence batcher runs them as a batch.
- openai: an OpenAI-compatible endpoint (avatar/llm/openai_api.py), one HTTP stream each.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.conversation_tokens import ConversationTokens
from avatar.errors import RequestError
from avatar.llm import trtllm
from avatar.llm.backend import DecoderBackend, ReplyBackend
from avatar.llm.conversation import SESSION_TTL_S, STORE_URL_ENV, MemoryStore, open_store
from avatar.llm.engine import ChatEngine, EngineConfig
from avatar.llm.openai_api import EndpointError, OpenAIBackend, list_models
from avatar.llm.scheduler import Event
from avatar.llm.sequences import SequenceDecoder, Step
from avatar.llm.settings import LlmSettings, engine_config, llm_settings
from avatar.llm.tokenizer import Tokenizer
from avatar.llm.trtllm import TensorRtLlmBackend
from avatar.model_io import EMOTION_ENCODER, LLM, LLM_DECODER
from avatar.model_parameters import ModelParameters
from avatar.triton import bls
from avatar.triton.diagnostics import enable_crash_reports
from avatar.triton.metrics import Failures, Gauge

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonSequenceDecoder(SequenceDecoder):
    """`llm_decoder` through BLS: one request per sequence step, sent concurrently so that
    the sequence batcher gathers them into one execution."""

    def __init__(self, model: str, max_batch: int):
        self.model = model
        self._pool = ThreadPoolExecutor(max_batch, thread_name_prefix="llm-step")

    def run(self, steps):
        if len(steps) == 1:
            return [self._step(steps[0])]
        return list(self._pool.map(self._step, steps))

    def _step(self, step: Step) -> np.ndarray:
        new = len(step.ids)
        inputs = LLM_DECODER.rows(
            input_ids=[step.ids],
            attention_mask=np.ones((1, step.position + new), np.int64),
            position_ids=np.arange(step.position, step.position + new)[None],
        )
        out = bls.infer(
            self.model,
            inputs,
            list(LLM_DECODER.outputs),
            correlation_id=step.sequence_id,
            flags=bls.sequence_flags(step.start, step.end),
        )
        return out["logits"][0, -1]

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _tensorrt_llm(model: str, tokenizer: Tokenizer, max_streams: int) -> TensorRtLlmBackend:
    """TensorRT-LLM's `tensorrt_llm` model through decoupled BLS calls."""

    def stream(request_id: str, inputs, stop):
        return bls.stream(
            model, inputs, trtllm.OUTPUTS, request_id=request_id, stop=stop, idle_timeout_s=60
        )

    def cancel(request_id: str) -> None:
        for _ in bls.stream(
            model, trtllm.stop_tensors(), trtllm.OUTPUTS, request_id=request_id, idle_timeout_s=10
        ):
            pass

    return TensorRtLlmBackend(tokenizer, stream, cancel, tokenizer.end_id, max_streams)


def _embedder(model: str, batch: int = 16):
    """Texts -> sentence vectors by the served MiniLM (`emotion_encoder`, whose batches
    hold at most `batch` rows): what candidates of a reply are chosen by and a question's
    subject is judged by (GroundingConfig.embeds)."""
    from avatar.animation.emotion_classifier import SentenceTokenizer

    tokenize = SentenceTokenizer()

    def embed(texts: list[str]) -> np.ndarray:
        rows = []
        for start in range(0, len(texts), batch):
            inputs = EMOTION_ENCODER.rows(**tokenize(texts[start : start + batch]))
            out = bls.infer(model, inputs, list(EMOTION_ENCODER.outputs))
            rows.append(EMOTION_ENCODER.read_rows(out)["embedding"])
        return np.concatenate(rows)

    return embed


def _artifact_folder(repository: Path, decoder_model: str) -> Path:
    """The decoder's version folder: the materialiser places the tokenizer, chat template
    and model config beside its graph there."""
    folder = repository.parent / decoder_model / "1"
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder}/tokenizer.json is missing: materialise the repository")
    return folder


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        enable_crash_reports("llm")
        params = ModelParameters(json.loads(args["model_config"]))
        settings = llm_settings(params, EngineConfig.persona)
        config = engine_config(params, settings)
        if config.grounding.embeds:  # the served MiniLM, through BLS
            embed = _embedder(params.str("embedding_model", "emotion_encoder"))
            config = dataclasses.replace(config, embed=embed)
        self.decoder: TritonSequenceDecoder | None = None
        store_url = params.str("session_store", "") or os.environ.get(STORE_URL_ENV, "")
        store = open_store(store_url, config.sessions, params.float("session_ttl_s", SESSION_TTL_S))
        tokens = ConversationTokens.from_environment()
        backend = self._backend(settings, params, config, Path(args["model_repository"]))
        self.engine = ChatEngine(backend, None, config, store=store, tokens=tokens)
        self.memory_failures = Failures("llm", "session_store")
        self.reply_failures = Failures("llm", settings.backend)
        backend.start()
        warm_up = self._warm_up if settings.backend == "decoder" else self._check_endpoint
        threading.Thread(target=warm_up, args=(settings,), name="llm-warm-up", daemon=True).start()
        self.generations, self.sessions = Gauge("llm", "generations"), Gauge("llm", "sessions")
        where = "redis" if store_url else "memory"
        pb_utils.Logger.log_info(
            f"llm: {settings.describe()}, batch {config.max_batch}, persona from "
            f"{settings.persona_source}, conversations in {where}, session ids "
            f"{'signed' if tokens else 'as callers send them'}"
        )

    def _backend(
        self, settings: LlmSettings, params: ModelParameters, config: EngineConfig, repo: Path
    ) -> ReplyBackend:
        if settings.endpoint is not None:
            return OpenAIBackend(settings.endpoint, config.max_batch)
        decoder_model = params.str("decoder_model", "llm_decoder")
        tokenizer = Tokenizer(_artifact_folder(repo, decoder_model))
        if settings.backend == "tensorrt_llm":
            return _tensorrt_llm(settings.tensorrt_llm_model, tokenizer, config.max_batch)
        self.decoder = TritonSequenceDecoder(decoder_model, config.max_batch)
        return DecoderBackend(
            self.decoder, tokenizer, config.max_batch, config.context_tokens, config.embed
        )

    def _check_endpoint(self, settings: LlmSettings) -> None:
        """Logs whether the endpoint answers (the model loads either way: the server may
        come up later; each reply that fails meanwhile gets a clear error)."""
        assert settings.endpoint is not None
        try:
            models = list_models(settings.endpoint)
            pb_utils.Logger.log_info(f"llm: {settings.endpoint.address} serves {models}")
        except EndpointError as error:
            pb_utils.Logger.log_warn(f"llm: the endpoint does not answer yet: {error}")

    def _warm_up(self, _settings: LlmSettings, attempts: int = 60) -> None:
        """Runs the persona once so that the first turn finds its KV cached; retried while
        `llm_decoder` is still loading (models load in no set order)."""
        done: queue.Queue[Event] = queue.Queue()
        for _ in range(attempts):
            time.sleep(1.0)  # BLS works only once `initialize` has returned
            self.engine.warm_up(lambda e: e.finish_reason is not None and done.put(e))
            try:
                event = done.get(timeout=120)
            except queue.Empty:
                break
            if event.finish_reason != "error":
                pb_utils.Logger.log_info(
                    f"llm: persona warmed up in {event.stats['total_ms']:.0f} ms"
                )
                return
        pb_utils.Logger.log_warn("llm: persona warm-up failed; the first turn runs it")

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            requested = bls.requested_outputs(request)
            try:
                if _flag(request, "stop"):
                    outcome = self.engine.stop(
                        request.request_id(),
                        _spoken(request),
                        _text(request, "session_id", optional=True),
                    )
                    stats = {"stop": outcome}
                    sender.send(_response("", "", "", stats, requested), flags=FINAL)
                    continue
                turn = self.engine.parse(
                    _text(request, "messages"),
                    _text(request, "session_id", optional=True),
                    _text(request, "sampling", optional=True),
                    _text(request, "parent_session_id", optional=True),
                    _text(request, "context", optional=True),
                )
                self.engine.submit(
                    turn,
                    self._counted(_Stream(sender, requested).emit),
                    request.is_cancelled,
                    request.request_id(),
                )
            except Exception as error:  # this request fails; the model keeps serving
                pb_utils.Logger.log_warn(f"llm: {type(error).__name__}: {error}")
                sender.send(bls.error_response(error), flags=FINAL)

    def _counted(self, emit):
        """`emit`, with the generation counted in flight until its final event (the
        `avatar_active` gauges on /metrics show cancelled work stop)."""
        self.generations.add(1)

        def counted(event: Event) -> None:
            try:
                emit(event)
            finally:
                if event.finish_reason is not None:
                    self.generations.add(-1)
                    if event.finish_reason == "error":
                        self.reply_failures.increment()
                    if isinstance(self.engine.sessions, MemoryStore):
                        self.sessions.set(len(self.engine.sessions))
                    if (event.stats or {}).get("memory_error"):
                        self.memory_failures.increment()

        return counted

    def finalize(self) -> None:
        self.engine.backend.stop()
        if self.decoder is not None:
            self.decoder.close()
        pb_utils.Logger.log_info("llm: finalized")


class _Stream:
    """Maps scheduler events of one request to responses; closes the stream once."""

    def __init__(self, sender, requested: frozenset[str]):
        self.sender, self.requested = sender, requested

    def emit(self, event: Event) -> None:
        try:
            self._emit(event)
        except Exception as error:  # e.g. the client went away; generation still ends
            pb_utils.Logger.log_warn(f"llm: could not send a response: {error}")

    def _emit(self, event: Event) -> None:
        if event.finish_reason == "error":
            message = pb_utils.TritonError(f"generation failed: {event.error}")
            self.sender.send(pb_utils.InferenceResponse(error=message), flags=FINAL)
            return
        for chunk in event.chunks:
            self.sender.send(_response(chunk.text, chunk.sentence or "", "", None, self.requested))
        if event.finish_reason is not None:
            response = _response("", "", event.finish_reason, event.stats or {}, self.requested)
            self.sender.send(response, flags=FINAL)


def _text(request, name: str, optional: bool = False) -> str:
    value = bls.input_text(request, name, optional=True)  # RequestError on invalid UTF-8
    if value is None and not optional:
        raise RequestError(f"missing input {name!r} (required unless stop is true)")
    return value or ""


def _flag(request, name: str) -> bool:
    array = bls.input_array(request, name, optional=True)
    return bool(array.reshape(-1)[0]) if array is not None and array.size else False


def _spoken(request) -> str | None:
    """The `spoken` input, or None when absent (the memory is left as generated)."""
    return bls.input_text(request, "spoken", optional=True)


def _response(text: str, sentence: str, finish: str, stats: dict | None, requested: frozenset[str]):
    """One response (avatar.model_io.LLM); `stats` None: "" (only the last one has them)."""
    tensors = LLM.response(text=text, sentence=sentence, finish_reason=finish, stats=stats)
    tensors.setdefault("stats", np.array([b""], dtype=object))
    return bls.response(tensors, requested)
