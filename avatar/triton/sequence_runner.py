"""Embedded runner for `llm_decoder`: Triton's implicit state, emulated in the python backend.

In production `llm_decoder` is a TensorRT engine (or ONNX Runtime model) whose KV cache
Triton keeps as implicit state (`sequence_batching.state` in its config.pbtxt): each step
request carries only the new token ids, and the cache stays beside the model. The python
backend cannot hold implicit state, so the embedded target serves this runner instead
(serving.repository.embedded_config): it keeps each sequence's cache per
correlation id (avatar.llm.sequences.KvCacheSequences), starts it on START, frees it on END
and after `max_sequence_idle_microseconds` of silence, and runs the steps of the requests
the sequence batcher gathered (oldest strategy) as one ONNX Runtime call.

Differences from the native contract, all invisible to the `llm` caller: `logits` holds
the last position only ([1, 1, V]; the native graph returns every new position), and a
started sequence reuses the KV cache of the longest prompt prefix an ended sequence had.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.errors import RequestError
from avatar.llm.cache import PrefixCache
from avatar.llm.decoder import OrtDecoder
from avatar.llm.sequences import KvCacheSequences, Step
from avatar.model_io import LLM_DECODER
from avatar.model_parameters import ModelParameters
from avatar.triton.bls import error_response, input_array
from avatar.triton.diagnostics import enable_crash_reports

DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds


@dataclasses.dataclass(frozen=True)
class RunnerArgs:
    """What a sequence runner reads from Triton's `initialize` arguments."""

    name: str
    params: ModelParameters
    graph: Path  # the ONNX file served
    threads: int  # ONNX Runtime intra-op threads
    states: dict[str, str]  # the config's state pairs, input -> output
    idle_timeout_s: float  # sequence_batching.max_sequence_idle_microseconds
    max_sequences: int  # sequence_batching.oldest.max_candidate_sequences

    @classmethod
    def read(cls, args: dict[str, str]) -> RunnerArgs:
        """The arguments, with crash reports turned on for the model."""
        name = args["model_name"]
        enable_crash_reports(name)
        config = json.loads(args["model_config"])
        params = ModelParameters(config)
        batching = config.get("sequence_batching", {})
        idle_us = int(batching.get("max_sequence_idle_microseconds") or DEFAULT_IDLE_US)
        return cls(
            name,
            params,
            Path(args["model_repository"]) / args["model_version"] / params.str("onnx_file"),
            params.int("intra_op_threads", 1),
            json.loads(params.str("sequence_state")),
            idle_us / 1e6,
            int(batching.get("oldest", {}).get("max_candidate_sequences") or 64),
        )


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        setup = RunnerArgs.read(args)
        self.name = setup.name
        decoder = OrtDecoder(setup.graph, threads=setup.threads)
        layout = decoder.layout
        expected = dict(zip(layout.past_names(), layout.present_names(), strict=True))
        if setup.states != expected:
            raise ValueError(
                f"{self.name}: sequence_batching.state must pair each past_key_values.* input "
                f"with its present.* output; the config has {setup.states}"
            )
        self.sequences = KvCacheSequences(
            decoder,
            PrefixCache(setup.params.int("prefix_cache_entries", 16)),
            idle_timeout_s=setup.idle_timeout_s,
            max_sequences=setup.max_sequences,
        )
        pb_utils.Logger.log_info(
            f"{self.name}: KV cache kept per sequence for {setup.graph.name} "
            f"(emulated implicit state, idle timeout {setup.idle_timeout_s:g} s)"
        )

    def execute(self, requests: list) -> list:
        return run_steps(self.name, requests, _step, self.sequences, _logits_response)


def run_steps(name: str, requests: list, parse, sequences, respond) -> list:
    """One execution of a sequence runner: each request parsed into a step (`parse`) and
    checked; the valid steps run as one call of `sequences`; `respond(logits)` makes each
    response. A bad step fails its request only; a failed call fails this batch's requests
    and frees their sequences."""
    steps: list = []
    for request in requests:
        try:
            step = parse(request)
            sequences.check(step)
            steps.append(step)
        except Exception as error:  # this request fails; the others run
            steps.append(error)
    valid = [s for s in steps if not isinstance(s, Exception)]
    try:
        logits = iter(sequences.run(valid) if valid else [])
    except Exception as error:  # the batch failed: each of its requests says why
        pb_utils.Logger.log_warn(f"{name}: {type(error).__name__}: {error}")
        for step in valid:
            sequences.release(step.sequence_id)
        return [error_response(error) for _ in requests]
    return [
        error_response(step) if isinstance(step, Exception) else respond(next(logits))
        for step in steps
    ]


def sequence_step(request) -> tuple[int, bool, bool]:
    """(correlation id, START, END) of a step request; RequestError without an id."""
    value = request.correlation_id()
    if not value:
        raise RequestError("a step needs a correlation id (sequence id), none was given")
    start = bool(input_array(request, "START").reshape(-1)[0])
    end = bool(input_array(request, "END").reshape(-1)[0])
    return int(value), start, end


def _logits_response(logits: np.ndarray):
    tensors = LLM_DECODER.response(logits=logits[None])  # [1, 1, vocab]: the last position
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()]
    )


def _step(request) -> Step:
    ids = input_array(request, "input_ids").reshape(-1)
    mask = input_array(request, "attention_mask").reshape(-1)
    sequence, start, end = sequence_step(request)
    return Step(sequence, ids.tolist(), int(mask.size - ids.size), start, end)
