"""Embedded runner for `asr_decoder`: its implicit state, emulated in the python backend.

In production `asr_decoder` is a TensorRT engine of the sequence-form graph (`model.onnx`:
the cross-attention K/V and the self-attention cache are implicit state, config.pbtxt).
The python backend cannot hold implicit state, so the embedded target serves this runner
(`embedded_runner` in the config): it keeps each window's caches per correlation id
(avatar.asr.sequences.WhisperSequences) and runs the stateless step graph
(`model.step.onnx`, the same network without the state output: on the CPU every graph
output is a copy, 37 MB per row and step for a 30-s window) over them.
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.asr.onnx_runtime import OnnxWhisperRuntime
from avatar.asr.sequences import WhisperSequences, WindowStep
from avatar.errors import RequestError
from avatar.model_io import ASR_DECODER
from avatar.triton.bls import input_array
from avatar.triton.sequence_runner import RunnerArgs, run_steps, sequence_step

STATE = {"self_kv": "self_kv_out", "cross_kv": "cross_kv_out"}  # the config's state pairs


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        setup = RunnerArgs.read(args)
        self.name = setup.name
        if setup.states != STATE:
            raise ValueError(
                f"{self.name}: sequence_batching.state must be {STATE}: {setup.states}"
            )
        runtime = OnnxWhisperRuntime(None, setup.graph, threads=setup.threads)
        _, kv, heads, _, width = runtime.decoder.get_inputs()[2].shape  # cross_kv
        (vocab,) = [o.shape[1] for o in runtime.decoder.get_outputs() if o.name == "logits"]
        self.sequences = WhisperSequences(
            runtime.decode, (kv, heads, width), vocab, setup.idle_timeout_s, setup.max_sequences
        )
        pb_utils.Logger.log_info(
            f"{self.name}: caches kept per sequence for {setup.graph.name} "
            f"(emulated implicit state, idle timeout {setup.idle_timeout_s:g} s)"
        )

    def execute(self, requests: list) -> list:
        return run_steps(self.name, requests, _step, self.sequences, _logits_response)


def _step(request) -> WindowStep:
    sequence, start, end = sequence_step(request)
    tokens = input_array(request, "tokens").reshape(-1).astype(np.int64, copy=False)
    kv = input_array(request, "encoder_kv")
    if kv.ndim != 5 or kv.shape[0] != 1:
        raise RequestError(
            f"encoder_kv must be [1, 2L, H, positions, Dh] (positions 0 after the START "
            f"step); got {list(kv.shape)}"
        )
    return WindowStep(sequence, tokens, kv[0] if kv.shape[3] else None, start, end)


def _logits_response(logits: np.ndarray):
    tensors = ASR_DECODER.response(logits=logits)  # [1, vocab]: the step's one row
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()]
    )
