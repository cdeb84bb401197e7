"""`avatar_speech`: text -> one utterance (the `tts` stream joined), not streamed.

A thin adapter: BLS to `tts` through avatar.triton.bls, joining in avatar.pipeline.speech.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.pipeline.speech import join_speech
from avatar.pipeline.turn import Speech
from avatar.triton import bls
from avatar.triton.params import ModelParameters

TTS_OUTPUTS = ["audio", "sample_rate", "sentence", "phonemes", "phoneme_starts", "phoneme_ends"]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.tts_model = ModelParameters(json.loads(args["model_config"])).str("tts_model", "tts")
        pb_utils.Logger.log_info(f"avatar_speech: via {self.tts_model}")

    def execute(self, requests: list) -> list:
        return bls.answer_each("avatar_speech", requests, self._speak)

    def _speak(self, request):
        text = bls.input_text(request, "text")  # one UTF-8 string, else RequestError
        pieces = [
            Speech(
                audio=out["audio"].reshape(-1),
                sample_rate=int(out["sample_rate"].reshape(-1)[0]),
                phonemes=[p.decode("utf-8") for p in out["phonemes"].reshape(-1)],
                starts=out["phoneme_starts"].reshape(-1),
                ends=out["phoneme_ends"].reshape(-1),
            )
            for out in bls.stream(
                self.tts_model, {"text": np.array([text.encode()], object)}, TTS_OUTPUTS
            )
        ]
        speech = join_speech(pieces)
        tensors = {
            "audio": speech.audio,
            "sample_rate": np.array([speech.sample_rate], np.int32),
            "duration": np.array([speech.audio.size / speech.sample_rate], np.float32),
            "phonemes": np.array([p.encode("utf-8") for p in speech.phonemes], dtype=object),
            "phoneme_starts": speech.starts,
            "phoneme_ends": speech.ends,
        }
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()]
        )
