"""Generic python-backend runner for models declared with a native ONNX/TensorRT platform.

The embedded target of `serving.repository.materialize` gives such a model this runner
(its `1/model.py` imports `TritonPythonModel` from here), keeping the config's inputs,
outputs, max_batch_size, dynamic batching and instance count.
"""

from __future__ import annotations

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from avatar.model_parameters import ModelParameters
from avatar.onnx_batching import BatchedSession
from avatar.triton.bls import error_response, input_array
from avatar.triton.diagnostics import enable_crash_reports


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        enable_crash_reports(args["model_name"])
        config = json.loads(args["model_config"])
        params = ModelParameters(config)
        folder = Path(args["model_repository"]) / args["model_version"]
        path = folder / params.str("onnx_file", "model.onnx")
        self.session = BatchedSession.from_config(
            path,
            config,
            threads=params.int("intra_op_threads", 1),
            # Off for models only other models call with tensors they made (e.g. the
            # ASR decoder's 37-MB cross-attention cache on every step).
            check_finite=params.bool("check_finite_inputs", True),
            # Off for models whose dynamic dims must not be 0 (lipsync: audio samples).
            allow_empty=params.bool("allow_empty_inputs", True),
        )
        pb_utils.Logger.log_info(
            f"{config['name']}: ONNX Runtime runner for {path.name} "
            f"(declared platform {params.str('declared_platform', '?')})"
        )

    def execute(self, requests: list) -> list:
        arrays: list = []
        for request in requests:
            try:
                arrays.append({i.name: input_array(request, i.name) for i in self.session.inputs})
            except Exception as error:  # reported per request
                arrays.append(error)
        valid = [a for a in arrays if not isinstance(a, Exception)]
        outcomes = iter(self.session.run(valid))
        responses = []
        for item in arrays:
            outcome = item if isinstance(item, Exception) else next(outcomes)
            if isinstance(outcome, Exception):
                responses.append(error_response(outcome))
            else:
                tensors = [pb_utils.Tensor(name, value) for name, value in outcome.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        assert len(responses) == len(requests), "one response per request"
        return responses
