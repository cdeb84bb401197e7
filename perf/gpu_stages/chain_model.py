"""Triton BLS model: the turn's critical path over the `perf.gpu_stages` models, `reps`
times; returns the milliseconds per stage (JSON) and whether every output stayed on the GPU.

Each stage's outputs are asked for in GPU memory and read with DLPack (no host copy) and
handed to the next stage as they are."""

from __future__ import annotations

import json
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        sys.path.insert(0, config["parameters"]["repo_root"]["string_value"])
        import torch

        from perf.gpu_stages import chain, served
        from perf.gpu_stages.networks import STAGES

        self.torch, self.chain, self.c_order = torch, chain, served.c_order
        # each stage's served model (perf.gpu_stages.chain.turn_models, read by the writer)
        self.models = json.loads(config["parameters"]["models"]["string_value"])
        self.outputs = {
            self.models[name]: [t.name for t in stage.outputs] for name, stage in STAGES.items()
        }
        # The chain itself is a CPU instance (a GPU instance's own response was refused:
        # "output tensor shape does not match size of output"); its tensors live on `device`.
        gpu = config["parameters"]["device"]["string_value"] == "cuda"
        self.device = torch.device("cuda:0" if gpu else "cpu")
        memory = pb_utils.TRITONSERVER_MEMORY_GPU if gpu else pb_utils.TRITONSERVER_MEMORY_CPU
        self.memory = pb_utils.PreferredMemory(memory, 0)
        self.on_gpu = True

    def call(self, model: str, inputs: dict) -> dict:
        request = pb_utils.InferenceRequest(
            model_name=model,
            inputs=[
                pb_utils.Tensor.from_dlpack(k, self.c_order(self.torch, v))
                for k, v in inputs.items()
            ],
            requested_output_names=self.outputs[model],
            preferred_memory=self.memory,
        )
        response = request.exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        out = {}
        for tensor in response.output_tensors():
            self.on_gpu = self.on_gpu and not tensor.is_cpu()
            out[tensor.name()] = self.torch.from_dlpack(tensor.to_dlpack())
        return out

    def turn(self) -> dict[str, float]:
        return self.chain.chain_once(self.torch, self.device, self.call, self.models)

    def execute(self, requests):
        responses = []
        for request in requests:
            reps_in = pb_utils.get_input_tensor_by_name(request, "reps")
            reps = int(self.torch.from_dlpack(reps_in)[0])
            sweep = json.loads(request.parameters() or "{}").get("sessions")
            if sweep:  # perf.gpu_stages.sessions: paced sessions, each stage call its own
                from perf.gpu_stages.sessions import paced_sessions

                answer = paced_sessions(
                    self.torch, self.device, self.call, models=self.models, **json.loads(sweep)
                )
            else:
                self.turn()  # warm-up
                answer = {"reps": [self.turn() for _ in range(reps)]}
            body = json.dumps({**answer, "outputs_on_gpu": self.on_gpu})
            # JSON as UTF-8 bytes in a UINT8 tensor made through DLPack, not numpy: with
            # numpy 2 the r24.10 stub misreads a numpy array's size ("output tensor shape
            # does not match size of output").
            data = self.torch.frombuffer(bytearray(body.encode()), dtype=self.torch.uint8)
            tensor = pb_utils.Tensor.from_dlpack("timings", data)
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
