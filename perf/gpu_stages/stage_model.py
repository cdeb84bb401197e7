"""Triton python model of one `perf.gpu_stages` network (its `stage` parameter names it).

Inputs are read through DLPack where the caller put them (GPU memory: the config keeps
FORCE_CPU_ONLY_INPUT_TENSORS off) and outputs handed back the same way, so a GPU tensor
crosses the model boundary without a host copy."""

from __future__ import annotations

import json
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        parameters = json.loads(args["model_config"])["parameters"]
        sys.path.insert(0, parameters["repo_root"]["string_value"])
        import torch

        from perf.gpu_stages.networks import STAGES

        self.torch = torch
        self.stage = STAGES[parameters["stage"]["string_value"]]
        gpu = args["model_instance_kind"] == "GPU"
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}" if gpu else "cpu")
        torch.manual_seed(0)
        self.forward = self.stage.build(torch, self.device)

    def execute(self, requests):
        torch = self.torch
        responses = []
        for request in requests:
            inputs = {
                t.name: torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, t.name))
                for t in self.stage.inputs
            }
            with torch.inference_mode():
                outputs = self.forward(**{k: v.to(self.device) for k, v in inputs.items()})
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
            tensors = [
                pb_utils.Tensor.from_dlpack(t.name, value.contiguous())
                for t, value in zip(self.stage.outputs, outputs, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
