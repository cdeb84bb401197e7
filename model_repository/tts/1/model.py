"""`tts`: decoupled BLS model, text -> one response per sentence (a thin adapter).

All logic is in avatar/tts (unit-tested without a server); this file converts tensors,
calls `tts_vits` through avatar.triton.bls, and streams the results.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.model_io import TTS, TTS_VITS
from avatar.model_parameters import ModelParameters
from avatar.triton import bls
from avatar.triton.diagnostics import enable_crash_reports
from avatar.triton.metrics import Gauge
from avatar.tts.normalize import MAX_CHARS
from avatar.tts.phonemes import MAX_PHONEMES, Phonemizer
from avatar.tts.request import CONTROL_INPUTS, LANGUAGE_INPUT, language_of, parse_request
from avatar.tts.synth import SentenceAudio, Synthesizer
from avatar.tts.voice import packaged_voice
from avatar.tts.voices import PiperSpeaker, Voices, parse_voices

VITS_OUTPUTS = list(TTS_VITS.outputs)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        enable_crash_reports("tts")
        params = ModelParameters(json.loads(args["model_config"]))
        self.vits_model = params.str("vits_model", "tts_vits")
        self.max_chars = params.int("max_chars", MAX_CHARS)
        voice = packaged_voice()
        max_phonemes = params.int("max_phonemes", MAX_PHONEMES)
        pad_to = params.int("pad_to", 64)
        phonemizer = Phonemizer(voice.config, max_phonemes)
        english = Synthesizer(phonemizer, self._infer, pad_to=pad_to)
        # a voice per language: Piper voices the operator configures (each run by its own
        # served model), espeak-ng's voice for the other languages of FALLBACK_ESPEAK
        self.voices = Voices.build(
            PiperSpeaker("en", english, f"Piper {voice.onnx_path.name} via {self.vits_model}"),
            parse_voices(params.str("voices", "")),
            lambda model: lambda inputs: bls.infer(model, inputs, VITS_OUTPUTS),
            max_phonemes=max_phonemes,
            pad_to=pad_to,
            fallback=params.str("espeak_fallback", "true").lower() == "true",
        )
        self.active = Gauge("tts", "requests")
        # requests are served concurrently, so that tts_vits's dynamic batcher sees
        # sentences of several turns at once (espeak-ng itself runs under a lock)
        self.pool = ThreadPoolExecutor(
            max_workers=params.int("concurrent_requests", 4), thread_name_prefix="tts"
        )
        for code, speaker in self.voices.speakers.items():
            pb_utils.Logger.log_info(f"tts: {code}: {speaker.description}")

    def _infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return bls.infer(self.vits_model, inputs, VITS_OUTPUTS)

    def execute(self, requests: list) -> None:
        for request in requests:
            self.active.add(1)
            self.pool.submit(self._answer, request, request.get_response_sender())

    def _answer(self, request, sender) -> None:
        """One request, on a pool thread: its sentences, then the final flag (or error)."""
        try:
            try:
                self._serve(request, sender)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as error:  # this request fails; the model keeps serving
                pb_utils.Logger.log_warn(f"tts: {type(error).__name__}: {error}")
                sender.send(
                    bls.error_response(error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
        except Exception as error:  # e.g. the client went away
            pb_utils.Logger.log_warn(f"tts: could not answer: {error}")
        finally:
            self.active.add(-1)

    def _serve(self, request, sender) -> None:
        arrays = {"text": bls.input_array(request, "text")}
        for name in (*CONTROL_INPUTS, LANGUAGE_INPUT):
            arrays[name] = bls.input_array(request, name, optional=True)
        speaker = self.voices.speaker(language_of(arrays))
        text, controls = parse_request(arrays, speaker.config)
        for index, unit in enumerate(speaker.units(text, self.max_chars)):
            if bls.is_cancelled(request):
                pb_utils.Logger.log_info(f"tts: cancelled after {index} sentences")
                return
            result = speaker.speak(unit, controls)
            sender.send(_response(result, index, bls.requested_outputs(request)))

    def finalize(self) -> None:
        self.pool.shutdown(wait=True)  # every request still gets its final response
        pb_utils.Logger.log_info("tts: finalized")


def _response(result: SentenceAudio, index: int, requested: frozenset[str]):
    tensors = TTS.response(
        audio=result.audio,
        sample_rate=result.sample_rate,
        sentence=result.text,
        sentence_index=index,
        phonemes=result.phonemes,
        phoneme_starts=result.starts,
        phoneme_ends=result.ends,
    )
    return bls.response(tensors, requested)
