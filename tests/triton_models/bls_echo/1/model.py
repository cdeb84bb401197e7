"""Test model: `count` responses of a few small tensors, then the final flag."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "count").as_numpy()[0])
            for index in range(count):
                tensors = [
                    pb_utils.Tensor("values", np.full(16 + index, index, np.float32)),
                    pb_utils.Tensor("label", np.array([f"part {index}".encode()], object)),
                ]
                sender.send(pb_utils.InferenceResponse(output_tensors=tensors))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
