"""The `data_type` names of a Triton `config.pbtxt` and the numpy dtypes they hold.

Plain names, no Triton import: the python-backend runners read their config as JSON and
check requests with this table; the export's sidecar records dtypes with it.
"""

from __future__ import annotations

# numpy dtype name -> config data_type
TRITON_DTYPES: dict[str, str] = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "object": "TYPE_STRING",
}
NUMPY_DTYPES: dict[str, str] = {v: k for k, v in TRITON_DTYPES.items()}
