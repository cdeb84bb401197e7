"""avatar.triton.bls without a server: every BLS request asks for host memory, and an
output that still arrives on the GPU is a clear StageError, not an `as_numpy` crash.

`triton_python_backend_utils` exists only inside a stub, so a small stand-in records
what the helper asks of it; the tensors carry their memory type like pb_utils.Tensor.
"""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest

from avatar.errors import StageError


class FakeTensor:
    def __init__(self, name: str, array: np.ndarray, on_gpu: bool = False):
        self._name, self._array, self._on_gpu = name, array, on_gpu

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return not self._on_gpu

    def as_numpy(self) -> np.ndarray:
        if self._on_gpu:  # what the r24.10 stub does (src/pb_tensor.cc)
            raise RuntimeError("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._array


class FakeResponse:
    def __init__(self, tensors):
        self.tensors = tensors

    def has_error(self) -> bool:
        return False

    def output_tensors(self):
        return self.tensors


@pytest.fixture
def bls(monkeypatch):
    made: list[dict] = []
    fake = types.ModuleType("triton_python_backend_utils")
    fake.TRITONSERVER_MEMORY_CPU, fake.TRITONSERVER_MEMORY_GPU = "cpu", "gpu"
    fake.PreferredMemory = lambda kind, device=0: ("preferred", kind, device)
    fake.Tensor = FakeTensor
    fake.get_output_tensor_by_name = lambda response, name: next(
        (t for t in response.tensors if t.name() == name), None
    )

    class InferenceRequest:
        response: FakeResponse

        def __init__(self, **kwargs):
            made.append(kwargs)

        def exec(self, decoupled=False):
            return InferenceRequest.response

    fake.InferenceRequest = InferenceRequest
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.delitem(sys.modules, "avatar.triton.bls", raising=False)
    module = importlib.import_module("avatar.triton.bls")
    module.made, module.fake = made, fake
    yield module
    sys.modules.pop("avatar.triton.bls", None)


def test_requests_ask_for_host_memory(bls):
    bls.fake.InferenceRequest.response = FakeResponse([FakeTensor("frames", np.ones(3))])
    out = bls.infer("renderer", {"x": np.zeros(2, np.float32)}, ["frames"])
    assert np.array_equal(out["frames"], np.ones(3))
    assert bls.made[-1]["preferred_memory"] == ("preferred", "cpu", 0)


def test_an_output_on_the_gpu_is_a_stage_error_naming_it(bls):
    gpu = FakeTensor("frames", np.ones(3), on_gpu=True)
    bls.fake.InferenceRequest.response = FakeResponse([gpu])
    with pytest.raises(StageError, match="'frames' arrived in GPU memory"):
        bls.infer("renderer", {"x": np.zeros(2, np.float32)}, ["frames"])
