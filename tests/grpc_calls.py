"""One gRPC streaming call to any model with raw tensors, for the reliability tests.

Every model is called over a stream (decoupled models need one; the others answer on it
too), so one helper serves bad-input, overload, cancellation and access tests.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Mapping, Sequence

import numpy as np


@dataclasses.dataclass
class Reply:
    """The responses of one call (outputs as numpy), or the error that ended it."""

    responses: list[dict[str, np.ndarray]]
    error: str | None
    seconds: float

    def text(self, name: str, index: int = 0) -> str:
        return self.responses[index][name].reshape(-1)[0].decode("utf-8")


def tensor(name: str, array: np.ndarray):
    """An InferInput whose Triton dtype follows the numpy dtype (object -> BYTES)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    array = np.asarray(array)
    dtype = "BYTES" if array.dtype == object else np_to_triton_dtype(array.dtype)
    item = grpcclient.InferInput(name, list(array.shape), dtype)
    item.set_data_from_numpy(array)
    return item


def strings(*values: str | bytes) -> np.ndarray:
    """A BYTES tensor [n]; str values are UTF-8 encoded, bytes pass unchanged."""
    return np.array([v.encode("utf-8") if isinstance(v, str) else v for v in values], object)


def call(
    url: str,
    model: str,
    inputs: Mapping[str, np.ndarray],
    *,
    timeout_s: float = 120.0,
    headers: Mapping[str, str] | None = None,
    ssl: Mapping[str, str] | None = None,
    cancel_after: int = 0,
) -> Reply:
    """Send one request over a gRPC stream; collect responses until the final one or an
    error. `cancel_after` > 0 cancels the stream after that many non-empty responses.
    `ssl`: keyword arguments of InferenceServerClient (ssl, root_certificates, ...)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url, **(ssl or {}))
    started = time.perf_counter()
    responses: list[dict[str, np.ndarray]] = []
    error = None
    ended = False  # the server closed the stream; else closing it must cancel it
    try:
        client.start_stream(
            callback=lambda result, error: results.put((result, error)), headers=dict(headers or {})
        )
        try:
            client.async_stream_infer(
                model, [tensor(k, v) for k, v in inputs.items()], enable_empty_final_response=True
            )
        except InferenceServerException as refused:  # the stream itself was refused
            try:  # the callback has the server's reason
                return Reply([], str(results.get(timeout=5)[1]), time.perf_counter() - started)
            except queue.Empty:
                return Reply([], str(refused), time.perf_counter() - started)
        while True:
            try:
                result, err = results.get(timeout=timeout_s)
            except queue.Empty:
                error = f"no response for {timeout_s:g} s; stream cancelled"
                break
            if err is not None:
                error, ended = str(err), True
                break
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
            if cancel_after and len(responses) >= cancel_after:
                break
            if response.parameters["triton_final_response"].bool_param:
                ended = True
                break
    finally:
        client.stop_stream(cancel_requests=not ended)
        client.close()
    return Reply(responses, error, time.perf_counter() - started)


def execution_counts(url: str, models: Sequence[str], headers=None) -> dict[str, int]:
    """Triton's statistics: model -> executions so far (grows while a model works)."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as client:
        counts = {}
        for model in models:
            stats = client.get_inference_statistics(model, headers=headers, as_json=True)
            counts[model] = sum(int(s.get("execution_count", 0)) for s in stats["model_stats"])
    return counts
