"""`avatar_animate`: phoneme timings -> ARKit-52 frames (a thin adapter over
avatar.pipeline.speech / avatar.animation)."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from avatar.model_io import AVATAR_ANIMATE
from avatar.pipeline.request import Controls
from avatar.pipeline.speech import animate_utterance, animation_json
from avatar.triton import bls
from avatar.triton.diagnostics import enable_crash_reports


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        enable_crash_reports("avatar_animate")
        pb_utils.Logger.log_info("avatar_animate: ready")

    def execute(self, requests: list) -> list:
        return bls.answer_each("avatar_animate", requests, self._animate)

    def _animate(self, request):
        values = bls.read_inputs(AVATAR_ANIMATE, request)  # RequestError: not UTF-8 text
        controls = Controls.from_json(values["controls"] or "")
        animation = animate_utterance(
            values["phonemes"],
            values["phoneme_starts"],
            values["phoneme_ends"],
            values["duration"],
            controls,
        )
        tensors = AVATAR_ANIMATE.response(
            blendshapes=animation.blendshapes,
            head_pose=animation.head_pose,
            fps=animation.fps,
            animation=animation_json(animation, controls),
        )
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()]
        )
