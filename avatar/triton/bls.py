"""The one BLS helper: run a request on another model, check for errors, raise typed ones.

Imported only inside the python-backend stub. Two rules keep the stub's native heap
intact when several threads use BLS at once (Triton 2.51, python_backend r24.10):

- a decoupled BLS iterator is dropped only once the stub's helper thread has let go of
  it (`avatar.triton.retire`), and `is_cancelled` below is the round trip that proves it;
- a response carries only the outputs its request asked for (`response`): the stub's
  `ResponseSender::Send` prunes the others with the GIL released
  (src/response_sender.cc), destroying their numpy arrays without the GIL.

No wait is unbounded: `stream` gives up on a callee that has been silent for
`idle_timeout_s` (a callee whose stub died never ends its stream).

Memory: every caller here reads outputs as numpy, so each BLS request asks for host
memory (`PreferredMemory(TRITONSERVER_MEMORY_CPU)`): the parent process then allocates
the callee's outputs in CPU shared memory even when the callee is a TensorRT model on a
GPU instance (python_backend r24.10 src/request_executor.cc `ResponseAlloc`), where
`Tensor.as_numpy()` of a GPU tensor would raise "Tensor is stored in GPU and cannot be
converted to NumPy" (src/pb_tensor.cc). A tensor that still arrives on the GPU is
reported as a StageError naming it, never read as garbage.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.errors import RequestError, StageError
from avatar.model_io import ModelIO
from avatar.triton.retire import Retirement

RETIRED = Retirement()
_POLL_S = 0.05  # how often a waiting stream asks stop()
_END = object()


def _request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    timeout_us: int,
    request_id: str = "",
    *,
    correlation_id: int = 0,
    flags: int = 0,
) -> pb_utils.InferenceRequest:
    tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in inputs.items()]
    kwargs: dict = {"timeout": timeout_us} if timeout_us else {}
    if request_id:
        kwargs["request_id"] = request_id
    if correlation_id:  # a step of a sequence (sequence batching); flags: START / END
        kwargs["correlation_id"], kwargs["flags"] = correlation_id, flags
    kwargs["preferred_memory"] = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    return pb_utils.InferenceRequest(
        model_name=model, inputs=tensors, requested_output_names=list(outputs), **kwargs
    )


def _outputs(model: str, response: pb_utils.InferenceResponse, names: Sequence[str]):
    if response.has_error():
        raise StageError(model, response.error().message())
    result = {}
    for name in names:
        tensor = pb_utils.get_output_tensor_by_name(response, name)
        if tensor is None:
            raise StageError(model, f"response has no output {name!r}")
        result[name] = host_array(model, name, tensor)
    return result


def host_array(model: str, name: str, tensor: pb_utils.Tensor) -> np.ndarray:
    """A BLS output as numpy: it is in host memory because the request asked for it."""
    if not tensor.is_cpu():
        raise StageError(
            model,
            f"output {name!r} arrived in GPU memory although host memory was requested; "
            "read it with to_dlpack() (e.g. torch.from_dlpack) instead of as numpy",
        )
    return tensor.as_numpy()


def sequence_flags(start: bool, end: bool) -> int:
    """The request flags of a sequence step (for `infer`'s `flags`)."""
    return (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if start else 0) | (
        pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if end else 0
    )


def infer(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    timeout_us: int = 0,
    *,
    request_id: str = "",
    correlation_id: int = 0,
    flags: int = 0,
) -> dict[str, np.ndarray]:
    """One synchronous BLS call. Raises StageError with the callee's message on failure.
    `correlation_id` and `flags` (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START/END) make it a
    step of a sequence on a model with sequence batching."""
    request = _request(
        model, inputs, outputs, timeout_us, request_id, correlation_id=correlation_id, flags=flags
    )
    response = request.exec()
    return _outputs(model, response, outputs)


def stream(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    timeout_us: int = 0,
    *,
    request_id: str = "",
    stop: Callable[[], bool] = lambda: False,
    idle_timeout_s: float = 0.0,
) -> Iterator[dict[str, np.ndarray]]:
    """A decoupled BLS call: yields each non-empty response's outputs until the final flag.

    Once `stop()` is True (polled every 50 ms, also while waiting) the generator ends and
    the rest of the stream is drained unseen: Triton 2.51's python backend cannot cancel a
    BLS stream, so the callee must be told to end (e.g. the llm's `stop` input). A callee
    silent for `idle_timeout_s` (0: no limit) raises StageError.
    """
    iterator = _request(model, inputs, outputs, timeout_us, request_id).exec(decoupled=True)
    pending: queue.Queue = queue.Queue()
    threading.Thread(
        target=_pump, args=(iterator, pending), name=f"bls-{model}", daemon=True
    ).start()
    del iterator  # the pump owns it, and retires it when the stream has ended
    last = time.monotonic()
    while True:
        if stop():
            return
        try:
            response = pending.get(timeout=_POLL_S)
        except queue.Empty:
            if idle_timeout_s and time.monotonic() - last > idle_timeout_s:
                raise StageError(
                    model, f"no response for {idle_timeout_s:g} s (is its stub alive?)"
                ) from None
            continue
        last = time.monotonic()
        if response is _END:
            return
        if isinstance(response, BaseException):
            raise StageError(model, f"stream failed: {response}")
        if response.has_error():
            raise StageError(model, response.error().message())
        if not response.output_tensors():  # the empty final response of a stream
            continue
        yield _outputs(model, response, outputs)


def _pump(iterator, pending: queue.Queue) -> None:
    """Reads a BLS stream to its end on its own thread, so that the reader can wait with a
    timeout and stop early; then retires the iterator (see avatar.triton.retire)."""
    end: object = _END
    try:
        for response in iterator:
            pending.put(response)
    except Exception as error:  # e.g. the stub is shutting down
        end = error
    finally:
        # retired before the reader hears of the end, so that the reader's next round
        # trip already counts for it (the final response queued the cleanup)
        RETIRED.keep(iterator)
    pending.put(end)


def is_cancelled(request: pb_utils.InferenceRequest) -> bool:
    """`request.is_cancelled()`, recorded as a helper-thread round trip (it lets finished
    BLS iterators be dropped safely). Never call it after the request's final response."""
    return bool(RETIRED.round_trip(lambda: bool(request.is_cancelled())))


def cancellation_check(
    request: pb_utils.InferenceRequest, every_s: float = 0.02
) -> Callable[[], bool]:
    """A check of `is_cancelled` for a loop between its steps: it asks the server at most
    once per `every_s` (each ask is a round trip) and stays True once it has been."""
    asked = {"at": -every_s, "cancelled": False}

    def check() -> bool:
        now = time.monotonic()
        if not asked["cancelled"] and now - asked["at"] >= every_s:
            asked["at"], asked["cancelled"] = now, is_cancelled(request)
        return asked["cancelled"]

    return check


def coded_error_response(message: str, code: str) -> pb_utils.InferenceResponse:
    """An error response with a TritonError code ("CANCELLED", "UNAVAILABLE": the client's
    gRPC status), where this python backend has codes; a plain error where it has not."""
    value = getattr(pb_utils.TritonError, code, None)
    error = (
        pb_utils.TritonError(message, value) if value is not None else pb_utils.TritonError(message)
    )
    return pb_utils.InferenceResponse(error=error)


def cancelled_response(what: str) -> pb_utils.InferenceResponse:
    """The answer to a request its client cancelled (gRPC status CANCELLED)."""
    return coded_error_response(f"{what} cancelled by the client", "CANCELLED")


def response(
    tensors: Mapping[str, np.ndarray], requested: Collection[str] = ()
) -> pb_utils.InferenceResponse:
    """A response with the outputs of `tensors` that the request asked for (all when
    `requested` is empty), so that the stub never prunes tensors without the GIL."""
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor(name, value)
            for name, value in tensors.items()
            if not requested or name in requested
        ]
    )


def requested_outputs(request: pb_utils.InferenceRequest) -> frozenset[str]:
    """The output names the request asked for (Triton fills in all when it named none)."""
    return frozenset(request.requested_output_names())


def error_response(error: Exception) -> pb_utils.InferenceResponse:
    """A per-request error response; RequestErrors keep their message, others say so."""
    if isinstance(error, RequestError):
        message = f"invalid request: {error}"
    elif isinstance(error, StageError):
        message = f"stage failed: {error}"
    else:
        message = f"internal error: {type(error).__name__}: {error}"
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


def answer_each(
    model: str,
    requests: Sequence[pb_utils.InferenceRequest],
    handle: Callable[[pb_utils.InferenceRequest], pb_utils.InferenceResponse],
) -> list[pb_utils.InferenceResponse]:
    """`execute` of a non-decoupled model: one response per request, a failing request
    answered with its own error while the others are served."""
    responses = []
    for request in requests:
        try:
            responses.append(handle(request))
        except Exception as error:  # this request fails; the model keeps serving
            pb_utils.Logger.log_warn(f"{model}: {type(error).__name__}: {error}")
            responses.append(error_response(error))
    assert len(responses) == len(requests), "one response per request"
    return responses


def input_array(request: pb_utils.InferenceRequest, name: str, optional: bool = False):
    """The named input as numpy, or None when optional and absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        if optional:
            return None
        raise RequestError(f"missing input {name!r}")
    return tensor.as_numpy()


def read_inputs(io: ModelIO, request: pb_utils.InferenceRequest) -> dict[str, Any]:
    """The request's inputs decoded by the model's call (avatar.model_io; None when
    absent); RequestError when one is not what it should be (e.g. text not UTF-8)."""
    try:
        return io.read_request(lambda name: input_array(request, name, optional=True))
    except ValueError as error:
        raise RequestError(f"input {error}") from None


def input_text(request: pb_utils.InferenceRequest, name: str, optional: bool = False):
    """The named BYTES input [1] as str (RequestError when it is not one valid UTF-8
    string), or None when optional and absent."""
    array = input_array(request, name, optional)
    if array is None:
        return None
    values = array.reshape(-1)
    if values.size != 1:
        raise RequestError(f"input {name!r} has {values.size} strings: expected one")
    value = values[0]
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(
            f"input {name!r} is not valid UTF-8 (byte {value[error.start]:#04x} at offset "
            f"{error.start}): expected UTF-8 text"
        ) from None
