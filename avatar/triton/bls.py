"""The one BLS helper: run a request on another model, check for errors, raise typed ones.

Imported only inside the python-backend stub.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import triton_python_backend_utils as pb_utils

from avatar.errors import RequestError, StageError


def _request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    timeout_us: int,
    request_id: str = "",
) -> pb_utils.InferenceRequest:
    tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in inputs.items()]
    kwargs: dict = {"timeout": timeout_us} if timeout_us else {}
    if request_id:
        kwargs["request_id"] = request_id
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
        result[name] = tensor.as_numpy()
    return result


def infer(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    timeout_us: int = 0,
    *,
    request_id: str = "",
) -> dict[str, np.ndarray]:
    """One synchronous BLS call. Raises StageError with the callee's message on failure."""
    response = _request(model, inputs, outputs, timeout_us, request_id).exec()
    return _outputs(model, response, outputs)


def stream(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    timeout_us: int = 0,
    *,
    request_id: str = "",
    stop: Callable[[], bool] = lambda: False,
) -> Iterator[dict[str, np.ndarray]]:
    """A decoupled BLS call: yields each non-empty response's outputs until the final flag.

    Once `stop()` is True the rest is drained unseen: Triton 2.51's python backend cannot
    cancel a BLS stream, so the callee must be told to end (e.g. the llm's `stop` input).
    """
    stopped = False
    for response in _request(model, inputs, outputs, timeout_us, request_id).exec(decoupled=True):
        stopped = stopped or stop()
        if stopped:
            continue
        if response.has_error():
            raise StageError(model, response.error().message())
        if not response.output_tensors():  # the empty final response of a stream
            continue
        yield _outputs(model, response, outputs)


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
