"""The `llm` (decoupled BLS) and `llm_decoder` models on a real embedded tritonserver,
over gRPC streams: a multi-turn chat with a session, streamed tokens with sentence
marks, concurrent streams, cancellation, and per-request errors for bad input."""

from __future__ import annotations

import json
import queue
import threading

import numpy as np
import pytest

from serving.served import served_onnx

pytestmark = pytest.mark.server
LLM_MODELS = ("llm", "llm_decoder")
GREEDY = {"temperature": 0, "max_tokens": 40}


@pytest.fixture(scope="module")
def grpc_url(triton_server) -> str:
    return triton_server.grpc_url


def _inputs(messages, session: str = "", sampling: dict | None = None, **extra):
    import tritonclient.grpc as grpcclient

    values = dict(extra)
    if messages is not None:
        values["messages"] = messages if isinstance(messages, str) else json.dumps(messages)
    if session:
        values["session_id"] = session
    if sampling is not None:
        values["sampling"] = json.dumps(sampling)
    tensors = []
    for name, value in values.items():
        if isinstance(value, bool):
            tensor = grpcclient.InferInput(name, [1], "BOOL")
            tensor.set_data_from_numpy(np.array([value]))
        else:
            tensor = grpcclient.InferInput(name, [1], "BYTES")
            tensor.set_data_from_numpy(np.array([value.encode()], dtype=object))
        tensors.append(tensor)
    return tensors


def chat(
    url: str,
    messages,
    session: str = "",
    sampling: dict | None = None,
    cancel_after=0,
    *,
    request_id: str = "",
    on_response=lambda response: None,
    **extra,
):
    """One streamed turn: (list of response dicts, error message or None)."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    responses, error = [], None
    try:
        client.async_stream_infer(
            "llm",
            _inputs(messages, session, sampling, **extra),
            request_id=request_id,
            enable_empty_final_response=True,
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
                on_response(responses[-1])
            if cancel_after and len(responses) >= cancel_after:
                client.stop_stream(cancel_requests=True)
                return responses, None
            if response.parameters["triton_final_response"].bool_param:
                return responses, None
    finally:
        client.stop_stream()
        client.close()


def stop(url: str, request_id: str, spoken: str | None = None, session: str = "") -> str:
    """A stop request for the generation sent as `request_id` in `session`; its outcome."""
    extra = {"stop": True} if spoken is None else {"stop": True, "spoken": spoken}
    responses, error = chat(url, None, session, request_id=request_id, **extra)
    assert error is None, error
    return json.loads(responses[-1]["stats"])["stop"]


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
    first_stats, stats = (json.loads(r[-1]["stats"]) for r in (first, second))
    # the session's first turn (question + reply) is part of the second prompt
    assert stats["prompt_tokens"] > first_stats["prompt_tokens"] + first_stats["completion_tokens"]


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
    together = "".join(r["text"] for r in results[questions[0]][0])
    assert together.strip() and "".join(r["text"] for r in alone).strip()
    if served_onnx("llm_decoder").name == "model.onnx":
        # FP32 rows do not depend on their batch; the INT8 variant's int8 compute rounds a
        # row differently in a batch (its gate record: greedy rows alone vs in 5s)
        assert together == "".join(r["text"] for r in alone)


def test_cancelled_stream_leaves_model_serving(grpc_url):
    long = {"temperature": 0, "max_tokens": 300}
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    responses, _ = chat(grpc_url, story, "", long, cancel_after=2)
    assert len(responses) == 2
    after, error = chat(grpc_url, [{"role": "user", "content": "Hello"}], "", GREEDY)
    assert error is None and after[-1]["finish_reason"] in ("stop", "length")


def test_stop_request_ends_the_generation_and_the_session_keeps_what_was_spoken(grpc_url):
    """Barge-in through the llm's `stop` input (how the avatar model stops a generation)."""
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    outcome: dict[str, str] = {}

    def barge_in(response: dict) -> None:
        if response["text"] and "stop" not in outcome:
            # the id alone (another client's guess) stops nothing
            outcome["other"] = stop(grpc_url, "story-1", "Hijacked.")
            outcome["stop"] = stop(grpc_url, "story-1", "Once upon a time.", "stopper")

    long = {"temperature": 0, "max_tokens": 300}
    responses, error = chat(
        grpc_url, story, "stopper", long, request_id="story-1", on_response=barge_in
    )
    assert error is None and outcome["stop"] == "stopped" and outcome["other"] == "unknown"
    assert responses[-1]["finish_reason"] == "cancelled"
    assert json.loads(responses[-1]["stats"])["completion_tokens"] < 20  # not 300
    # the session holds [user, "Once upon a time."]: the same prompt as sending it whole
    follow = [{"role": "user", "content": "What happened next?"}]
    with_session, _ = chat(grpc_url, follow, "stopper", GREEDY)
    spoken = [*story, {"role": "assistant", "content": "Once upon a time."}, *follow]
    explicit, _ = chat(grpc_url, spoken, "", GREEDY)
    tokens = [json.loads(r[-1]["stats"])["prompt_tokens"] for r in (with_session, explicit)]
    assert tokens[0] == tokens[1], tokens
    assert stop(grpc_url, "never-sent") == "unknown"


@pytest.mark.parametrize(
    ("messages", "sampling", "words"),
    [
        ([], None, "non-empty"),
        ([{"role": "robot", "content": "hi"}], None, "unknown"),
        ([{"role": "user", "content": "x" * 100_000}], None, "100000 characters"),
        ([{"role": "user", "content": "hi"}], {"temperature": -1}, "temperature"),
        ([{"role": "user", "content": "hi"}], {"top_p": 2}, "top_p"),
        ("not json", None, "not valid JSON"),
        (None, None, "missing input 'messages'"),
    ],
)
def test_bad_requests_get_clear_errors(grpc_url, messages, sampling, words):
    responses, error = chat(grpc_url, messages, "", sampling)
    assert error is not None and words in error and "invalid request" in error
    assert not responses


# ------------------------------------------------- llm_decoder: the KV cache stays inside


def decoder_step(url: str, sequence_id: int, ids: list[int], past: int, *, start=False, end=False):
    """One step of a sequence on `llm_decoder`: (logits of the last position, error)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    arrays = {
        "input_ids": np.asarray([ids], np.int64),
        "attention_mask": np.ones((1, past + len(ids)), np.int64),
        "position_ids": np.arange(past, past + len(ids), dtype=np.int64)[None],
    }
    tensors = []
    for name, value in arrays.items():
        tensor = grpcclient.InferInput(name, list(value.shape), "INT64")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    client = grpcclient.InferenceServerClient(url)
    try:
        result = client.infer(
            "llm_decoder", tensors, sequence_id=sequence_id, sequence_start=start, sequence_end=end
        )
        return result.as_numpy("logits")[0, -1], None
    except InferenceServerException as error:
        return None, str(error)
    finally:
        client.close()


def test_llm_decoder_keeps_each_sequences_kv_cache(grpc_url):
    """Two interleaved sequences stepped with token ids only give the greedy tokens the
    in-process decoder gives with the whole cache passed in (export/llm verified that), on
    the graph the server runs (the INT8 variant while its gate passes)."""
    from avatar.llm.decoder import OrtDecoder, greedy

    decoder = OrtDecoder(served_onnx("llm_decoder"))
    prompts = {7001: [1, 504, 3458, 282, 4649, 314], 7002: [1, 17830, 28, 638, 359, 346]}
    expected = {k: greedy(decoder, [p], 6)[0] for k, p in prompts.items()}
    tokens = {k: [] for k in prompts}
    for k, prompt in prompts.items():
        logits, error = decoder_step(grpc_url, k, prompt, 0, start=True)
        assert error is None, error
        tokens[k].append(int(logits.argmax()))
    for n in range(1, 6):
        for k, prompt in prompts.items():  # interleaved: the states must stay apart
            logits, error = decoder_step(
                grpc_url, k, [tokens[k][-1]], len(prompt) + n - 1, end=n == 5
            )
            assert error is None, error
            tokens[k].append(int(logits.argmax()))
    assert tokens == expected


def test_llm_decoder_steps_of_unknown_or_ended_sequences_are_clear_errors(grpc_url):
    """Triton's sequence batcher refuses steps of sequences it does not know (the runner's
    own checks, for sequences it dropped, are in test_llm_engine); a bad step fails alone."""
    _, error = decoder_step(grpc_url, 7101, [42], 3)
    assert error and "must specify the START flag" in error
    logits, error = decoder_step(grpc_url, 7102, [1, 42], 0, start=True, end=True)
    assert error is None and logits is not None
    _, error = decoder_step(grpc_url, 7102, [42], 2)  # ended with its first step
    assert error and "must specify the START flag" in error
    _, error = decoder_step(grpc_url, 7103, [1, 42], 0, start=True)
    assert error is None
    _, error = decoder_step(grpc_url, 7103, [42, 43], 2)  # one token per step
    assert error and "one token" in error
    _, error = decoder_step(grpc_url, 7103, [42], 2, end=True)  # the sequence survived
    assert error is None


def test_a_question_the_words_miss_is_judged_by_the_served_minilm(triton_server):
    """The served grounding's `"subject": "embedding"`: a question that speaks to the avatar
    in words the rules do not know ("How do people refer to you?") is judged by the served
    MiniLM, which the `llm` model calls through BLS; one that does not say "you" is not."""
    from serving.gauges import metrics, summed_by

    def minilm_requests() -> float:
        values = metrics(triton_server.metrics_url, ["nv_inference_request_success"])
        return summed_by(values, "nv_inference_request_success").get("emotion_encoder", 0.0)

    short = {"temperature": 0, "max_tokens": 8}
    counts = [minilm_requests()]
    for question in ("Where is the spa?", "How do people refer to you?"):
        _, error = chat(triton_server.grpc_url, [{"role": "user", "content": question}], "", short)
        assert error is None, error
        counts.append(minilm_requests())
    assert counts[1] == counts[0], "a question that does not speak to the avatar was embedded"
    assert counts[2] > counts[1], "the question the words miss was not judged by MiniLM"
