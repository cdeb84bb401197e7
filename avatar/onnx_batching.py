"""Run a list of requests through one ONNX Runtime session, batched as Triton would.

Triton's python backend hands a model the list of requests its dynamic batcher gathered;
unlike the native backends, the model must concatenate them itself. `BatchedSession`
does that for any ONNX model whose tensors batch on axis 0: it validates each request,
groups requests whose non-batch shapes agree, runs each group once and splits the
outputs back. A request that fails validation or makes ONNX Runtime fail gets its own
error; the other requests of the batch are still answered.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from avatar.config_dtypes import NUMPY_DTYPES
from avatar.errors import RequestError

log = logging.getLogger(__name__)

Result = dict[str, np.ndarray] | Exception


@dataclasses.dataclass(frozen=True)
class TensorIO:
    """A tensor as a Triton config declares it: dims exclude the batch axis, -1 is dynamic."""

    name: str
    dtype: str  # numpy dtype name
    dims: tuple[int, ...]

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> TensorIO:
        return cls(
            entry["name"],
            NUMPY_DTYPES[entry["data_type"]],
            tuple(int(d) for d in entry["dims"]),
        )

    def check(
        self, array: np.ndarray, batched: bool, finite: bool = True, allow_empty: bool = True
    ) -> None:
        """Raise RequestError unless `array` matches this declaration (and, unless
        `allow_empty`, holds at least one value per batch item)."""
        if array.dtype.name != self.dtype:
            raise RequestError(
                f"input {self.name!r} has dtype {array.dtype.name}, expected {self.dtype}"
            )
        dims = array.shape[1:] if batched else array.shape
        if len(dims) != len(self.dims) or any(
            want not in (-1, got) for want, got in zip(self.dims, dims, strict=True)
        ):
            expected = ["batch", *self.dims] if batched else list(self.dims)
            raise RequestError(
                f"input {self.name!r} has shape {list(array.shape)}, expected {expected} (-1: any)"
            )
        if batched and array.shape[0] == 0:
            raise RequestError(f"input {self.name!r} has an empty batch")
        if not allow_empty and 0 in dims:
            raise RequestError(
                f"input {self.name!r} is empty (shape {list(array.shape)}); expected at least "
                "one value per item"
            )
        if finite and array.dtype.kind == "f" and not np.isfinite(array).all():
            raise RequestError(f"input {self.name!r} contains NaN or Inf")


class BatchedSession:
    """An ONNX Runtime session that serves many requests per call (batch on axis 0)."""

    def __init__(
        self,
        session: Any,  # onnxruntime.InferenceSession
        inputs: Sequence[TensorIO],
        outputs: Sequence[TensorIO],
        batched: bool,
        *,
        check_finite: bool = True,
        allow_empty: bool = True,
    ):
        self.session = session
        self.check_finite = check_finite
        self.allow_empty = allow_empty
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.batched = batched
        names = {i.name for i in session.get_inputs()}
        declared = {i.name for i in self.inputs}
        if names != declared:
            raise ValueError(f"config inputs {sorted(declared)} != ONNX inputs {sorted(names)}")

    @classmethod
    def from_config(
        cls,
        path: Path,
        config: Mapping[str, Any],
        threads: int = 1,
        check_finite: bool = True,
        allow_empty: bool = True,
    ) -> BatchedSession:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return cls(
            session,
            [TensorIO.from_config(e) for e in config.get("input", [])],
            [TensorIO.from_config(e) for e in config.get("output", [])],
            batched=int(config.get("max_batch_size", 0)) > 0,
            check_finite=check_finite,
            allow_empty=allow_empty,
        )

    def _validate(self, request: Mapping[str, np.ndarray]) -> None:
        sizes = set()
        for spec in self.inputs:
            if spec.name not in request:
                raise RequestError(f"missing input {spec.name!r}")
            spec.check(request[spec.name], self.batched, self.check_finite, self.allow_empty)
            if self.batched:
                sizes.add(request[spec.name].shape[0])
        if len(sizes) > 1:
            raise RequestError(f"inputs disagree on the batch size: {sorted(sizes)}")

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.outputs]
        values = self.session.run(names, dict(feeds))
        return {
            o.name: np.asarray(v).astype(o.dtype, copy=False)
            for o, v in zip(self.outputs, values, strict=True)
        }

    def _run_group(self, group: list[Mapping[str, np.ndarray]]) -> list[Result]:
        if len(group) == 1:
            return [self._run(group[0])]
        feeds = {i.name: np.concatenate([r[i.name] for r in group]) for i in self.inputs}
        merged = self._run(feeds)
        sizes = [next(iter(r.values())).shape[0] for r in group]
        bounds = np.cumsum([0, *sizes])
        return [
            {name: value[bounds[k] : bounds[k + 1]] for name, value in merged.items()}
            for k in range(len(group))
        ]

    def run(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[Result]:
        """One result per request, in order: a dict of outputs or the exception it raised."""
        results: list[Result | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            try:
                self._validate(request)
            except RequestError as error:
                results[index] = error
                continue
            if self.batched:
                key = tuple(request[i.name].shape[1:] for i in self.inputs)
            else:
                key = ("single", index)
            groups[key].append(index)

        for indices in groups.values():
            group = [requests[i] for i in indices]
            try:
                outcomes = self._run_group(group)
            except Exception:  # isolate the culprit below
                if len(group) == 1:
                    outcomes = [self._safe_run(group[0])]
                else:
                    log.warning("batch of %d failed; retrying one by one", len(group))
                    outcomes = [self._safe_run(r) for r in group]
            for index, outcome in zip(indices, outcomes, strict=True):
                results[index] = outcome
        assert all(r is not None for r in results), "every request must get a result"
        return results  # type: ignore[return-value]

    def _safe_run(self, request: Mapping[str, np.ndarray]) -> Result:
        try:
            return self._run(request)
        except Exception as error:  # returned as this request's error
            return RuntimeError(f"ONNX Runtime failed: {error}")
