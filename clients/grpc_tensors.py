"""Numpy tensors (as avatar.model_io builds them) as tritonclient's gRPC inputs: the one
place a client turns a model's request into `InferInput`s."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

import numpy as np


def infer_inputs(tensors: Mapping[str, np.ndarray], grpc: ModuleType | None = None) -> list:
    """One `InferInput` per tensor, its Triton dtype from the array's; `grpc`:
    tritonclient.grpc (the default) or tritonclient.grpc.aio."""
    from tritonclient.utils import np_to_triton_dtype

    if grpc is None:
        from tritonclient import grpc
    inputs = []
    for name, value in tensors.items():
        array = np.ascontiguousarray(value)
        tensor = grpc.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs
