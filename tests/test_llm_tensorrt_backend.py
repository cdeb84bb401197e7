"""The production LLM backend: TensorRT-LLM's `tensorrt_llm` model behind the `llm` model.

TensorRT-LLM does not install here, so these tests hold the contract: the config in
model_repository/optional/ parses, is off by default, and declares exactly the tensors
(names, dtypes, shapes) the `llm` model sends and reads; the backend streams, stops and
fails as the others do, against a stand-in for the BLS call.
"""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from avatar.llm import trtllm
from avatar.llm.backend import Reply
from avatar.llm.sampling import SamplingParams
from avatar.llm.template import Message
from model_configs.pbtxt import SOURCE_REPOSITORY, model_names, parse_config

CONFIG = SOURCE_REPOSITORY / "optional" / "tensorrt_llm" / "config.pbtxt"
NUMPY = {
    "TYPE_INT32": "int32",
    "TYPE_FP32": "float32",
    "TYPE_BOOL": "bool",
    "TYPE_UINT64": "uint64",
}


@pytest.fixture(scope="module")
def config() -> mc.ModelConfig:
    return parse_config(CONFIG)


def test_config_parses_and_is_off_by_default(config):
    assert config.name == "tensorrt_llm" and config.backend == "tensorrtllm"
    assert "$" not in CONFIG.read_text(), "placeholder left"
    assert config.model_transaction_policy.decoupled and config.max_batch_size > 0
    assert "tensorrt_llm" not in model_names() and "optional" not in model_names()
    assert config.parameters["exclude_input_in_output"].string_value == "true"
    assert config.parameters["enable_kv_cache_reuse"].string_value == "true"


def _check(arrays: dict[str, np.ndarray], declared, config: mc.ModelConfig) -> None:
    """Each array is a declared tensor with its dtype and [batch 1, *dims] shape."""
    by_name = {t.name: t for t in declared}
    assert set(arrays) <= set(by_name), set(arrays) - set(by_name)
    for name, array in arrays.items():
        entry = by_name[name]
        assert array.dtype == np.dtype(NUMPY[mc.DataType.Name(entry.data_type)]), name
        dims = [1, *entry.dims] if config.max_batch_size else list(entry.dims)
        assert array.ndim == len(dims), (name, array.shape, dims)
        assert all(d in (-1, n) for d, n in zip(dims, array.shape, strict=True)), name
    required = {t.name for t in declared if not t.optional}
    assert required <= set(arrays), required - set(arrays)


def test_the_llm_models_tensors_match_the_config(config):
    sampling = SamplingParams(temperature=0.5, top_k=20, seed=7, max_tokens=64)
    request = trtllm.request_tensors([1, 2, 3, 4], sampling, end_id=2, pad_id=0)
    _check(request, config.input, config)
    assert request["input_ids"].shape == (1, 4) and request["input_lengths"].item() == 4
    assert request["request_output_len"].item() == 64 and request["streaming"].item()
    assert request["random_seed"].item() == 7 and request["runtime_top_k"].item() == 20
    _check(trtllm.stop_tensors(), config.input, config)
    # the table names the same dtypes as the config
    declared = {t.name: mc.DataType.Name(t.data_type) for t in [*config.input, *config.output]}
    for tensor in (*trtllm.REQUEST, *trtllm.STOP, *trtllm.RESPONSE):
        assert declared[tensor.name] == tensor.triton, tensor.name
        assert np.dtype(tensor.dtype) == np.dtype(NUMPY[tensor.triton])
    outputs = {t.name: t for t in config.output}
    for tensor in trtllm.RESPONSE:
        assert list(outputs[tensor.name].dims) == list(tensor.dims)


def test_greedy_is_top_k_one():
    request = trtllm.request_tensors([5], SamplingParams(temperature=0), 2, 0)
    assert request["runtime_top_k"].item() == 1


@pytest.fixture(scope="module")
def tokenizer():
    from avatar.llm.tokenizer import Tokenizer
    from export.registry import ensure_all

    return Tokenizer(Path(ensure_all(["llm_decoder"])["llm_decoder"]))


class FakeTensorRtLlm:
    """Streams the ids of a text, one response per id, as `tensorrt_llm` streams them."""

    def __init__(self, tokenizer, text: str, config: mc.ModelConfig):
        self.ids = [*tokenizer.encode(text), tokenizer.end_id]
        self.config, self.cancelled, self.requests = config, [], []

    def stream(self, request_id, inputs, stop):
        _check(dict(inputs), self.config.input, self.config)
        self.requests.append(request_id)
        for token in self.ids:
            if stop():
                return
            yield {
                "output_ids": np.array([[[token]]], np.int32),
                "sequence_length": np.array([[1]], np.int32),
            }

    def cancel(self, request_id):
        self.cancelled.append(request_id)


def _run(backend, **sampling) -> tuple[Reply, queue.Queue]:
    events: queue.Queue = queue.Queue()
    reply = Reply([Message("user", "Hi")], SamplingParams(**sampling), events.put)
    backend.submit(reply)
    return reply, events


def _final(events: queue.Queue):
    chunks = []
    while True:
        event = events.get(timeout=30)
        chunks += event.chunks
        if event.finish_reason is not None:
            return chunks, event


def test_replies_stream_as_sentences_and_stop_at_the_end_id(tokenizer, config):
    fake = FakeTensorRtLlm(tokenizer, "Hello there. I am Mia, nice to meet you.", config)
    backend = trtllm.TensorRtLlmBackend(tokenizer, fake.stream, fake.cancel, tokenizer.end_id)
    chunks, final = _final(_run(backend)[1])
    assert final.finish_reason == "stop"
    assert [c.sentence for c in chunks if c.sentence] == [
        "Hello there.",
        "I am Mia, nice to meet you.",
    ]
    assert final.stats["prompt_tokens"] > 0 and final.stats["completion_tokens"] > 5
    backend.stop()


def test_a_stop_ends_the_reply_and_stops_the_engine(tokenizer, config):
    fake = FakeTensorRtLlm(tokenizer, "word " * 300, config)
    backend = trtllm.TensorRtLlmBackend(tokenizer, fake.stream, fake.cancel, tokenizer.end_id)
    reply, events = _run(backend)
    reply.stopped = True
    _, final = _final(events)
    assert final.finish_reason == "cancelled"
    assert fake.cancelled == fake.requests  # the stop request named the same id
    backend.stop()


def test_a_failing_call_ends_the_reply_with_its_error(tokenizer):
    def broken(request_id, inputs, stop):
        raise RuntimeError("tensorrt_llm: no response for 60 s (is its stub alive?)")
        yield  # pragma: no cover

    backend = trtllm.TensorRtLlmBackend(tokenizer, broken, lambda _: None, tokenizer.end_id)
    _, final = _final(_run(backend)[1])
    assert final.finish_reason == "error" and "no response" in final.error
    backend.stop()
