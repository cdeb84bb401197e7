"""`avatar_animate`: phoneme timings -> ARKit-52 frames (a thin adapter over
avatar.pipeline.speech / avatar.animation)."""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.pipeline.request import Controls
from avatar.pipeline.speech import animate_utterance, animation_json
from avatar.triton import bls
from avatar.triton.diagnostics import enable_crash_reports


def _strings(array: np.ndarray) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        enable_crash_reports("avatar_animate")
        pb_utils.Logger.log_info("avatar_animate: ready")

    def execute(self, requests: list) -> list:
        return bls.answer_each("avatar_animate", requests, self._animate)

    def _animate(self, request):
        # one valid UTF-8 string, else RequestError (not an internal error)
        controls = Controls.from_json(bls.input_text(request, "controls", optional=True) or "")
        duration = bls.input_array(request, "duration", optional=True)
        animation = animate_utterance(
            _strings(bls.input_array(request, "phonemes")),
            bls.input_array(request, "phoneme_starts"),
            bls.input_array(request, "phoneme_ends"),
            None if duration is None else float(duration.reshape(-1)[0]),
            controls,
        )
        tensors = {
            "blendshapes": animation.blendshapes,
            "head_pose": animation.head_pose,
            "fps": np.array([animation.fps], np.float32),
            "animation": np.array(
                [json.dumps(animation_json(animation, controls)).encode()], object
            ),
        }
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()]
        )
