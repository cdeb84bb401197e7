"""Embedded runner for `llm_decoder`: Triton's implicit state, emulated in the python backend.

In production `llm_decoder` is a TensorRT engine (or ONNX Runtime model) whose KV cache
Triton keeps as implicit state (`sequence_batching.state` in its config.pbtxt): each step
request carries only the new token ids, and the cache stays beside the model. The python
backend cannot hold implicit state, so the embedded target serves this runner instead
(avatar.serving.repository.embedded_config): it keeps each sequence's cache per
correlation id (avatar.llm.sequences.KvCacheSequences), starts it on START, frees it on END
and after `max_sequence_idle_microseconds` of silence, and runs the steps of the requests
the sequence batcher gathered (oldest strategy) as one ONNX Runtime call.

Differences from the native contract, all invisible to the `llm` caller: `logits` holds
the last position only ([1, 1, V]; the native graph returns every new position), and a
started sequence reuses the KV cache of the longest prompt prefix an ended sequence had.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.errors import RequestError
from avatar.llm.cache import PrefixCache
from avatar.llm.decoder import OrtDecoder
from avatar.llm.sequences import KvCacheSequences, Step
from avatar.triton.bls import error_response, input_array
from avatar.triton.diagnostics import enable_crash_reports
from avatar.triton.params import ModelParameters

DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.name = args["model_name"]
        enable_crash_reports(self.name)
        config = json.loads(args["model_config"])
        params = ModelParameters(config)
        path = Path(args["model_repository"]) / args["model_version"] / params.str("onnx_file")
        decoder = OrtDecoder(path, threads=params.int("intra_op_threads", 1))
        declared = json.loads(params.str("sequence_state"))
        layout = decoder.layout
        expected = dict(zip(layout.past_names(), layout.present_names(), strict=True))
        if declared != expected:
            raise ValueError(
                f"{self.name}: sequence_batching.state must pair each past_key_values.* input "
                f"with its present.* output; the config has {declared}"
            )
        batching = config.get("sequence_batching", {})
        idle_us = int(batching.get("max_sequence_idle_microseconds") or DEFAULT_IDLE_US)
        candidates = int(batching.get("oldest", {}).get("max_candidate_sequences") or 64)
        self.sequences = KvCacheSequences(
            decoder,
            PrefixCache(params.int("prefix_cache_entries", 16)),
            idle_timeout_s=idle_us / 1e6,
            max_sequences=candidates,
        )
        pb_utils.Logger.log_info(
            f"{self.name}: KV cache kept per sequence for {path.name} "
            f"(emulated implicit state, idle timeout {idle_us / 1e6:g} s)"
        )

    def execute(self, requests: list) -> list:
        steps: list[Step | Exception] = []
        for request in requests:
            try:
                step = _step(request)
                self.sequences.check(step)
                steps.append(step)
            except Exception as error:  # this request fails; the others run
                steps.append(error)
        valid = [s for s in steps if isinstance(s, Step)]
        try:
            logits = iter(self.sequences.run(valid) if valid else [])
        except Exception as error:  # the batch failed: each of its requests says why
            pb_utils.Logger.log_warn(f"{self.name}: {type(error).__name__}: {error}")
            for step in valid:
                self.sequences.release(step.sequence_id)
            return [error_response(error) for _ in requests]
        responses = []
        for step in steps:
            if isinstance(step, Exception):
                responses.append(error_response(step))
            else:
                row = next(logits)[None, None, :].astype(np.float32, copy=False)
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("logits", row)])
                )
        return responses


def _step(request) -> Step:
    sequence_id = request.correlation_id()
    if not sequence_id:
        raise RequestError("a step needs a correlation id (sequence id), none was given")
    ids = input_array(request, "input_ids").reshape(-1)
    mask = input_array(request, "attention_mask").reshape(-1)
    start = bool(input_array(request, "START").reshape(-1)[0])
    end = bool(input_array(request, "END").reshape(-1)[0])
    return Step(int(sequence_id), ids.tolist(), int(mask.size - ids.size), start, end)
