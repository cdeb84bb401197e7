"""The `llm` (decoupled BLS) and `llm_decoder` models on a real embedded tritonserver,
over gRPC streams: a multi-turn chat with a session, streamed tokens with sentence
marks, concurrent streams, cancellation, and per-request errors for bad input."""

from __future__ import annotations

import json
import queue
import threading

import numpy as np
import pytest

pytestmark = pytest.mark.server
LLM_MODELS = ("llm", "llm_decoder")
GREEDY = {"temperature": 0, "max_tokens": 40}


@pytest.fixture(scope="module")
def grpc_url(triton_server) -> str:
    return triton_server.grpc_url


def _inputs(messages, session: str = "", sampling: dict | None = None):
    import tritonclient.grpc as grpcclient

    values = {"messages": messages if isinstance(messages, str) else json.dumps(messages)}
    if session:
        values["session_id"] = session
    if sampling is not None:
        values["sampling"] = json.dumps(sampling)
    tensors = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value.encode()], dtype=object))
        tensors.append(tensor)
    return tensors


def chat(url: str, messages, session: str = "", sampling: dict | None = None, cancel_after=0):
    """One streamed turn: (list of response dicts, error message or None)."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    responses, error = [], None
    try:
        client.async_stream_infer(
            "llm", _inputs(messages, session, sampling), enable_empty_final_response=True
        )
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                return responses, str(error)
            response = result.get_response()
            if response.outputs:
                responses.append(
                    {o.name: result.as_numpy(o.name)[0].decode() for o in response.outputs}
                )
            if cancel_after and len(responses) >= cancel_after:
                client.stop_stream(cancel_requests=True)
                return responses, None
            if response.parameters["triton_final_response"].bool_param:
                return responses, None
    finally:
        client.stop_stream()
        client.close()


def test_multi_turn_chat_streams_tokens_and_sentences(grpc_url):
    first, error = chat(grpc_url, [{"role": "user", "content": "Hi! Who are you?"}], "t1", GREEDY)
    assert error is None
    assert len(first) > 3  # streamed token by token
    assert first[-1]["finish_reason"] in ("stop", "length")
    reply = "".join(r["text"] for r in first)
    assert reply.strip() and any(r["sentence"] for r in first)
    second, error = chat(
        grpc_url, [{"role": "user", "content": "What is your name?"}], "t1", GREEDY
    )
    assert error is None and second[-1]["finish_reason"] in ("stop", "length")
    stats = json.loads(second[-1]["stats"])
    assert stats["cached_tokens"] > stats["prompt_tokens"] / 2  # the first turn was reused


def test_concurrent_streams_all_complete(grpc_url):
    questions = ["Tell me a joke.", "Where is the station?", "Name three colours."]
    results: dict[str, tuple] = {}

    def one(q: str) -> None:
        results[q] = chat(grpc_url, [{"role": "user", "content": q}], "", GREEDY)

    threads = [threading.Thread(target=one, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    alone = chat(grpc_url, [{"role": "user", "content": questions[0]}], "", GREEDY)[0]
    for q in questions:
        responses, error = results[q]
        assert error is None and responses[-1]["finish_reason"] in ("stop", "length"), q
    assert "".join(r["text"] for r in results[questions[0]][0]) == "".join(r["text"] for r in alone)


def test_cancelled_stream_leaves_model_serving(grpc_url):
    long = {"temperature": 0, "max_tokens": 300}
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    responses, _ = chat(grpc_url, story, "", long, cancel_after=2)
    assert len(responses) == 2
    after, error = chat(grpc_url, [{"role": "user", "content": "Hello"}], "", GREEDY)
    assert error is None and after[-1]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    ("messages", "sampling", "words"),
    [
        ([], None, "non-empty"),
        ([{"role": "robot", "content": "hi"}], None, "unknown"),
        ([{"role": "user", "content": "x" * 100_000}], None, "100000 characters"),
        ([{"role": "user", "content": "hi"}], {"temperature": -1}, "temperature"),
        ([{"role": "user", "content": "hi"}], {"top_p": 2}, "top_p"),
        ("not json", None, "not valid JSON"),
    ],
)
def test_bad_requests_get_clear_errors(grpc_url, messages, sampling, words):
    responses, error = chat(grpc_url, messages, "", sampling)
    assert error is not None and words in error and "invalid request" in error
    assert not responses
