"""`avatar_speech`: text -> one utterance (the `tts` stream joined), not streamed.

A thin adapter: BLS to `tts` through avatar.triton.bls, joining in avatar.pipeline.speech.
"""

from __future__ import annotations

import json

import triton_python_backend_utils as pb_utils

from avatar.model_io import AVATAR_SPEECH, TTS
from avatar.model_parameters import ModelParameters
from avatar.pipeline.speech import TTS_OUTPUTS, join_speech, speech_from_tts
from avatar.triton import bls
from avatar.triton.diagnostics import enable_crash_reports


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        enable_crash_reports("avatar_speech")
        self.tts_model = ModelParameters(json.loads(args["model_config"])).str("tts_model", "tts")
        pb_utils.Logger.log_info(f"avatar_speech: via {self.tts_model}")

    def execute(self, requests: list) -> list:
        return bls.answer_each("avatar_speech", requests, self._speak)

    def _speak(self, request):
        text = bls.input_text(request, "text")  # one UTF-8 string, else RequestError
        pieces = [
            speech_from_tts(out)
            for out in bls.stream(self.tts_model, TTS.request(text=text), TTS_OUTPUTS)
        ]
        bls.is_cancelled(request)  # a helper-thread round trip: finished iterators may go
        speech = join_speech(pieces)
        tensors = AVATAR_SPEECH.response(
            audio=speech.audio,
            sample_rate=speech.sample_rate,
            duration=speech.audio.size / speech.sample_rate,
            phonemes=speech.phonemes,
            phoneme_starts=speech.starts,
            phoneme_ends=speech.ends,
        )
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()]
        )
