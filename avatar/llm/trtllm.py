"""Production: replies from TensorRT-LLM's `tensorrt_llm` model on the same Triton
(model_repository/optional/tensorrt_llm/config.pbtxt, the TensorRT-LLM backend's
inflight batcher), streamed through a decoupled BLS call.

The `llm` model keeps what it owns (persona, memory, chat template, tokenizer, sentence
streaming, stops) and sends token ids; TensorRT-LLM keeps the KV cache (paged, reused
across requests that share a prefix: `enable_kv_cache_reuse`), batches in flight and
samples. One request per reply, `streaming` true: each response carries the new ids.

The tensors are one table (`REQUEST`, `RESPONSE`), checked against the config by
tests/test_llm_tensorrt_backend.py; the Triton calls are injected (`Streamer`), so this
module runs and is tested without Triton.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from avatar.llm.backend import Reply, ReplyBackend, TokenizedPrompts
from avatar.llm.sampling import SamplingParams
from avatar.llm.scheduler import Event
from avatar.llm.stream import TextStream
from avatar.llm.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # numpy dtype name
    triton: str  # the config's data_type
    dims: tuple[int, ...]  # as the config declares them (no batch dim)


# what the `llm` model sends (batch of one: each array is [1, *dims])
REQUEST = (
    Tensor("input_ids", "int32", "TYPE_INT32", (-1,)),
    Tensor("input_lengths", "int32", "TYPE_INT32", (1,)),
    Tensor("request_output_len", "int32", "TYPE_INT32", (1,)),
    Tensor("end_id", "int32", "TYPE_INT32", (1,)),
    Tensor("pad_id", "int32", "TYPE_INT32", (1,)),
    Tensor("streaming", "bool", "TYPE_BOOL", (1,)),
    Tensor("temperature", "float32", "TYPE_FP32", (1,)),
    Tensor("runtime_top_k", "int32", "TYPE_INT32", (1,)),
    Tensor("runtime_top_p", "float32", "TYPE_FP32", (1,)),
    Tensor("repetition_penalty", "float32", "TYPE_FP32", (1,)),
    Tensor("random_seed", "uint64", "TYPE_UINT64", (1,)),
)
# a stop request (the same request id): ends the running generation
STOP = (*REQUEST[:3], Tensor("stop", "bool", "TYPE_BOOL", (1,)))
# what it reads: output_ids [1, beams=1, new ids], sequence_length [1, beams=1]
RESPONSE = (
    Tensor("output_ids", "int32", "TYPE_INT32", (-1, -1)),
    Tensor("sequence_length", "int32", "TYPE_INT32", (-1,)),
)
OUTPUTS = tuple(t.name for t in RESPONSE)

# (request id, inputs, stop polled while streaming) -> the responses' outputs
Streamer = Callable[[str, Mapping[str, np.ndarray], Callable[[], bool]], Iterator[dict]]


def request_tensors(
    prompt: list[int], sampling: SamplingParams, end_id: int, pad_id: int
) -> dict[str, np.ndarray]:
    """The inputs of one streamed generation (names, dtypes and shapes as in REQUEST)."""
    greedy = sampling.temperature == 0
    values = {
        "input_ids": [prompt],
        "input_lengths": [[len(prompt)]],
        "request_output_len": [[sampling.max_tokens]],
        "end_id": [[end_id]],
        "pad_id": [[pad_id]],
        "streaming": [[True]],
        "temperature": [[sampling.temperature if not greedy else 1.0]],
        "runtime_top_k": [[1 if greedy else sampling.top_k]],
        "runtime_top_p": [[sampling.top_p if not greedy else 0.0]],
        "repetition_penalty": [[sampling.repetition_penalty]],
        "random_seed": [[sampling.seed or 0]],
    }
    return {t.name: np.asarray(values[t.name], dtype=t.dtype) for t in REQUEST}


def stop_tensors() -> dict[str, np.ndarray]:
    """A stop request's inputs (TensorRT-LLM ends the request of the same id)."""
    values = {
        "input_ids": [[0]],
        "input_lengths": [[1]],
        "request_output_len": [[1]],
        "stop": [[True]],
    }
    return {t.name: np.asarray(values[t.name], dtype=t.dtype) for t in STOP}


class TensorRtLlmBackend(TokenizedPrompts, ReplyBackend):
    """Replies from `tensorrt_llm`: the chat template and tokenizer of the decoder backend,
    generation there. `stream(request_id, inputs, stop)` runs one decoupled call;
    `cancel(request_id)` sends the stop request."""

    name = "tensorrt_llm"

    def __init__(
        self,
        tokenizer: Tokenizer,
        stream: Streamer,
        cancel: Callable[[str], None],
        end_id: int,
        max_streams: int = 8,
    ):
        self.tokenizer, self._stream, self._cancel = tokenizer, stream, cancel
        self.end_id = end_id
        self._pool = ThreadPoolExecutor(max_streams, thread_name_prefix="llm-trtllm")

    def submit(self, reply: Reply) -> None:
        self._pool.submit(self._run, reply)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, reply: Reply) -> None:
        started, first = time.monotonic(), None
        prompt = self.prompt(reply.messages)
        text = TextStream(self.tokenizer.stream_decoder(), reply.sampling.stop)
        request_id = f"llm-{secrets.token_hex(8)}"
        inputs = request_tensors(prompt, reply.sampling, self.end_id, self.tokenizer.pad_id)
        generated = 0
        reason = "length"
        try:
            for out in self._stream(request_id, inputs, reply.ended):
                for token in np.asarray(out["output_ids"]).reshape(-1).tolist():
                    first = first or time.monotonic()
                    if token in self.tokenizer.stop_ids:
                        reason = "stop"
                        break
                    generated += 1
                    delta = text.push(int(token))
                    if delta:
                        reply.emit(Event(reply.splitter.push(delta)))
                    if text.stopped:
                        reason = "stop"
                        break
                if reason == "stop":
                    self._cancel(request_id)  # a stop string: the engine may go on
                    break
            if reply.ended():
                self._cancel(request_id)
                reason = "cancelled"
        except Exception as error:  # the reply ends with an error; the model serves on
            log.warning("tensorrt_llm reply failed: %s", error)
            reply.emit(Event([], "error", _stats(started, first, prompt, generated), str(error)))
            return
        chunks = reply.final_chunks(text.finish())
        reply.emit(Event(chunks, reason, _stats(started, first, prompt, generated)))


def _stats(started: float, first: float | None, prompt: list[int], generated: int) -> dict:
    now = time.monotonic()
    return {
        "prompt_tokens": float(len(prompt)),
        "completion_tokens": float(generated),
        "ttft_ms": ((first or now) - started) * 1000,
        "total_ms": (now - started) * 1000,
    }
